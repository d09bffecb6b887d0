// Ring reduce: ring reduce-scatter, then every rank sends its reduced block to the root.
//
// Cost: 2·(p-1)·α + 2·(p-1)/p·n·β + (p-1)/p·n·γ  (the gather's p-1 messages go up at once, so
// its latency is closer to α + (p-1)/p·n·β at the root's link).
//
// The reduction work is spread over all ranks and no link carries more than ~2·n, where the
// binomial tree makes each of lg p edges carry n and reduce n. The automatic choice takes it from
// the switch reduce.mst_below (cost.h: measured).
#include "algo/common.h"

namespace shoal::algo {

void reduce_ring(Ctx& c, const void* in, void* out, size_t count, int root) {
  const int p = c.size, r = c.rank;
  Blocks b = even_blocks(count, p, c.esize);
  uint8_t* dst = r == root ? u8(out) + b.off[r] : c.scratch(std::max<size_t>(b.len[r], 1), 1);
  ring_reduce_scatter(c, u8(in), nullptr, dst, b);
  if (r == root) {
    std::vector<Request*> recvs;
    for (int j = 0; j < p; ++j)
      if (j != r) recvs.push_back(c.irecv(j, u8(out) + b.off[j], b.len[j]));
    c.wait(recvs);
  } else {
    c.send(root, dst, b.len[r]);
  }
}

}  // namespace shoal::algo
