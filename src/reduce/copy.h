// Copies for results the caller will not read back at once: large outputs of the shared-memory
// algorithms. Non-temporal stores skip the read-for-ownership of every destination line, which
// on this class of machine doubles copy throughput once the data no longer fits in cache
// (BENCHMARKS.md, "Non-temporal copies").
#pragma once
#include <cstddef>

namespace shoal {

// Outputs at least this large (the whole op's output, bytes; the 2-rank single-copy allgather
// compares its own block, with a larger size on Intel: direct_allgather.cpp) are written with
// copy_streaming.
inline constexpr size_t kStreamingOutputBytes = size_t(8) << 20;

// copy_streaming copies shorter than this with ordinary stores.
inline constexpr size_t kStreamingMinBytes = 4096;

// dst = src (n bytes, no overlap) with non-temporal stores where the kernel level in use
// (reduce.h: the CPU's, or SHOAL_SIMD) has them, from kStreamingMinBytes; ends with a store fence
// so the data is visible to other processes like an ordinary store.
void copy_streaming(void* dst, const void* src, size_t n);

}  // namespace shoal
