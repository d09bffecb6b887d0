// Direct shared-memory reduce-scatter (single host).
//
// Cost, with α = one barrier, β = memory copy per byte, n = bytes of the whole input, N chunks:
//   (N + 1)·α + ~2·n·β + (p-1)/p·n·γ
// per rank: copy (p-1)/p·n into its scratch (all blocks but its own), then reduce its own block
// in one pass over p sources (n bytes read) straight into `out`. The p2p versions over shm rings
// copy each partial twice per hop and take p-1 (ring) or lg p (halving) doorbell rounds; this
// takes one barrier per chunk: chosen whenever every rank shares this host.
//
// Pipeline: chunk m covers elements [m·pe, (m+1)·pe) of every block; each rank's slot m % 2 holds
// its pieces of chunk m, block j's piece at j·pe (its own block's piece is not copied: the rank
// reduces it straight from `in`, as srcs[0], so in place (out = in + rank·count) works because
// reduce_many lets dst alias srcs[0]). Phase m (between barriers m and m+1) copies chunk m in and
// reduces chunk m-1. A slot written in phase m is read in phase m+1 and rewritten in phase m+2,
// barriers between; after the last reduce, end() closes with a barrier only when the next op
// could overwrite the slot just read (direct_common.h, slot_of).
#include <vector>

#include "algo/direct_common.h"
#include "reduce/reduce.h"

namespace shoal::algo {

using namespace direct;

void reduce_scatter_direct(Ctx& c, const void* in, void* out, size_t count) {
  ShmGroup& g = *c.shm();
  const int p = c.size, r = c.rank;
  const size_t es = c.esize;
  Sig s(OpKind::reduce_scatter, c);
  if (small_fits(count * es * static_cast<size_t>(p))) return reduce_scatter_small(c, in, out, count, s.value());
  begin(c, s.value());
  // pe: elements of each block per chunk, whole cache lines where possible. Where each rank has a
  // core, no more than a block's: the op's place in the slot (Places) moves by what it
  // uses of it. Ranks that share cores, whose place stays, keep the L2's pieces: with a block's,
  // their reduce_scatter of 256 KiB took 1.20-1.37x the time at 4 and 8 ranks (BENCHMARKS.md,
  // "Direct ops: each op's place in the slot").
  const size_t line = std::max<size_t>(64 / es, 1);
  const size_t l2_piece = std::max<size_t>(reduce_scatter_piece(slot_bytes(g), p, c.ways().l2()) / es, 1);
  const size_t pe = g.shares_cores() ? l2_piece : std::min(l2_piece, (count + line - 1) / line * line);
  const size_t nchunks = std::max<size_t>(1, (count + pe - 1) / pe);
  auto clen = [&](size_t m) { return std::min(pe, count - std::min(count, m * pe)); };
  RankPtrs srcs(p);
  Places places(c, static_cast<size_t>(p) * pe * es);
  for (size_t ph = 0; ph <= nchunks; ++ph) {
    if (ph < nchunks) {
      const size_t m = ph, len = clen(m);
      uint8_t* sl = slot(g, r, slot_of(c, m)) + places[r];
      for (int j = 0; j < p; ++j)
        if (j != r)
          copy_in(c, sl + static_cast<size_t>(j) * pe * es, u8(in) + (static_cast<size_t>(j) * count + m * pe) * es,
                  len * es);
    }
    if (ph >= 1) {
      const size_t m = ph - 1, len = clen(m);
      if (len) {
        int k = 0;
        srcs[k++] = u8(in) + (static_cast<size_t>(r) * count + m * pe) * es;
        for (int j = 0; j < p; ++j)
          if (j != r) srcs[k++] = slot(g, j, slot_of(c, m)) + places[j] + static_cast<size_t>(r) * pe * es;
        reduce_many(u8(out) + m * pe * es, srcs.data(), p, len, c.dt, c.op);
      }
    }
    if (ph == nchunks) break;
    g.barrier();
    if (ph == 0) check(c, places);
  }
  end(c, nchunks);
}

}  // namespace shoal::algo
