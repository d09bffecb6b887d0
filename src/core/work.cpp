#include "shoal/work.h"

#include <sys/resource.h>

#include <algorithm>

#include "base/log.h"
#include "transport/futex.h"

namespace shoal {
namespace {
// asked_: an unbounded wait() began (help() asked once, if the op had not finished);
// run_async(), test() or a bounded wait() began (kick() asked once); time_wait() was called.
constexpr uint8_t kWaited = 1, kKicked = 2, kTimed = 4;
// This thread's CPU time (µs) and how often it has blocked (voluntary context switches: a sleep,
// I/O, a futex wait; not a preemption or a yield).
struct ThreadUsage {
  int64_t cpu_us = 0;
  long blocked = 0;
};
ThreadUsage thread_usage() {
  rusage ru{};
  getrusage(RUSAGE_THREAD, &ru);
  auto us = [](const timeval& t) { return int64_t(t.tv_sec) * 1000000 + t.tv_usec; };
  return {us(ru.ru_utime) + us(ru.ru_stime), ru.ru_nvcsw};
}
// state_: finish() has begun (only the first call goes on); the op is done (error_ is final);
// on_complete() has stored callback_. Whichever of finish() and on_complete() sets its bit second
// runs the callback.
constexpr uint32_t kFinishing = 1, kDone = 2, kCallback = 4;
// A sleeping waiter looks again at least this often (the wake is the normal way out).
constexpr std::chrono::microseconds kMaxSleep{100000};
}  // namespace

bool Work::done() const { return state_.load(std::memory_order_acquire) & kDone; }

bool Work::wait(std::chrono::milliseconds timeout) {
  const bool unbounded = timeout == std::chrono::milliseconds::max();
  if (!done()) {
    if (!unbounded) {
      kick_once();
    } else if (driver_ && first_wait()) {
      driver_->help(this);  // an unbounded wait on a queued op may run it on this thread
    }
  } else if (unbounded && (asked_.load(std::memory_order_relaxed) & kTimed)) {
    first_wait();  // the op ran on another thread before its caller waited: that wait counts too
  }
  if (!done()) {
    const auto deadline = unbounded ? std::chrono::steady_clock::time_point::max() : std::chrono::steady_clock::now() + timeout;
    waiters_.fetch_add(1, std::memory_order_seq_cst);  // pairs with finish(): it wakes, or we see kDone
    for (uint32_t s; !((s = state_.load(std::memory_order_seq_cst)) & kDone);) {
      auto left = kMaxSleep;
      if (!unbounded) {
        left = std::min(left, std::chrono::duration_cast<std::chrono::microseconds>(deadline - std::chrono::steady_clock::now()));
        if (left.count() <= 0) {
          waiters_.fetch_sub(1);
          return false;
        }
      }
      futex_wait(&state_, s, left);
    }
    waiters_.fetch_sub(1);
  }
  if (error_) std::rethrow_exception(error_);
  return true;
}

bool Work::first_wait() {
  const uint8_t asked = asked_.fetch_or(kWaited);
  if (asked & kWaited) return false;
  if ((asked & kTimed) && timed_thread_ == std::this_thread::get_id()) {
    const ThreadUsage now = thread_usage();
    if (now.blocked == timed_blocked_)
      cpu_before_wait_ns_.store((now.cpu_us - timed_cpu_us_) * 1000, std::memory_order_relaxed);
  }
  return true;
}

void Work::time_wait() {
  timed_thread_ = std::this_thread::get_id();
  const ThreadUsage now = thread_usage();
  timed_cpu_us_ = now.cpu_us;
  timed_blocked_ = now.blocked;
  asked_.fetch_or(kTimed, std::memory_order_release);
}

std::chrono::nanoseconds Work::cpu_before_wait() const {
  return std::chrono::nanoseconds(cpu_before_wait_ns_.load(std::memory_order_relaxed));
}

bool Work::test() const {
  kick_once();
  return done();
}

void Work::run_async() const { kick_once(); }

void Work::kick_once() const {
  if (done() || !driver_ || (asked_.fetch_or(kKicked) & kKicked)) return;
  driver_->kick();
}

std::exception_ptr Work::error() const { return done() ? error_ : nullptr; }

void Work::on_complete(std::function<void()> fn) {
  if (done()) return fn();  // a completed Work may be shared (blocking calls): it is not written
  callback_ = std::move(fn);
  if (state_.fetch_or(kCallback, std::memory_order_acq_rel) & kDone) {
    auto cb = std::move(callback_);
    cb();
  }
}

void Work::finish(std::exception_ptr err) {
  if (state_.fetch_or(kFinishing, std::memory_order_acq_rel) & kFinishing) return;
  error_ = std::move(err);
  const uint32_t before = state_.fetch_or(kDone, std::memory_order_seq_cst);
  if (waiters_.load(std::memory_order_seq_cst) != 0) futex_wake_all(&state_);
  if (before & kCallback) {
    auto cb = std::move(callback_);
    try {
      cb();
    } catch (const std::exception& e) {  // the thread that finishes ops must go on
      SHOAL_LOG(error, "%s: an on_complete callback threw: %s", name_.c_str(), e.what());
    } catch (...) {
      SHOAL_LOG(error, "%s: an on_complete callback threw", name_.c_str());
    }
  }
}

}  // namespace shoal
