// One core's copy rate by glibc's memcpy and by non-temporal stores (32-byte AVX2 ones, and
// 64-byte AVX-512 ones where the CPU has them), for copies of 1-128 MiB repeated into the same
// destination, as an op writes its output call after call. Where the cache keeps the destination,
// memcpy's ordinary stores need no trip to memory for it; past that, non-temporal stores save the
// read of every destination line. glibc's memcpy turns to non-temporal stores itself above a
// threshold of its own (BENCHMARKS.md, "The 2-rank allgather's own block on Intel").
//
//   gcc -O2 -o /tmp/copy_rates scripts/copy_rates.c && /tmp/copy_rates
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// n a multiple of 256 and d 64-byte aligned (the buffers below are page-aligned).
__attribute__((target("avx2"))) static void copy_nt_avx2(uint8_t* d, const uint8_t* s, size_t n) {
  for (size_t i = 0; i < n; i += 32) _mm256_stream_si256((__m256i*)(d + i), _mm256_loadu_si256((const __m256i*)(s + i)));
  _mm_sfence();
}

__attribute__((target("avx512f"))) static void copy_nt_avx512(uint8_t* d, const uint8_t* s, size_t n) {
  for (size_t i = 0; i < n; i += 64) _mm512_stream_si512((__m512i*)(d + i), _mm512_loadu_si512(s + i));
  _mm_sfence();
}

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

int main(void) {
  const int ways = __builtin_cpu_supports("avx512f") ? 3 : 2;
  printf("#  MiB  memcpy GB/s  non-temporal AVX2 GB/s  non-temporal AVX-512 GB/s  (best of 20 copies each, after one untimed)\n");
  for (size_t mib = 1; mib <= 128; mib *= 2) {
    const size_t n = mib << 20;
    uint8_t* s = aligned_alloc(4096, n);
    uint8_t* d = aligned_alloc(4096, n);
    if (!s || !d) {
      fprintf(stderr, "copy_rates: no memory for %zu MiB\n", mib);
      return 1;
    }
    memset(s, 1, n);
    memset(d, 2, n);
    double best[3] = {1e30, 1e30, 1e30};
    for (int way = 0; way < ways; ++way)
      for (int i = 0; i <= 20; ++i) {
        const double t0 = now_us();
        if (way == 0) memcpy(d, s, n);
        else if (way == 1) copy_nt_avx2(d, s, n);
        else copy_nt_avx512(d, s, n);
        const double us = now_us() - t0;
        if (i > 0 && us < best[way]) best[way] = us;
      }
    printf("%6zu  %11.2f  %22.2f", mib, n / best[0] / 1e3, n / best[1] / 1e3);
    if (ways == 3) printf("  %25.2f", n / best[2] / 1e3);
    printf("\n");
    free(s);
    free(d);
  }
  return 0;
}
