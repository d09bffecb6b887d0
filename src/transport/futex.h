// Futex wait/wake on a 32-bit word in memory shared between processes (no FUTEX_PRIVATE_FLAG).
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>

namespace shoal {

// Sleeps while *word == expected, at most `timeout`. Returns on wake, change, timeout or signal.
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::microseconds timeout);
void futex_wake_all(std::atomic<uint32_t>* word);

}  // namespace shoal
