// Direct shared-memory allreduce and reduce (single host; DeepSpeed-style).
//
// Cost, with α = one barrier, β = time per byte of memory copy, N = ⌈n / chunk⌉ chunks (chunk
// ≈ kWorkingSetBytes / 2p per rank, at most one L2: two_shot_chunk): each rank copies (p-1)/p·n
// into its scratch, reduces n/p reading p sources (n bytes read), and copies n out:
//   (N + 2)·α + ~3·n·β + (p-1)/p·n·γ          (reduce: only the root copies out: ~2·n·β)
// One shot, where the costs measured on the machine say it is cheaper (cost.h): every rank
// (reduce: the root) reduces the whole vector itself:
//   α + (p + 1)·n·β + (p-1)·n·γ        (one barrier: see slot_of in direct_common.h)
// The 2-rank allreduce by single copy (allreduce_single_copy): each rank reduces half, reading the
// peer's input for it, then reads the peer's half of the result: 2·α + ~3.5·n·β (2n read, 1.5n
// written) + n/2·γ, with the kernel's copy for n of it.
// A reduce's one shot is streamed (reduce_streamed): the root reduces piece by piece as the
// others copy in, so its reduction hides behind their copies, and the root copies nothing in:
//   α + max(n·β, (p-1)·n·γ) + one piece's copy and reduction   (any n: the slot is a ring of pieces)
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

// The 2-rank allreduce by single copy reads the peer's input for its half in pieces of this size
// into private memory, which stays in the L2 while it is reduced.
constexpr size_t kSingleCopyPieceBytes = size_t(256) << 10;

// The 2-rank allreduce by single copy, where each rank has a core and the group may copy between
// processes (Ways::allreduce_single_copy): each rank reduces its half of the vector into its
// output, reading the peer's input for it straight from the peer (ShmGroup::read) piece by piece;
// after a barrier, it reads the peer's half of the result straight from the peer's output. A rank
// reads 2n and writes 1.5n, where the two shot reads 2.5n and writes 2n, as Open MPI's allreduce
// at 2 ranks does (BENCHMARKS.md, "In place against Open MPI"). Each rank publishes its input and
// its output, so a rank in place and one not run together: no rank writes what its peer still
// reads (its half of its output, read after the barrier, it wrote before it).
void allreduce_single_copy(Ctx& c, const void* in, void* out, size_t count, uint64_t sig) {
  ShmGroup& g = *c.shm();
  const int r = c.rank, j = 1 - r;
  const size_t es = c.esize, unit = 64 / es;
  const size_t h = count / 2 / unit * unit;  // rank 0's half: [0, h), rank 1's: [h, count)
  auto off = [&](int k) { return k == 0 ? size_t(0) : h; };
  auto len = [&](int k) { return k == 0 ? h : count - h; };
  begin_single(c, sig, out, in);
  const uint8_t* peer_in = peer_input(c, j);
  const size_t pe = kSingleCopyPieceBytes / es;
  uint8_t* piece = c.scratch(pe * es, 1);
  for (size_t k = 0; k < len(r); k += pe) {
    const size_t l = std::min(pe, len(r) - k), at = (off(r) + k) * es;
    g.read(j, peer_in + at, piece, l * es);
    const void* srcs[2];
    srcs[r] = u8(in) + at;
    srcs[j] = piece;
    reduce_many(u8(out) + at, srcs, 2, l, c.dt, c.op);
  }
  g.barrier();
  if (len(j)) g.read(j, peer_buffer(c, j) + off(j) * es, u8(out) + off(j) * es, len(j) * es);
  end_single(c);
}

// An allreduce in place writes its output with ordinary stores while its ranks write this much or
// less in all (reduce_impl): measured up to 64 MiB, and at 4 and 8 ranks with 128-256 MiB a loss
// (BENCHMARKS.md, "An allreduce in place writes its output through the caches").
constexpr size_t kInPlaceCachedBytes = size_t(64) << 20;

