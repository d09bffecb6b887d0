#include "engine/engine.h"

#include <poll.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "base/cpu_relax.h"
#include "base/cpus.h"
#include "base/log.h"
#include "base/params.h"
#include "shoal/error.h"
#include "transport/futex.h"
#include "transport/shm_segment.h"

namespace shoal {
namespace {
constexpr auto kPeerCheckEvery = std::chrono::milliseconds(50);
// A waiter reads the clock (for its spin, yield and deadline) once every this many idle polls.
constexpr unsigned kPollsPerClockRead = 8;
// Where the ranks have a CPU each, a waiter that has found a peer it waits for on its own CPU this
// many looks in a row (each a yield: tens of ops) tries to move to a free CPU (move_off), and moves
// at most once per kMoveEvery.
constexpr unsigned kSharedLooksBeforeMove = 64;
constexpr auto kMoveEvery = std::chrono::milliseconds(10);
constexpr auto kMaxSleep = std::chrono::milliseconds(20);
// How long after raising its `sleeping` flag a waiter sleeps at most: a peer that published its
// news just as the flag went up may have read it down and not rung (ShmControl::ring() has no fence), and
// that news is visible well within this.
constexpr auto kRaiseWindow = std::chrono::microseconds(100);
// A wait with at least this many bytes still to move over TCP, all one way, skips the yield
// phase (Engine::one_way_bulk).
constexpr size_t kBulkBytes = size_t(1) << 20;

// How long a waiter polls before it yields or sleeps. Ranks often outnumber cores: then a
// spinning waiter steals the core from the peer it waits for, so it yields at once (after the
// few polls of the wait's first rounds; BENCHMARKS.md, "Waiting when ranks outnumber cores").
// SHOAL_SPIN_US overrides.
std::chrono::microseconds spin_time(bool shares_cpus) {
  if (auto us = params::integer("SHOAL_SPIN_US")) return std::chrono::microseconds(*us);
  return std::chrono::microseconds(shares_cpus ? 0 : 50);
}

// After polling, a waiter whose ranks outnumber their CPUs yields its CPU for a while before it
// sleeps (SHOAL_YIELD_US overrides).
std::chrono::microseconds yield_time(bool shares_cpus) {
  if (auto us = params::integer("SHOAL_YIELD_US")) return std::chrono::microseconds(*us);
  return std::chrono::microseconds(shares_cpus ? 1000 : 0);
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}
}  // namespace

Engine::Engine(int rank_, int size_, std::string group_)
    : rank(rank_),
      size(size_),
      group(std::move(group_)),
      pidfds_(size_, -1) {
  set_cpus(size_, cpus_of_this_thread());
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  wakefd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epfd_ < 0 || wakefd_ < 0) throw Error(std::string("epoll/eventfd: ") + std::strerror(errno));
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLET;
  epoll_ctl(epfd_, EPOLL_CTL_ADD, wakefd_, &ev);
  peer_ctl_.assign(size, nullptr);
  links_.resize(size);
}

Engine::~Engine() {
  for (auto& l : links_)
    if (l) l->close();
  for (int fd : pidfds_)
    if (fd >= 0) close(fd);
  if (wakefd_ >= 0) close(wakefd_);
  if (epfd_ >= 0) close(epfd_);
}

void Engine::set_links(std::vector<std::unique_ptr<Link>> links) {
  links_ = std::move(links);
  links_.resize(size);
  any_fd_ = std::any_of(links_.begin(), links_.end(), [](auto& l) { return l && l->wakes_by() == Link::Wake::fd; });
}

void Engine::set_cpus(int ranks, int cpus) {
  spin_ = spin_time(ranks > cpus);
  yield_ = yield_time(ranks > cpus);
}

void Engine::set_shm(ShmControl* self, std::vector<ShmControl*> peers) {
  self_ = self;
  if (self_) call_words_ = self_->call;
  peer_ctl_ = std::move(peers);
  peer_ctl_.resize(size, nullptr);
  for (int r = 0; r < size; ++r) {
    if (!peer_ctl_[r] || r == rank) continue;
    pidfds_[r] = static_cast<int>(syscall(SYS_pidfd_open, peer_ctl_[r]->pid, 0));
    if (pidfds_[r] < 0) SHOAL_LOG(info, "pidfd_open(%d) failed: %s", peer_ctl_[r]->pid, std::strerror(errno));
  }
}

