// One core's copy rate by the distance between destination and source within a 4 KiB page
// ((dst - src) mod 4096), for glibc's memcpy and for the kernel's copy of process_vm_readv (a child
// process's pages read into this one's), as the shared-memory paths copy: the same buffers again
// and again, in the cache. Both copy by `rep movsb`, which on our AMD EPYC (Zen 4) crawls at distances
// of 1-15 bytes (glibc bug 30994); src/reduce/copy.h steers around it (BENCHMARKS.md, "Copies a
// few bytes apart in their pages").
//
//   gcc -O2 -o /tmp/copy_distance scripts/copy_distance.c && /tmp/copy_distance [BYTES]
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char** argv) {
  const size_t n = argc > 1 ? strtoul(argv[1], NULL, 0) : 262144;
  const size_t span = n + 2 * 4096;
  // The source is shared with the child (same address in both), so the kernel's copy reads the
  // very pages memcpy reads.
  uint8_t* src = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  uint8_t* dst = aligned_alloc(4096, span);
  if (src == MAP_FAILED || !dst) return 1;
  memset(src, 1, span);
  memset(dst, 2, span);
  const pid_t child = fork();
  if (child == 0) {
    pause();
    _exit(0);
  }
  const int distances[] = {0, 1, 4, 8, 12, 15, 16, 24, 32, 48, 63, 64, 2048, 4088, 4095};
  const int reps = n >= 1 << 20 ? 200 : (int)(200e6 / n);
  printf("# %zu bytes, %d copies each; GB/s by (dst - src) mod 4096\n# distance   memcpy   process_vm_readv\n", n, reps);
  for (size_t k = 0; k < sizeof distances / sizeof distances[0]; ++k) {
    uint8_t* s = src + 4096;
    uint8_t* d = dst + 4096 + distances[k];
    double rate[2];
    for (int way = 0; way < 2; ++way) {
      struct iovec l = {d, n}, r = {s, n};
      for (int i = 0; i < 3; ++i) way ? (void)process_vm_readv(child, &l, 1, &r, 1, 0) : (void)memcpy(d, s, n);
      const double t0 = now_s();
      for (int i = 0; i < reps; ++i) {
        if (way) {
          if (process_vm_readv(child, &l, 1, &r, 1, 0) != (ssize_t)n) return 2;
        } else {
          memcpy(d, s, n);
          __asm__ volatile("" ::"r"(d) : "memory");
        }
      }
      rate[way] = (double)n * reps / (now_s() - t0) / 1e9;
    }
    printf("%10d %8.1f %18.1f\n", distances[k], rate[0], rate[1]);
  }
  kill(child, SIGKILL);
  waitpid(child, NULL, 0);
  return 0;
}
