// Scratch buffers of a communicator, kept across ops so that steady-state ops allocate nothing.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "shoal/error.h"

namespace shoal {

class Scratch {
 public:
  static constexpr int kBuffers = 4;
  uint8_t* get(size_t bytes, int index) {
    if (index < 0 || index >= kBuffers) throw Error("internal error: scratch index out of range");
    auto& b = bufs_[index];
    if (b.size < bytes) {
      size_t n = (bytes + 4095) / 4096 * 4096;
      void* p = std::aligned_alloc(64, n);
      if (!p) throw Error("out of memory allocating " + std::to_string(n) + " bytes of scratch");
      b.ptr.reset(static_cast<uint8_t*>(p));
      b.size = n;
    }
    return b.ptr.get();
  }

 private:
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  struct Buf {
    std::unique_ptr<uint8_t, Free> ptr;
    size_t size = 0;
  };
  Buf bufs_[kBuffers];
};

}  // namespace shoal
