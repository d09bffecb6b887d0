// Direct shared-memory allreduce and reduce (single host; DeepSpeed-style).
//
// Cost, with α = one barrier, β = time per byte of memory copy, N = ⌈n / chunk⌉ chunks (chunk
// ≈ kWorkingSetBytes / 2p per rank): each rank copies (p-1)/p·n into its scratch, reduces n/p
// reading p sources (n bytes read), and copies n out:
//   (N + 2)·α + ~3·n·β + (p-1)/p·n·γ          (reduce: only the root copies out: ~2·n·β)
// One shot, where the costs measured on the machine say it is cheaper (cost.h): every rank
// (reduce: the root) reduces the whole vector itself:
//   α + (p + 1)·n·β + (p-1)·n·γ        (one barrier: see slot_of in direct_common.h)
//
// Why it is chosen whenever every rank shares this host: the p2p algorithms over shm rings copy
// every message twice (into the ring, out of it) and need 2·(p-1) (ring) or 2·lg p (BDE) message
// rounds, each a doorbell handshake; here each byte is copied into shared memory once, reduced
// in place by exactly one rank in a single pass over p sources (reduce_many), and read out once,
// with one barrier per chunk.
//
// Chunk pipeline (one barrier per chunk). Chunk m uses slot m % 2 of every rank; a slot holds the
// chunk's input (ce elements; this rank's own slice is not copied, it is reduced straight from
// `in`) followed by a result area for one slice (ce / p elements). Phase m, between barriers m
// and m+1, does: copy-in of chunk m; reduce of chunk m-1 (rank r: slice r of every rank's slot,
// canonical order 0..p-1, into its own result area); copy-out of chunk m-2 (every slice, from its
// owner's result area). Safety: a slot's input area written in phase m is read in phase m+1 and
// rewritten in phase m+2; its result area written in phase m+1 is read in phase m+2 and rewritten
// in phase m+3; a barrier separates each write from the reads and the reads from the rewrite.
// After the last copy-out, end() closes with a barrier only when the next op could overwrite the
// slot just read (direct_common.h, slot_of).
// Slices are multiples of a cache line so no two ranks write one line.
#include <vector>

#include "algo/cost.h"
#include "algo/direct_common.h"
#include "reduce/copy.h"
#include "reduce/reduce.h"
#include "shoal/error.h"

namespace shoal::algo {
namespace {

using namespace direct;

void reduce_impl(Ctx& c, const void* in, void* out, size_t count, int root) {  // root < 0: allreduce
  ShmGroup& g = *c.shm();
  const int p = c.size, r = c.rank;
  const size_t es = c.esize, n = count * es;
  Sig s(root < 0 ? OpKind::allreduce : OpKind::reduce, c);
  if (small_fits(count * c.esize)) return allreduce_small(c, in, out, count, root, s.value());
  const size_t sb = slot_bytes(g);
  // The ranks agree on the way by the same table (cost.h, compared when the group formed); the
  // signature would make a disagreement a mismatch error rather than a wrong result.
  const bool one_shot = n <= sb && c.ways().reduce_one_shot(root < 0 ? Choice::allreduce : Choice::reduce, n, p);
  s.add(one_shot);
  begin(c, s.value());
  const bool writes_out = root < 0 || r == root;
  RankPtrs srcs(p);

  if (one_shot) {
    copy_in(c, slot(g, r, slot_of(c, 0)), in, n);
    g.barrier();
    check(c);
    if (writes_out && count) {
      for (int j = 0; j < p; ++j) srcs[j] = slot(g, j, slot_of(c, 0));
      reduce_many(out, srcs.data(), p, count, c.dt, c.op);
    }
    return;  // no closing barrier: the next direct op writes the other slot first (direct_common.h)
  }

  // ce: chunk elements, a multiple of p cache lines (so slices are whole lines), with the input
  // (ce) and one result slice (ce / p) fitting in a slot.
  const size_t pz = static_cast<size_t>(p);
  const size_t max_el = sb / es * pz / (pz + 1);
  size_t unit = pz * (64 / es);
  const size_t target = pipelined(chunk_target(g, p), n, kMinChunkBytes * pz);  // slices of 64 KiB at least
  size_t ce = std::min(target / es, max_el) / unit * unit;
  if (ce == 0) {
    unit = pz;
    ce = max_el / unit * unit;
  }
  // A vector of one chunk is cut into p equal slices, so that every rank reduces its share.
  ce = std::min(ce, (count + unit - 1) / unit * unit);
  const size_t se = ce / pz;
  const size_t nchunks = std::max<size_t>(1, (count + ce - 1) / ce);
  auto clen = [&](size_t m) { return std::min(ce, count - std::min(count, m * ce)); };
  auto slice_len = [&](size_t m, int j) {
    const size_t l = clen(m), off = static_cast<size_t>(j) * se;
    return off < l ? std::min(se, l - off) : size_t(0);
  };
  const uint8_t* src = u8(in);
  uint8_t* dst = u8(out);
  const CopyFn copy_out = output_copy(n);

  for (size_t ph = 0; ph <= nchunks + 1; ++ph) {
    if (ph < nchunks) {  // copy-in chunk ph, all but this rank's own slice
      const size_t m = ph, l = clen(m);
      const size_t a = std::min(l, static_cast<size_t>(r) * se), e = std::min(l, (static_cast<size_t>(r) + 1) * se);
      uint8_t* sl = slot(g, r, slot_of(c, m));
      const uint8_t* base = src + m * ce * es;
      copy_in(c, sl, base, a * es);
      copy_in(c, sl + e * es, base + e * es, (l - e) * es);
    }
    if (ph >= 1 && ph <= nchunks) {  // reduce slice r of chunk ph-1
      const size_t m = ph - 1, len = slice_len(m, r), off = static_cast<size_t>(r) * se;
      if (len) {
        for (int j = 0; j < p; ++j)
          srcs[j] = j == r ? src + (m * ce + off) * es : slot(g, j, slot_of(c, m)) + off * es;
        uint8_t* result = slot(g, r, slot_of(c, m)) + ce * es;
        // Where this rank's copies in take non-temporal stores (stores.h), its result for the
        // others does too: reduced into private memory, then streamed to the slot.
        if (streams(c)) {
          uint8_t* mine = c.scratch(len * es, 1);
          reduce_many(mine, srcs.data(), p, len, c.dt, c.op);
          copy_streaming(result, mine, len * es);
        } else {
          reduce_many(result, srcs.data(), p, len, c.dt, c.op);
        }
      }
    }
    if (ph >= 2 && writes_out) {  // copy-out chunk ph-2
      const size_t m = ph - 2;
      for (int j = 0; j < p; ++j) {
        const size_t len = slice_len(m, j);
        if (len)
          copy_out(dst + (m * ce + static_cast<size_t>(j) * se) * es, slot(g, j, slot_of(c, m)) + ce * es,
                      len * es);
      }
    }
    if (ph == nchunks + 1) break;
    g.barrier();
    if (ph == 0) check(c);
  }
  end(c, nchunks);
}

}  // namespace

void allreduce_direct(Ctx& c, const void* in, void* out, size_t count) { reduce_impl(c, in, out, count, -1); }

void reduce_direct(Ctx& c, const void* in, void* out, size_t count, int root) {
  reduce_impl(c, in, out, count, root);
}

}  // namespace shoal::algo
