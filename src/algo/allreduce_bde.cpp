// BDE allreduce (Rabenseifner): recursive-halving reduce-scatter, then recursive-doubling
// allgather ("bisection, distance doubling, exchange").
//
// Cost (p a power of two): 2·lg p·α + 2·(p-1)/p·n·β + (p-1)/p·n·γ.
// Other p: the extra rem = p - p' ranks (p' the largest power of two <= p) first fold into a
// partner and are unfolded at the end: + 2·α + 2·n·β + n·γ on those pairs.
//
// Same bandwidth and reduction terms as the ring but lg p instead of p-1 latency terms: for
// messages where the ring's 2·(p-1)·α dominates and the binomial tree's lg p·n·β has become too
// expensive. The ring's neighbour-only traffic keeps every link busy, while the halving steps'
// long-distance partners share links between hosts. The automatic choice takes it from the
// switch allreduce.mst_below up to allreduce.bde_up_to, or allreduce.bde_up_to_odd_p when p is
// not a power of two (cost.h: measured).
//
// Fold: among ranks 0 .. 2·rem-1, each even rank sends its whole vector to the next odd rank,
// which reduces and takes part under new rank r/2; the others take part as r - rem. Halving:
// with partner distance p'/2, p'/4, .., 1, each participant keeps one half of its current range
// of the p' blocks (the upper half if its bit is set) and receives the partner's copy of that half
// into the output (chunked, reduced as the chunks land); afterwards participant q owns block q.
// Doubling: distances 1, 2, .., p'/2 exchange the owned ranges back. Unfold: each odd rank sends
// the result to its even partner. The output is the accumulator; in == out works (received
// chunks then go through scratch slots).
#include "algo/common.h"

namespace shoal::algo {

void allreduce_bde(Ctx& c, const void* in, void* out, size_t count) {
  const int p = c.size, r = c.rank;
  const size_t n = count * c.esize;
  const int pp = pow2_floor(p), rem = p - pp;
  uint8_t* o = u8(out);
  const int q = fold_in(c, in, out, n);
  if (q < 0) {  // an even fold rank: the result comes back from its odd partner
    recv_chunks(c, r + 1, out, n);
    return;
  }
  const Blocks b = even_blocks(count, pp, c.esize);
  recursive_halving(c, q, rem, r < 2 * rem ? o : u8(in), o, b.off);

  for (int mask = 1; mask < pp; mask *= 2) {
    const int peer = fold_rank(q ^ mask, rem);
    const int mine = q & ~(mask - 1), theirs = mine ^ mask;
    c.sendrecv(peer, o + b.off[mine], b.span(mine, mine + mask), peer, o + b.off[theirs],
               b.span(theirs, theirs + mask));
  }

  if (r < 2 * rem) send_chunks(c, r - 1, out, n);
}

}  // namespace shoal::algo
