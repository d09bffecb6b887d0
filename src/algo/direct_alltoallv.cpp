// Direct shared-memory alltoallv: blocks of any size between each pair of ranks (single host).
//
// The ranks do not know each other's counts, so the op opens with a small round (direct_small.cpp,
// no barrier): each rank publishes a table of the bytes it sends each peer and expects from each,
// and, when they fit in its small slot with the table, the blocks themselves. Every rank reads
// every table, so all of them learn the same things: whether every rank sends each peer what
// that peer expects (a difference is a mismatch error on every rank, naming both ranks of the
// pair, where the pairwise exchange's framing would have caught it), where every rank's blocks
// are, and the largest block between two ranks.
//
// A rank whose blocks do not fit there but each fit one piece of the pipeline's first phase puts
// them in its data slot before publishing its table.
//
// Cost, when every rank's blocks came with its table or went to its slot: α' + 2·n·β per rank
// (α' = one cache line from each peer, n = bytes the rank sends): each rank copies its blocks in
// and its own block out of every peer's, and the table round is the only synchronisation.
// Otherwise α' + N·α + 2·n·β (α = one barrier, one more when N is even): alltoall's pipeline
// (direct_alltoall.cpp), with N phases for the group's largest block, or the pairwise exchange
// where the measured costs say the rings beat the slots (cost.h; the size is what a rank sends
// at most, which every rank knows from the tables). The pairwise exchange over the shm rings also copies twice, but pays a frame, a
// doorbell and a flow-control round trip per step and peer, and p-1 steps.
#include <algorithm>
#include <cstring>
#include <string>

#include "algo/cost.h"
#include "algo/direct_common.h"
#include "engine/engine.h"
#include "reduce/copy.h"

