#include "transport/core_probe.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <system_error>
#include <thread>

#include "base/cpu_relax.h"
#include "base/log.h"

namespace shoal {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kBatches = 8, kTripsPerBatch = 32;  // two clock reads a batch, over 32 trips
constexpr auto kPeriod = std::chrono::milliseconds(1000);
constexpr auto kFirstRetry = std::chrono::milliseconds(10);
// How long one measurement may wait for the two threads to run at once (ranks hold the cores).
constexpr auto kPatience = std::chrono::milliseconds(2);

struct alignas(128) Line {  // 128: the adjacent-line prefetcher pairs 64-byte lines
  std::atomic<uint64_t> v{0};
};

std::atomic<uint32_t> g_rtt_ns{0};
// 0: no threads measure in this process; 1: being started; 2: started (or could not be). A forked
// child (pthread_atfork) goes back to 0: it has none of its parent's threads.
std::atomic<int> g_state{0};

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
      // The clock is read once in 64 spins: a clock that is a system call must not lengthen the trips.
      for (unsigned spins = 1; pong.v.load(std::memory_order_acquire) != seq; ++spins) {
        if (spins % 64 == 0 && Clock::now() > deadline) {
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
  Probe* before = nullptr;  // a parent's, in a forked child: still reachable, for leak checkers
  Line ping, pong;
  std::mutex mu;
  std::condition_variable cv;
  uint64_t asked = 0;  // measurements asked for
};

void run(Probe* pr, int cpu_a, int cpu_b) {
  Line& ping = pr->ping;
  Line& pong = pr->pong;
  std::thread echo;
  try {
    echo = std::thread([pr, cpu_b] {
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
      // No clock on a trip's path: the clock is read once in 256 spins without a ping, and the
      // echo sleeps again once 20 µs have passed in such reads.
      Clock::time_point quiet_since{};
      for (unsigned spins = 0;;) {
        const uint64_t v = ping.v.load(std::memory_order_acquire);
        if (v != last) {
          last = v;
          if (v != ~uint64_t(0)) pong.v.store(v, std::memory_order_release);
          spins = 0;
          quiet_since = {};
        } else if (++spins % 256 == 0) {
          const auto now = Clock::now();
          if (quiet_since == Clock::time_point{}) quiet_since = now;
          else if (now - quiet_since > std::chrono::microseconds(20)) break;
        } else {
          cpu_relax();
        }
      }
    }
  });
  } catch (const std::system_error&) {
    return;  // no thread to be had (a process or container limit): ordinary stores stay
  }
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
  static Probe* probe;  // reachable, for leak checkers
  Probe* next = new Probe;
  next->before = probe;
  probe = next;
  try {
    std::thread(run, probe, cpus[0], cpus[1]).detach();
  } catch (const std::system_error&) {
    // no thread to be had: the round trip stays 0 (ordinary stores)
  }
}

}  // namespace

uint32_t core_round_trip_ns() {
  if (g_state.load(std::memory_order_acquire) != 2) {
    int idle = 0;
    if (g_state.compare_exchange_strong(idle, 1, std::memory_order_acq_rel)) {
      static bool at_fork = false;  // handlers pass to children: registered once
      if (!at_fork) {
        at_fork = true;
        pthread_atfork(nullptr, nullptr, [] {
          g_rtt_ns.store(0, std::memory_order_relaxed);
          g_state.store(0, std::memory_order_release);
        });
      }
      start();
      g_state.store(2, std::memory_order_release);
    }
  }
  return g_rtt_ns.load(std::memory_order_relaxed);
}

}  // namespace shoal
