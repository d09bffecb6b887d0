// Direct shared-memory ops for small messages (single host): no barrier.
//
// Cost of an allreduce of n ≤ kSmallBytes: α' + n·β + (p-1)·n·β + (p-1)·n·γ, where α' is one
// cache line from each peer (its slot's head: the number and, up to 48 B, the data) instead of
// a barrier's round trips between every pair of ranks. Each rank
// copies its input into its own slot, reads every peer's slot when its number is there, and
// reduces all p in rank order. A barrier costs a round trip between every pair of ranks and, when
// ranks outnumber cores, a turn on a core for every rank before any leaves; here a rank waits only
// for the data it reads, and a rank that reads nothing (a broadcast's root, the non-root ranks of
// a reduce or gather) leaves at once. Slots rotate (kSmallSlots heads and line areas,
// kSmallDataSlots data areas: direct_common.h), so ranks may drift up to kSmallSlots - 1 ops apart
// (kSmallDataSlots - 1 for an op with more than kSmallLineBytes of data); a rank reuses a slot
// once every peer has said it is done with the op that used it (`done`, said every kDoneEvery-th
// op and after reading a data area, and read from the peers only when the last value seen is too
// old).
//
// Mismatched calls: every direct op writes its number and token in its slot (chunked ones too,
// in begin()), and a reader compares the token with its own: a peer in another call is a
// PeerError, never a wrong result.
#include <algorithm>
#include <vector>

#include "algo/direct_common.h"
#include "base/prefetch.h"
#include "reduce/copy.h"
#include "reduce/reduce.h"
#include "engine/engine.h"
#include "shoal/error.h"

