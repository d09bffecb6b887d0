#include "base/cpus.h"

#include <sched.h>

#include <algorithm>
#include <thread>

namespace shoal {

std::string affinity_text() {
  cpu_set_t set;
  CPU_ZERO(&set);
  int top = -1;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) top = c;
  }
  if (top < 0) {  // unreadable (or empty): every CPU online
    CPU_ZERO(&set);
    top = static_cast<int>(std::max(1u, std::thread::hardware_concurrency())) - 1;
    for (int c = 0; c <= std::min(top, CPU_SETSIZE - 1); ++c) CPU_SET(c, &set);
    top = std::min(top, CPU_SETSIZE - 1);
  }
  std::string hex;
  for (int base = top / 4 * 4; base >= 0; base -= 4) {
    int d = 0;
    for (int b = 0; b < 4; ++b)
      if (CPU_ISSET(base + b, &set)) d |= 1 << b;
    hex += "0123456789abcdef"[d];
  }
  return hex;
}

int cpus_in_union(const std::vector<std::string>& masks) {
  std::vector<int> digits;  // by position from the lowest
  for (const auto& m : masks) {
    if (digits.size() < m.size()) digits.resize(m.size(), 0);
    for (size_t i = 0; i < m.size(); ++i) {
      const char ch = m[m.size() - 1 - i];
      const int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : 0;
      digits[i] |= d;
    }
  }
  int n = 0;
  for (int d : digits) n += __builtin_popcount(static_cast<unsigned>(d));
  return std::max(1, n);
}

}  // namespace shoal
