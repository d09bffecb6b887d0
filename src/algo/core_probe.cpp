#include "algo/core_probe.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "base/cpu_relax.h"
#include "base/log.h"

namespace shoal::algo {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kBatches = 16, kTripsPerBatch = 8;
constexpr auto kPeriod = std::chrono::milliseconds(1000);
constexpr auto kFirstRetry = std::chrono::milliseconds(10);
// How long one measurement may wait for the two threads to run at once (ranks hold the cores).
constexpr auto kPatience = std::chrono::milliseconds(2);

struct alignas(64) Line {
  std::atomic<uint64_t> v{0};
};

std::atomic<uint32_t> g_rtt_ns{0};
std::atomic<pid_t> g_started_in{0};  // the process whose threads measure

void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

// One measurement: the least time per round trip over kBatches batches, or 0 where the two
// threads did not run at once within kPatience.
uint32_t measure(Line& ping, Line& pong, uint64_t& seq) {
  double best = 0;
  const auto deadline = Clock::now() + kPatience;
  for (int b = 0; b < kBatches; ++b) {
    const auto t0 = Clock::now();
    for (int i = 0; i < kTripsPerBatch; ++i) {
      ping.v.store(++seq, std::memory_order_release);
      while (pong.v.load(std::memory_order_acquire) != seq) {
        if (Clock::now() > deadline) {
          ping.v.store(~uint64_t(0), std::memory_order_release);  // lets the echo move on
          return 0;
        }
        cpu_relax();
      }
    }
    const double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / kTripsPerBatch;
    if (best == 0 || ns < best) best = ns;
  }
  return static_cast<uint32_t>(best);
}

// The echo sleeps until the prober wakes it for a measurement, then answers each trip, spinning
// until 20 µs pass without one.
// Made anew by each process that starts measuring (a forked child must not share its parent's
// lock or condition), and never freed: the two threads run until the process ends.
struct Probe {
  Line ping, pong;
  std::mutex mu;
  std::condition_variable cv;
  uint64_t asked = 0;  // measurements asked for
};

void run(Probe* pr, int cpu_a, int cpu_b) {
  Line& ping = pr->ping;
  Line& pong = pr->pong;
  std::thread echo([pr, cpu_b] {
    Line& ping = pr->ping;
    Line& pong = pr->pong;
    pin(cpu_b);
    uint64_t last = 0, served = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(pr->mu);
        pr->cv.wait(lock, [&] { return pr->asked != served; });
        served = pr->asked;
      }
      auto idle_since = Clock::now();
      for (;;) {
        const uint64_t v = ping.v.load(std::memory_order_acquire);
        if (v != last) {
          last = v;
          if (v != ~uint64_t(0)) pong.v.store(v, std::memory_order_release);
          idle_since = Clock::now();
        } else if (Clock::now() - idle_since > std::chrono::microseconds(20)) {
          break;
        } else {
          cpu_relax();
        }
      }
    }
  });
  echo.detach();
  pin(cpu_a);
  uint64_t seq = 0;
  auto retry = kFirstRetry;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(pr->mu);
      ++pr->asked;
    }
    pr->cv.notify_one();
    // The first batch waits for the echo to wake; the ones after it are timed.
    const uint32_t ns = measure(ping, pong, seq);
    SHOAL_LOG(trace, "cache-line round trip between CPUs %d and %d: %u ns (0: they did not run at once)", cpu_a, cpu_b, ns);
    if (ns) {
      g_rtt_ns.store(ns, std::memory_order_relaxed);
      retry = kFirstRetry;
      std::this_thread::sleep_for(kPeriod);
    } else {  // the ranks held the cores: sooner than a period, then less often
      std::this_thread::sleep_for(retry);
      retry = std::min<std::chrono::milliseconds>(retry * 2, kPeriod);
    }
  }
}

void start() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return;
  int cpus[2], n = 0;
  for (int c = 0; c < CPU_SETSIZE && n < 2; ++c)
    if (CPU_ISSET(c, &set)) cpus[n++] = c;
  if (n < 2) return;
  static Probe* probe;  // reachable, for leak checkers; one per process that started
  probe = new Probe;
  std::thread(run, probe, cpus[0], cpus[1]).detach();
}

}  // namespace

uint32_t core_round_trip_ns() {
  const pid_t me = getpid();
  if (g_started_in.load(std::memory_order_relaxed) != me) {
    static std::mutex mu;
    std::lock_guard<std::mutex> lock(mu);
    if (g_started_in.load(std::memory_order_relaxed) != me) {
      g_rtt_ns.store(0, std::memory_order_relaxed);
      start();
      g_started_in.store(me, std::memory_order_relaxed);
    }
  }
  return g_rtt_ns.load(std::memory_order_relaxed);
}

}  // namespace shoal::algo
