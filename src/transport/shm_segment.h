// One rank's shared-memory segment: its control block, the inbound rings from each peer on its
// host (one per slot: the host's ranks in rank order, its own slot unused) and a scratch area the
// direct algorithms use. Every page is reserved when the segment is made, so a /dev/shm without
// room is an error then, never a SIGBUS at a later first touch. Created by its owner with mode 0600 under a name that
// carries the owner's pid ("/shoal-<pid>-<group id>-<rank>"), mapped by same-host peers, and
// unlinked by the owner once every peer has mapped it; remove_stale_segments() unlinks what a
// crashed process left between creation and that point.
#pragma once
#include <atomic>
#include <cstring>
#include <cstddef>
#include <cstdint>
#include <string>

namespace shoal {

// A rank's state in its control block. The owner writes it, once, through ShmControl::leave;
// peers read it (ShmControl::state_of) before they wait on, read from or write to the owner.
enum class PeerState : uint32_t {
  alive = 0,
  aborted = 1,    // its group failed (a peer, a timeout, abort()): the reason says why
  destroyed = 2,  // its communicator was destroyed (a peer still waiting on it fails)
};

struct alignas(64) ShmControl {
  uint64_t magic;
  uint64_t nonce;  // the probe: a peer that can open the segment and read this nonce shares our memory
  int32_t pid;
  int32_t size;  // ring slots: the ranks of the owner's host
  uint64_t self_addr;  // where this block is mapped in the owner: the single-copy probe reads it there
  uint64_t ring_bytes;
  uint64_t scratch_bytes;
  alignas(64) std::atomic<uint32_t> doorbell;  // bumped by anyone with news for the owner
  alignas(64) std::atomic<uint32_t> sleeping;  // owner is (about to be) in futex_wait on doorbell
  // 1 + the CPU the owner ran on when it last looked during a wait, 0 before its first
  // (Engine::wait_loop): a waiter whose peer is on its own CPU hands the CPU over rather than
  // polls. A peer that has not waited since keeps its old CPU here: a waiter then yields where it
  // could poll, which costs it a system call a look. Written only when it changes, on a line of
  // its own.
  alignas(64) std::atomic<uint32_t> cpu;
  alignas(64) std::atomic<uint32_t> state;     // a PeerState: leave() writes it, state_of() reads it
  // 1 + the rank whose memory the owner is writing into by single copy right now, else 0: a rank
  // that failed an op waits until no peer writes into it before the failure reaches its caller
  // (ShmGroup::quiesce_writes).
  alignas(64) std::atomic<uint32_t> writing_to;
  char reason[256];
  alignas(64) std::atomic<uint64_t> barrier_seq;  // ShmGroup barrier arrivals of the owner
  // The owner's current call (a CallRecord, base/call.h), read by a peer only to describe it in
  // the error of a mismatch: on a line of its own, which the owner's stores keep in its cache.
  alignas(64) std::atomic<uint64_t> call[4];

  // "rank <owner> aborted: <reason>": what a peer that finds this block's state not alive reports.
  // Call after that load (an acquire): the owner wrote the reason before its state (a release).
  std::string aborted_message(int owner) const;
  // By the owner: it leaves the group with `reason` (written first, so that a peer that sees the
  // state sees the reason). `order` is at least a release; seq_cst where a later load of the
  // owner's must not pass it (Engine::abort).
  void leave(PeerState s, const std::string& why, std::memory_order order = std::memory_order_release) {
    std::strncpy(reason, why.c_str(), sizeof reason - 1);
    state.store(static_cast<uint32_t>(s), order);
  }
  PeerState state_of(std::memory_order order = std::memory_order_acquire) const {
    return static_cast<PeerState>(state.load(order));
  }
  // By anyone with news for the owner (after writing into its ring, or freeing space in one it
  // writes): wakes the owner if it sleeps. An owner that is awake is not rung (shm_segment.cpp).
  void ring() {
    if (sleeping.load(std::memory_order_relaxed)) wake_owner();
  }
  void wake_owner();
};

struct alignas(64) ShmRing {  // single producer (the peer), single consumer (the owner)
  alignas(64) std::atomic<uint64_t> head;  // bytes ever written
  alignas(64) std::atomic<uint64_t> tail;  // bytes ever consumed
  // data follows (ring_bytes, a power of two), 64-byte aligned
};

class ShmSegment {
 public:
  // Creates this rank's segment (O_EXCL, 0600) or maps a peer's (open_existing). Throws Error;
  // for lack of room in /dev/shm, one that says how much it needs and how much is free.
  static ShmSegment create(const std::string& name, int slots, size_t ring_bytes, size_t scratch_bytes, uint64_t nonce);
  static size_t bytes_for(int slots, size_t ring_bytes, size_t scratch_bytes);
  static ShmSegment open_existing(const std::string& name);  // throws Error if absent or not ours
  ShmSegment() = default;
  ShmSegment(ShmSegment&& o) noexcept;
  ShmSegment& operator=(ShmSegment&& o) noexcept;
  ~ShmSegment();

  ShmControl* control() const { return reinterpret_cast<ShmControl*>(base_); }
  ShmRing* ring(int from) const;      // inbound ring written by the rank in slot `from`
  uint8_t* ring_data(int from) const;
  uint8_t* scratch() const;
  bool valid() const { return base_ != nullptr; }
  void unlink();  // removes the name (the mapping stays)

  // "/shoal-<pid>-n<PID namespace inode>-<group>-<rank>".
  static std::string make_name(int pid, const std::string& group_id, int rank);
  // Unlinks /dev/shm/shoal-<pid>-n<ns>-* of this PID namespace whose pid is no longer running.
  static void remove_stale_segments();

 private:
  uint8_t* base_ = nullptr;
  size_t bytes_ = 0;
  std::string name_;
  bool owner_ = false;
};

}  // namespace shoal