void Engine::begin_op(const char* what, Clock::time_point deadline) {
  what_ = what;
  deadline_ = deadline;
  timeout_ = std::chrono::milliseconds(0);
}

void Engine::post(Request* r) {
  if (r->peer < 0 || r->peer >= size || r->peer == rank || !links_[r->peer])
    throw Error(std::string(r->what) + ": internal error: no link to rank " + std::to_string(r->peer));
  links_[r->peer]->post(r);
}

bool Engine::poll() {
  bool moved = background && background();
  for (int r = 0; r < size; ++r) {
    Link* l = links_[r].get();
    if (!l || !l->busy()) continue;
    try {
      moved |= l->progress();
    } catch (const CallMismatch& e) {
      fail_mismatch(r, e.what());
    } catch (const PeerError& e) {
      fail_peer(r, e.what());
    }
  }
  return moved;
}

CallRecord Engine::load_call(const std::atomic<uint64_t>* w) {
  // Relaxed, word by word: a record read while its owner moves on may mix two calls' words, which
  // an error message can bear (the owner is usually stuck in the call it describes).
  return CallRecord{w[0].load(std::memory_order_relaxed), w[1].load(std::memory_order_relaxed),
                    w[2].load(std::memory_order_relaxed), w[3].load(std::memory_order_relaxed)};
}

CallRecord Engine::shm_call(int r) const {
  if (r < 0 || r >= size || !peer_ctl_[r]) return CallRecord{};
  return load_call(peer_ctl_[r]->call);
}

// A line of an error that quotes rank r's call.
static std::string called(int r, const std::string& what) { return "\n  rank " + std::to_string(r) + " called: " + what; }

std::vector<int> Engine::add_calls(std::string& msg, const std::vector<int>& peers) const {
  std::vector<int> remote;
  if (!describe_call) return remote;
  msg += called(rank, describe_call(call()));
  std::vector<int> quoted;  // each peer once, at most kQuotedPeers of them
  for (int r : peers)
    if (r >= 0 && r < size && r != rank && quoted.size() < kQuotedPeers &&
        std::find(quoted.begin(), quoted.end(), r) == quoted.end())
      quoted.push_back(r);
  for (int r : quoted) {
    if (peer_ctl_[r]) msg += called(r, describe_call(shm_call(r)));
    else remote.push_back(r);
  }
  return remote;
}

void Engine::add_published_calls(std::string& msg, const std::vector<int>& remote) const {
  if (remote.empty()) return;
  std::vector<std::string> texts;
  if (peer_calls) {
    try {
      texts = peer_calls(remote);
    } catch (...) {
    }
  }
  texts.resize(remote.size());
  for (size_t i = 0; i < remote.size(); ++i)
    msg += called(remote[i], texts[i].empty() ? "(not known: it did not say in time)" : texts[i]);
}

void Engine::fail_mismatch(int peer, const std::string& what) {
  if (aborted()) fail_peer(peer, what);
  std::string msg = what;
  const std::vector<int> remote = add_calls(msg, {peer});
  abort(msg);
  close_links();
  add_published_calls(msg, remote);  // they fail, and say, once this rank's links close
  throw PeerError(msg);
}

void Engine::fail_peer(int peer, const std::string& what) {
  // A peer that aborted first (its own peer died, a mismatch, a timeout) closes its links; say
  // what it saw, so that every rank's error leads to the rank that failed first.
  std::string msg = what;
  if (peer_abort_reason && !aborted()) {
    std::string why;
    try {
      why = peer_abort_reason(peer);
    } catch (...) {
    }
    if (!why.empty()) msg = std::string(what_) + " on group '" + group + "': rank " + std::to_string(peer) + " aborted: " + why;
  }
  // What this rank was running, unless the peer's reason says already (a mismatch it found).
  if (describe_call && call().seq != 0 && msg.find(called(rank, "")) == std::string::npos)
    msg += called(rank, describe_call(call()));
  abort(msg);
  close_links();
  throw PeerError(msg);
}

void Engine::close_links() noexcept {
  for (auto& l : links_)
    if (l) l->close();
}

void Engine::wake() {
  std::atomic<uint32_t>* bell = self_ ? &self_->doorbell : &local_bell_;
  bell->fetch_add(1, std::memory_order_seq_cst);
  futex_wake_all(bell);
  uint64_t one = 1;
  (void)!write(wakefd_, &one, sizeof one);
}

