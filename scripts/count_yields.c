// Counts a process's sched_yield calls and how many returned within 1 µs (no other task ran):
// preloaded into ranks, it prints a line at exit for each process that made over 1000 (BENCHMARKS.md, "Four ranks on two
// cores through torch").
//
//   gcc -O2 -shared -fPIC -o /tmp/count_yields.so scripts/count_yields.c
//   LD_PRELOAD=/tmp/count_yields.so taskset -c 0 .venv/bin/torchrun --nproc-per-node 2 scripts/torch_call_paths.py 4K
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static unsigned long calls, at_once;

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

int sched_yield(void) {
  const double start = now_us();
  const long r = syscall(SYS_sched_yield);
  __atomic_fetch_add(&calls, 1, __ATOMIC_RELAXED);  // any thread may yield
  if (now_us() - start < 1.0) __atomic_fetch_add(&at_once, 1, __ATOMIC_RELAXED);
  return (int)r;
}

__attribute__((destructor)) static void report(void) {
  if (calls > 1000) fprintf(stderr, "pid %d: %lu sched_yield calls, %lu returned within 1 us\n", getpid(), calls, at_once);
}
