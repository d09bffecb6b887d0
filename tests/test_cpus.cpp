// The CPUs a rank may run on (src/base/cpus.h): its affinity as text, and the union of several
// ranks' masks, which decides whether waiters poll or hand their CPU over.
#include <sched.h>

#include <string>
#include <thread>
#include <vector>

#include "base/cpus.h"
#include "harness.h"

using namespace shoal;

TEST(Cpus, UnionCountsEachCpuOnce) {
  EXPECT_EQ(cpus_in_union({"0", "1"}), 2);              // CPUs 0 and 1, one rank on each
  EXPECT_EQ(cpus_in_union({"0", "0"}), 1);              // both ranks held to CPU 0
  EXPECT_EQ(cpus_in_union({"0-1", "0", "1"}), 2);       // three ranks on CPUs 0-1
  EXPECT_EQ(cpus_in_union({"0-3", "4-7"}), 8);
  EXPECT_EQ(cpus_in_union({"0-3,8,10-11", "2-9"}), 12);  // 0-11
  EXPECT_EQ(cpus_in_union({"1500", "0"}), 2);           // past cpu_set_t's 1024
  EXPECT_EQ(cpus_in_union({}), 1);                      // at least one
  EXPECT_EQ(cpus_in_union({"x"}), 1);                   // what does not parse adds none
}

TEST(Cpus, AffinityTextIsTheThreadsMask) {
  cpu_set_t all;
  ASSERT_EQ(sched_getaffinity(0, sizeof all, &all), 0);
  EXPECT_EQ(cpus_in_union({affinity_text()}), CPU_COUNT(&all));
  // Held to one CPU (in a thread of its own: affinity is per thread), the text names that CPU.
  int first = 0;
  while (!CPU_ISSET(first, &all)) ++first;
  std::string text;
  std::thread([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    if (sched_setaffinity(0, sizeof one, &one) == 0) text = affinity_text();
  }).join();
  EXPECT_EQ(text, std::to_string(first));
  EXPECT_EQ(cpus_in_union({text}), 1);
}

TEST(Cpus, AffinityTextWritesRanges) {
  // Every CPU the process may use but the first, when it has at least 3: a range or a list.
  cpu_set_t all;
  ASSERT_EQ(sched_getaffinity(0, sizeof all, &all), 0);
  if (CPU_COUNT(&all) < 3) GTEST_SKIP() << "needs 3 CPUs";
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &all)) cpus.push_back(c);
  std::string text;
  std::thread([&] {
    cpu_set_t some;
    CPU_ZERO(&some);
    for (size_t i = 1; i < cpus.size(); ++i) CPU_SET(cpus[i], &some);
    if (sched_setaffinity(0, sizeof some, &some) == 0) text = affinity_text();
  }).join();
  EXPECT_EQ(cpus_in_union({text}), static_cast<int>(cpus.size()) - 1) << text;
  if (cpus.back() - cpus[1] + 1 == static_cast<int>(cpus.size()) - 1) {
    EXPECT_EQ(text, std::to_string(cpus[1]) + "-" + std::to_string(cpus.back()));
  }
}
