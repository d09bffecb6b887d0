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
  EXPECT_EQ(cpus_in_union({"1", "2"}), 2);               // CPUs 0 and 1, one rank on each
  EXPECT_EQ(cpus_in_union({"1", "1"}), 1);               // both ranks held to CPU 0
  EXPECT_EQ(cpus_in_union({"3", "1", "2"}), 2);          // three ranks on CPUs 0-1
  EXPECT_EQ(cpus_in_union({"f", "f0"}), 8);              // masks of different lengths
  EXPECT_EQ(cpus_in_union({"80000000000000000", "1"}), 2);  // CPU 67 and CPU 0
  EXPECT_EQ(cpus_in_union({"ff", "0f"}), 8);
  EXPECT_EQ(cpus_in_union({}), 1);                       // at least one
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
  std::string expect(1, "1248"[first % 4]);
  expect += std::string(static_cast<size_t>(first / 4), '0');
  EXPECT_EQ(text, expect);
  EXPECT_EQ(cpus_in_union({text}), 1);
}
