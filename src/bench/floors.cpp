// shoal-bench --floors: the limits of this machine that a one-host collective cannot beat, measured
// by the launcher before it starts the ranks (nothing else of the benchmark runs then).
//
// - Memory bandwidth B: one thread per core, each copying its own 64 MiB buffer (far beyond the
//   caches) with memcpy; B counts the bytes read plus the bytes written per second, all threads
//   together; the best of several rounds. An allreduce of n bytes on p ranks of one host reads
//   every rank's input and writes every rank's output at least once, 2·p·n bytes through memory:
//   its floor is 2·p·n / B.
// - Cache-line round trip: two threads on two cores pass one cache line back and forth (each
//   waits for the other's write, then writes); the median over rounds of the time per round trip.
//   A small collective needs at least one: a rank's data reaches a peer in a line the peer reads.
// - Core hand-over: two processes pinned to one core each yield it to the other (sched_yield); the
//   time per hand-over, the median over rounds. Where ranks outnumber cores, every rank must run
//   in every collective: a small op costs at least (ranks per core) hand-overs.
#include <pthread.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench.h"

namespace shoal::bench {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<int> cpus_in(const cpu_set_t& set) {
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

double copy_bandwidth(int threads) {
  constexpr size_t kBytes = size_t(64) << 20;
  constexpr int kRounds = 5, kCopiesPerRound = 4;
  std::vector<std::vector<char>> src(threads), dst(threads);
  for (int t = 0; t < threads; ++t) {
    src[t].assign(kBytes, static_cast<char>(t + 1));  // touched: no page faults while timed
    dst[t].assign(kBytes, 0);
  }
  double best = 0;
  for (int round = 0; round < kRounds; ++round) {
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        ready.fetch_add(1);
        while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
        for (int k = 0; k < kCopiesPerRound; ++k) std::memcpy(dst[t].data(), src[t].data(), kBytes);
      });
    while (ready.load() < threads) std::this_thread::yield();
    const auto t0 = Clock::now();
    go.store(true, std::memory_order_release);
    for (auto& th : pool) th.join();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, 2.0 * kBytes * kCopiesPerRound * threads / s);
  }
  return best;
}

double cacheline_round_trip_ns(int cpu_a, int cpu_b) {
  constexpr int kTrips = 20000, kRounds = 7;
  struct alignas(64) Line {
    std::atomic<uint64_t> v{0};
  };
  std::vector<double> ns;
  for (int round = 0; round < kRounds; ++round) {
    Line ping, pong;
    std::thread echo([&] {
      pin(cpu_b);
      for (uint64_t i = 1; i <= kTrips; ++i) {
        while (ping.v.load(std::memory_order_acquire) != i) {
        }
        pong.v.store(i, std::memory_order_release);
      }
    });
    pin(cpu_a);
    // The echo thread may start late: the first trips wait for it, so time the second half only.
    Clock::time_point t0;
    for (uint64_t i = 1; i <= kTrips; ++i) {
      if (i == kTrips / 2 + 1) t0 = Clock::now();
      ping.v.store(i, std::memory_order_release);
      while (pong.v.load(std::memory_order_acquire) != i) {
      }
    }
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    echo.join();
    ns.push_back(s * 1e9 / (kTrips / 2));
  }
  std::sort(ns.begin(), ns.end());
  return ns[ns.size() / 2];
}

double core_handover_ns(int cpu) {
  constexpr int kYields = 20000, kRounds = 5;
  pin(cpu);  // the child inherits it
  std::vector<double> ns;
  for (int round = 0; round < kRounds; ++round) {
    const pid_t child = fork();
    if (child == 0) {
      for (int i = 0; i < 2 * kYields; ++i) sched_yield();  // outlasts the parent's timed loop
      _exit(0);
    }
    if (child < 0) return 0;
    sched_yield();  // the child runs once before the clock starts
    const auto t0 = Clock::now();
    for (int i = 0; i < kYields; ++i) sched_yield();  // each lets the child run: two hand-overs
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    waitpid(child, nullptr, 0);
    ns.push_back(s * 1e9 / (2.0 * kYields));
  }
  std::sort(ns.begin(), ns.end());
  return ns[ns.size() / 2];
}

}  // namespace

Floors measure_floors() {
  Floors f;
  cpu_set_t saved;  // the cores allowed, restored at the end: the ranks inherit the launcher's
  const bool have_saved = sched_getaffinity(0, sizeof saved, &saved) == 0;
  const std::vector<int> cpus = have_saved ? cpus_in(saved) : std::vector<int>{};
  f.bw_threads = std::max<int>(1, static_cast<int>(cpus.size()));
  f.bw_bytes_per_s = copy_bandwidth(f.bw_threads);
  if (cpus.size() >= 2) f.rtt_ns = cacheline_round_trip_ns(cpus[0], cpus[1]);
  if (!cpus.empty()) f.handover_ns = core_handover_ns(cpus[0]);
  if (have_saved) sched_setaffinity(0, sizeof saved, &saved);
  return f;
}

std::string floors_env(const Floors& f) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "SHOAL_BENCH_FLOORS=%.6g,%d,%.6g,%.6g", f.bw_bytes_per_s, f.bw_threads, f.rtt_ns,
                f.handover_ns);
  return buf;
}

double over_memory_floor(double us, Op op, size_t bytes, int p, const Floors& f) {
  if (op != Op::allreduce || f.bw_bytes_per_s <= 0) return NAN;
  return us / (2.0 * p * static_cast<double>(bytes) / f.bw_bytes_per_s * 1e6);
}

double over_round_trip(double us, const Floors& f) { return f.rtt_ns > 0 ? us * 1e3 / f.rtt_ns : NAN; }

std::optional<Floors> floors_from_env() {
  const char* s = std::getenv("SHOAL_BENCH_FLOORS");
  Floors f;
  if (!s || std::sscanf(s, "%lf,%d,%lf,%lf", &f.bw_bytes_per_s, &f.bw_threads, &f.rtt_ns, &f.handover_ns) != 4)
    return std::nullopt;
  return f;
}

}  // namespace shoal::bench
