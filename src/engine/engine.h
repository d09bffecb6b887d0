// The engine progresses every link of a communicator and decides how a waiting rank waits:
// poll briefly, then sleep on the rank's futex doorbell (shm peers ring it when they write or
// free ring space) or on the epoll fd of its TCP sockets. It also watches the peers (a same-host
// peer that dies is seen through its pidfd; a TCP peer through its socket), enforces the op's
// deadline and carries the communicator's abort state.
#pragma once
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/call.h"
#include "transport/link.h"
#include "transport/waiter.h"

namespace shoal {

struct ShmControl;
using Clock = std::chrono::steady_clock;

class Engine final : public Waiter {
 public:
  Engine(int rank, int size, std::string group);
  ~Engine();

  const int rank;
  const int size;
  const std::string group;

  // Set-up (before any op): the links, this rank's control block (null if it has no shared
  // segment), the same-host peers' control blocks and pids.
  void set_links(std::vector<std::unique_ptr<Link>> links);
  void set_shm(ShmControl* self, std::vector<ShmControl*> peers);
  // How a wait spends its time: polls first where the group's `ranks` on this machine have a CPU
  // each of the `cpus` they may run on between them, hands the CPU over at once where they do
  // not. Until called (the rendezvous), as for the whole group on this thread's CPUs.
  void set_cpus(int ranks, int cpus);
  int epoll_fd() const { return epfd_; }
  Link* link(int peer) const { return links_[peer].get(); }

  // The op now running: its name and deadline, used in errors. With a timeout instead, the
  // deadline counts from the op's first wait (a wait reads the clock anyway; an op that never
  // waits then reads it not at once).
  void begin_op(const char* what, Clock::time_point deadline);
  void begin_op(const char* what, std::chrono::milliseconds timeout) {
    what_ = what;
    timeout_ = timeout;
  }

  void post(Request* r);
  // Progress until every request in [reqs, reqs+n) completes. Throws PeerError or Timeout; on
  // either the engine is aborted first (every peer is told).
  void wait(Request* const* reqs, size_t n);
  // Wait until `done()` holds, progressing links meanwhile (the shm barrier's progress is in
  // shared memory rather than in links: it waits through Waiter). `waiting_for` names peers for
  // errors.
  void wait_until(bool (*done)(void*), void* arg, const std::vector<int>& waiting_for) override {
    wait_loop(waiting_for, done, arg);
  }
  // One progress pass over every busy link; true if anything moved. Throws like wait().
  bool poll();
  void wake();  // from any thread: interrupt sleep()

  // Fails the communicator: every later wait throws PeerError(reason); peers are told.
  void abort(const std::string& reason) noexcept;
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  // Closes every link, so remote peers see this rank leave at once. Only on the thread that
  // progresses the links (the progress thread); idempotent.
  void close_links() noexcept;
  std::string abort_reason() const;
  [[noreturn]] void throw_aborted();

  // Throws PeerError if a same-host peer's process has exited or aborted.
  void check_peers();
  // Whether same-host peer r's process has exited (its pidfd is readable); false for others.
  bool exited(int r) const override;
  // Fails the op because of `peer` (aborting this rank, closing links): the message leads to
  // the reason the peer published, if any.
  [[noreturn]] void fail_peer(int peer, const std::string& what) override;

  // The call this rank runs now (the communicator's description of it), kept where same-host
  // peers read it (the control block, if this rank has one); and a same-host peer's (seq 0 if r
  // has no shared control block). set_call is for the thread that owns the engine; call() may be
  // read from any thread (an abort from another thread publishes it).
  void set_call(const CallRecord& c) noexcept {
    call_words_[0].store(c.seq, std::memory_order_relaxed);
    call_words_[1].store(c.what, std::memory_order_relaxed);
    call_words_[2].store(c.count, std::memory_order_relaxed);
    call_words_[3].store(c.tag, std::memory_order_relaxed);
  }
  CallRecord call() const { return load_call(call_words_); }
  CallRecord shm_call(int r) const;
  // Fails the op because `peer` is in a different call: the message quotes both calls (the
  // peer's read from its control block on this host, or, from another host, what it published
  // when it failed in turn: peer_calls), then as fail_peer.
  [[noreturn]] void fail_mismatch(int peer, const std::string& what);
  // Set by the communicator: a call in words, and the words peers on another host published for
  // their calls when they failed (by peer; "" where none did in time).
  std::function<std::string(const CallRecord&)> describe_call;
  std::function<std::vector<std::string>(const std::vector<int>&)> peer_calls;

