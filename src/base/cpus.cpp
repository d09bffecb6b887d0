#include "base/cpus.h"

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <set>
#include <thread>

namespace shoal {

namespace {

// This thread's CPUs in increasing order; empty if the mask cannot be read. A kernel built for
// more CPUs than cpu_set_t holds (1024) refuses a set that small: the set grows until it fits.
std::vector<int> affinity() {
  std::vector<int> cpus;
  for (int n = CPU_SETSIZE; n <= (1 << 20); n *= 2) {
    cpu_set_t* set = CPU_ALLOC(n);
    if (!set) break;
    const size_t bytes = CPU_ALLOC_SIZE(n);
    CPU_ZERO_S(bytes, set);
    const bool got = sched_getaffinity(0, bytes, set) == 0;
    const bool too_small = !got && errno == EINVAL;
    if (got)
      for (int c = 0; c < n; ++c)
        if (CPU_ISSET_S(c, bytes, set)) cpus.push_back(c);
    CPU_FREE(set);
    if (!too_small) break;
  }
  return cpus;
}

}  // namespace

std::string affinity_text() {
  std::vector<int> cpus = affinity();
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
  for (int c : allowed) {
    if (c == cpu) continue;
    bool taken = false;
    for (int r = 0; r < n && !taken; ++r) taken = r != rank && on(r, c);
    if (!taken) return c;
  }
  return -1;
}

}  // namespace shoal
