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
  // Blocks until the op completes or `timeout` passes. Returns true once complete; false if it is
  // still pending at `timeout`. Throws the op's error if it failed. (Every op also has the group's
  // deadline, so an op never stays pending forever.)
  bool wait(std::chrono::milliseconds timeout = std::chrono::milliseconds::max());
  bool test() const;                 // complete (successfully or not), without blocking
  std::exception_ptr error() const;  // null while pending or on success
  const std::string& name() const { return name_; }
  // The rank a completed recv received from (for Communicator::kAnySource); -1 otherwise.
  int source() const { return source_.load(); }
  void set_source(int r) { source_.store(r); }  // for the core
  // Called once when the op finishes, on the progress thread (or at once if already finished).
  void on_complete(std::function<void()> fn);

  // For the core: mark the op finished (err null on success).
  void finish(std::exception_ptr err);
  // For the core: called once by the first wait() on a pending op, so that a caller who waits
  // right away can run the op on its own thread instead of handing it to the progress thread.
  void set_helper(std::function<void()> help);

 private:
  std::string name_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  std::function<void()> callback_;
  std::function<void()> helper_;
  std::atomic<int> source_{-1};
};

}  // namespace shoal
