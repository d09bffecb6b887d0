// The CPUs a rank may run on (src/base/cpus.h): its affinity as text, and the union of several
// ranks' masks, which decides whether waiters poll or hand their CPU over.
#include <sched.h>

#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "base/cpus.h"
#include "harness.h"

using namespace shoal;
using namespace shoal_test;

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

TEST(Cpus, OnlyTheHighestRankOnACpuMovesAndToAFreeOne) {
  // last_cpu: by rank, 1 + the CPU each last waited on, 0 unknown.
  EXPECT_EQ(cpu_to_move_to(1, 0, {1, 1}, {0, 1}), 1);   // ranks 0 and 1 on CPU 0: rank 1 moves to 1
  EXPECT_EQ(cpu_to_move_to(0, 0, {1, 1}, {0, 1}), -1);  // rank 0 stays: rank 1 moves instead
  EXPECT_EQ(cpu_to_move_to(2, 0, {1, 2, 1}, {0, 1, 2}), 2);  // CPU 1 has rank 1: CPU 2
  EXPECT_EQ(cpu_to_move_to(1, 0, {1, 1, 2, 3}, {0, 1, 2}), -1);  // every other CPU taken
  EXPECT_EQ(cpu_to_move_to(1, 0, {1, 1}, {0}), -1);     // held to this CPU
  EXPECT_EQ(cpu_to_move_to(1, 4, {0, 5}, {2, 4, 6}), 6);  // rank 0 unknown: the next CPU up
  EXPECT_EQ(cpu_to_move_to(1, 4, {7, 5}, {2, 4, 6}), 2);  // rank 0 last on CPU 6: round to the first
  EXPECT_EQ(cpu_to_move_to(1, 5, {0, 6}, {2, 4, 6}), 6);  // a CPU outside the list: the next one up
}

// Two ranks that the scheduler put on one CPU while the other is free come apart, where they would
// otherwise hand that CPU to each other op after op. The ranks start held to one CPU (so they share
// it from the first op), poll as ranks with a CPU each (SHOAL_SPIN_US), and are then given two. The
// blocking ops run on the callers' threads, whose masks the test widens (the progress threads keep
// the one CPU they started with).
TEST(Cpus, RanksOnOneCpuOfTwoMoveApart) {
  cpu_set_t all;
  ASSERT_EQ(sched_getaffinity(0, sizeof all, &all), 0);
  if (CPU_COUNT(&all) < 2) GTEST_SKIP() << "needs 2 CPUs";
  int a = 0;
  while (!CPU_ISSET(a, &all)) ++a;
  int b = a + 1;
  while (!CPU_ISSET(b, &all)) ++b;
  RunConfig cfg = transport_config("shm");
  cfg.env.push_back({"SHOAL_SPIN_US", "50"});
  cfg.before_construct = [a](int) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(a, &one);
    if (sched_setaffinity(0, sizeof one, &one) != 0) throw std::runtime_error("sched_setaffinity");
  };
  run_ranks(2, cfg, [a, b](Communicator& c) {
    CallOptions blocking;
    blocking.blocking = true;
    float x = 1, y = 0;
    for (int i = 0; i < 100; ++i) c.allreduce(&x, &y, 1, DType::f32, ReduceOp::sum, blocking)->wait();
    SH_CHECK(y == 2) << y;
    cpu_set_t two;
    CPU_ZERO(&two);
    CPU_SET(a, &two);
    CPU_SET(b, &two);
    SH_CHECK(sched_setaffinity(0, sizeof two, &two) == 0);
    // Within 200 ops of being given a second CPU the ranks run on different CPUs: the higher one
    // moves after 64 looks that found the other on its CPU (26-28 ops on an Intel Xeon of 2
    // vCPUs), where the scheduler alone parted them after 412-1,047. Each op's float says where
    // a rank runs, so both see the same answer and leave the loop together.
    int apart_at = -1;
    for (int i = 0; i < 200 && apart_at < 0; ++i) {
      float cpu = static_cast<float>(sched_getcpu()), both[2] = {0, 0};
      c.allgather(&cpu, both, 1, DType::f32, blocking)->wait();
      if (both[0] != both[1]) apart_at = i;
    }
    SH_CHECK(apart_at >= 0) << "rank " << c.rank() << " still shared CPU " << sched_getcpu() << " after 200 ops";
  });
}
