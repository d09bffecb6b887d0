#include "transport/shm_group_impl.h"

#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <string>

#include "base/cpu_relax.h"
#include "base/log.h"
#include "shoal/error.h"
#include "transport/cma.h"
#include "transport/futex.h"

namespace shoal {
namespace {
constexpr int kQuickPolls = 16;
// Single-copy transfers go in pieces of this size, each after a look at the peer's state, so that
// a peer that has failed its op (a third rank died, a timeout, abort()) waits for at most one
// piece before its failure reaches its caller (quiesce_writes).
constexpr size_t kTransferPiece = size_t(1) << 20;
// prefault() maps the peers' areas too in groups of up to this many ranks. For the small slots alone
// it measured no cost in construction at 2-16 ranks; at 128 ranks it made construction about 15%
// slower and a rank's resident size (shared pages counted) three times larger, for faults that
// only the first ops of each slot take (BENCHMARKS.md, "A group's first small ops"). With the data
// slots' shares too, a group of 2 takes 14-33 ms to make instead of 8-14 ("A group's first chunked
// ops"); 3-16 ranks with a core each are not measured. Where it stops paying is a judgement.
constexpr int kPrefaultPeersUpTo = 16;

std::vector<uint8_t*> scratch_areas(const std::vector<ShmSegment>& segs) {
  std::vector<uint8_t*> areas;
  for (const ShmSegment& s : segs) areas.push_back(s.scratch());
  return areas;
}
}  // namespace

#ifndef MADV_POPULATE_READ  // Linux 5.14; older kernels answer EINVAL, and the pages are read instead
#define MADV_POPULATE_READ 22
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

ShmGroupImpl::ShmGroupImpl(Waiter& waiter, int rank, const std::vector<ShmSegment>& segs, bool single_copy, int cores,
                           std::chrono::milliseconds timeout)
    : ShmGroup(scratch_areas(segs), segs[rank].control()->scratch_bytes),
      waiter_(waiter),
      rank_(rank),
      single_copy_(single_copy),
      cores_(std::max(1, cores)),
      timeout_(timeout) {
  for (int r = 0; r < static_cast<int>(segs.size()); ++r) {
    ctl_.push_back(segs[r].control());
    if (r != rank) others_.push_back(r);
  }
  seq_ = ctl_[rank]->barrier_seq.load();
}

void ShmGroupImpl::prefault(const std::vector<std::pair<size_t, size_t>>& areas) {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  for (int r = 0; r < size(); ++r) {
    if (r != rank_ && size() > kPrefaultPeersUpTo) continue;
    for (const auto& [off, bytes] : areas) {
      if (off >= scratch_bytes()) continue;
      const uintptr_t begin = (reinterpret_cast<uintptr_t>(scratch(r)) + off) & ~(page - 1);
      const uintptr_t end = reinterpret_cast<uintptr_t>(scratch(r)) + off + std::min(bytes, scratch_bytes() - off);
      // A read maps a page of tmpfs writable as well (a shared mapping without write notification).
      if (madvise(reinterpret_cast<void*>(begin), end - begin, r == rank_ ? MADV_POPULATE_WRITE : MADV_POPULATE_READ) != 0)
        for (uintptr_t a = begin; a < end; a += page) (void)*reinterpret_cast<volatile const uint8_t*>(a);
    }
  }
}

void ShmGroupImpl::arrive() {
  ++seq_;
  ctl_[rank_]->barrier_seq.store(seq_, std::memory_order_seq_cst);
  for (int r : others_) ctl_[r]->ring();
}

void ShmGroupImpl::complete() {
  auto arrived = [&] {
    for (int r : others_)
      if (ctl_[r]->barrier_seq.load(std::memory_order_acquire) < seq_) return false;
    return true;
  };
  // Peers on other cores arrive within a few polls; the engine's wait (clock, links, the list
  // of late peers) is for the others, and for every wait where ranks share cores.
  if (!shares_cores())
    for (int i = 0; i < kQuickPolls && !arrived(); ++i) cpu_relax();
  if (!arrived()) {
    std::vector<int> late;
    for (int r : others_)
      if (ctl_[r]->barrier_seq.load(std::memory_order_acquire) < seq_) late.push_back(r);
    waiter_.wait_for(arrived, late);
  }
  // A peer that arrived and then failed (its op timed out, or abort() was called) has aborted
  // the group: its arrival must not let this rank complete the op as if nothing happened.
  for (int r : others_)
    if (ctl_[r]->state_of() == PeerState::aborted)
      waiter_.fail_peer(r, ctl_[r]->aborted_message(r));
}

void ShmGroupImpl::wait(bool (*done)(void*), void* arg, int peer) {
  waiter_.wait_until(done, arg, peer >= 0 ? std::vector<int>{peer} : others_);
}

void ShmGroupImpl::ring_peers() {
  for (int r : others_) ctl_[r]->ring();
}

void ShmGroupImpl::read(int r, const void* remote, void* local, size_t n) {
  transfer(r, false, static_cast<uint8_t*>(local), static_cast<uint8_t*>(const_cast<void*>(remote)), n);
}

void ShmGroupImpl::write(int r, const void* local, void* remote, size_t n) {
  transfer(r, true, static_cast<uint8_t*>(const_cast<void*>(local)), static_cast<uint8_t*>(remote), n);
}

void ShmGroupImpl::transfer(int r, bool to_peer, uint8_t* local, uint8_t* remote, size_t n) {
  std::atomic<uint32_t>& writing = ctl_[rank_]->writing_to;
  for (size_t off = 0; off < n; off += kTransferPiece) {
    // The peer keeps its memory until this rank's next barrier unless it failed its op: then it
    // names why. A write announces itself (writing_to) before that look, and the peer sets its
    // state before it waits for announced writes to end (quiesce_writes), both seq_cst: either
    // this rank sees the state and writes nothing more, or the peer sees the announcement and
    // waits for the piece. A failed call means the peer is gone or did just that; a local fault
    // is reported the same way, as the kernel does not say which side's address it could not use.
    if (to_peer) writing.store(static_cast<uint32_t>(r) + 1, std::memory_order_seq_cst);
    if (ctl_[r]->state_of(std::memory_order_seq_cst) != PeerState::alive) {
      writing.store(0, std::memory_order_release);
      waiter_.fail_peer(r, ctl_[r]->aborted_message(r));
    }
    const size_t len = std::min(kTransferPiece, n - off);
    const int e = to_peer ? cma::write(ctl_[r]->pid, local + off, remote + off, len)
                          : cma::read(ctl_[r]->pid, remote + off, local + off, len);
    if (to_peer) writing.store(0, std::memory_order_release);
    // A read that overlapped the peer's failing its op may hold bytes its caller wrote after
    // getting the buffer back: the peer sets its state before that (Engine::abort), so a look
    // after the read tells.
    if (e == 0 && (to_peer || ctl_[r]->state_of(std::memory_order_seq_cst) == PeerState::alive)) continue;
    if (ctl_[r]->state_of() != PeerState::alive) waiter_.fail_peer(r, ctl_[r]->aborted_message(r));
    waiter_.fail_peer(r, std::string("single-copy ") + (to_peer ? "write" : "read") + " of " + std::to_string(n) +
                             " bytes with rank " + std::to_string(r) + " failed: " + std::strerror(e) +
                             (e == ESRCH ? " (the process is gone)" : ""));
  }
}

void ShmGroupImpl::quiesce_writes() {
  if (!single_copy_) return;
  const uint32_t me = static_cast<uint32_t>(rank_) + 1;
  // A piece is at most kTransferPiece bytes (well under a millisecond), but a writer may be
  // stopped or starved of a core for long: only its exit ends the wait early, as a piece landing
  // after the caller got its buffer back would corrupt memory. The group's timeout bounds a
  // writer that hangs.
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  for (int r : others_) {
    while (ctl_[r]->writing_to.load(std::memory_order_seq_cst) == me && !waiter_.exited(r)) {
      if (std::chrono::steady_clock::now() >= deadline) {
        SHOAL_LOG(warn, "rank %d still writes into rank %d's buffer %.0f s after rank %d's op failed", r, rank_,
                  std::chrono::duration<double>(timeout_).count(), rank_);
        return;
      }
      sched_yield();
    }
  }
}

}  // namespace shoal
