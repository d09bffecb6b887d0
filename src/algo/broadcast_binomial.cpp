// Tree broadcasts: binomial (Algo::mst) and pipelined chain (Algo::ring).
//
// Binomial cost: ⌈lg p⌉·(α + n·β) unpipelined; here every edge forwards kChunkBytes messages as
// they arrive, so for n >> kChunkBytes it approaches (⌈lg p⌉ + n/kChunkBytes - 1)·(α + kChunkBytes·β)
// at the deepest leaf, but the root still sends the whole vector ⌈lg p⌉ times (⌈lg p⌉·n·β at the
// root's link): fewest latency terms. Scatter + allgather sends no byte more than twice from any
// rank (2·(p-1)/p·n·β); the automatic choice between hosts changes from this one to that at the
// switch broadcast.mst_below (cost.h: measured).
//
// Chain cost: (p - 2 + n/kChunkBytes)·(α + kChunkBytes·β): every rank receives from its
// predecessor (relative order from the root) and forwards each chunk to its successor, so each
// link carries n once: ≈ n·β for very large n, the best possible, but p-1 latency terms before
// the last rank sees anything. Between hosts the automatic choice does not take it
// (scatter-allgather is close at large n without the long start-up); on one host over TCP, where
// every byte costs the same CPUs, it does from the switch broadcast.chain_from.
#include "algo/common.h"

namespace shoal::algo {

void tree_bcast(Ctx& c, uint8_t* buf, size_t bytes, int parent, const std::vector<int>& children) {
  const size_t n = chunk_count(bytes);
  std::vector<Request*> recvs, sends;
  if (parent >= 0) post_recv_chunks(c, parent, buf, bytes, recvs);
  for (size_t k = 0; k < n; ++k) {
    if (parent >= 0) c.wait({recvs[k]});
    for (int ch : children) sends.push_back(c.isend(ch, buf + k * kChunkBytes, chunk_len(bytes, k)));
  }
  if (!sends.empty()) c.wait(sends);
}

void binomial_tree(int v, int p, int& parent, std::vector<int>& children) {
  parent = v == 0 ? -1 : v - lowbit(v);
  for (int mask = (v == 0 ? pow2_ceil(p) : lowbit(v)) / 2; mask >= 1; mask /= 2)
    if (v + mask < p) children.push_back(v + mask);
}

void broadcast_binomial(Ctx& c, void* buf, size_t count, int root) {
  const int p = c.size;
  int parent;
  std::vector<int> children;
  binomial_tree(mod(c.rank - root, p), p, parent, children);
  if (parent >= 0) parent = mod(parent + root, p);
  for (int& ch : children) ch = mod(ch + root, p);
  tree_bcast(c, u8(buf), count * c.esize, parent, children);
}

void broadcast_chain(Ctx& c, void* buf, size_t count, int root) {
  const int p = c.size, vr = mod(c.rank - root, p);
  const int parent = vr == 0 ? -1 : mod(vr - 1 + root, p);
  std::vector<int> children;
  if (vr + 1 < p) children.push_back(mod(vr + 1 + root, p));
  tree_bcast(c, u8(buf), count * c.esize, parent, children);
}

}  // namespace shoal::algo
