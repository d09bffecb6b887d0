// The handle of an op submitted to a communicator.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <thread>

namespace shoal {

class Work;

// For the core: what a pending Work asks of the communicator that queued it. Both are called at
// most once per Work, and never after it finished.
class WorkDriver {
 public:
  // By the first unbounded wait(): run the op (and the ops queued before it) on the waiting
  // thread if no other thread runs ops, so that a caller who waits at once needs no hand-off.
  virtual void help(const Work* w) = 0;
  // By the first run_async(), test() or bounded wait(): start the op on the progress thread now.
  virtual void kick() = 0;

 protected:
  ~WorkDriver() = default;
};

class Work {
 public:
  explicit Work(std::string name, WorkDriver* driver = nullptr) : name_(std::move(name)), driver_(driver) {}
  // Blocks until the op completes or `timeout` passes. Returns true once complete; false if it is
  // still pending at `timeout`. Throws the op's error if it failed. (Every op also has the group's
  // deadline, so an op never stays pending forever.)
  // An unbounded wait on a collective still queued runs it (and the collectives queued before
  // it) on the calling thread.
  bool wait(std::chrono::milliseconds timeout = std::chrono::milliseconds::max());
  bool test() const;                 // complete (successfully or not), without blocking
  // For a caller that will not wait for the op soon (it consumes the result through a callback,
  // or computes meanwhile): starts it on the communicator's progress thread now. Without it, a
  // collective nobody waits for starts by itself within 1-8 ms (Communicator).
  // test() and a wait with a timeout do the same.
  void run_async() const;
  std::exception_ptr error() const;  // null while pending or on success
  const std::string& name() const { return name_; }
  // The rank a completed recv received from (for Communicator::kAnySource); -1 otherwise.
  int source() const { return source_.load(); }
  void set_source(int r) { source_.store(r); }  // for the core
  // Called once when the op finishes, on the thread that finished it (or at once, here, if it
  // has finished). One callback per Work. An exception it throws is logged, not propagated.
  void on_complete(std::function<void()> fn);

  // For the core: mark the op finished (err null on success).
  void finish(std::exception_ptr err);
  // For the core, by the thread that submits the op, at most once, before the Work reaches
  // another thread: if the op's first unbounded wait() comes from this thread, and the thread
  // has not blocked in between (a sleep, I/O), the wait notes the CPU time the thread used in
  // between, whether or not the op had finished by then (time off the CPU, preempted or yielded,
  // does not count). cpu_before_wait() gives it; negative until then, or if another thread
  // waits, or the thread blocked. test() and bounded waits do not count.
  void time_wait();
  std::chrono::nanoseconds cpu_before_wait() const;

 private:
  void kick_once() const;
  bool first_wait();  // marks kWaited (and notes cpu_before_wait, if timed); true the first time

  bool done() const;

  std::string name_;
  WorkDriver* const driver_;
  mutable std::atomic<uint8_t> asked_{0};  // kWaited, kKicked, kTimed (work.cpp)
  std::thread::id timed_thread_;  // by time_wait(): the thread, its CPU time, its blocking sleeps
  int64_t timed_cpu_us_ = 0;
  long timed_blocked_ = 0;
  std::atomic<int64_t> cpu_before_wait_ns_{-1};
  // kFinishing, kDone, kCallback (work.cpp); the word waiters sleep on. No lock: an op's fixed cost
  // is a few atomic operations, and nothing is woken unless a thread sleeps (waiters_).
  std::atomic<uint32_t> state_{0};
  std::atomic<uint32_t> waiters_{0};
  std::exception_ptr error_;  // written before kDone, read after it
  std::function<void()> callback_;
  std::atomic<int> source_{-1};
};

}  // namespace shoal
