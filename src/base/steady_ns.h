// The steady clock in nanoseconds, for the rules that judge by how long things took or how far
// apart they came (transport/stores.h, algo/slot_places.h).
#pragma once
#include <chrono>
#include <cstdint>

namespace shoal {

inline uint64_t steady_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

}  // namespace shoal
