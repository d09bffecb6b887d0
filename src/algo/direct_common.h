// Shared-memory ("direct") algorithms: common layout, chunk sizes and the mismatch check.
//
// Every rank's scratch area (ShmGroup::scratch(r), scratch_bytes() each) is laid out as
//   [0, kHeaderBytes)   header: word 0 = this rank's count of chunked direct ops (private to the
//                       owner), words 1 and 2 = the token of its chunked op with an even / odd
//                       number (published); words 3 and 4 = its count of all direct ops and the
//                       least `done` it knows of its peers (private); word 8 = `done`, the last
//                       direct op whose small slots it has finished reading (published), and
//                       word 9 = `progress`, how far this rank is in a streamed op (published;
//                       "Streamed ops" below), on a line of their own
//   [.., + kSmallArea)  small slots (direct_small.cpp): kSmallSlots heads of one line each,
//                       kSmallSlots line areas of kSmallLineBytes, then kSmallDataSlots data areas
//                       of kSmallBytes
//   [.., end)           data: two slots of slot_bytes() each, used alternately by chunk
// Word 5 of the header is the address of the buffer a single-copy op lets its peers read or
// write, and word 11 that of its input where it has two (published; begin_single), words 6 and 7
// the place in its slots of its chunked op with an even / odd number (published; Places), and
// word 10, on the line of words 8 and 9, the
// number of the last rooted single-copy op whose copy this rank has made (published;
// begin_rooted_single).
//
// Mismatch check. Direct algorithms move no framed messages, so the framing cannot catch ranks
// that called different ops or counts (which would read a peer's scratch out of bounds or out of
// step). Instead op number k writes a token = hash(op kind, dtype, reduce op, count(s), root, k)
// into header word 1 + k % 2 before its first barrier, and every rank compares all ranks' word
// 1 + k % 2 right after that barrier: all ranks see the same set of tokens, so either all go on
// or all throw PeerError. No rank can rewrite that word before every rank has read it: the next
// op (k+1) writes the other word, and op k+2 starts only after op k+1's first barrier, which
// every rank reaches only after its check in op k. So even an op with a single barrier (the
// direct barrier) checks safely: a barrier run against a peer's allreduce fails on both sides.
// A streamed reduce's root checks each peer's small token instead (small_wait, before it arrives
// at the op's barrier); its other ranks check as above.
//
// Reuse across ops. A direct op ends without a closing barrier unless its last chunk used the
// slot the next op writes first (end(), slot_of()): the next op's first barrier then guarantees
// that no slow peer still reads what the next op overwrites.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "algo/common.h"
#include "algo/cost.h"
#include "transport/stores.h"
#include "reduce/copy.h"
#include "base/cpu_relax.h"
#include "base/cpus.h"
#include "base/hash.h"
#include "transport/shm_group.h"

