// Direct shared-memory allgather(v) and gather (single host).
//
// Allgather cost: (N + 1)·α + n·β·(1/p + (p-1)/p) ≈ (N + 1)·α + n·β per rank (α = one barrier,
// β = memory copy per byte, n = total bytes, N = ⌈largest block / chunk⌉): each rank copies its
// block into its scratch once and every rank copies the p-1 other blocks straight out of their
// owners' scratch. Over shm rings the ring allgather copies every block twice per hop and needs
// p-1 rounds of doorbells; chosen whenever every rank shares this host.
//
// Gather: the same with only the root copying out, its own block straight into its output and not
// through its scratch: (N + 1)·α + (p-1)/p·n·β at the root. By single
// copy, where the group may and the measured costs say so (cost.h): n/p·β' (β' = a
// process_vm_writev per byte), every rank writing its block into the root's output at once, each
// waiting for the root alone and the root for their copies (begin_rooted_single).
//
// Pipeline: piece m (bytes [m·chunk, (m+1)·chunk) of each block) goes through slot m % 2 of its
// owner; phase m (between barriers m and m+1) copies piece m of the own block in and piece m-1
// of every other block out. A slot written in phase m is read in phase m+1 and rewritten in phase
// m+2 with barriers between; after the last copy-out, end() closes with a barrier only when the
// next op could overwrite the slot just read (direct_common.h). Unequal counts are fine:
// N follows the largest block, smaller blocks just have nothing to move in later phases.
#include "algo/cost.h"
#include "algo/direct_common.h"

namespace shoal::algo {
namespace {

using namespace direct;

// The 2-rank allgather by single copy streams its own block from this size on an Intel Xeon of
// ours (kStreamingOutputBytes elsewhere): its cache keeps an own block of 8 MiB with the rest of
// the output, where ordinary stores were faster (BENCHMARKS.md, "The 2-rank allgather's own block
// on Intel").
constexpr size_t kStreamOwnBlockIntel = size_t(16) << 20;

void gather_impl(Ctx& c, const void* in, void* out, const Blocks& b, int root, uint64_t sig) {
  if (small_fits(b.max_len())) return gather_small(c, in, out, b, root, sig);
  ShmGroup& g = *c.shm();
  const int p = c.size, r = c.rank;
  // gather: each rank writes its block into the root's out (the p-1 copies run in parallel, where
  // the root reading them would make them one after the other), where the measured costs say that
  // beats the scratch (cost.h, Choice::gather).
  if (root >= 0 && g.single_copy() && c.ways().single_copy(Choice::gather, b.total(), p)) {
    // The root's own block, out of the writers' way (the others' out may be null).
    uint8_t* own = r == root ? u8(out) + b.off[r] : nullptr;
    const void* mine = r == root && in != own ? apart_from_out(c, in, b.len[r], out, b.total()) : in;
    const Small sm = begin_rooted_single(c, sig, root, out);
    if (r != root) g.write(root, in, const_cast<uint8_t*>(peer_buffer(c, root)) + b.off[r], b.len[r]);
    if (r == root && mine != own) copy_bytes(own, mine, b.len[r]);
    return end_rooted_single(c, sm, root);
  }
  // allgather at 2 ranks: each reads the other's input, where the measured costs say that beats
  // the scratch (cost.h, Choice::allgather; measured at 2 ranks only).
  if (root < 0 && p == 2 && g.single_copy() && c.ways().single_copy(Choice::allgather, b.total(), p)) {
    uint8_t* own = u8(out) + b.off[r];
    // The peer reads this rank's input while this rank writes its output: an input that overlaps
    // the output other than as its own block is read from a copy.
    const void* mine = in != own ? apart_from_out(c, in, b.len[r], out, b.total()) : in;
    begin_single(c, sig, mine);
    const int j = 1 - r;
    g.read(j, peer_buffer(c, j), u8(out) + b.off[j], b.len[j]);
    // Its own block by non-temporal stores once that block alone is that large: with smaller
    // blocks the output stays in cache and ordinary stores win (BENCHMARKS.md, "Broadcast and
    // allgather tuned again; allgather's own block streamed", and "The 2-rank allgather's own
    // block on Intel" for the larger size there). In place: nothing to copy.
    const size_t stream_from = c.ways().cpu() == BuiltInCpu::intel ? kStreamOwnBlockIntel : kStreamingOutputBytes;
    if (own != mine) (b.len[r] >= stream_from ? copy_streaming : copy_bytes)(own, mine, b.len[r]);
    return end_single(c);
  }
  begin(c, sig);
  const bool writes_out = root < 0 || r == root;
  // Pieces of one length, cut from the largest block.
  const size_t most = (root < 0 ? chunk_in_l2(c) : chunk_target(g, p)) / c.esize * c.esize;
  const size_t cb = even_pieces(b.max_len(), most, c.esize);
  const size_t nchunks = std::max<size_t>(1, (b.max_len() + cb - 1) / cb);
  const CopyFn copy_out = output_copy(b.total(), root < 0 ? static_cast<size_t>(p) : 1, kStreamAllgather);
  auto piece = [&](int j, size_t m) { return std::min(cb, b.len[j] - std::min(b.len[j], m * cb)); };
  Places places(c, cb);
  if (writes_out) copy_bytes(u8(out) + b.off[r], in, b.len[r]);
  for (size_t ph = 0; ph <= nchunks; ++ph) {
    if (ph < nchunks && r != root) copy_in(c, slot(g, r, slot_of(c, ph)) + places[r], u8(in) + ph * cb, piece(r, ph));
    if (ph >= 1 && writes_out) {
      const size_t m = ph - 1;
      for (int j = 0; j < p; ++j)
        if (j != r) copy_out(u8(out) + b.off[j] + m * cb, slot(g, j, slot_of(c, m)) + places[j], piece(j, m));
    }
    if (ph == nchunks) break;
    g.barrier();
    if (ph == 0) check(c, places);
  }
  end(c, nchunks);
}

}  // namespace

void allgatherv_direct(Ctx& c, const void* in, void* out, const std::vector<size_t>& counts) {
  Sig s(OpKind::allgatherv, c);
  gather_impl(c, in, out, counted_blocks(counts, c.esize), -1, s.value());
}

void allgather_direct(Ctx& c, const void* in, void* out, size_t count) {
  Sig s(OpKind::allgatherv, c);  // as allgatherv_direct's: the ranks may mix the two
  if (small_fits(count * c.esize)) return gather_small(c, in, out, count * c.esize, -1, s.value());
  gather_impl(c, in, out, uniform_blocks(count, c.size, c.esize), -1, s.value());
}

void gather_direct(Ctx& c, const void* in, void* out, size_t count, int root) {
  Sig s(OpKind::gather, c);
  if (small_fits(count * c.esize)) return gather_small(c, in, out, count * c.esize, root, s.value());
  gather_impl(c, in, out, uniform_blocks(count, c.size, c.esize), root, s.value());
}

}  // namespace shoal::algo
