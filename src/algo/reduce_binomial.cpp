// Binomial-tree reduce.
//
// Cost: ⌈lg p⌉·(α + n·β + n·γ); each edge is pipelined in kChunkBytes messages, so a parent
// reduces chunk k of a child's vector while chunk k+1 arrives.
//
// Relative rank v = (rank - root) mod p. For mask = 1, 2, 4, ..: a rank with bit `mask` set sends
// its partial to v - mask and is done; otherwise it receives and folds in the partial of child
// v + mask (if it exists). ⌈lg p⌉ latency terms make it the choice for small and mid-sized
// reduces; for large ones the whole vector crossing lg p edges (n·β each) loses to the ring
// reduce-scatter + gather (reduce_ring.cpp).
#include "algo/common.h"

namespace shoal::algo {

void binomial_reduce(Ctx& c, const void* in, void* acc, size_t count, int root) {
  const int p = c.size, vr = mod(c.rank - root, p);
  const size_t n = count * c.esize;
  const void* cur = in;
  for (int mask = 1; mask < p; mask <<= 1) {
    if (vr & mask) {
      send_chunks(c, mod(vr - mask + root, p), cur, n);
      return;
    }
    const int child = vr + mask;
    if (child < p) {
      send_recv_reduce(c, -1, nullptr, 0, mod(child + root, p), cur, acc, n);
      cur = acc;
    }
  }
  copy_bytes(acc, cur, n);  // the root when it had no child (p == 1)
}

void reduce_binomial(Ctx& c, const void* in, void* out, size_t count, int root) {
  const int p = c.size, vr = mod(c.rank - root, p);
  const bool has_children = vr == 0 ? p > 1 : (lowbit(vr) > 1 && vr + 1 < p);
  void* acc = nullptr;
  if (vr == 0)
    acc = out;
  else if (has_children)
    acc = c.scratch(std::max<size_t>(count * c.esize, 1), 1);
  binomial_reduce(c, in, acc, count, root);
}

}  // namespace shoal::algo
