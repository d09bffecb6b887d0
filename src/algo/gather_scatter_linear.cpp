// Linear gather and scatter (Algo::linear): the root exchanges one message with every other rank
// directly, all posted at once.
//
// Cost: (p-1)·α + (p-1)/p·n·β at the root (n = size·count·esize), and n/p·β elsewhere.
//
// The binomial tree (gather_scatter.cpp) has only ⌈lg p⌉ latency terms, but every interior rank
// receives its subtree's blocks and sends them on: over TCP each hop is two kernel copies per
// byte, so for large messages the tree moves up to ⌈lg p⌉/2 times more bytes through the busiest
// ranks than this. Chosen above the measured crossover (select.cpp).
#include "algo/common.h"

namespace shoal::algo {

void gather_linear(Ctx& c, const void* in, void* out, size_t count, int root) {
  const size_t bs = count * c.esize;
  if (c.rank != root) {
    c.send(root, in, bs);
    return;
  }
  std::vector<Request*> reqs;
  for (int j = 0; j < c.size; ++j)
    if (j != root) reqs.push_back(c.irecv(j, u8(out) + static_cast<size_t>(j) * bs, bs));
  c.start();
  copy_bytes(u8(out) + static_cast<size_t>(root) * bs, in, bs);
  c.wait(reqs);
}

void scatter_linear(Ctx& c, const void* in, void* out, size_t count, int root) {
  const size_t bs = count * c.esize;
  if (c.rank != root) {
    c.recv(root, out, bs);
    return;
  }
  std::vector<Request*> reqs;
  for (int j = 0; j < c.size; ++j)
    if (j != root) reqs.push_back(c.isend(j, u8(in) + static_cast<size_t>(j) * bs, bs));
  c.start();
  copy_bytes(out, u8(in) + static_cast<size_t>(root) * bs, bs);
  c.wait(reqs);
}

}  // namespace shoal::algo

namespace shoal::algo {

// Linear broadcast: the root sends the whole vector to every rank, all sends posted at once.
// Cost: (p-1)·α + (p-1)·n·β at the root. Worse than scatter+allgather when the root's link is the
// bottleneck (separate hosts), but it moves the fewest bytes in total — (p-1)·n against
// scatter+allgather's (p-1)/p·n·(p+1) — which is what counts when the ranks share one host's
// CPUs and every byte over TCP costs two kernel copies (measured: docs/algorithms.md).
void broadcast_linear(Ctx& c, void* buf, size_t count, int root) {
  const size_t n = count * c.esize;
  if (c.rank != root) {
    c.recv(root, buf, n);
    return;
  }
  std::vector<Request*> reqs;
  for (int j = 0; j < c.size; ++j)
    if (j != root) reqs.push_back(c.isend(j, buf, n));
  c.wait(reqs);
}

}  // namespace shoal::algo
