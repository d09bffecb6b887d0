// The shared-memory side of a single-host group: each rank owns one segment (mode 0600, unlinked
// from /dev/shm as soon as every peer has mapped it, so none is left behind even after a crash)
// holding its control block, its inbound rings from each peer, and a scratch area that every peer
// can read and write directly. The direct algorithms (src/algo/direct_*.cpp) work on the scratch
// areas and synchronise with barrier(); where the kernel permits, they read the peers' buffers
// directly (read()).
#pragma once
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace shoal {

class ShmGroup {
 public:
  virtual ~ShmGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Rank r's scratch area, mapped in this process; scratch_bytes() each, 64-byte aligned. Not
  // virtual: a direct op names a slot or its own scratch on every copy.
  uint8_t* scratch(int r) const { return scratch_[r]; }
  size_t scratch_bytes() const { return scratch_bytes_; }
  // All ranks of the group arrive before any leaves. Sleeps (futex) after a short spin; throws
  // PeerError if a peer dies or aborts, Timeout at the op's deadline. Memory written to scratch
  // areas before barrier() is visible to every rank after it.
  void barrier() {
    arrive();
    complete();
  }
  // barrier() in two halves, for a rank with work to do between saying it has arrived (all it
  // did before arrive() is visible to the peers once they leave their barrier) and waiting for
  // the others (complete(): all they did before arriving is visible here after it). A rank that
  // has arrived completes before its next arrive(), unless a failure between the two aborts the
  // group.
  virtual void arrive() = 0;
  virtual void complete() = 0;
  // Waits until done(arg) holds, as barrier() waits; `peer` (or every peer, when -1) is the one
  // whose death or abort fails the wait. For protocols of their own over the scratch areas.
  virtual void wait(bool (*done)(void*), void* arg, int peer) = 0;
  // Wakes every peer that sleeps in a wait (after writing what it may be waiting for).
  virtual void ring_peers() = 0;
  // Single copy (transport/cma.h): whether every rank may read every other rank's memory, as the
  // probe found when the group formed (SHOAL_CMA=0 turns it off); the same answer on every rank.
  virtual bool single_copy() const = 0;
  // Whether the group's ranks outnumber the CPUs the ranks of this machine may run on between them
  // (the union of their affinities, base/cpus.h): the same answer on every rank, for choices the
  // ranks must agree on. Then a rank that waits hands its core over at once rather than polling
  // first: the rank it waits for may be queued behind it on that core.
  virtual bool shares_cores() const = 0;
  // Copies n bytes at `remote`, an address in rank r's process, into `local`, by one copy in the
  // kernel. Only where single_copy(); r keeps that memory unchanged until this rank says it is
  // done (a barrier, or the op's own word) unless r fails its op. Throws PeerError if r is gone,
  // or failed its op before the copy ended (its caller may have rewritten that memory since).
  virtual void read(int r, const void* remote, void* local, size_t n) = 0;
  // The other way: n bytes at `local` into `remote`, an address in rank r's process. Each piece
  // is written only while r is alive and not aborted (see quiesce_writes).
  virtual void write(int r, const void* local, void* remote, size_t n) = 0;
  // After this rank aborted (its state is set): waits until no peer is in the middle of a write()
  // into this process, or has exited, for at most the group's timeout. An op that lets peers write into its
  // caller's buffer fails through here, so no write lands after the failure has reached the
  // caller, who may by then have freed the buffer.
  virtual void quiesce_writes() = 0;

 protected:
  // The areas scratch(r) returns, by rank.
  ShmGroup(std::vector<uint8_t*> scratch, size_t scratch_bytes)
      : scratch_(std::move(scratch)), scratch_bytes_(scratch_bytes) {}

 private:
  std::vector<uint8_t*> scratch_;
  size_t scratch_bytes_;
};

}  // namespace shoal