namespace shoal::algo::direct {
namespace {

struct alignas(64) SlotHead {
  std::atomic<uint64_t> n;  // the op whose data the slot holds (published last)
  uint64_t tok;
  uint8_t data[kSmallInlineBytes];  // the op's data when it fits
};
static_assert(sizeof(SlotHead) == 64);

std::atomic<uint64_t>& done_word(ShmGroup& g, int r) {
  return *reinterpret_cast<std::atomic<uint64_t>*>(header(g, r) + 8);
}
SlotHead& head(ShmGroup& g, int r, uint64_t n) {
  return reinterpret_cast<SlotHead*>(g.scratch(r) + kHeaderBytes)[n % kSmallSlots];
}
uint8_t* slot_data(ShmGroup& g, int r, uint64_t n, size_t bytes) {
  if (bytes <= kSmallInlineBytes) return head(g, r, n).data;
  uint8_t* lines = g.scratch(r) + kHeaderBytes + kSmallSlots * sizeof(SlotHead);
  if (!in_data_area(bytes)) return lines + (n % kSmallSlots) * kSmallLineBytes;
  return lines + kSmallSlots * kSmallLineBytes + (n % kSmallDataSlots) * kSmallBytes;
}

// n bytes of an op's data that takes `bytes` of the slot, from `src` to `dst` in this rank's slot.
// A data area's copy takes the stores the group's choice takes (copy_in): its readers hold its
// lines from the op before, and where they sit on a far core an ordinary store takes each line
// back from there first. A head's or line area's few lines keep ordinary stores.
void copy_to_slot(Ctx& c, size_t bytes, uint8_t* dst, const void* src, size_t n) {
  if (in_data_area(bytes)) return copy_in(c, dst, src, n);
  copy_bytes(dst, src, n);
}

// Wakes the peers that sleep (an awake peer costs a load of a line it rarely writes).
void ring_peers(Ctx& c) { c.shm()->ring_peers(); }

// The own slot's number and token, after its data.
void publish_head(ShmGroup& g, int r, const Small& s) {
  SlotHead& hd = head(g, r, s.n);
  hd.tok = s.tok;
  hd.n.store(s.n, std::memory_order_release);
}

// Whether a rank says now that it is done with op `s`, whose writers wrote at most `written`
// bytes each (direct_common.h, kDoneEvery).
bool says_done(const Small& s, size_t written) { return s.n % kDoneEvery == 0 || in_data_area(written); }

// How many ops ahead a rank takes the lines of its own slot for writing (small_begin).
constexpr uint64_t kPrefetchAhead = 8;

}  // namespace

Small small_begin(Ctx& c, uint64_t sig, size_t bytes, bool ahead) {
  ShmGroup& g = *c.shm();
  if (g.scratch_bytes() < kHeaderBytes + kSmallArea)
    throw Error(std::string(c.what) + ": the shared-memory scratch area (" + std::to_string(g.scratch_bytes()) +
                " bytes) is too small for the direct algorithms");
  uint64_t* h = header(g, c.rank);
  const uint64_t n = ++h[3];  // words 3 and 4 are private to this rank
  // h[4]: the least op number that every peer has said it is done with, as read last.
  auto least_done = [&] {
    uint64_t m = UINT64_MAX;
    for (int j = 0; j < c.size; ++j)
      if (j != c.rank) m = std::min(m, done_word(g, j).load(std::memory_order_acquire));
    return m;
  };
  const uint64_t depth = in_data_area(bytes) ? kSmallDataSlots : kSmallSlots;
  if (n > depth && h[4] < n - depth) {
    const uint64_t need = n - depth;  // every peer done with the op that used this slot last
    uint64_t m = least_done();
    if (m < need) {
      wait_for(c, [&] { return (m = least_done()) >= need; }, -1);
    }
    h[4] = m;
  }
  // A rank that runs ahead takes the lines of the slot kPrefetchAhead ops on, which a peer read
  // last: a store to them then does not stall this rank (and every store behind it) until the
  // peer gives them up. Only once every peer has said it is done with them: a writer near its
  // depth would take the lines its readers are about to read. Not a data area: fewer of them, so
  // a peer may still be reading that one. A rank that reads its peers in the same op waits for
  // them anyway, its stores meanwhile.
  if (ahead) {
    const uint64_t later = n + kPrefetchAhead;
    if (later > kSmallSlots && h[4] < later - kSmallSlots) h[4] = least_done();  // read again
    if (later <= kSmallSlots || h[4] >= later - kSmallSlots) {
      prefetch_for_write(&head(g, c.rank, later));
      if (bytes > kSmallInlineBytes && !in_data_area(bytes)) prefetch_for_write(slot_data(g, c.rank, later, bytes), bytes);
    }
  }
  return Small{n, hash_mix(sig, n)};
}

uint8_t* small_data(Ctx& c, const Small& s, size_t bytes) { return slot_data(*c.shm(), c.rank, s.n, bytes); }

void small_publish(Ctx& c, const Small& s) {
  publish_head(*c.shm(), c.rank, s);
  ring_peers(c);
}

const uint8_t* small_wait(Ctx& c, int j, const Small& s, size_t bytes) {
  ShmGroup& g = *c.shm();
  SlotHead& hd = head(g, j, s.n);
  wait_for(c, [&] { return hd.n.load(std::memory_order_acquire) >= s.n; }, j);
  if (small_other_call(c, j, s)) small_mismatch(c, j);
  return slot_data(g, j, s.n, bytes);
}

bool small_other_call(Ctx& c, int j, const Small& s) {
  SlotHead& hd = head(*c.shm(), j, s.n);
  const uint64_t n = hd.n.load(std::memory_order_acquire);
  return n >= s.n && (n != s.n || hd.tok != s.tok);
}

void small_mismatch(Ctx& c, int j) {
  c.engine().fail_mismatch(j, std::string(c.what) + ": rank " + std::to_string(j) + " is in a different call than rank " +
                                     std::to_string(c.rank) + " (over shared memory): mismatched ops across ranks");
}

// For a rank that reads what rank j writes and j reads nothing back (a rooted op): j tends to run
// ahead, so its next ops' heads are likely written already. In an op where every rank reads the
// others, those lines are not written yet, and a copy here would make their writer wait for it.
void small_read_ahead(Ctx& c, int j, const Small& s) {
  __builtin_prefetch(&head(*c.shm(), j, s.n + 1));
  __builtin_prefetch(&head(*c.shm(), j, s.n + 2));
}

void small_wait_all(Ctx& c, const Small& s) {
  for (int j = 0; j < c.size; ++j)
    if (j != c.rank) small_wait(c, j, s, 0);
}

void small_done(Ctx& c, const Small& s, size_t written) {
  if (!says_done(s, written)) return;
  done_word(*c.shm(), c.rank).store(s.n, std::memory_order_release);
  ring_peers(c);
}

void small_publish_done(Ctx& c, const Small& s) {
  ShmGroup& g = *c.shm();
  publish_head(g, c.rank, s);
  if (says_done(s, 0)) done_word(g, c.rank).store(s.n, std::memory_order_release);
  ring_peers(c);
}

// ---- The ops ------------------------------------------------------------------------------------

void allreduce_small(Ctx& c, const void* in, void* out, size_t count, int root, uint64_t sig) {
  const int p = c.size, r = c.rank;
  const size_t n = count * c.esize;
  const bool writes = root < 0 || r != root;  // nobody reads a reduce's root's input
  const bool leaf = root >= 0 && r != root;    // reads nothing
  const Small s = small_begin(c, sig, writes ? n : 0, leaf);
  if (writes) copy_to_slot(c, n, small_data(c, s, n), in, n);
  if (leaf) return small_publish_done(c, s);
  small_publish(c, s);
  RankPtrs srcs(p);
  for (int j = 0; j < p; ++j) {
    if (j == r) {
      srcs[j] = in;
      continue;
    }
    if (root >= 0) small_read_ahead(c, j, s);
    srcs[j] = small_wait(c, j, s, n);
  }
  if (count) reduce_many(out, srcs.data(), p, count, c.dt, c.op);
  small_done(c, s, n);
}

void broadcast_small(Ctx& c, void* buf, size_t count, int root, uint64_t sig) {
  const size_t n = count * c.esize;
  const Small s = small_begin(c, sig, c.rank == root ? n : 0, c.rank == root);
  if (c.rank == root) {
    copy_to_slot(c, n, small_data(c, s, n), buf, n);
    return small_publish_done(c, s);
  }
  small_publish(c, s);
  small_read_ahead(c, root, s);
  copy_bytes(buf, small_wait(c, root, s, n), n);
  small_done(c, s, n);
}

namespace {
// Block j is bytes [off(j), off(j) + len(j)) of the output.
template <class Off, class Len>
void gather_small_blocks(Ctx& c, const void* in, void* out, Off off, Len len, int root, uint64_t sig) {
  const int p = c.size, r = c.rank;
  const bool writes = root < 0 || r != root;  // nobody reads a gather's root's block
  const bool leaf = root >= 0 && r != root;    // reads nothing
  const Small s = small_begin(c, sig, writes ? len(r) : 0, leaf);
  if (writes) copy_to_slot(c, len(r), small_data(c, s, len(r)), in, len(r));
  if (leaf) return small_publish_done(c, s);
  small_publish(c, s);
  copy_bytes(u8(out) + off(r), in, len(r));
  size_t written = 0;  // the most a peer wrote
  for (int j = 0; j < p; ++j) {
    if (j == r) continue;
    if (root >= 0) small_read_ahead(c, j, s);
    copy_bytes(u8(out) + off(j), small_wait(c, j, s, len(j)), len(j));
    written = std::max(written, len(j));
  }
  small_done(c, s, written);
}
}  // namespace

void gather_small(Ctx& c, const void* in, void* out, const Blocks& b, int root, uint64_t sig) {
  gather_small_blocks(
      c, in, out, [&](int j) { return b.off[j]; }, [&](int j) { return b.len[j]; }, root, sig);
}

void gather_small(Ctx& c, const void* in, void* out, size_t bytes, int root, uint64_t sig) {
  gather_small_blocks(
      c, in, out, [=](int j) { return static_cast<size_t>(j) * bytes; }, [=](int) { return bytes; }, root, sig);
}

// The root's slot holds the other ranks' blocks, in rank order without its own: one cache line
// for a reader more often (2 ranks of up to kSmallInlineBytes each), and 1/p fewer bytes copied.
void scatter_small(Ctx& c, const void* in, void* out, size_t count, int root, uint64_t sig) {
  const size_t bs = count * c.esize;
  const size_t before = bs * static_cast<size_t>(root);  // the blocks of the ranks below the root
  const size_t others = bs * static_cast<size_t>(c.size - 1);
  const Small s = small_begin(c, sig, c.rank == root ? others : 0, c.rank == root);
  if (c.rank == root) {
    uint8_t* slot = small_data(c, s, others);
    copy_to_slot(c, others, slot, in, before);
    copy_to_slot(c, others, slot + before, u8(in) + before + bs, others - before);
    small_publish_done(c, s);
    return copy_bytes(out, u8(in) + before, bs);
  }
  small_publish(c, s);
  small_read_ahead(c, root, s);
  const size_t at = bs * static_cast<size_t>(c.rank < root ? c.rank : c.rank - 1);
  copy_bytes(out, small_wait(c, root, s, others) + at, bs);
  small_done(c, s, others);
}

void reduce_scatter_small(Ctx& c, const void* in, void* out, size_t count, uint64_t sig) {
  const int p = c.size, r = c.rank;
  const size_t bs = count * c.esize;
  const size_t all = bs * static_cast<size_t>(p);
  const Small s = small_begin(c, sig, all);
  copy_to_slot(c, all, small_data(c, s, all), in, all);
  small_publish(c, s);
  RankPtrs srcs(p);
  for (int j = 0; j < p; ++j) srcs[j] = (j == r ? u8(in) : small_wait(c, j, s, all)) + static_cast<size_t>(r) * bs;
  if (count) reduce_many(out, srcs.data(), p, count, c.dt, c.op);
  small_done(c, s, all);
}

void alltoall_small(Ctx& c, const void* in, void* out, size_t count, uint64_t sig) {
  const int p = c.size, r = c.rank;
  const size_t bs = count * c.esize;
  const size_t all = bs * static_cast<size_t>(p);
  const Small s = small_begin(c, sig, all);
  copy_to_slot(c, all, small_data(c, s, all), in, all);  // before out is written: in may be out
  small_publish(c, s);
  if (in != out) copy_bytes(u8(out) + static_cast<size_t>(r) * bs, u8(in) + static_cast<size_t>(r) * bs, bs);
  for (int j = 0; j < p; ++j)
    if (j != r) copy_bytes(u8(out) + static_cast<size_t>(j) * bs, small_wait(c, j, s, all) + static_cast<size_t>(r) * bs, bs);
  small_done(c, s, all);
}

void barrier_small(Ctx& c, uint64_t sig) {
  const Small s = small_begin(c, sig, 0);
  small_publish(c, s);
  small_wait_all(c, s);
  small_done(c, s, 0);
}

}  // namespace shoal::algo::direct