void Engine::sleep(std::chrono::microseconds max, bool (*done)(void*), void* arg) {
  std::atomic<uint32_t>* bell = self_ ? &self_->doorbell : &local_bell_;
  std::atomic<uint32_t> dummy{0};
  std::atomic<uint32_t>* sleeping = self_ ? &self_->sleeping : &dummy;
  if (!raised_) {  // up until a peer rings or the wait ends (wait_loop lowers it)
    sleeping->store(1, std::memory_order_seq_cst);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    raised_ = true;
    raised_at_ = Clock::now();
  }
  uint32_t snap = bell->load(std::memory_order_seq_cst);
  // Re-check after announcing sleep and taking the snapshot: news that arrived before the
  // snapshot is seen here; news after it changes the doorbell, so futex_wait returns at once.
  const bool ready = poll() || done(arg) || aborted();
  const auto since = Clock::now() - raised_at_;
  if (since < kRaiseWindow) max = std::min(max, std::chrono::ceil<std::chrono::microseconds>(kRaiseWindow - since));
  if (!ready) {
    if (any_fd_) {
      // A busy link that rings the doorbell cannot wake epoll: look again within a millisecond.
      bool bell_busy = false;
      for (auto& l : links_)
        if (l && l->busy() && l->wakes_by() == Link::Wake::doorbell) bell_busy = true;
      auto ms = bell_busy ? 1 : std::max<long>(1, std::chrono::duration_cast<std::chrono::milliseconds>(max).count());
      epoll_event evs[16];
      epoll_wait(epfd_, evs, 16, static_cast<int>(ms));
      uint64_t v;
      (void)!read(wakefd_, &v, sizeof v);
    } else {
      futex_wait(bell, snap, max);
    }
  }
  // Rung: the news is here, and until this rank sleeps again its peers need not ring (a system call
  // each). A sleep that timed out keeps the flag up, so a long wait sleeps long after the first.
  if (bell->load(std::memory_order_relaxed) != snap) lower_sleeping();
}

void Engine::lower_sleeping() noexcept {
  if (!raised_) return;
  if (self_) self_->sleeping.store(0, std::memory_order_relaxed);
  raised_ = false;
}

void Engine::wait(Request* const* reqs, size_t n) {
  struct Arg {
    Request* const* reqs;
    size_t n;
  } arg{reqs, n};
  auto done = [](void* p) {
    auto* a = static_cast<Arg*>(p);
    for (size_t i = 0; i < a->n; ++i)
      if (!a->reqs[i]->complete) return false;
    return true;
  };
  // The peers of the requests still incomplete: one that finished its part with this rank and
  // then left (destroyed its communicator) is no failure of the others.
  auto pending = [](void* p, std::vector<int>& peers) {
    auto* a = static_cast<Arg*>(p);
    peers.clear();
    for (size_t i = 0; i < a->n; ++i)
      if (!a->reqs[i]->complete && std::find(peers.begin(), peers.end(), a->reqs[i]->peer) == peers.end())
        peers.push_back(a->reqs[i]->peer);
  };
  if (done(&arg)) return;
  std::vector<int> peers;
  pending(&arg, peers);
  wait_loop(std::move(peers), done, &arg, pending, !one_way_bulk(reqs, n));
}

// The yield phase of a wait pays off when the peer's answer is a few microseconds away and may be
// queued behind this rank on its core, and when this rank's own sends move as the peer drains
// (exchanges: ring steps, all-to-all). A rank that only receives, or only sends, a large message
// over TCP (a scatter's or broadcast's leaves and root, a gather's) has nothing to do until the
// kernel has moved more of it, and epoll says exactly when; yielding meanwhile calls recv/send
// into EAGAIN and switches tasks thousands of times, taking the core from the rank that does the
// copies. So a one-way bulk transfer sleeps on epoll at once, and exchanges (allreduce,
// allgather, all-to-all), which measured slower without the yield phase, keep it (BENCHMARKS.md,
// "Waiting for one-way TCP transfers").
bool Engine::one_way_bulk(Request* const* reqs, size_t n) const {
  if (!any_fd_) return false;  // no socket links: no walk over the requests
  size_t left = 0;
  int dir = -1;
  for (size_t i = 0; i < n; ++i) {
    const Request* r = reqs[i];
    if (r->complete) continue;
    const Link* l = links_[r->peer].get();
    if (!l || !l->kernel_moves_bytes()) return false;
    if (dir >= 0 && dir != static_cast<int>(r->dir)) return false;
    dir = static_cast<int>(r->dir);
    left += r->bytes - r->done;
  }
  return left >= kBulkBytes;
}