// Elements of one piece of a streamed reduce of `count`: an eighth of the vector, from
// kStreamPieceBytes, and at most a quarter of the slot, so that the others copy in ahead of the root;
// fewer than 2^kMaxStreamPiecesLog2 pieces (progress_base), and never more than the slot holds.
size_t stream_piece_elements(size_t count, size_t es, size_t slot) {
  const size_t bytes = std::min(std::max(kStreamPieceBytes, count * es / 8), slot / 4);
  return std::min(std::max({size_t(1), bytes / 64 * 64 / es, count >> kMaxStreamPiecesLog2}), slot / es);
}

// A reduce's one shot, streamed: the other ranks copy their input into their slot piece by piece
// and publish each piece (progress); the root reduces piece m of every rank, its own straight from
// `in`, as soon as all are there, overlapping its reduction with their next copies. The slot is a
// ring of pieces: a rank overwrites a piece only after the root has published that it reduced it.
// One barrier, which the root arrives at first and completes last: the other ranks leave once
// their pieces are in, and their next op writes the other slot first (slot_of) and this one only
// after its own first barrier, which the root reaches only when done here.
void reduce_streamed(Ctx& c, const void* in, void* out, size_t count, int root, uint64_t sig) {
  ShmGroup& g = *c.shm();
  const int p = c.size, r = c.rank;
  const size_t es = c.esize;
  const Small sm = begin(c, sig);
  const uint64_t base = progress_base(c);
  const int s0 = slot_of(c, 0);
  const size_t pe = stream_piece_elements(count, es, slot_bytes(g));
  const size_t npieces = (count + pe - 1) / pe, ring = slot_bytes(g) / (pe * es);
  // Where piece m lies in rank j's slot: its ring starts at j's place (Places), which the root
  // reads as j's first piece lands. Where every op starts at the slot's start, the 2-rank reduce
  // of 128 KiB takes 15-18 µs, the time of its copies into lines the root's core still holds.
  Places places(c, npieces * pe * es);
  auto at = [&](int j, size_t m) { return ((places[j] / (pe * es) + m) % ring) * pe * es; };
  auto len = [&](size_t m) { return std::min(pe, count - m * pe); };
  if (r != root) {
    uint8_t* mine = slot(g, r, s0);
    // Before waiting on the root, see that it is in this call: else a PeerError, not a hang.
    if (npieces > ring) small_wait(c, root, sm, 0);
    for (size_t m = 0; m < npieces; ++m) {
      if (m >= ring) wait_progress(c, root, base + (m - ring));
      copy_in(c, mine + at(r, m), u8(in) + m * pe * es, len(m) * es);
      publish_progress(c, base + m + 1);
    }
    g.barrier();
    check(c);
    return;
  }
  // Every peer is in this call before any of its pieces is read: a peer in another call is a
  // PeerError here rather than a wait for pieces that never come. Before arriving: a peer that
  // has left this op may reuse its small slot's head only once this rank has said it is done
  // with it, which it may have (begin), but none leaves before this rank has arrived.
  for (int j = 0; j < p; ++j)
    if (j != r) small_wait(c, j, sm, 0);
  RankPtrs srcs(p);
  g.arrive();
  for (size_t m = 0; m < npieces; ++m) {
    for (int j = 0; j < p; ++j) {
      if (j == r) {
        srcs[j] = u8(in) + m * pe * es;
        continue;
      }
      wait_progress(c, j, base + m);
      if (m == 0) places.read(c, j);
      srcs[j] = slot(g, j, s0) + at(j, m);
    }
    reduce_many(u8(out) + m * pe * es, srcs.data(), p, len(m), c.dt, c.op);
    if (npieces > ring) publish_progress(c, base + m + 1);
  }
  g.complete();
}

