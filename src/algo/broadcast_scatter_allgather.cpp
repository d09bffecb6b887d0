// Broadcast as binomial scatter + ring allgather (van de Geijn).
//
// Cost: (⌈lg p⌉ + p - 1)·α + 2·(p-1)/p·n·β.
//
// The vector is cut into p blocks indexed by relative rank v = (rank - root) mod p. The binomial
// scatter hands each subtree its contiguous range of blocks (⌈lg p⌉ steps, (p-1)/p·n·β at the
// root), then the ring allgather over the relative ring completes every rank. No rank sends more
// than ~2·n, against ⌈lg p⌉·n at the root of a binomial tree; its p-1 latency terms make it poor
// for small broadcasts. The automatic choice between hosts takes it from the switch
// broadcast.mst_below (cost.h: measured).
#include "algo/common.h"

namespace shoal::algo {

void broadcast_scatter_allgather(Ctx& c, void* buf, size_t count, int root) {
  const int p = c.size, vr = mod(c.rank - root, p);
  auto abs = [&](int v) { return mod(v + root, p); };
  Blocks b = even_blocks(count, p, c.esize);
  uint8_t* base = u8(buf);
  const int sub = vr == 0 ? pow2_ceil(p) : lowbit(vr);
  if (vr != 0) c.recv(abs(vr - sub), base + b.off[vr], b.span(vr, std::min(vr + sub, p)));
  std::vector<Request*> sends;
  for (int mask = sub / 2; mask >= 1; mask /= 2) {
    const int child = vr + mask;
    if (child >= p) continue;
    sends.push_back(c.isend(abs(child), base + b.off[child], b.span(child, std::min(child + mask, p))));
  }
  if (!sends.empty()) c.wait(sends);
  ring_allgather(c, base, b, vr, abs(vr - 1), abs(vr + 1));
}

}  // namespace shoal::algo
