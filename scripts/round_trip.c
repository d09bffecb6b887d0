// The round trip of a cache line between CPUs 0 and 1, as src/transport/core_probe.cpp measures
// it for the library: two threads pinned to them pass a counter back and forth 20,000 times; prints
// ns per round trip. On our VMs it tells the two states of the host's placement of the vCPUs
// apart: ~50-60 ns where they share a cache, 300-550 where they do not (BENCHMARKS.md, "Near and
// far cores"). scripts/ab_by_core_state.sh runs it before each benchmark run.
//
//   gcc -O2 -pthread -o /tmp/round_trip scripts/round_trip.c && /tmp/round_trip
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

enum { kTrips = 20000 };
static _Alignas(128) _Atomic long g_flag;

static void pin(int cpu) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

static void* echo(void* arg) {
  (void)arg;
  pin(1);
  for (long i = 0; i < kTrips; i++) {
    while (atomic_load_explicit(&g_flag, memory_order_acquire) != 2 * i + 1) {
    }
    atomic_store_explicit(&g_flag, 2 * i + 2, memory_order_release);
  }
  return NULL;
}

int main(void) {
  pthread_t t;
  pthread_create(&t, NULL, echo, NULL);
  pin(0);
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (long i = 0; i < kTrips; i++) {
    atomic_store_explicit(&g_flag, 2 * i + 1, memory_order_release);
    while (atomic_load_explicit(&g_flag, memory_order_acquire) != 2 * i + 2) {
    }
  }
  clock_gettime(CLOCK_MONOTONIC, &b);
  pthread_join(t, NULL);
  printf("%.0f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / kTrips);
  return 0;
}
