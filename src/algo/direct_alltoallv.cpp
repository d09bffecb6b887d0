// Direct shared-memory alltoallv: blocks of any size between each pair of ranks (single host).
//
// Cost: N·α + 2·n·β per rank (α = one barrier, n = bytes the rank sends, N = ⌈largest block
// between two ranks / piece⌉, piece = a slot's share per peer): each rank copies its
// blocks into its scratch once, and its own block out of every peer's scratch. The pairwise
// exchange over the shm rings also copies twice, but pays a frame, a doorbell and a flow-control
// round trip per step and peer, and p-1 steps; here a phase costs one barrier for all peers.
//
// The ranks do not know each other's counts, so the first phase publishes them: rank r's slot of
// phase 0 opens with a table of the bytes it sends each peer and the bytes it expects from each,
// and after the first barrier every rank reads the table of every peer. A rank learns there how
// many phases the group's largest block needs, and whether every rank sends each peer what that
// peer expects (a difference is a mismatch error on every rank, naming both ranks of the pair,
// where the pairwise exchange's framing would have caught it). Phase m then carries piece m of every block: the piece for peer j at
// table + j·piece of the slot, as direct_alltoall.cpp lays out equal blocks. Slots alternate by
// phase, with the other chunked direct ops' reuse rules (direct_common.h, slot_of and end).
#include <algorithm>
#include <cstring>
#include <string>

#include "algo/direct_common.h"
#include "engine/engine.h"
#include "reduce/copy.h"

namespace shoal::algo {

using namespace direct;

namespace {

// The table at the head of every phase's slot: words [0, p) the bytes sent to each rank, [p, 2p)
// the bytes expected from each, then the largest block this rank sends a peer; whole cache lines.
size_t table_bytes(int p) { return (static_cast<size_t>(2 * p + 1) * 8 + 63) / 64 * 64; }
}  // namespace

void alltoallv_direct(Ctx& c, const void* in, const std::vector<size_t>& send_counts, void* out,
                      const std::vector<size_t>& recv_counts) {
  ShmGroup& g = *c.shm();
  const int p = c.size, r = c.rank;
  const size_t es = c.esize, tb = table_bytes(p);
  // A piece per peer and phase, the same on every rank (it depends on p and the scratch size only).
  const size_t piece_bytes = chunk_target(g, p) > tb ? (chunk_target(g, p) - tb) / static_cast<size_t>(p) / 64 * 64 : 0;
  if (piece_bytes < kMinPieceBytes) return alltoallv_pairwise(c, in, send_counts, out, recv_counts);
  const Blocks sb = counted_blocks(send_counts, es), rb = counted_blocks(recv_counts, es);
  Sig sig(OpKind::alltoallv, c);
  sig.add(2);  // 2: the form with counts per rank (they differ per rank by design: the table checks them)
  const uint8_t* src = u8(in);
  if (overlaps(in, sb.total(), out, rb.total())) {  // out's blocks are written while in's are still copied in
    uint8_t* t = c.scratch(sb.total(), 0);
    std::memcpy(t, in, sb.total());
    src = t;
  }
  begin(c, sig.value());
  auto piece = [&](size_t len, size_t m) { return std::min(piece_bytes, len - std::min(len, m * piece_bytes)); };
  auto copy_in = [&](size_t m) {
    uint8_t* mine = slot(g, r, slot_of(c, m)) + tb;
    for (int j = 0; j < p; ++j)
      if (j != r) copy_bytes(mine + j * piece_bytes, src + sb.off[j] + m * piece_bytes, piece(sb.len[j], m));
  };
  auto copy_out = [&](size_t m) {
    for (int j = 0; j < p; ++j)
      if (j != r) copy_bytes(u8(out) + rb.off[j] + m * piece_bytes, slot(g, j, slot_of(c, m)) + tb + r * piece_bytes, piece(rb.len[j], m));
  };

  uint64_t* table = reinterpret_cast<uint64_t*>(slot(g, r, slot_of(c, 0)));
  for (int j = 0; j < p; ++j) table[j] = sb.len[j], table[p + j] = rb.len[j];
  size_t largest_sent = 0;  // the block to itself never goes through the slots
  for (int j = 0; j < p; ++j)
    if (j != r) largest_sent = std::max(largest_sent, sb.len[j]);
  table[2 * p] = largest_sent;
  copy_in(0);
  copy_bytes(u8(out) + rb.off[r], src + sb.off[r], sb.len[r]);  // dispatch checked sb.len[r] == rb.len[r]
  g.barrier();
  check(c);
  // Every rank checks every pair, in the same order, so that all of them fail on the same one.
  auto table_of = [&](int j) { return reinterpret_cast<const uint64_t*>(slot(g, j, slot_of(c, 0))); };
  size_t largest = 0;
  for (int i = 0; i < p; ++i) {
    const uint64_t* t = table_of(i);
    largest = std::max<size_t>(largest, t[2 * p]);
    for (int k = 0; k < p; ++k) {
      const uint64_t expects = table_of(k)[p + i];
      if (k != i && t[k] != expects)
        c.engine().fail_mismatch(i == r ? k : i, std::string(c.what) + ": rank " + std::to_string(i) + " sends rank " +
                                                     std::to_string(k) + " " + std::to_string(t[k]) + " bytes, and rank " +
                                                     std::to_string(k) + " expects " + std::to_string(expects) +
                                                     " (send and receive counts must match pair by pair)");
    }
  }
  const size_t nchunks = std::max<size_t>(1, (largest + piece_bytes - 1) / piece_bytes);
  for (size_t ph = 1; ph <= nchunks; ++ph) {
    if (ph < nchunks) copy_in(ph);
    copy_out(ph - 1);
    if (ph == nchunks) break;
    g.barrier();
  }
  end(c, nchunks);
}

}  // namespace shoal::algo
