// Ring allgather(v).
//
// Cost: (p-1)·α + (p-1)/p·n·β  (n = total bytes gathered; with unequal counts the β term is the
// largest block per step: Σ_steps max_len·β in the worst case, since the ring moves in lockstep).
//
// Each rank sends only to its right neighbour and receives only from its left one, so every link
// carries (p-1)/p·n and no rank's bandwidth is shared: bandwidth-optimal, and the choice off-host
// from the measured switch allgather.rd_below (cost.h), where its p-1 latency terms no longer
// matter. Every step is cut into
// kChunkBytes messages, each forwarded at the next step as soon as it lands, so the steps
// overlap. All receives go up front (each has its own place in the output), so nothing waits on
// buffer space.
#include "algo/common.h"

namespace shoal::algo {

void ring_allgather(Ctx& c, uint8_t* buf, const Blocks& b, int v, int left, int right) {
  const int p = c.size;
  if (p < 2) return;
  struct Item {
    int step;
    int blk;
    size_t off;  // within the block
    size_t len;
  };
  std::vector<Item> items;
  for (int s = 0; s < p - 1; ++s) {
    int blk = mod(v - s - 1, p);
    size_t n = chunk_count(b.len[blk]);
    for (size_t k = 0; k < n; ++k) items.push_back({s, blk, k * kChunkBytes, chunk_len(b.len[blk], k)});
  }
  std::vector<Request*> recvs;
  recvs.reserve(items.size());
  for (auto& it : items) recvs.push_back(c.irecv(left, buf + b.off[it.blk] + it.off, it.len));
  std::vector<Request*> sends;
  post_send_chunks(c, right, buf + b.off[v], b.len[v], sends);
  for (size_t i = 0; i < items.size(); ++i) {
    c.wait({recvs[i]});
    const Item& it = items[i];
    if (it.step < p - 2) sends.push_back(c.isend(right, buf + b.off[it.blk] + it.off, it.len));
  }
  c.wait(sends);
}

void allgatherv_ring(Ctx& c, const void* in, void* out, const std::vector<size_t>& counts) {
  const int p = c.size, r = c.rank;
  Blocks b = counted_blocks(counts, c.esize);
  copy_bytes(u8(out) + b.off[r], in, b.len[r]);
  ring_allgather(c, u8(out), b, r, mod(r - 1, p), mod(r + 1, p));
}

}  // namespace shoal::algo
