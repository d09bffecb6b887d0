#include "base/cpus.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <set>
#include <thread>

#include "base/log.h"

namespace shoal {

namespace {

// Calls f(set, bytes, n) with this thread's affinity mask, in a set of n CPUs; false if the mask
// cannot be read. A kernel built for more CPUs than cpu_set_t holds (1024) refuses a set that
// small: the set grows until it fits.
template <class F>
bool with_mask(F&& f) {
  for (int n = CPU_SETSIZE; n <= (1 << 20); n *= 2) {
    cpu_set_t* set = CPU_ALLOC(n);
    if (!set) return false;
    const size_t bytes = CPU_ALLOC_SIZE(n);
    CPU_ZERO_S(bytes, set);
    const bool got = sched_getaffinity(0, bytes, set) == 0;
    const bool too_small = !got && errno == EINVAL;
    if (got) f(set, bytes, n);
    CPU_FREE(set);
    if (!too_small) return got;
  }
  return false;
}

}  // namespace

std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
  with_mask([&](const cpu_set_t* set, size_t bytes, int n) {
    for (int c = 0; c < n; ++c)
      if (CPU_ISSET_S(c, bytes, set)) cpus.push_back(c);
  });
  return cpus;
}

std::string affinity_text() {
  std::vector<int> cpus = allowed_cpus();
  if (cpus.empty())
    for (unsigned c = 0; c < std::max(1u, std::thread::hardware_concurrency()); ++c) cpus.push_back(static_cast<int>(c));
  std::string text;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    text += (text.empty() ? "" : ",") + std::to_string(cpus[i]);
    if (j > i) text += "-" + std::to_string(cpus[j]);
    i = j + 1;
  }
  return text;
}

int cpus_in_union(const std::vector<std::string>& lists) {
  std::set<int> all;
  for (const auto& list : lists) {
    const char* p = list.data();
    const char* end = p + list.size();
    while (p < end) {
      int lo = 0, hi = 0;
      auto r = std::from_chars(p, end, lo);
      if (r.ec != std::errc()) break;
      hi = lo;
      p = r.ptr;
      if (p < end && *p == '-') {
        r = std::from_chars(p + 1, end, hi);
        if (r.ec != std::errc()) break;
        p = r.ptr;
      }
      for (int c = lo; c <= hi && c - lo < (1 << 20); ++c) all.insert(c);
      if (p < end && *p == ',') ++p;
      else break;
    }
  }
  return std::max<int>(1, static_cast<int>(all.size()));
}

int cpu_to_move_to(int rank, int cpu, const std::vector<unsigned>& last_cpu, const std::vector<int>& allowed) {
  const auto on = [&](int r, int c) { return last_cpu[static_cast<size_t>(r)] == static_cast<unsigned>(c) + 1; };
  const int n = static_cast<int>(last_cpu.size());
  for (int r = rank + 1; r < n; ++r)
    if (on(r, cpu)) return -1;
  // From the next CPU up, round to the first: the CPUs nearest above (often the same socket's).
  const size_t start = static_cast<size_t>(std::upper_bound(allowed.begin(), allowed.end(), cpu) - allowed.begin());
  for (size_t i = 0; i < allowed.size(); ++i) {
    const int c = allowed[(start + i) % allowed.size()];
    if (c == cpu) continue;
    bool taken = false;
    for (int r = 0; r < n && !taken; ++r) taken = r != rank && on(r, c);
    if (!taken) return c;
  }
  return -1;
}

bool move_this_thread_to(int cpu) {
  bool moved = false;
  with_mask([&](const cpu_set_t* mask, size_t bytes, int n) {
    if (cpu < 0 || cpu >= n || !CPU_ISSET_S(cpu, bytes, mask)) return;
    cpu_set_t* one = CPU_ALLOC(n);
    if (!one) return;
    CPU_ZERO_S(bytes, one);
    CPU_SET_S(cpu, bytes, one);
    // Held to `cpu`, the thread moves there before the call returns; given its mask back, it stays
    // until the scheduler moves it again.
    moved = sched_setaffinity(0, bytes, one) == 0;
    if (moved && sched_setaffinity(0, bytes, mask) != 0 && sched_setaffinity(0, bytes, mask) != 0)
      SHOAL_LOG(warn, "could not give this thread back its CPU affinity (it stays on CPU %d): %s", cpu,
                std::strerror(errno));
    CPU_FREE(one);
  });
  return moved;
}

namespace {
std::atomic<long> l2_for_testing{-1};
}

size_t l2_bytes() {
  const long forced = l2_for_testing.load(std::memory_order_relaxed);
  if (forced >= 0) return static_cast<size_t>(forced);
#ifdef _SC_LEVEL2_CACHE_SIZE
  static const size_t bytes = [] {
    const long b = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return b > 0 ? static_cast<size_t>(b) : size_t(0);
  }();
  return bytes;
#else
  return 0;
#endif
}

void set_l2_bytes_for_testing(long bytes) { l2_for_testing.store(bytes, std::memory_order_relaxed); }

}  // namespace shoal
