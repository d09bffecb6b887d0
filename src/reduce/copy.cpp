#include "reduce/copy.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

#include "reduce/kernels.h"

namespace shoal {
namespace {

__attribute__((target("avx2"))) void copy_nt_avx2(uint8_t* d, const uint8_t* s, size_t n) {
  size_t head = (32 - (reinterpret_cast<uintptr_t>(d) & 31)) & 31;
  if (head > n) head = n;
  std::memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32));
    __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 64));
    __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 96), e);
  }
  for (; i + 32 <= n; i += 32)
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i)));
  _mm_sfence();
  std::memcpy(d + i, s + i, n - i);
}

// n >= 64 bytes, no overlap: unaligned loads, stores aligned to 32 bytes after the first.
__attribute__((target("avx2"))) void copy_avx2(uint8_t* d, const uint8_t* s, size_t n) {
  const __m256i first = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s));
  const __m256i last = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + n - 32));
  size_t i = 32 - (reinterpret_cast<uintptr_t>(d) & 31);
  for (; i + 128 <= n; i += 128) {
    __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32));
    __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 64));
    __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 96));
    _mm256_store_si256(reinterpret_cast<__m256i*>(d + i), a);
    _mm256_store_si256(reinterpret_cast<__m256i*>(d + i + 32), b);
    _mm256_store_si256(reinterpret_cast<__m256i*>(d + i + 64), c);
    _mm256_store_si256(reinterpret_cast<__m256i*>(d + i + 96), e);
  }
  for (; i + 32 <= n; i += 32)
    _mm256_store_si256(reinterpret_cast<__m256i*>(d + i), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(d), first);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + n - 32), last);
}

}  // namespace

void copy_short_distance(void* dst, const void* src, size_t n) {
  const auto d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(src);
  const bool apart = (d > s ? d - s : s - d) >= n;
  if (apart && n >= 64 && n < kShortDistanceUntil && reduce_impl::current_level() >= reduce_impl::SimdLevel::avx2) {
    copy_avx2(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), n);
    return;
  }
  if (n && dst != src) std::memmove(dst, src, n);
}

namespace {
std::atomic<int> bounce_forced{-1};
}  // namespace

bool bounce_short_distances() {
  const int forced = bounce_forced.load(std::memory_order_relaxed);
  if (forced >= 0) return forced == 1;
#if defined(__x86_64__) || defined(__i386__)
  static const bool amd = [] {
    __builtin_cpu_init();
    return __builtin_cpu_is("amd");
  }();
  return amd && reduce_impl::current_level() >= reduce_impl::SimdLevel::avx2;
#else
  return false;
#endif
}

void set_bounce_for_testing(int forced) { bounce_forced.store(forced, std::memory_order_relaxed); }

// The kernel level decides, so that SHOAL_SIMD=scalar also runs (and tests) the plain copy of a
// CPU without AVX2.
void copy_streaming(void* dst, const void* src, size_t n) { copy_streaming_from(kStreamingMinBytes, dst, src, n); }

void copy_streaming_from(size_t from, void* dst, const void* src, size_t n) {
  if (n == 0) return;  // src may be null
  if (n < std::max<size_t>(from, 64) || reduce_impl::current_level() < reduce_impl::SimdLevel::avx2) {
    copy_bytes(dst, src, n);
    return;
  }
  copy_nt_avx2(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), n);
}

}  // namespace shoal
