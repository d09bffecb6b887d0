// Direct algorithms' shared pieces: the scratch header token check and chunk sizing.
#include "algo/direct_common.h"

#include <string>

#include "base/params.h"
#include "engine/engine.h"
#include "shoal/error.h"

namespace shoal::algo::direct {
namespace {

// Mixed into a single-copy op's token: a peer that runs the two-copy form of the same call (it
// cannot, while every rank sees the same sizes and group) fails the check instead of misreading.
constexpr uint64_t kSingleCopyToken = 0x434d41;

}  // namespace

Small begin(Ctx& c, uint64_t sig) {
  ShmGroup& g = *c.shm();
  if (g.scratch_bytes() < kSlotsStart + 2 * 64 * static_cast<size_t>(c.size) + 64)
    throw Error(std::string(c.what) + ": the shared-memory scratch area (" + std::to_string(g.scratch_bytes()) +
                " bytes) is too small for the direct algorithms");
  const Small sm = small_begin(c, sig, 0);
  small_publish_done(c, sm);
  take_chunked_number(c, sig);
  return sm;
}

void take_chunked_number(Ctx& c, uint64_t sig) {
  uint64_t* h = header(*c.shm(), c.rank);
  const uint64_t n = h[0] + 1;  // word 0 is private to this rank
  h[0] = n;
  __atomic_store_n(&h[1 + (n & 1)], hash_mix(sig, n), __ATOMIC_RELEASE);
}

void check(Ctx& c) {
  ShmGroup& g = *c.shm();
  const size_t w = 1 + (header(g, c.rank)[0] & 1);
  const uint64_t mine = __atomic_load_n(&header(g, c.rank)[w], __ATOMIC_ACQUIRE);
  for (int j = 0; j < c.size; ++j) {
    if (j == c.rank) continue;
    const uint64_t t = __atomic_load_n(&header(g, j)[w], __ATOMIC_ACQUIRE);
    if (t != mine)
      c.engine().fail_mismatch(j, std::string(c.what) + ": rank " + std::to_string(j) + " is in a different call than rank " +
                                       std::to_string(c.rank) + " (over shared memory): mismatched ops across ranks");
  }
}

void begin_single(Ctx& c, uint64_t sig, const void* mine, const void* input) {
  begin(c, hash_mix(sig, kSingleCopyToken));
  // Word 11 shares the line of words 8-10, which peers poll: written only by the ops that have it.
  if (input) __atomic_store_n(&header(*c.shm(), c.rank)[11], reinterpret_cast<uintptr_t>(input), __ATOMIC_RELEASE);
  __atomic_store_n(&header(*c.shm(), c.rank)[5], reinterpret_cast<uintptr_t>(mine), __ATOMIC_RELEASE);
  c.shm()->barrier();
  check(c);
}

const uint8_t* peer_buffer(Ctx& c, int j) {
  return reinterpret_cast<const uint8_t*>(__atomic_load_n(&header(*c.shm(), j)[5], __ATOMIC_ACQUIRE));
}

const uint8_t* peer_input(Ctx& c, int j) {
  return reinterpret_cast<const uint8_t*>(__atomic_load_n(&header(*c.shm(), j)[11], __ATOMIC_ACQUIRE));
}

namespace {
std::atomic<uint64_t>& progress_word(ShmGroup& g, int r) {
  return *reinterpret_cast<std::atomic<uint64_t>*>(header(g, r) + 9);
}
std::atomic<uint64_t>& copied_word(ShmGroup& g, int r) {
  return *reinterpret_cast<std::atomic<uint64_t>*>(header(g, r) + 10);
}
}  // namespace

Small begin_rooted_single(Ctx& c, uint64_t sig, int root, const void* mine) {
  const Small s = small_begin(c, hash_mix(sig, kSingleCopyToken), 0, c.rank == root);
  if (c.rank == root) {
    // Published by the head's release; no rank reads this word before it has seen that head.
    __atomic_store_n(&header(*c.shm(), c.rank)[5], reinterpret_cast<uintptr_t>(mine), __ATOMIC_RELAXED);
    // The root says it is done with this op's heads only once it has checked every peer's
    // (end_rooted_single): until then no peer reuses the slot of the head it checks.
    small_publish(c, s);
    return s;
  }
  // No rank reads a peer's slot data here, and the root's head is read below, before this rank
  // says it copied: only then may the root reuse that slot.
  small_publish_done(c, s);
  small_wait(c, root, s, 0);
  return s;
}

void end_rooted_single(Ctx& c, const Small& s, int root) {
  ShmGroup& g = *c.shm();
  if (c.rank != root) {
    copied_word(g, c.rank).store(s.n, std::memory_order_release);
    g.ring_peers();
    return;
  }
  for (int j = 0; j < c.size; ++j) {
    if (j == root) continue;
    std::atomic<uint64_t>& w = copied_word(g, j);
    wait_for(c, [&] { return w.load(std::memory_order_acquire) >= s.n || small_other_call(c, j, s); }, j);
    // Word 10 may already hold a later op's number: a rank that left this op early (a small
    // op's leaf, in another call) copies in the next one before this root looks. Its head for
    // this op, published before any later word 10 (so seen here after that acquire) and kept
    // while this root has not said done, says which call it was in.
    if (small_other_call(c, j, s)) small_mismatch(c, j);
  }
  small_done(c, s, 0);
}

// The chunked number leads: every value of an op is above every value of the ops before it,
// compared modulo 2^64 (wait_progress).
uint64_t progress_base(Ctx& c) { return header(*c.shm(), c.rank)[0] << 32; }

void publish_progress(Ctx& c, uint64_t v) {
  progress_word(*c.shm(), c.rank).store(v, std::memory_order_release);
  c.shm()->ring_peers();
}

void wait_progress(Ctx& c, int j, uint64_t v) {
  std::atomic<uint64_t>& w = progress_word(*c.shm(), j);
  wait_for(c, [&] { return static_cast<int64_t>(w.load(std::memory_order_acquire) - v) > 0; }, j);
}

int slot_of(Ctx& c, size_t m) { return static_cast<int>((header(*c.shm(), c.rank)[0] + m) & 1); }

uint64_t op_number(Ctx& c) { return header(*c.shm(), c.rank)[0]; }

namespace {
// Word 6 + k % 2 of rank r's header: the place of its chunked op number k (Places).
uint64_t& place_word(ShmGroup& g, int r, uint64_t k) { return header(g, r)[6 + (k & 1)]; }
}  // namespace

Places::Places(Ctx& c, size_t bytes) : at_(c.size) {
  ShmGroup& g = *c.shm();
  const size_t share = slot_share(slot_bytes(g), c.size, c.ways().l2(), g.shares_cores());
  moves_ = share > 0;
  if (!moves_) return;
  const size_t foot = (bytes + 63) / 64 * 64;  // places of whole cache lines
  const size_t turns = bytes == 0 ? 0 : share / foot;
  const size_t at = turns > 1 ? c.ways().places().next(turns, slot_of(c, 0)) * foot : 0;
  at_[c.rank] = at;
  __atomic_store_n(&place_word(g, c.rank, op_number(c)), at, __ATOMIC_RELAXED);
}

void Places::read(Ctx& c) {
  for (int j = 0; moves_ && j < c.size; ++j)
    if (j != c.rank) read(c, j);
}

void check(Ctx& c, Places& places) {
  check(c);
  places.read(c);
}

void Places::read(Ctx& c, int j) {
  if (moves_) at_[j] = static_cast<size_t>(__atomic_load_n(&place_word(*c.shm(), j, op_number(c)), __ATOMIC_RELAXED));
}

size_t slot_share(size_t slot, int p, size_t l2, bool shares_cores) {
  if (!cuts_by_l2(l2) || shares_cores) return 0;
  return std::min(slot, l2 / static_cast<size_t>(std::max(p - 1, 1)));
}

void end(Ctx& c, size_t nchunks) {
  if (nchunks % 2 == 0) c.shm()->barrier();
}

size_t scratch_setting() { return params::bytes("SHOAL_SHM_SCRATCH").value_or(size_t(16) << 20); }

size_t slot_bytes(size_t scratch) { return (scratch - kSlotsStart) / 2 / 64 * 64; }

size_t slot_bytes(const ShmGroup& g) { return slot_bytes(g.scratch_bytes()); }

size_t chunk_target(ShmGroup& g, int p) { return chunk_target(slot_bytes(g), p); }

size_t chunk_target(size_t slot, int p) {
  size_t t = kWorkingSetBytes / (2 * static_cast<size_t>(p));
  t = std::clamp(t, kMinChunkBytes, kMaxChunkBytes);
  return std::min(t, slot) / 64 * 64;
}

size_t chunk_in_l2(size_t slot, int p, size_t l2) {
  const size_t t = chunk_target(slot, p);
  return cuts_by_l2(l2) ? std::min(t, l2 / 64 * 64) : t;
}

size_t two_shot_chunk(size_t slot, int p, size_t n, size_t l2, bool shares_cores) {
  const size_t pz = static_cast<size_t>(p), unit = 64 * pz;
  const size_t in_l2 = chunk_in_l2(slot, p, l2);
  const size_t chunk = shares_cores || !cuts_by_l2(l2) ? pipelined(in_l2, n, kMinChunkBytes * pz) : in_l2;
  return std::min(chunk, slot * pz / (pz + 1)) / unit * unit;
}

size_t reduce_scatter_piece(size_t slot, int p, size_t l2) {
  const size_t b = chunk_in_l2(slot, p, l2) / static_cast<size_t>(p);  // chunk_target is within the slot
  return b >= 64 ? b / 64 * 64 : b;
}

}  // namespace shoal::algo::direct

namespace shoal {
std::vector<std::pair<size_t, size_t>> shm_first_ops_areas(const ShmGroup& g, size_t l2) {
  using namespace algo::direct;
  if (g.size() < 2) return {};  // a group of one runs no op on its scratch
  const size_t share = slot_share(slot_bytes(g), g.size(), l2, g.shares_cores());
  // Slot 0 starts where the small slots end.
  if (share == 0) return {{0, kSlotsStart}};
  return {{0, kSlotsStart + share}, {kSlotsStart + slot_bytes(g), share}};
}
}  // namespace shoal
