// Direct shared-memory broadcast and scatter (single host).
//
// Broadcast cost: (N + 1)·α + 2·n·β (α = one barrier, β = memory copy per byte, N = ⌈n / chunk⌉):
// the root copies each chunk into its scratch once, barrier, every other rank copies it out. Over
// shm rings the binomial tree copies the vector 2·⌈lg p⌉ times on its critical path and the
// root's sends serialise; here there is one copy in and p-1 parallel copies out: chosen whenever
// every rank shares this host. By single copy at 2 ranks, where the group may and the measured
// costs say so (cost.h): 2·α + n/2·β' (β' = a process_vm_readv or _writev per byte), the root
// writing one half while the other rank reads the other.
//
// Scatter cost: (N + 1)·α + 2·(p-1)/p·n·β (n = size·count·esize): the root copies every other
// rank's block (a piece of each per chunk) into its scratch, barrier, each rank copies its own.
// By single copy, where the group may and the measured costs say so (cost.h): n/p·β' per reader
// (β' = a process_vm_readv per byte), the readers in parallel, each waiting for the root alone
// and the root for their copies (begin_rooted_single).
//
// Pipeline: chunk m goes through the root's slot m % 2; phase m (between barriers m and m+1)
// copies chunk m in and chunk m-1 out. A slot written in phase m is read in phase m+1 and only
// rewritten in phase m+2, a barrier in between each time. After the last copy-out, end() closes
// with a barrier only when the next op could overwrite the slot just read (direct_common.h).
#include <cstring>

#include "algo/cost.h"
#include "algo/direct_common.h"

namespace shoal::algo {

using namespace direct;

void broadcast_direct(Ctx& c, void* buf, size_t count, int root) {
  ShmGroup& g = *c.shm();
  const int p = c.size, r = c.rank;
  const size_t n = count * c.esize;
  Sig s(OpKind::broadcast, c);
  if (small_fits(n)) return broadcast_small(c, buf, count, root, s.value());
  // By single copy, where the measured costs say that beats the two copies through the root's
  // scratch (cost.h, Choice::broadcast), both ranks copying at once: the root writes the first
  // half into the other rank's buffer while that rank reads the second half from the root's.
  // With more ranks the readers share the root's pages and the cores: slower than the scratch
  // in the median at every size from 128 KiB (BENCHMARKS.md, "Broadcast, allgather, scatter and
  // gather by single copy").
  if (p == 2 && g.single_copy() && c.ways().single_copy(Choice::broadcast, n, p)) {
    begin_single(c, s.value(), buf);
    const size_t half = n / 2 / 64 * 64;
    const int peer = 1 - r;
    if (r == root) g.write(peer, buf, const_cast<uint8_t*>(peer_buffer(c, peer)), half);
    else g.read(root, peer_buffer(c, root) + half, u8(buf) + half, n - half);
    end_single(c);
    return;
  }
  begin(c, s.value());
  // Chunks of one length, as few as chunk_target allows but four once one will not do.
  const size_t cb = even_pieces(n, chunk_target(g, p) / c.esize * c.esize, c.esize, kMinChunks);
  const size_t nchunks = std::max<size_t>(1, (n + cb - 1) / cb);
  auto clen = [&](size_t m) { return std::min(cb, n - std::min(n, m * cb)); };
  const CopyFn copy_out = output_copy(n, static_cast<size_t>(p), kStreamBroadcast);
  Places places(c, cb);
  for (size_t ph = 0; ph <= nchunks; ++ph) {
    if (r == root && ph < nchunks) copy_in(c, slot(g, root, slot_of(c, ph)) + places[root], u8(buf) + ph * cb, clen(ph));
    if (r != root && ph >= 1) {
      const size_t m = ph - 1;
      copy_out(u8(buf) + m * cb, slot(g, root, slot_of(c, m)) + places[root], clen(m));
    }
    if (ph == nchunks) break;
    g.barrier();
    if (ph == 0) check(c, places);
  }
  end(c, nchunks);
}

void scatter_direct(Ctx& c, const void* in, void* out, size_t count, int root) {
  ShmGroup& g = *c.shm();
  const int p = c.size, r = c.rank;
  const size_t es = c.esize, bs = count * es;
  Sig s(OpKind::scatter, c);
  if (small_fits(bs * static_cast<size_t>(p))) return scatter_small(c, in, out, count, root, s.value());
  // Each rank reads its block of the root's buffer, where the measured costs say that beats the
  // two copies through the root's scratch (cost.h, Choice::scatter).
  // The root's own block, copied while the others read or copy out (its out may be that block,
  // in place, or overlap the others' blocks: then only once they are read).
  const uint8_t* own = r == root ? u8(in) + static_cast<size_t>(root) * bs : nullptr;  // the others' in may be null
  const bool copy_own = r == root && out != own;
  const bool own_last = copy_own && overlaps(out, bs, in, bs * static_cast<size_t>(p));
  if (g.single_copy() && c.ways().single_copy(Choice::scatter, bs * static_cast<size_t>(p), p)) {
    const Small sm = begin_rooted_single(c, s.value(), root, in);
    if (r != root) g.read(root, peer_buffer(c, root) + static_cast<size_t>(r) * bs, out, bs);
    if (copy_own && !own_last) copy_bytes(out, own, bs);
    end_rooted_single(c, sm, root);
    if (own_last) copy_bytes(out, own, bs);
    return;
  }
  begin(c, s.value());
  // pb: bytes of each block per chunk, of one length; the root's slot holds one piece of every block.
  const size_t most = std::max(es, std::min(slot_bytes(g) / p, chunk_target(g, p)) / 64 * 64 / es * es);
  const size_t pb = even_pieces(bs, most, es);
  const size_t nchunks = std::max<size_t>(1, (bs + pb - 1) / pb);
  auto clen = [&](size_t m) { return std::min(pb, bs - std::min(bs, m * pb)); };
  Places places(c, static_cast<size_t>(p) * pb);
  for (size_t ph = 0; ph <= nchunks; ++ph) {
    if (r == root && ph < nchunks) {
      uint8_t* sl = slot(g, root, slot_of(c, ph)) + places[root];
      for (int j = 0; j < p; ++j)
        if (j != root) copy_in(c, sl + static_cast<size_t>(j) * pb, u8(in) + static_cast<size_t>(j) * bs + ph * pb, clen(ph));
    }
    if (r != root && ph >= 1) {
      const size_t m = ph - 1;
      copy_bytes(u8(out) + m * pb, slot(g, root, slot_of(c, m)) + places[root] + static_cast<size_t>(r) * pb, clen(m));
    }
    if (ph == nchunks) break;
    g.barrier();
    if (ph == 0) check(c, places);
  }
  // The others are copying out the last chunk; every block of in has left.
  if (own_last) copy_bytes(out, own, bs);
  else if (copy_own) copy_bytes(out, own, bs);
  end(c, nchunks);
}

}  // namespace shoal::algo