void Engine::wait_loop(std::vector<int> waiting_for, bool (*done)(void*), void* arg,
                       void (*refresh)(void*, std::vector<int>&), bool may_yield) {
  const auto yield = may_yield ? yield_ : std::chrono::microseconds(0);
  struct Lower {  // the flag sleep() raised comes down however the wait ends
    Engine* e;
    ~Lower() { e->lower_sleeping(); }
  } lower{this};
  auto spin_start = Clock::now();
  if (timeout_.count() > 0) {
    deadline_ = spin_start + timeout_;
    timeout_ = std::chrono::milliseconds(0);
  }
  unsigned polls = 0;
  const bool watch_cpu = spin_.count() > 0;  // ranks with a CPU each: is a peer on this one?
  for (;;) {
    if (aborted()) throw_aborted();
    bool moved = poll();
    if (done(arg)) return;
    if (moved) {
      spin_start = Clock::now();
      continue;
    }
    // The answer is often a few polls away; a waiter that yields at once (ranks share cores)
    // reads the clock every time, as a yield costs far more.
    if (spin_.count() > 0 && ++polls % kPollsPerClockRead != 0) {
      cpu_relax();
      continue;
    }
    auto now = Clock::now();
    if (now - spin_start < spin_) {
      // A peer waited for on this rank's own CPU runs only once this rank lets it: yield to it.
      // The scheduler may put two ranks on one CPU while another is idle (an outside task wakes
      // on a rank's CPU, and the balancer moves the rank away) and leave them there for tens of
      // milliseconds: ranks that hand the CPU over keep it busy with one task at a time, and a
      // task that ran a moment ago counts as cache-hot. So after kSharedLooksBeforeMove such
      // looks in a row the highest rank there moves to a free CPU of its mask (move_off;
      // BENCHMARKS.md, "Two ranks on one CPU of two").
      const int cpu = watch_cpu ? publish_cpu() : -1;  // at every look: the scheduler moves threads
      if (cpu >= 0 && peer_on_cpu(waiting_for, cpu)) {
        if (++shared_cpu_looks_ >= kSharedLooksBeforeMove && now - moved_at_ >= kMoveEvery) {
          shared_cpu_looks_ = 0;  // one try per kSharedLooksBeforeMove looks, whether it moves or not
          if (move_off(cpu)) {
            moved_at_ = now;
            continue;
          }
        }
        sched_yield();
      } else {
        shared_cpu_looks_ = 0;
        cpu_relax();
      }
      continue;
    }
    if (now - spin_start < spin_ + yield) {
      // Ranks outnumber cores: the rank we wait for may be queued behind us on this core.
      // Yielding lets it run without the cost of a futex sleep and wake-up.
      sched_yield();
      continue;
    }
    if (refresh) refresh(arg, waiting_for);
    if (now >= deadline_) fail_timeout(waiting_for);
    if (now - last_check_ >= kPeerCheckEvery) {
      last_check_ = now;
      int gone = -1;
      std::string why;
      for (int r : waiting_for)
        if (!(why = gone_reason(r)).empty()) {
          gone = r;
          break;
        }
      if (gone >= 0) {
        // What the peer wrote before it left is visible now (its state store is a release and
        // our load an acquire; an exited process wrote everything it ever will). A peer that
        // finished its part of the op and left at once, between our last look and this one, is
        // no failure: progress once more and look again before failing.
        poll();
        if (done(arg)) return;
        if (refresh) refresh(arg, waiting_for);
        if (std::find(waiting_for.begin(), waiting_for.end(), gone) != waiting_for.end()) {
          abort(why);
          close_links();
          throw PeerError(why);
        }
      }
    }
    if (done(arg)) return;
    auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline_ - now);
    sleep(std::min<std::chrono::microseconds>(left, kMaxSleep), done, arg);
    spin_start = Clock::now() - spin_ + std::chrono::microseconds(spin_.count() / 4);  // short re-spin
  }
}

