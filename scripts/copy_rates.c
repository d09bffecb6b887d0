// One core's copy rate by memcpy and by non-temporal stores, for copies of 1-64 MiB repeated into
// the same destination (as an op writes its output call after call): where the cache keeps the
// destination, ordinary stores need no trip to memory for it; past that, non-temporal stores save
// the read of every destination line (BENCHMARKS.md, "The 2-rank allgather's own block on Intel").
//
//   gcc -O2 -mavx2 -o /tmp/copy_rates scripts/copy_rates.c && /tmp/copy_rates
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void copy_nt(uint8_t* d, const uint8_t* s, size_t n) {  // n a multiple of 128, d 32-aligned
  for (size_t i = 0; i < n; i += 128)
    for (size_t k = 0; k < 128; k += 32)
      _mm256_stream_si256((__m256i*)(d + i + k), _mm256_loadu_si256((const __m256i*)(s + i + k)));
  _mm_sfence();
}

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

int main(void) {
  printf("# MiB  memcpy GB/s  non-temporal GB/s  (best of 20 copies each, after one untimed)\n");
  for (size_t mib = 1; mib <= 64; mib *= 2) {
    const size_t n = mib << 20;
    uint8_t* s = aligned_alloc(4096, n);
    uint8_t* d = aligned_alloc(4096, n);
    memset(s, 1, n);
    memset(d, 2, n);
    double best[2] = {1e30, 1e30};
    for (int way = 0; way < 2; ++way)
      for (int i = 0; i <= 20; ++i) {
        const double t0 = now_us();
        if (way == 0) memcpy(d, s, n);
        else copy_nt(d, s, n);
        const double us = now_us() - t0;
        if (i > 0 && us < best[way]) best[way] = us;
      }
    printf("%6zu  %11.2f  %17.2f\n", mib, n / best[0] / 1e3, n / best[1] / 1e3);
    free(s);
    free(d);
  }
  return 0;
}
