#include "shoal/work.h"

namespace shoal {

bool Work::wait(std::chrono::milliseconds timeout) {
  if (timeout != std::chrono::milliseconds::max()) kick_once();
  std::unique_lock<std::mutex> lk(mu_);
  if (!done_ && helper_ && timeout == std::chrono::milliseconds::max()) {  // an unbounded wait may run the op itself
    auto help = std::move(helper_);
    helper_ = nullptr;
    lk.unlock();
    help(this);
    lk.lock();
  }
  if (timeout == std::chrono::milliseconds::max()) {
    cv_.wait(lk, [&] { return done_; });
  } else if (!cv_.wait_for(lk, timeout, [&] { return done_; })) {
    return false;
  }
  if (error_) std::rethrow_exception(error_);
  return true;
}

bool Work::test() const {
  kick_once();
  std::lock_guard<std::mutex> lk(mu_);
  return done_;
}

void Work::run_async() const { kick_once(); }

void Work::kick_once() const {
  std::function<void()> kick;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (done_ || !kick_) return;
    kick = std::move(kick_);
    kick_ = nullptr;
  }
  kick();
}

std::exception_ptr Work::error() const {
  std::lock_guard<std::mutex> lk(mu_);
  return error_;
}

void Work::on_complete(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!done_) {
      callback_ = std::move(fn);
      return;
    }
  }
  fn();
}

void Work::finish(std::exception_ptr err) {
  std::function<void()> cb;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (done_) return;
    done_ = true;
    error_ = err;
    cb = std::move(callback_);
    helper_ = nullptr;
    kick_ = nullptr;
  }
  cv_.notify_all();
  if (cb) cb();
}

}  // namespace shoal
