// The handle of an op submitted to a communicator.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <string>

namespace shoal {

class Work {
 public:
  explicit Work(std::string name) : name_(std::move(name)) {}
  // For the core: `help` is called once, by the first unbounded wait() on the pending op, so that
  // a caller who waits right away can run the op on its own thread instead of handing it to the
  // progress thread; `kick` once, by the first run_async(), test() or bounded wait().
  Work(std::string name, std::function<void(const Work*)> help, std::function<void()> kick)
      : name_(std::move(name)), helper_(std::move(help)), kick_(std::move(kick)) {}
  // Blocks until the op completes or `timeout` passes. Returns true once complete; false if it is
  // still pending at `timeout`. Throws the op's error if it failed. (Every op also has the group's
  // deadline, so an op never stays pending forever.)
  // An unbounded wait on a collective still queued runs it (and the collectives queued before
  // it) on the calling thread.
  bool wait(std::chrono::milliseconds timeout = std::chrono::milliseconds::max());
  bool test() const;                 // complete (successfully or not), without blocking
  // For a caller that will not wait for the op soon (it consumes the result through a callback,
  // or computes meanwhile): starts it on the communicator's progress thread now. Without it, a
  // collective nobody waits for starts by itself within about a millisecond (Communicator).
  // test() and a wait with a timeout do the same.
  void run_async() const;
  std::exception_ptr error() const;  // null while pending or on success
  const std::string& name() const { return name_; }
  // The rank a completed recv received from (for Communicator::kAnySource); -1 otherwise.
  int source() const { return source_.load(); }
  void set_source(int r) { source_.store(r); }  // for the core
  // Called once when the op finishes, on the progress thread (or at once if already finished).
  void on_complete(std::function<void()> fn);

  // For the core: mark the op finished (err null on success).
  void finish(std::exception_ptr err);

 private:
  void kick_once() const;

  std::string name_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  std::function<void()> callback_;
  std::function<void(const Work*)> helper_;
  mutable std::function<void()> kick_;
  std::atomic<int> source_{-1};
};

}  // namespace shoal