namespace shoal::algo::direct {

inline constexpr size_t kHeaderBytes = 128;
// Small ops (direct_small.cpp): each direct op, numbered n from 1 by every rank, has slot n %
// kSmallSlots of every rank: a head line holding its number and token and, up to
// kSmallInlineBytes, its data (the data rides with the flag: one line moves to each reader, as in
// Open MPI's fast boxes); up to kSmallLineBytes, in the slot's line area (op n: area n %
// kSmallSlots); larger data, up to kSmallBytes, in one of kSmallDataSlots data areas (op n: area
// n % kSmallDataSlots). The heads are contiguous (one page per rank), and the large data areas
// few, so that cycling through them stays in the caches and the TLB. A rank that waits for no one
// (a broadcast's or scatter's root, a reduce's or gather's other ranks) runs ahead of the slowest
// peer, up to kSmallSlots - 1 ops with up to kSmallLineBytes of data, kSmallDataSlots - 1 with more:
// with ranks outnumbering cores, a rank then does many ops per turn on its core instead of one
// (BENCHMARKS.md, "Small rooted ops" and "Line areas"). 164 KiB per rank.
//
// A rank says it is done with an op (the word a writer polls before reusing a slot) only every
// kDoneEvery-th op, and after reading a data area: a writer at its depth polls that word, and
// each store to it would first take the line back from the writer. So a writer may stop
// kDoneEvery - 1 ops short of its depth (with a data area too, after readers whose last ops were
// smaller), and no wait is longer for it: a rank waiting in op m has said it is done with
// m - kDoneEvery or later.
inline constexpr int kSmallSlots = 64;
inline constexpr int kSmallDataSlots = 16;
inline constexpr int kDoneEvery = 8;
static_assert(kDoneEvery < kSmallDataSlots);
inline constexpr size_t kSmallBytes = 8192;
inline constexpr size_t kSmallLineBytes = 512;
// Whether an op that puts `bytes` in a rank's slot puts them in a data area.
inline bool in_data_area(size_t bytes) { return bytes > kSmallLineBytes; }
inline constexpr size_t kSmallInlineBytes = 48;
inline constexpr size_t kSmallArea = kSmallSlots * (size_t(64) + kSmallLineBytes) + kSmallDataSlots * kSmallBytes;
// Where a scratch area's two data slots start: after the header and the small slots.
inline constexpr size_t kSlotsStart = kHeaderBytes + kSmallArea;
// Per-rank bytes one pipeline chunk moves through scratch: the whole group touches about
// 2·p·chunk bytes of scratch per phase, kept under kWorkingSetBytes so it stays in L3.
inline constexpr size_t kWorkingSetBytes = size_t(16) << 20;
inline constexpr size_t kMinChunkBytes = size_t(64) << 10;
inline constexpr size_t kMaxChunkBytes = size_t(4) << 20;
// alltoall(v): a phase's piece of each block is at least this, else the pairwise exchange runs
// (each phase's barrier among many ranks would cost more than p-1 steps; with the default 16 MiB
// scratch, from 23 ranks).
inline constexpr size_t kMinPieceBytes = size_t(16) << 10;
// The phases of alltoall and alltoallv after begin(): this rank's blocks `sb` of `src` go to the
// peers, theirs land in `out` as `rb` says; `largest` is the group's largest block between two
// ranks (the same on every rank: it sets the number of phases). Ends with end().
void alltoall_pipeline(Ctx& c, const uint8_t* src, const Blocks& sb, void* out, const Blocks& rb, size_t largest);
// The piece of each block that one phase of that pipeline moves, for `largest` (a multiple of 64).
size_t alltoall_piece(ShmGroup& g, int p, size_t largest);
size_t alltoall_piece(size_t chunk_target, int p, size_t largest);  // for the group's chunk_target

// A direct op's token base, which its ranks write and its readers compare: the op's signature
// (Ctx::sig), which holds the call's arguments and number, and the kind of direct op. A subgroup's
// ops have their parent's signature, whose arguments fix theirs, so only what the signature
// lacks is added (a form, a way chosen on this host).
struct Sig : Hash {
  Sig(OpKind kind, const Ctx& c) : Hash(hash_mix(c.sig(), static_cast<uint64_t>(kind) + 1)) {}
};

// A direct op's number among all direct ops of the group, and its token (small ops below).
struct Small {
  uint64_t n;    // this op's number among the direct ops
  uint64_t tok;  // its token: the op's signature mixed with n
};

// Starts a chunked direct op: writes its token (sig mixed with this rank's chunked-op number)
// into the own header, and takes its number among all direct ops (small_begin and
// small_publish_done with no data, so that a peer in a small op at the same number sees the
// mismatch).
// Returns the op's number among all direct ops, for a reader that checks a peer's (small_wait).
Small begin(Ctx& c, uint64_t sig);
// begin()'s second half, for an op that took its number among all direct ops in a small round of
// its own (alltoallv's tables): the chunked op's number and token.
void take_chunked_number(Ctx& c, uint64_t sig);
// After the op's first barrier: throws PeerError unless every rank published the same token.
void check(Ctx& c);

// Which of the two slots chunk m of the current op uses: they alternate by chunk, starting from
// the op's own number (the header's word 0, set by begin()). So an op's first chunk, written
// before its first barrier, never lands in the slot the previous op used last; that is what
// lets the small allreduce end without a closing barrier: a peer may still be reading this
// rank's slot of op n while this rank starts op n+1 in the other slot, and op n+1's first
// barrier waits for every rank to have left op n before anyone writes that slot again.
int slot_of(Ctx& c, size_t m);
// The current op's number among this rank's chunked direct ops (the header's word 0): the same on
// every rank of the group, since they make the same ops.
uint64_t op_number(Ctx& c);
// The share at the start of each slot that the places of successive ops move through (Places), in
// bytes: L2/(p-1)
// within a slot of `slot` bytes, where `p` ranks with a core each cut chunks by an L2 of `l2`
// bytes (cuts_by_l2); 0 elsewhere (every op at the slot's start).
size_t slot_share(size_t slot, int p, size_t l2, bool shares_cores);
// Ends a chunked direct op whose last phase read chunk nchunks-1 from the peers' slots. A closing
// barrier is needed only when that slot is the one the next op writes before its first barrier,
// i.e. when nchunks is even (slot_of); otherwise the next op's first barrier covers it.
void end(Ctx& c, size_t nchunks);
// Bytes of each rank's scratch area as SHOAL_SHM_SCRATCH sets it (16 MiB when unset): what the
// rendezvous reserves in each segment, and what the cost model (model.h) assumes.
size_t scratch_setting();
// Bytes of one of the two data slots of a scratch area of `scratch` bytes (a multiple of 64), and
// of each rank's scratch in `g`.
size_t slot_bytes(size_t scratch);
size_t slot_bytes(const ShmGroup& g);
inline uint8_t* slot(const ShmGroup& g, int r, int s) { return g.scratch(r) + kSlotsStart + s * slot_bytes(g); }
// Rank r's header words (the layout above).
inline uint64_t* header(ShmGroup& g, int r) { return reinterpret_cast<uint64_t*>(g.scratch(r)); }
// Whether this rank's copies into its scratch take non-temporal stores now.
inline bool streams(Ctx& c) { return shoal::streams(c.ways().stores()); }

// dst = src into this rank's scratch for the others to read, with the stores transport/stores.h
// chooses.
inline void copy_in(Ctx& c, void* dst, const void* src, size_t n) {
  const ShmGroup& g = *c.shm();
  copy_for_readers(c.ways().stores(), c.ways().scratch_pages(), g.scratch(c.rank), g.scratch_bytes(), dst, src, n);
}

// ---- Streamed ops: pieces published as they land -------------------------------------------------
//
// A streamed op moves its data through one slot (slot_of(c, 0)) as a ring of pieces, without a
// barrier between a piece's writer and its readers: the writer publishes how many pieces it has
// written in its header's progress word, a reader waits for the count and publishes how many it
// has read where the writer waits for that before overwriting a piece. Its one barrier is
// arrived at by the readers (or the root that reads) as they start and completed when they are
// done, so the writers leave once their pieces are in, and their next op writes the other slot
// first and this one only after its own barrier, which the readers reach once done here. A
// rank checks that a peer is in the same call (small_wait on `begin`'s Small) before it waits for
// that peer's progress: a peer in another call is a PeerError, not a wait for pieces that never
// come.
// The smallest piece a streamed op waits for: a reader that waits for smaller pieces spends more in
// waits than the overlap saves.
inline constexpr size_t kStreamPieceBytes = size_t(32) << 10;
// The value below every progress of the current op (its chunked number, set by begin(), times
// 2^32); an op's values stay under 2^kMaxStreamPiecesLog2 above it, and are compared modulo 2^64
// (wait_progress), so the numbers may wrap.
inline constexpr int kMaxStreamPiecesLog2 = 31;
uint64_t progress_base(Ctx& c);
// Publishes this rank's progress (above progress_base) and wakes the peers that sleep.
void publish_progress(Ctx& c, uint64_t v);
// Waits until rank j's progress is above `v`, by their difference: a value of an earlier op is
// below `v` even where the numbers wrapped in between.
void wait_progress(Ctx& c, int j, uint64_t v);

// ---- Single copy: between the ranks' own buffers (ShmGroup::read, write) ----------------------
//
// Where the kernel permits it (g.single_copy()), broadcast, allgather, scatter and gather move
// blocks straight between the ranks' own buffers where the measured costs say (cost.h), and so
// does the 2-rank allreduce (Ways::allreduce_single_copy, with a barrier between its halves): one copy
// per byte instead of two (into the owner's scratch, out of it), and no pipeline: one barrier
// before (the addresses are published and the tokens checked) and one after (no rank leaves, and
// rewrites or frees its buffer, while a peer still copies). So do alltoall's medium blocks where
// every rank has a core of its own (direct_alltoall.cpp); alltoall was slower with it at other
// sizes (a block read by several ranks, or both cores busy in the pipeline already;
// BENCHMARKS.md, "Single-copy transfers" and "alltoall by single copy").
// begin_single() is begin() plus the address of this rank's buffer in header word 5 (and, where
// given, of its input in word 11), then the first barrier and check(); after it peer_buffer(c, j)
// (and peer_input(c, j)) is rank j's. Op k+1 rewrites words 5 and 11 only after op k's closing
// barrier, by which every rank has read them.
void begin_single(Ctx& c, uint64_t sig, const void* mine, const void* input = nullptr);
const uint8_t* peer_buffer(Ctx& c, int j);
const uint8_t* peer_input(Ctx& c, int j);
inline void end_single(Ctx& c) { c.shm()->barrier(); }
// A rooted single-copy op (scatter, gather: only the root's buffer is shared) waits one way, with
// no barrier. The root publishes its buffer's address (word 5) with its op's head; each other
// rank waits for that head alone (small_wait: the same call), copies, and says so in its header's
// word 10 (the op's number); the root waits for that from each of them, checks each one's head
// for the op (a later op's word 10 may come from a rank that left this op early, in another
// call), and says it is done with those heads only then. So the others wait for no one but the
// root, and the root for nothing but their copies: with ranks sharing cores, a barrier's every
// rank taking a turn before any leaves is paid by the root alone. The root rewrites word 5 only
// in a later op, after every rank's copy. The op takes no chunked number and uses no data slot,
// only its small head, so the chunked ops around it keep their reuse rule (slot_of, end) as if
// it were not there.
Small begin_rooted_single(Ctx& c, uint64_t sig, int root, const void* mine);
void end_rooted_single(Ctx& c, const Small& s, int root);

// ---- Small ops: no barrier (direct_small.cpp) ----------------------------------------------------
//
// A small op writes its data with its number and token into the rank's own slot, reads what it
// needs from the peers' slots once their number is there (checking their token: a peer in a
// different call is a PeerError), and says it is done. A rank reuses a slot only after every peer
// has said it is done with the op that used it last, so ranks may be up to kSmallSlots - 1 ops
// apart and no op waits for a peer that only reads (a broadcast's root, a reduce's other ranks
// leave at once).
// Takes the next op number and waits until its slot is free here for writing `bytes` (its head,
// and its data area when they do not fit inline). `ahead`: this rank reads nothing of the op (a
// broadcast's or scatter's root, a reduce's or gather's other ranks), so it may run ahead of its
// readers, and takes the lines of a later slot for writing meanwhile. Throws like a wait.
Small small_begin(Ctx& c, uint64_t sig, size_t bytes, bool ahead = false);
// Where this rank writes the `bytes` of op `s`, before small_publish.
uint8_t* small_data(Ctx& c, const Small& s, size_t bytes);
// Publishes the own slot's number and token (after its data).
void small_publish(Ctx& c, const Small& s);
// Waits until rank j has published op `s` (PeerError if it published another call); returns its
// data, of which j wrote `bytes` (every reader knows how much: the op's arguments say).
const uint8_t* small_wait(Ctx& c, int j, const Small& s, size_t bytes);
// Whether rank j's head for op `s` says j is in another call (published with another number or
// token); small_mismatch fails the op on j for it (PeerError).
bool small_other_call(Ctx& c, int j, const Small& s);
[[noreturn]] void small_mismatch(Ctx& c, int j);
void small_wait_all(Ctx& c, const Small& s);  // every other rank
// Before waiting for rank j in a rooted op: starts loading j's next heads.
void small_read_ahead(Ctx& c, int j, const Small& s);
// This rank reads no more of the peers' slots for op `s`, whose writers wrote at most `written`
// bytes each (the op's arguments say): it says so every kDoneEvery-th op, or at once where that
// is more than kSmallLineBytes (a data area, of which a writer has kSmallDataSlots only).
void small_done(Ctx& c, const Small& s, size_t written);
// small_publish and small_done at once, for a rank that reads none of its peers' data in op `s`
// (a broadcast's root, a reduce's other ranks, a chunked op's begin()): the peers are woken once
// for both.
void small_publish_done(Ctx& c, const Small& s);
// Waits until cond() holds, polling briefly before ShmGroup::wait (which reads the clock, yields
// or sleeps, and fails on a dead or aborted `peer`, every peer when -1, or at the deadline); where
// ranks share cores, without the brief polls (ShmGroup::shares_cores). A writer of what cond()
// reads wakes the sleepers after it (ShmGroup::ring_peers).
inline constexpr int kQuickPolls = 32;
template <class F>
void wait_for(Ctx& c, F cond, int peer) {
  if (cond()) return;
  if (!c.shm()->shares_cores())
    for (int i = 0; i < kQuickPolls; ++i) {
      cpu_relax();
      if (cond()) return;
    }
  c.shm()->wait([](void* f) { return (*static_cast<F*>(f))(); }, &cond, peer);
}
// One value per rank, on the stack up to kStackRanks ranks: a vector on the heap cost a small op as
// much as its data path.
template <class T>
class PerRank {
 public:
  explicit PerRank(int p) {
    if (p > kStackRanks) heap_.resize(p);
  }
  T& operator[](int j) { return data()[j]; }
  const T& operator[](int j) const { return data()[j]; }
  T* data() { return heap_.empty() ? stack_ : heap_.data(); }
  const T* data() const { return heap_.empty() ? stack_ : heap_.data(); }

