// The copies of the data paths.
//
// copy_bytes is every ordinary copy of the shared-memory transport and algorithms. glibc's memmove
// copies from about 2 KiB to the L2's size with `rep movsb`, and so does the kernel's copy to and
// from user memory (process_vm_readv/writev) at every size; on our AMD EPYC (Zen 4) that instruction
// runs 5-25x slower when the destination lies 1-15 bytes past the source modulo a 4 KiB page
// (glibc bug 30994; BENCHMARKS.md, "Copies a few bytes apart in their pages"). Such distances
// come from buffers at arbitrary offsets (a block of 1,025 floats, a tensor view), so copy_bytes
// takes a vector loop there, and on AMD single-copy transfers go through a buffer placed at the
// peer's offset (transport/cma.cpp).
//
// copy_streaming is for results the caller will not read back at once: large outputs of the
// shared-memory algorithms. Non-temporal stores skip the read-for-ownership of every destination
// line, which on this class of machine doubles copy throughput once the data no longer fits in
// cache (BENCHMARKS.md, "Non-temporal copies").
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace shoal {

// Copies from this length to kShortDistanceUntil take `rep movsb` in glibc 2.36 on our AMD EPYC.
inline constexpr size_t kShortDistanceFrom = 2048;
// From this length glibc's memmove copies by a loop that is as fast at any distance (its L2's
// size on our AMD EPYC), and faster than copy_bytes' loop from 2 MiB.
inline constexpr size_t kShortDistanceUntil = size_t(1) << 20;

// Whether dst lies 1-15 bytes past src modulo a 4 KiB page.
inline bool short_page_distance(const void* dst, const void* src) {
  const uintptr_t d = (reinterpret_cast<uintptr_t>(dst) - reinterpret_cast<uintptr_t>(src)) & 4095;
  return d - 1 < 15;
}

// copy_bytes for the lengths and distances above (and any other, by memmove).
void copy_short_distance(void* dst, const void* src, size_t n);

// Whether single-copy transfers at such distances go through a buffer: on AMD CPUs (where the
// kernel's copy was measured slow there), at a SIMD level at which copy_short_distance takes its
// vector loop. Test-only: set_bounce_for_testing(1 or 0) forces the answer, -1 goes back.
bool bounce_short_distances();
void set_bounce_for_testing(int forced);

// dst = src (n bytes; the two may overlap, as with memmove) with ordinary stores.
inline void copy_bytes(void* dst, const void* src, size_t n) {
  if (n >= kShortDistanceFrom && short_page_distance(dst, src)) return copy_short_distance(dst, src, n);
  if (n && dst != src) std::memmove(dst, src, n);
}

// Outputs at least this large (the whole op's output, bytes; the 2-rank single-copy allgather
// compares its own block, with a larger size on Intel: direct_allgather.cpp) are written with
// copy_streaming, and so are smaller ones where the host's ranks write enough together
// (output_copy, algo/common.h); an allreduce's output in place, up to kInPlaceCachedBytes in all,
// is not (direct_allreduce.cpp).
inline constexpr size_t kStreamingOutputBytes = size_t(8) << 20;

// copy_streaming copies shorter than this with ordinary stores (copy_streaming_from takes another
// length).
inline constexpr size_t kStreamingMinBytes = 4096;

// dst = src (n bytes, no overlap) with non-temporal stores where the kernel level in use
// (reduce.h: the CPU's, or SHOAL_SIMD) has them, from kStreamingMinBytes; ends with a store fence
// so the data is visible to other processes like an ordinary store.
void copy_streaming(void* dst, const void* src, size_t n);
// copy_streaming with non-temporal stores from `from` bytes (at least 64).
void copy_streaming_from(size_t from, void* dst, const void* src, size_t n);

}  // namespace shoal