  // Hooks to the store, set by the communicator: publish this rank's abort reason (called once,
  // before the links close, so a peer that sees the connection drop can learn why), and look up
  // the reason a peer published (empty if none), so errors name the rank that failed first.
  std::function<void(const std::string&)> publish_abort;
  std::function<std::string(int)> peer_abort_reason;
  // Transport work that no posted request drives (accepting the TCP connections peers dial),
  // called on every progress pass; returns true if anything moved. Set at set-up.
  std::function<bool()> background;

 private:
  // `waiting_for` names the peers whose death or abort fails the wait (and the timeout's
  // message); `refresh`, if given, recomputes it before each look at the peers, so that a peer
  // whose requests have all completed may exit without failing the wait. `may_yield` false skips
  // the yield phase: after polling the waiter sleeps at once (see one_way_bulk in engine.cpp).
  void wait_loop(std::vector<int> waiting_for, bool (*done)(void*), void* arg,
                 void (*refresh)(void*, std::vector<int>&) = nullptr, bool may_yield = true);
  // Whether the incomplete requests among reqs[0, n) all go one way over TCP and still have at
  // least kBulkBytes to move (engine.cpp says why such a wait does not yield).
  bool one_way_bulk(Request* const* reqs, size_t n) const;
  // Sleeps until news may have arrived, at most `max`: a peer rang the doorbell, a socket became
  // ready, wake() was called, or time passed. Returns at once if done() already holds.
  void sleep(std::chrono::microseconds max, bool (*done)(void*), void* arg);
  [[noreturn]] void fail_timeout(const std::vector<int>& waiting_for);
  // For the errors of a mismatch or a timeout: appends this rank's call and those of `peers` on
  // this host (the first kQuotedPeers of them) to `msg`, and returns the others; after the abort
  // (which fails those peers in turn, and they publish their calls) add_published_calls appends
  // theirs.
  static constexpr size_t kQuotedPeers = 3;
  std::vector<int> add_calls(std::string& msg, const std::vector<int>& peers) const;
  void add_published_calls(std::string& msg, const std::vector<int>& remote) const;
  // Why same-host peer `r` can no longer take part (it aborted, destroyed its communicator or
  // exited), or "" while it can.
  std::string gone_reason(int r) const;
  // The CPU this thread runs on, published in this rank's control block (-1 where unknown or
  // without one), and whether one of `peers` last published the same.
  int publish_cpu() noexcept;
  bool peer_on_cpu(const std::vector<int>& peers, int cpu) const noexcept;
  // Moves this thread off `cpu` where cpu_to_move_to says (base/cpus.h); whether it moved.
  bool move_off(int cpu);
  unsigned shared_cpu_looks_ = 0;  // looks in a row that found a peer on this rank's CPU
  Clock::time_point moved_at_;

  std::vector<std::unique_ptr<Link>> links_;
  std::vector<Link*> busy_;  // scratch list for poll()
  ShmControl* self_ = nullptr;
  std::vector<ShmControl*> peer_ctl_;  // by rank, null where not shm
  std::vector<int> pidfds_;            // by rank, -1 where not shm
  int epfd_ = -1;
  int wakefd_ = -1;  // eventfd in epfd_
  std::atomic<uint32_t> local_bell_{0};  // doorbell when this rank has no shared segment
  bool any_fd_ = false;  // a link wakes waiters through the epoll set (Link::wakes_by)
  const char* what_ = "op";
  Clock::time_point deadline_;
  std::chrono::milliseconds timeout_{0};  // > 0: deadline_ is set by the op's first wait
  std::chrono::microseconds spin_;
  std::chrono::microseconds yield_;
  Clock::time_point last_check_;
  // This rank's `sleeping` flag is up (sleep() raised it; it comes down when a peer rings or the
  // wait ends), and since when.
  bool raised_ = false;
  Clock::time_point raised_at_;
  void lower_sleeping() noexcept;
  static CallRecord load_call(const std::atomic<uint64_t>* w);
  std::atomic<uint64_t> own_call_[4] = {};
  std::atomic<uint64_t>* call_words_ = own_call_;  // own_call_, or the control block's
  std::atomic<bool> aborted_{false};
  mutable std::mutex reason_mu_;
  std::string reason_;
};

}  // namespace shoal