 private:
  static constexpr int kStackRanks = 64;
  T stack_[kStackRanks];
  std::vector<T> heap_;
};
// An op's sources for reduce_many.
using RankPtrs = PerRank<const void*>;

// Where the current chunked op puts its data in each rank's slots, in bytes from a slot's start, a
// whole number of cache lines: its chunks start there (alltoallv's blocks in the slot, written and
// read in one phase, stay at the start). With a core for each rank, successive ops on a slot (they
// alternate slots: slot_of) move through a share of one L2, L2/(p-1) (slot_share), where that
// share holds two such ops or more, while they come fast (slot_places.h), and stay while they
// do not; elsewhere every op is at the start. A store to a slot line that a reader's core still
// holds from an earlier op first takes the line from that core, at 100-150 ns a KiB on our VMs,
// while the lines of a share the readers have let go come from the L3; a place further than one
// L2 comes from memory. Ranks that
// share cores gained nothing consistent (BENCHMARKS.md, "Direct ops: each op's place in the
// slot").
//
// Each rank chooses its own place and publishes it in its header (word 6 + the op's number % 2)
// before the release that publishes the op's first data, a barrier or a progress word. A reader
// reads a writer's place after seeing that release: the ops that check() read it right after,
// when check() has just read the same header line for the writer's token (a peer that goes on to
// its next op rewrites that line, and a read later would take it back from that peer's core); the
// streamed reduce's root, which calls no check(), as each peer's first piece lands. No rank
// rewrites that word while a reader may still read it: op k+2 writes it only after op k+1's first
// barrier (or its first small round: the streamed reduce's root waits for every peer's head),
// which no rank reaches before it has left op k. Where the group's share is 0 (the same on every
// rank: the host's smallest L2, whether ranks share cores), every place is the start and nothing
// is published or read.
class Places {
 public:
  // This rank's place for an op that puts `bytes` in a slot, published. Once per chunked op, after
  // begin() and before its first store to a slot.
  Places(Ctx& c, size_t bytes);
  // Every other rank's place (right after check()), or rank j's (after its first release).
  void read(Ctx& c);
  void read(Ctx& c, int j);
  size_t operator[](int j) const { return moves_ ? at_[j] : 0; }

