// Reduce-scatter by recursive halving (Algo::rd).
//
// Cost (p a power of two): lg p·α + (p-1)/p·n·β + (p-1)/p·n·γ  (n = bytes of the whole input).
// Other p: the rem = p - p' extra ranks fold into a partner first (+ α + n·β + n·γ) and get their
// block back at the end (+ α + n/p·β).
//
// Same β and γ terms as the ring with lg p latency terms instead of p-1. The automatic choice
// takes it below the switch reduce_scatter.halving_below (cost.h: measured), the ring above.
//
// Fold: among ranks 0 .. 2·rem-1 each even rank sends its whole input to the next odd rank,
// which reduces and takes part (new rank r/2) on behalf of both; the others take part as r - rem.
// Participant q stands for a "group" of output blocks: {2q, 2q+1} for q < rem, {q + rem} else,
// so the groups are contiguous in rank order. Halving at distances p'/2, .., 1 keeps the upper or
// lower half of the current range of groups (chunked exchanges, reduced as they land, into a
// full-size scratch accumulator); at the end participant q holds its group reduced, copies its
// own block out and, if it stands for an even rank too, sends that rank its block.
#include "algo/common.h"

namespace shoal::algo {

void reduce_scatter_halving(Ctx& c, const void* in, void* out, size_t count) {
  const int p = c.size, r = c.rank;
  const size_t bs = count * c.esize, n = bs * p;
  const int pp = pow2_floor(p), rem = p - pp;
  uint8_t* acc = c.scratch(std::max<size_t>(n, 1), 1);
  const int q = fold_in(c, in, acc, n);
  if (q < 0) {  // an even fold rank: its block comes back from its odd partner
    recv_chunks(c, r + 1, out, bs);
    return;
  }
  // Participant g's group of output blocks starts at rank fold_rank(g) - (g < rem).
  std::vector<size_t> edge(pp + 1);
  for (int g = 0; g <= pp; ++g) edge[g] = static_cast<size_t>(g < rem ? 2 * g : g + rem) * bs;
  recursive_halving(c, q, rem, r < 2 * rem ? acc : u8(in), acc, edge);
  if (r < 2 * rem) send_chunks(c, r - 1, acc + static_cast<size_t>(r - 1) * bs, bs);
  copy_bytes(out, acc + static_cast<size_t>(r) * bs, bs);
}

}  // namespace shoal::algo