int Engine::publish_cpu() noexcept {
  const int cpu = sched_getcpu();  // cheap: glibc reads the thread's rseq area, else the vDSO
  if (cpu < 0 || !self_) return -1;
  const uint32_t v = static_cast<uint32_t>(cpu) + 1;
  if (self_->cpu.load(std::memory_order_relaxed) != v) self_->cpu.store(v, std::memory_order_relaxed);
  return cpu;
}

bool Engine::move_off(int cpu) {
  std::vector<unsigned> last_cpu(static_cast<size_t>(size), 0);
  for (int r = 0; r < size; ++r)
    if (peer_ctl_[r] && r != rank) last_cpu[static_cast<size_t>(r)] = peer_ctl_[r]->cpu.load(std::memory_order_relaxed);
  last_cpu[static_cast<size_t>(rank)] = static_cast<unsigned>(cpu) + 1;
  const int to = cpu_to_move_to(rank, cpu, last_cpu, allowed_cpus());
  if (to < 0 || !move_this_thread_to(to)) return false;
  SHOAL_LOG(debug, "rank %d moved from CPU %d, where a peer it waited for ran, to CPU %d", rank, cpu, to);
  return true;
}

bool Engine::peer_on_cpu(const std::vector<int>& peers, int cpu) const noexcept {
  const uint32_t v = static_cast<uint32_t>(cpu) + 1;
  for (int r : peers)
    if (r != rank && r >= 0 && r < size && peer_ctl_[r] && peer_ctl_[r]->cpu.load(std::memory_order_relaxed) == v) return true;
  return false;
}

std::string Engine::gone_reason(int r) const {
  if (r == rank || r < 0 || r >= size || !peer_ctl_[r]) return "";
  const ShmControl* c = peer_ctl_[r];
  if (c->state_of() != PeerState::alive) return std::string(what_) + " on group '" + group + "': " + c->aborted_message(r);
  if (exited(r))
    return std::string(what_) + " on group '" + group + "': rank " + std::to_string(r) + " (pid " +
           std::to_string(c->pid) + ") exited while this rank waited for it";
  return "";
}

bool Engine::exited(int r) const {
  if (r < 0 || r >= size || pidfds_[r] < 0) return false;
  pollfd p{pidfds_[r], POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;
}

void Engine::check_peers() {
  last_check_ = Clock::time_point{};  // force the next wait to look
}

void Engine::fail_timeout(const std::vector<int>& waiting_for) {
  std::string msg = std::string(what_) + " on group '" + group + "' (rank " + std::to_string(rank) + " of " +
                    std::to_string(size) + ") timed out waiting for rank(s) " + rank_list(waiting_for);
  for (int r : waiting_for)
    if (r >= 0 && r < size && links_[r])
      if (std::string why = links_[r]->stalled(); !why.empty()) msg += "; " + why;
  const std::vector<int> remote = add_calls(msg, waiting_for);
  abort(msg);
  close_links();
  add_published_calls(msg, remote);
  throw Timeout(msg);
}

void Engine::abort(const std::string& reason) noexcept {
  {
    std::lock_guard<std::mutex> lk(reason_mu_);
    if (aborted_.load()) return;
    reason_ = reason;
    // The state is set before aborted_: a thread that sees aborted() (or returns from abort() as
    // a second caller) knows that peers see it too. seq_cst: ordered before the loads of the
    // peers' writing_to in ShmGroup::quiesce_writes (a writer stores its writing_to, then loads
    // this state: ShmGroupImpl::transfer).
    if (self_) self_->leave(PeerState::aborted, reason, std::memory_order_seq_cst);
    aborted_.store(true, std::memory_order_release);
  }
  SHOAL_LOG(warn, "group '%s' aborted: %s", group.c_str(), reason.c_str());
  if (publish_abort) {
    try {
      publish_abort(reason);
    } catch (...) {  // the store may be gone with the peer that hosted it
    }
  }
  if (self_)
    for (auto* c : peer_ctl_)
      if (c && c != self_) c->ring();
  wake();
}

std::string Engine::abort_reason() const {
  std::lock_guard<std::mutex> lk(reason_mu_);
  return reason_;
}

void Engine::throw_aborted() {
  close_links();  // we are on the progress thread: tell remote peers now
  throw PeerError("group '" + group + "' is aborted: " + abort_reason());
}

}  // namespace shoal