void reduce_impl(Ctx& c, const void* in, void* out, size_t count, int root) {  // root < 0: allreduce
  ShmGroup& g = *c.shm();
  const int p = c.size, r = c.rank;
  const size_t es = c.esize, n = count * es;
  Sig s(root < 0 ? OpKind::allreduce : OpKind::reduce, c);
  if (small_fits(count * c.esize)) return allreduce_small(c, in, out, count, root, s.value());
  const size_t sb = slot_bytes(g);
  // The ranks agree on the way: the group's single copy and cores are alike on every rank, and so
  // are the table and settings (cost.h, compared when the group formed); the signature would make
  // a disagreement a mismatch error rather than a wrong result.
  if (root < 0 && p == 2 && g.single_copy() && !g.shares_cores() && c.ways().allreduce_single_copy(n)) {
    s.add(2);
    return allreduce_single_copy(c, in, out, count, s.value());
  }
  const bool one_shot = (root >= 0 || n <= sb) && c.ways().reduce_one_shot(root < 0 ? Choice::allreduce : Choice::reduce, n, p);
  s.add(one_shot);
  if (one_shot && root >= 0 && count) return reduce_streamed(c, in, out, count, root, s.value());
  begin(c, s.value());
  const bool writes_out = root < 0 || r == root;
  RankPtrs srcs(p);

  if (one_shot) {
    Places places(c, n);
    copy_in(c, slot(g, r, slot_of(c, 0)) + places[r], in, n);
    g.barrier();
    check(c, places);
    if (writes_out && count) {
      for (int j = 0; j < p; ++j) srcs[j] = slot(g, j, slot_of(c, 0)) + places[j];
      reduce_many(out, srcs.data(), p, count, c.dt, c.op);
    }
    return;  // no closing barrier: the next direct op writes the other slot first (direct_common.h)
  }

  // ce: chunk elements, a multiple of p cache lines (so slices are whole lines), with the input
  // (ce) and one result slice (ce / p) fitting in a slot; where no such chunk fits (a tiny slot
  // among many ranks), a multiple of p elements.
  const size_t pz = static_cast<size_t>(p);
  size_t unit = pz * (64 / es);
  size_t ce = two_shot_chunk(sb, p, n, c.ways().l2(), g.shares_cores()) / es;
  if (ce == 0) {
    unit = pz;
    ce = sb / es * pz / (pz + 1) / unit * unit;
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
  // An allreduce in place: ordinary stores up to kInPlaceCachedBytes in all. The lines of `out`
  // that a chunk's copy out writes are those its copy in read two phases before and its reduction
  // one phase before, still in the caches, which a non-temporal store would first have to evict.
  // With more in all, ranks sharing cores lost by ordinary stores (why is not known).
  const size_t writers = root < 0 ? pz : 1;
  const bool cached_in_place = root < 0 && in == out && n * pz <= kInPlaceCachedBytes;
  const CopyFn copy_out = cached_in_place ? copy_bytes : output_copy(n, writers, kStreamReduceAlltoall);
  // A chunk's input and result slice (ce + se elements) start at each rank's place in its slots.
  Places places(c, (ce + se) * es);
  auto area = [&](int j, size_t m) { return slot(g, j, slot_of(c, m)) + places[j]; };

  for (size_t ph = 0; ph <= nchunks + 1; ++ph) {
    if (ph < nchunks) {  // copy-in chunk ph, all but this rank's own slice
      const size_t m = ph, l = clen(m);
      const size_t a = std::min(l, static_cast<size_t>(r) * se), e = std::min(l, (static_cast<size_t>(r) + 1) * se);
      uint8_t* sl = area(r, m);
      const uint8_t* base = src + m * ce * es;
      copy_in(c, sl, base, a * es);
      copy_in(c, sl + e * es, base + e * es, (l - e) * es);
    }
    if (ph >= 1 && ph <= nchunks) {  // reduce slice r of chunk ph-1
      const size_t m = ph - 1, len = slice_len(m, r), off = static_cast<size_t>(r) * se;
      if (len) {
        for (int j = 0; j < p; ++j)
          srcs[j] = j == r ? src + (m * ce + off) * es : area(j, m) + off * es;
        uint8_t* result = area(r, m) + ce * es;
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
          copy_out(dst + (m * ce + static_cast<size_t>(j) * se) * es, area(j, m) + ce * es, len * es);
      }
    }
    if (ph == nchunks + 1) break;
    g.barrier();
    if (ph == 0) check(c, places);
  }
  end(c, nchunks);
}

}  // namespace

void allreduce_direct(Ctx& c, const void* in, void* out, size_t count) { reduce_impl(c, in, out, count, -1); }

void reduce_direct(Ctx& c, const void* in, void* out, size_t count, int root) {
  reduce_impl(c, in, out, count, root);
}

}  // namespace shoal::algo
