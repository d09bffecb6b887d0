// Pairwise-exchange alltoall(v) (Algo::ring).
//
// Cost: (p-1)·α + Σ_j (send_j + recv_j)·β ≈ (p-1)·α + (p-1)/p·n·β for even counts (n = bytes each
// rank sends), with kAlltoallWindow steps in flight: ⌈(p-1)/W⌉ round trips of latency.
//
// Step k (1..p-1) sends to rank+k and receives from rank-k, so at every step each rank has
// exactly one inbound and one outbound message: no rank is flooded by p-1 senders at once (a
// naive all-at-once exchange makes every receiver's link the bottleneck and its buffers balloon).
// A few steps overlap (each to a different peer) to hide latency, but a step with a block of at
// least kAlltoallBulkBlock waits for the steps before it and runs alone, which measured faster
// with ranks sharing cores, while below it the window won (BENCHMARKS.md, "The pairwise
// exchange's window"). The block to self is copied locally. in == out (same sizes) works: the input is staged in scratch first.
#include "algo/common.h"

namespace shoal::algo {

void alltoallv_pairwise(Ctx& c, const void* in, const std::vector<size_t>& send_counts, void* out,
                        const std::vector<size_t>& recv_counts) {
  const int p = c.size, r = c.rank;
  const size_t es = c.esize;
  Blocks sb = counted_blocks(send_counts, es), rb = counted_blocks(recv_counts, es);
  const uint8_t* src = apart_from_out(c, in, sb.total(), out, rb.total());
  // Over shared memory every rank of the group is on this host and writes such an output; over
  // TCP the rule stays one writer's (not measured there).
  const size_t writers = c.topo == Topo::shm ? static_cast<size_t>(p) : 1;
  output_copy(rb.total(), writers, kStreamReduceAlltoall)(u8(out) + rb.off[r], src + sb.off[r], std::min(sb.len[r], rb.len[r]));
  std::vector<std::vector<Request*>> inflight;
  size_t head = 0;
  for (int k = 1; k < p; ++k) {
    const int to = mod(r + k, p), from = mod(r - k, p);
    const int window = std::max(sb.len[to], rb.len[from]) >= kAlltoallBulkBlock ? 1 : kAlltoallWindow;
    while (static_cast<int>(inflight.size() - head) >= window) c.wait(inflight[head++]);
    inflight.push_back({c.isend(to, src + sb.off[to], sb.len[to]), c.irecv(from, u8(out) + rb.off[from], rb.len[from])});
  }
  for (; head < inflight.size(); ++head) c.wait(inflight[head]);
}

}  // namespace shoal::algo
