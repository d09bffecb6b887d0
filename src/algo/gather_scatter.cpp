// Binomial-tree gather and scatter (Algo::mst).
//
// Cost: ⌈lg p⌉·α + (p-1)/p·n·β  (n = size·count·esize: everything the root receives or sends).
//
// Relative rank v = (rank - root) mod p; the subtree of v is the relative ranks
// [v, v + lowbit(v)) (the root's: all of them), contiguous in relative order, so each tree edge
// carries one message: a subtree's blocks, packed. ⌈lg p⌉ latency terms where a linear gather has
// p-1 at the root, and the root's link still carries only (p-1)/p·n: the choice off-host at every
// size. Interior ranks stage their subtree's blocks in scratch; the root receives straight into
// its output when it is rank 0 (relative order = rank order) and rotates otherwise.
#include "algo/common.h"

namespace shoal::algo {
namespace {

int subtree(int vr, int p) { return vr == 0 ? pow2_ceil(p) : lowbit(vr); }

}  // namespace

void gather_binomial(Ctx& c, const void* in, void* out, size_t count, int root) {
  const int p = c.size, vr = mod(c.rank - root, p);
  auto abs = [&](int v) { return mod(v + root, p); };
  const size_t bs = count * c.esize;
  const int sub = subtree(vr, p), hi = std::min(vr + sub, p), nblk = hi - vr;
  if (nblk == 1) {  // leaf
    c.send(abs(vr - lowbit(vr)), in, bs);
    return;
  }
  uint8_t* tmp = (vr == 0 && root == 0) ? u8(out) : c.scratch(std::max<size_t>(nblk * bs, 1), 0);
  copy_bytes(tmp, in, bs);
  std::vector<Request*> recvs;
  for (int mask = 1; mask < sub && vr + mask < p; mask *= 2) {
    const int child = vr + mask, chi = std::min(child + mask, hi);
    recvs.push_back(c.irecv(abs(child), tmp + static_cast<size_t>(mask) * bs, static_cast<size_t>(chi - child) * bs));
  }
  c.wait(recvs);
  if (vr != 0) {
    c.send(abs(vr - lowbit(vr)), tmp, static_cast<size_t>(nblk) * bs);
  } else if (root != 0) {
    for (int i = 0; i < p; ++i) copy_bytes(u8(out) + static_cast<size_t>(abs(i)) * bs, tmp + static_cast<size_t>(i) * bs, bs);
  }
}

void scatter_binomial(Ctx& c, const void* in, void* out, size_t count, int root) {
  const int p = c.size, vr = mod(c.rank - root, p);
  auto abs = [&](int v) { return mod(v + root, p); };
  const size_t bs = count * c.esize;
  const int sub = subtree(vr, p), hi = std::min(vr + sub, p), nblk = hi - vr;
  const uint8_t* tmp;
  if (vr == 0) {
    if (root == 0) {
      tmp = u8(in);
    } else {
      uint8_t* t = c.scratch(std::max<size_t>(p * bs, 1), 0);
      for (int i = 0; i < p; ++i) copy_bytes(t + static_cast<size_t>(i) * bs, u8(in) + static_cast<size_t>(abs(i)) * bs, bs);
      tmp = t;
    }
  } else if (nblk > 1) {
    uint8_t* t = c.scratch(static_cast<size_t>(nblk) * bs, 0);
    c.recv(abs(vr - lowbit(vr)), t, static_cast<size_t>(nblk) * bs);
    tmp = t;
  } else {  // leaf
    c.recv(abs(vr - lowbit(vr)), out, bs);
    return;
  }
  std::vector<Request*> sends;
  for (int mask = sub / 2; mask >= 1; mask /= 2) {
    const int child = vr + mask;
    if (child >= p) continue;
    const int chi = std::min(child + mask, hi);
    sends.push_back(c.isend(abs(child), tmp + static_cast<size_t>(mask) * bs, static_cast<size_t>(chi - child) * bs));
  }
  copy_bytes(out, tmp, bs);
  c.wait(sends);
}

}  // namespace shoal::algo
