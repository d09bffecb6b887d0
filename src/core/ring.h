// A FIFO over a power-of-two ring that allocates only when it grows. The communicator's op queue:
// std::deque allocates and frees a node every few elements of an op's size.
#pragma once
#include <cstddef>
#include <utility>
#include <vector>

namespace shoal {

template <class T>
class Ring {
 public:
  bool empty() const { return n_ == 0; }
  size_t size() const { return n_; }
  T& front() { return buf_[head_]; }
  const T& operator[](size_t i) const { return buf_[(head_ + i) & (buf_.size() - 1)]; }
  void push_back(T&& v) {
    if (n_ == buf_.size()) grow();
    buf_[(head_ + n_) & (buf_.size() - 1)] = std::move(v);
    ++n_;
  }
  T pop_front() {
    T v = std::move(buf_[head_]);
    head_ = (head_ + 1) & (buf_.size() - 1);
    --n_;
    return v;
  }
  void swap(Ring& o) noexcept {
    buf_.swap(o.buf_);
    std::swap(head_, o.head_);
    std::swap(n_, o.n_);
  }

 private:
  void grow() {
    std::vector<T> b(buf_.empty() ? 8 : 2 * buf_.size());
    for (size_t i = 0; i < n_; ++i) b[i] = std::move(buf_[(head_ + i) & (buf_.size() - 1)]);
    buf_.swap(b);
    head_ = 0;
  }
  std::vector<T> buf_;
  size_t head_ = 0, n_ = 0;
};

}  // namespace shoal