namespace shoal::algo {

using namespace direct;

namespace {
// The table at the head of a rank's small data: words [0, p) the bytes it sends each rank, [p, 2p)
// the bytes it expects from each, word 2p where its blocks for the peers are: following the
// table (in rank order), in its data slot (a piece per peer), or not yet placed.
size_t table_bytes(int p) { return static_cast<size_t>(2 * p + 1) * 8; }
constexpr uint64_t kNowhere = 0, kWithTable = 1, kInSlot = 2;
}  // namespace

void alltoallv_direct(Ctx& c, const void* in, const std::vector<size_t>& send_counts, void* out,
                      const std::vector<size_t>& recv_counts) {
  ShmGroup& g = *c.shm();
  const int p = c.size, r = c.rank;
  const size_t tb = table_bytes(p);
  // With many ranks a slot holds only small pieces of each block (see alltoall_direct), or the
  // table does not fit a small slot: the pairwise exchange.
  if (chunk_target(g, p) / static_cast<size_t>(p) < kMinPieceBytes || !small_fits(tb))
    return alltoallv_pairwise(c, in, send_counts, out, recv_counts);
  const Blocks sb = counted_blocks(send_counts, c.esize), rb = counted_blocks(recv_counts, c.esize);
  Sig sig(OpKind::alltoallv, c);
  sig.add(2);  // 2: the form with counts per rank (they differ per rank by design: the tables check them)

  // Every reader finds a peer's table in its data area: kSmallBytes says where, whatever it holds.
  const Small s = small_begin(c, sig.value(), kSmallBytes);
  uint8_t* mine = small_data(c, s, kSmallBytes);
  // Where this rank's blocks for its peers go before the table is published (before out is
  // written: in may be out): with the table, when they fit; else, when each fits one piece of
  // the pipeline's first slot and the measured costs say the slots beat the rings at what this
  // rank sends, there (the slot of the next chunked op's first chunk, which nothing reads before
  // this op's table round: the pipeline writes it before its first barrier too); else nowhere yet.
  const size_t piece = alltoall_piece(g, p, 0);  // what one phase moves of a block that small
  const int first_slot = slot_of(c, 1);
  size_t my_largest = 0;
  for (int j = 0; j < p; ++j)
    if (j != r) my_largest = std::max(my_largest, sb.len[j]);
  const bool to_slot = my_largest <= piece && !c.ways().alltoall_pairwise(Choice::alltoallv, sb.total(), p);
  const uint64_t placed = small_fits(tb + sb.total() - sb.len[r]) ? kWithTable : to_slot ? kInSlot : kNowhere;
  uint64_t* table = reinterpret_cast<uint64_t*>(mine);
  for (int j = 0; j < p; ++j) table[j] = sb.len[j], table[p + j] = rb.len[j];
  table[2 * p] = placed;
  for (int j = 0, at = 0; j < p; ++j) {
    if (j == r) continue;
    // The blocks' copies into the data area take the stores chosen, as the small ops' do (copy_in).
    if (placed == kWithTable) copy_in(c, mine + tb + at, u8(in) + sb.off[j], sb.len[j]), at += static_cast<int>(sb.len[j]);
    if (placed == kInSlot) copy_in(c, slot(g, r, first_slot) + j * piece, u8(in) + sb.off[j], sb.len[j]);
  }
  small_publish(c, s);

  // Every rank checks every pair, in the same order, so that all of them fail on the same one.
  RankPtrs tables(p);
  for (int j = 0; j < p; ++j) tables[j] = j == r ? mine : small_wait(c, j, s, kSmallBytes);
  auto word = [&](int j, int w) { return reinterpret_cast<const uint64_t*>(tables[j])[w]; };
  bool all_placed = true, any_in_slot = false;
  size_t largest = 0, most = 0;  // the largest block between two ranks, and what a rank sends at most
  for (int i = 0; i < p; ++i) {
    all_placed = all_placed && word(i, 2 * p) != kNowhere;
    any_in_slot = any_in_slot || word(i, 2 * p) == kInSlot;
    size_t sent = 0;
    for (int k = 0; k < p; ++k) sent += word(i, k);
    most = std::max(most, sent);
    for (int k = 0; k < p; ++k) {
      if (k == i) continue;
      largest = std::max<size_t>(largest, word(i, k));
      if (word(i, k) != word(k, p + i))
        c.engine().fail_mismatch(i == r ? k : i, std::string(c.what) + ": rank " + std::to_string(i) + " sends rank " +
                                                     std::to_string(k) + " " + std::to_string(word(i, k)) +
                                                     " bytes, and rank " + std::to_string(k) + " expects " +
                                                     std::to_string(word(k, p + i)) +
                                                     " (send and receive counts must match pair by pair)");
    }
  }
  // The rings, where the measured costs say they beat the slots at what a rank sends at most (a
  // rank that sends less may have put its blocks in its slot all the same).
  const bool rings = c.ways().alltoall_pairwise(Choice::alltoallv, most, p);
  if (all_placed && !(any_in_slot && rings)) {
    // Every peer has left the previous op (it published this op's table), so the round was the
    // op's barrier: what remains is copying out. A slot written counts as the chunked op's first
    // (and last) chunk, on every rank alike.
    if (any_in_slot) take_chunked_number(c, sig.value());
    // The own block first, while nothing of out is written yet; in place it may move within
    // the buffer (the other blocks of in are placed by now).
    if (sb.len[r]) copy_bytes(u8(out) + rb.off[r], u8(in) + sb.off[r], sb.len[r]);
    for (int j = 0; j < p; ++j) {
      if (j == r) continue;
      const uint8_t* from = slot(g, j, first_slot) + r * piece;
      if (word(j, 2 * p) == kWithTable) {
        from = static_cast<const uint8_t*>(tables[j]) + tb;  // j's block for r follows j's blocks for the ranks before r
        for (int k = 0; k < r; ++k)
          if (k != j) from += word(j, k);
      }
      copy_bytes(u8(out) + rb.off[j], from, rb.len[j]);
    }
    return small_done(c, s, kSmallBytes);
  }
  small_done(c, s, kSmallBytes);
  if (rings) return alltoallv_pairwise(c, in, send_counts, out, recv_counts);

  // out's blocks are written while in's are still copied in.
  const uint8_t* src = apart_from_out(c, in, sb.total(), out, rb.total());
  begin(c, sig.value());
  alltoall_pipeline(c, src, sb, out, rb, largest);
}

}  // namespace shoal::algo
