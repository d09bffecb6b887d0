// Two processes on CPUs 0 and 1 exchange N bytes as shoal's small allreduce does
// (src/algo/direct_small.cpp): each copies its input into one of 16 data areas of its shared
// slot, publishes the op's number in a head line, waits for the peer's, and sums the peer's area
// with its input. The copy in takes ordinary stores or non-temporal ones (`nt`, AVX2 as
// src/reduce/copy.cpp), or ordinary ones followed by a fence (`fenced`: the copy timed to its last
// store, as src/transport/stores.cpp times it); the readers hold each area's lines from the op
// before. Prints µs per exchange and the copy in, timed by two clock reads: its mean, ns, and the
// 10th, 50th and 90th percentiles of its ns per KiB. With scripts/round_trip.c before and after, it
// tells what each store costs in either state of our VMs' vCPUs (BENCHMARKS.md, "Short copies where
// the cores sit far apart" and "Short copies timed to their last store").
//
//   gcc -O2 -mavx2 -o /tmp/slot_exchange scripts/slot_exchange.c
//   /tmp/slot_exchange ordinary|fenced|nt BYTES      (BYTES: a multiple of 32, up to 16384)
#define _GNU_SOURCE
#include <immintrin.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { kOps = 100000, kHeads = 64, kAreas = 16, kAreaBytes = 16384 };
typedef struct {
  _Alignas(64) _Atomic long n;
  char pad[56];
} Head;
typedef struct {
  Head head[kHeads];
  _Alignas(64) char area[kAreas][kAreaBytes];
} Slot;

static void pin(int cpu) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  sched_setaffinity(0, sizeof s, &s);
}

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}

__attribute__((noinline)) static void copy_nt(float* d, const float* s, size_t n) {
  for (size_t i = 0; i < n; i += 8) _mm256_stream_ps(d + i, _mm256_loadu_ps(s + i));
  _mm_sfence();
}

static int by_value(const void* a, const void* b) {
  const float x = *(const float*)a, y = *(const float*)b;
  return x < y ? -1 : x > y;
}

__attribute__((noinline)) static void sum(float* restrict o, const float* restrict a, const float* restrict b, size_t n) {
  for (size_t i = 0; i < n; i += 8) _mm256_storeu_ps(o + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
}

int main(int argc, char** argv) {
  const size_t bytes = argc == 3 ? strtoul(argv[2], 0, 10) : 0;
  if (argc != 3 || (strcmp(argv[1], "ordinary") && strcmp(argv[1], "fenced") && strcmp(argv[1], "nt")) || !bytes || bytes % 32 || bytes > kAreaBytes) {
    fprintf(stderr, "usage: %s ordinary|fenced|nt BYTES (a multiple of 32, up to %d)\n", argv[0], kAreaBytes);
    return 2;
  }
  const int nt = !strcmp(argv[1], "nt"), fenced = !strcmp(argv[1], "fenced");
  static float per_kib[kOps];  // each copy's ns per KiB
  const size_t n = bytes / 4;
  Slot* slots = mmap(0, 2 * sizeof(Slot) + 64, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  _Atomic int* ready = (_Atomic int*)(slots + 2);
  const int me = fork() == 0, peer = !me;
  pin(me);
  float* in = aligned_alloc(64, kAreaBytes);
  float* out = aligned_alloc(64, kAreaBytes);
  for (size_t i = 0; i < n; ++i) in[i] = me + i;
  atomic_fetch_add(ready, 1);
  while (atomic_load(ready) < 2) {
  }
  double copy_ns = 0, check = 0;
  const double t0 = now_ns();
  for (long op = 1; op <= kOps; ++op) {
    float* mine = (float*)slots[me].area[op % kAreas];
    const double c0 = now_ns();
    if (nt)
      copy_nt(mine, in, n);
    else
      memcpy(mine, in, bytes);
    if (fenced) __atomic_thread_fence(__ATOMIC_SEQ_CST);  // as std::atomic_thread_fence in stores.cpp
    const double c = now_ns() - c0;
    copy_ns += c;
    per_kib[op - 1] = c * 1024 / bytes;
    atomic_store_explicit(&slots[me].head[op % kHeads].n, op, memory_order_release);
    while (atomic_load_explicit(&slots[peer].head[op % kHeads].n, memory_order_acquire) < op) _mm_pause();
    sum(out, in, (const float*)slots[peer].area[op % kAreas], n);
    check += out[op % n];
  }
  const double us = (now_ns() - t0) / kOps / 1000;
  if (me) {
    qsort(per_kib, kOps, sizeof per_kib[0], by_value);
    printf("%s %zu B: %.3f us per exchange, copy in %.0f ns; ns/KiB p10 %.0f p50 %.0f p90 %.0f (check %.0f)\n", argv[1],
           bytes, us, copy_ns / kOps, per_kib[kOps / 10], per_kib[kOps / 2], per_kib[kOps * 9 / 10], check);
    return 0;
  }
  wait(0);
  return 0;
}