 private:
  PerRank<size_t> at_;
  bool moves_;  // else every rank's place is the start
};
// check(), then every other rank's place (Places::read), from the header lines check() has just
// read.
void check(Ctx& c, Places& places);
// Whether an op that puts `bytes` in each slot runs as a small op.
inline bool small_fits(size_t bytes) { return bytes <= kSmallBytes; }
// The small versions of the direct ops (root < 0: all ranks want the result).
void allreduce_small(Ctx& c, const void* in, void* out, size_t count, int root, uint64_t sig);
void broadcast_small(Ctx& c, void* buf, size_t count, int root, uint64_t sig);
void gather_small(Ctx& c, const void* in, void* out, const Blocks& b, int root, uint64_t sig);
// gather_small of p blocks of `bytes` each (gather: no Blocks to allocate).
void gather_small(Ctx& c, const void* in, void* out, size_t bytes, int root, uint64_t sig);
void scatter_small(Ctx& c, const void* in, void* out, size_t count, int root, uint64_t sig);
void reduce_scatter_small(Ctx& c, const void* in, void* out, size_t count, uint64_t sig);
void alltoall_small(Ctx& c, const void* in, void* out, size_t count, uint64_t sig);
void barrier_small(Ctx& c, uint64_t sig);
// Target bytes per rank per chunk: kWorkingSetBytes / (2p), clamped to [kMinChunkBytes,
// kMaxChunkBytes] and to the slot (of `slot` bytes: the cost model asks without a group).
size_t chunk_target(ShmGroup& g, int p);
size_t chunk_target(size_t slot, int p);
// chunk_target, at most one core's L2 (`l2`: the group's Ways::l2; 0 leaves chunk_target): for
// the ops in which every rank copies a chunk in and reads its peers' in the same phase
// (allgather, reduce_scatter, and allreduce and reduce by two_shot_chunk). While a chunk fits
// the L2 of the core that wrote it, its readers take it from there. On an AMD EPYC with a 1 MiB
// L2, at 2-4 ranks against chunks of 2-4 MiB, these ops took 0.66-1.03x the time from 4 to 64 MiB
// (BENCHMARKS.md, "Chunks at most one L2"). Broadcast, scatter and gather, which one rank writes
// and the others read, keep chunk_target (at the sizes where the cut helped scatter and gather
// through the scratch, they run by single copy); so does alltoall, which the cut did not speed up.
size_t chunk_in_l2(size_t slot, int p, size_t l2);
// Whether chunks are cut by `l2`: a size read from the CPU, not 0 (unknown) nor implausibly small.
inline bool cuts_by_l2(size_t l2) { return l2 >= kMinChunkBytes; }
inline size_t chunk_in_l2(Ctx& c) { return chunk_in_l2(slot_bytes(*c.shm()), c.size, c.ways().l2()); }
// The two-shot allreduce's (and reduce's) chunk of `n` bytes in all, in bytes: chunk_in_l2, and
// where ranks share cores or the L2 is unknown pipelined() from it (at least kMinChunks chunks,
// down to 64 KiB a slice); whole cache lines for each of the p slices (a multiple of 64·p), the
// input and one result slice fitting in a slot; 0 where no such chunk fits the slot. With a core
// each, the extra phases cost more than they overlap once a chunk fits the L2: at 2 ranks, 512
// KiB-2 MiB took 0.57-0.78x the time in chunks of 1 MiB than in four; at 4 and 8 ranks on 2 cores
// 0.66-1.17x, with no pattern (BENCHMARKS.md, "Chunks at most one L2"). A chunk that does not fit
// the L2 leaves the caches between copy in and reduce: four chunks halved the 2-rank allreduce
// of 2 MiB when one chunk was 4 MiB ("Direct allreduce: at least 4 chunks").
size_t two_shot_chunk(size_t slot, int p, size_t n, size_t l2, bool shares_cores);
// The direct reduce_scatter's piece of each block per chunk, in bytes: chunk_in_l2 over p, whole
// cache lines where it is one or more.
size_t reduce_scatter_piece(size_t slot, int p, size_t l2);
// `chunk` for moving `bytes`, made smaller where that gives at least kMinChunks chunks of at least
// `least`: a rank's copy in and copy out of one chunk then stay in its cache, and the ranks'
// phases overlap; one or two chunks run copy-in, reduce and copy-out one after the other
// (BENCHMARKS.md, "Direct allreduce: at least 4 chunks").
inline constexpr size_t kMinChunks = 4;
inline size_t pipelined(size_t chunk, size_t bytes, size_t least = kMinChunkBytes) {
  return std::min(chunk, std::max(least, bytes / kMinChunks));
}
// Pieces of one length for moving `bytes` in pieces of at most `most` (a multiple of 64, or of
// `es` where under 64; the pieces are too): as few as `most` allows, but at least `least_parts`
// where one will not do and the bytes make that many lines, and none short by more than a line a
// piece. A short last piece after a full one overlaps nothing with it: the 2-rank broadcast of 4
// MiB + 64 B took 2-3x the time of 4 MiB, and the 2-rank scatter through the scratch of 8 MiB (a
// piece of 41 KiB after one of 4,055 KiB) 2.3x that of 7.5 MiB in the median (BENCHMARKS.md,
// "Copies a few bytes apart in their pages" and "Chunks at most one L2").
inline size_t even_pieces(size_t bytes, size_t most, size_t es, size_t least_parts = 1) {
  const size_t align = most >= 64 ? 64 : es;
  size_t parts = std::max<size_t>(1, (bytes + most - 1) / most);
  if (parts > 1) parts = std::max(parts, least_parts);
  return std::max(align, ((bytes + parts - 1) / parts + align - 1) / align * align);
}

}  // namespace shoal::algo::direct
