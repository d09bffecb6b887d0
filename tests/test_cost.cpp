// The measured cost curves of the ops with two ways on one host (src/algo/cost.cpp): the tuning
// file's parser, the cost between and beyond the measured points, and the choice, in one process.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "algo/algorithms.h"
#include "algo/cost.h"
#include "harness.h"
#include "shoal/error.h"

namespace {

using namespace shoal;
using namespace shoal::algo;
using shoal_test::ScopedEnv;

constexpr size_t K = 1024;

constexpr Choice kAllChoices[] = {Choice::allreduce, Choice::reduce,    Choice::alltoall, Choice::alltoallv,
                                  Choice::broadcast, Choice::allgather, Choice::scatter,  Choice::gather};

// The built-in files, as the library includes them.
const char* const kAmdFile =
#include "algo/cost_points.inc"
    ;
const char* const kIntelFile =
#include "algo/cost_points_intel.inc"
    ;

const char* const kPoints =
    "# measured\n"
    "direct allreduce 2 16384 10 20   # one shot ahead\n"
    "direct allreduce 2 65536 40 40\n"
    "direct allreduce 8 16384 100 60\n"
    "direct allreduce 8 65536 400 120\n"
    "direct reduce 4 16384 5 9\n"
    "direct alltoall 4 65536 30 50\n"
    "direct alltoall 4 1048576 900 700\n";

TEST(CostCurves, ParsesEveryField) {
  const auto t = parse_tuning(kPoints, "test").points;
  ASSERT_EQ(t.size(), 7u);
  EXPECT_EQ(t[3].op, Choice::allreduce);
  EXPECT_EQ(t[3].ranks, 8);
  EXPECT_EQ(t[3].bytes, 64 * K);
  EXPECT_DOUBLE_EQ(t[3].us[0], 400);
  EXPECT_DOUBLE_EQ(t[3].us[1], 120);
  EXPECT_EQ(t[4].op, Choice::reduce);
  EXPECT_EQ(t[6].op, Choice::alltoall);
  EXPECT_DOUBLE_EQ(t[6].us[1], 700);
  const auto b = parse_tuning("direct broadcast 2 262144 30 20\n", "test").points;
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].op, Choice::broadcast);
  EXPECT_DOUBLE_EQ(b[0].us[1], 20);
}

// Tuning files the parser must reject, each with what its error must say (besides the file).
struct Rejected {
  std::string text, says;
};
template <size_t N>
void expect_rejected(const Rejected (&cases)[N]) {
  for (const Rejected& c : cases) {
    try {
      parse_tuning(c.text, "the file");
      ADD_FAILURE() << "accepted:\n" << c.text;
    } catch (const InvalidArgument& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("the file"), std::string::npos) << m;
      EXPECT_NE(m.find(c.says), std::string::npos) << "expected '" << c.says << "' in: " << m;
    }
  }
}

TEST(CostCurves, RejectsWhatItCannotUseNamingTheLine) {
  const std::string reduce_line = "direct reduce 2 4096 1 1\ndirect alltoall 2 4096 1 1\n";
  const Rejected cases[] = {
      {"directt allreduce 2 4096 1 1\n" + reduce_line, "line 1"},
      {"direct barrier 2 4096 1 1\n" + reduce_line, "'allgather', 'scatter' or 'gather'"},
      {"direct allreduce 2 4096 1\n" + reduce_line, "expected: direct OP RANKS BYTES WAY0_US WAY1_US"},
      {"direct allreduce 2 4096 1 1 9\n" + reduce_line, "unexpected '9'"},
      {"direct allreduce 2 4096 1 1 9 9 9\n" + reduce_line, "unexpected '9'"},
      {"direct allreduce 2 4096 1 1 9 x\n" + reduce_line, "not 'x'"},
      {"direct allreduce 2 4096 1 1 9 -1\n" + reduce_line, "not negative"},
      {"direct allreduce 1 4096 1 1\n" + reduce_line, "at least 2"},
      {"direct allreduce 2 0 1 1\n" + reduce_line, "bytes must be"},
      {"direct allreduce 2 4096 -1 1\n" + reduce_line, "not negative"},
      {"direct allreduce 2 4096 nan 1\n" + reduce_line, "expected: direct OP"},
      {reduce_line + "direct allreduce 2 4096 1 1\ndirect allreduce 2 4096 2 2\n", "line 4"},
      {"# nothing\n", "no points"},
  };
  expect_rejected(cases);
}

TEST(CostCurves, AlongTheSizeStraightLinesThroughThePoints) {
  const auto t = parse_tuning(kPoints, "test").points;
  EXPECT_DOUBLE_EQ(way_us(t, Choice::allreduce, 2, 16 * K, 0), 10);   // a point
  EXPECT_DOUBLE_EQ(way_us(t, Choice::allreduce, 2, 40 * K, 0), 25);   // halfway
  EXPECT_DOUBLE_EQ(way_us(t, Choice::allreduce, 2, 40 * K, 1), 30);
  EXPECT_DOUBLE_EQ(way_us(t, Choice::allreduce, 2, 4 * K, 0), 10);    // below: the first
  EXPECT_DOUBLE_EQ(way_us(t, Choice::allreduce, 2, 112 * K, 0), 70);  // above: extended
}

TEST(CostCurves, AlongTheRanksInterpolatedThenScaled) {
  const auto t = parse_tuning(kPoints, "test").points;
  // 5 ranks: halfway between 2 and 8.
  EXPECT_DOUBLE_EQ(way_us(t, Choice::allreduce, 5, 16 * K, 0), 55);
  EXPECT_DOUBLE_EQ(way_us(t, Choice::allreduce, 5, 16 * K, 1), 40);
  // 16 ranks, twice the largest: one shot moves (p+2)·p bytes in all, two shot ∝ p.
  EXPECT_DOUBLE_EQ(way_us(t, Choice::allreduce, 16, 16 * K, 0), 100.0 * (18 * 16) / (10 * 8));
  EXPECT_DOUBLE_EQ(way_us(t, Choice::allreduce, 16, 16 * K, 1), 120);
  // reduce has one measured group size: 2 ranks scale down from it.
  EXPECT_DOUBLE_EQ(way_us(t, Choice::reduce, 2, 16 * K, 1), 4.5);
  // alltoall scales both ways ∝ p.
  EXPECT_DOUBLE_EQ(way_us(t, Choice::alltoall, 8, 64 * K, 0), 60);
  EXPECT_DOUBLE_EQ(way_us(t, Choice::alltoall, 8, 64 * K, 1), 100);
  EXPECT_THROW(way_us(t, Choice::alltoallv, 4, 16 * K, 0), Error);  // no points for it
}

// The points in effect decide, unless SHOAL_DIRECT_REDUCE, SHOAL_DIRECT_ALLTOALL,
// SHOAL_DIRECT_BROADCAST, SHOAL_DIRECT_ALLGATHER, SHOAL_DIRECT_SCATTER or SHOAL_DIRECT_GATHER
// forces a way. (With one pair of times per point this is the faster way.)
TEST(CostCurves, TheChoiceIsTheCheaperCurve) {
  ScopedEnv unset_reduce("SHOAL_DIRECT_REDUCE", nullptr), unset_alltoall("SHOAL_DIRECT_ALLTOALL", nullptr),
      unset_broadcast("SHOAL_DIRECT_BROADCAST", nullptr), unset_allgather("SHOAL_DIRECT_ALLGATHER", nullptr),
      unset_scatter("SHOAL_DIRECT_SCATTER", nullptr), unset_gather("SHOAL_DIRECT_GATHER", nullptr);
  for (const char* cpu : {"amd", "intel"}) {
    ScopedEnv kind("SHOAL_TUNING_BUILTIN", cpu);
    const auto held = tuning();
    const auto& points = held->points;
    for (Choice op : kAllChoices) {
      int ways[2] = {0, 0};
      for (int p : {2, 3, 4, 6, 8, 12, 16, 64})
        for (size_t n : {12 * K, 64 * K, 256 * K, 1024 * K, 8192 * K, 65536 * K}) {
          // The way that loses least, over the faster way, in the worse of the two pairs.
          double worst[2] = {0, 0};
          for (bool second : {false, true}) {
            const double t0 = way_us(points, op, p, n, 0, second), t1 = way_us(points, op, p, n, 1, second);
            worst[0] = std::max(worst[0], t0 / std::min(t0, t1));
            worst[1] = std::max(worst[1], t1 / std::min(t0, t1));
          }
          const int want = worst[0] <= worst[1] ? 0 : 1;
          EXPECT_EQ(Ways::current().cheaper(op, n, p), want) << cpu << ": " << choice_name(op) << " p " << p << " n " << n;
          ways[want]++;
        }
      // On the Intel Xeon single copy beat the scratch at every size of the 2-rank broadcast and
      // allgather (docs/bench/tune-intel-rest-2026-12-05.txt).
      const bool single_copy_only = std::string(cpu) == "intel" && (op == Choice::broadcast || op == Choice::allgather);
      if (!single_copy_only) {
        EXPECT_GT(ways[0], 0) << cpu << ": the built-in points never choose way 0 of " << choice_name(op);
      }
      EXPECT_GT(ways[1], 0) << cpu << ": the built-in points never choose way 1 of " << choice_name(op);
    }
  }
  {
    ScopedEnv forced("SHOAL_DIRECT_ALLTOALL", "pairwise");
    EXPECT_TRUE(Ways::current().alltoall_pairwise(Choice::alltoall, 16 * K, 2));
  }
  {
    ScopedEnv forced("SHOAL_DIRECT_ALLTOALL", "scratch");
    EXPECT_FALSE(Ways::current().alltoall_pairwise(Choice::alltoall, size_t(64) << 20, 64));
  }
  {
    ScopedEnv forced("SHOAL_DIRECT_REDUCE", "two_shot");
    EXPECT_FALSE(Ways::current().reduce_one_shot(Choice::reduce, 16 * K, 2));
  }
  {
    ScopedEnv forced("SHOAL_DIRECT_REDUCE", "one_shot");
    EXPECT_TRUE(Ways::current().reduce_one_shot(Choice::allreduce, size_t(64) << 20, 64));
  }
  {
    ScopedEnv forced("SHOAL_DIRECT_BROADCAST", "single_copy");
    EXPECT_TRUE(Ways::current().single_copy(Choice::broadcast, size_t(64) << 20, 64));
  }
  {
    ScopedEnv forced("SHOAL_DIRECT_BROADCAST", "scratch");
    EXPECT_FALSE(Ways::current().single_copy(Choice::broadcast, 16 * K, 2));
  }
  {
    ScopedEnv forced("SHOAL_DIRECT_ALLGATHER", "single_copy");
    EXPECT_TRUE(Ways::current().single_copy(Choice::allgather, size_t(64) << 20, 2));
  }
  {
    ScopedEnv forced("SHOAL_DIRECT_ALLGATHER", "scratch");
    EXPECT_FALSE(Ways::current().single_copy(Choice::allgather, 256 * K, 2));
  }
  {
    ScopedEnv forced("SHOAL_DIRECT_SCATTER", "single_copy");
    EXPECT_TRUE(Ways::current().single_copy(Choice::scatter, 16 * K, 4));
  }
  {
    ScopedEnv forced("SHOAL_DIRECT_SCATTER", "scratch");
    EXPECT_FALSE(Ways::current().single_copy(Choice::scatter, 256 * K, 2));
  }
  {
    ScopedEnv forced("SHOAL_DIRECT_GATHER", "single_copy");
    EXPECT_TRUE(Ways::current().single_copy(Choice::gather, 16 * K, 4));
  }
  {
    ScopedEnv forced("SHOAL_DIRECT_GATHER", "scratch");
    EXPECT_FALSE(Ways::current().single_copy(Choice::gather, size_t(64) << 20, 2));
  }
}

// The 2-rank allreduce by single copy: forced by SHOAL_DIRECT_REDUCE=single_copy at any size (the
// other ops and shapes then choose by the costs), never by the other forced ways, and unforced
// from 2 MiB on Intel's built-in costs only, whatever SHOAL_TUNING holds.
TEST(CostCurves, TheAllreduceBySingleCopyWhereForcedOrOnIntelsCostsFrom2MiB) {
  for (const char* cpu : {"amd", "intel"}) {
    ScopedEnv kind("SHOAL_TUNING_BUILTIN", cpu);
    {
      ScopedEnv forced("SHOAL_DIRECT_REDUCE", "single_copy");
      const Ways w = Ways::current();
      EXPECT_TRUE(w.allreduce_single_copy(16 * K)) << cpu;
      ScopedEnv unset("SHOAL_DIRECT_REDUCE", nullptr);
      const Ways costs = Ways::current();
      for (Choice op : {Choice::allreduce, Choice::reduce})
        for (int p : {2, 3, 8})
          for (size_t n : {16 * K, 1024 * K, size_t(16) << 20})
            EXPECT_EQ(w.cheaper(op, n, p), costs.cheaper(op, n, p)) << cpu << ": " << choice_name(op) << " p " << p << " n " << n;
    }
    for (const char* way : {"one_shot", "two_shot"}) {
      ScopedEnv forced("SHOAL_DIRECT_REDUCE", way);
      EXPECT_FALSE(Ways::current().allreduce_single_copy(size_t(64) << 20)) << cpu << " " << way;
    }
    ScopedEnv unset("SHOAL_DIRECT_REDUCE", nullptr);
    const Ways w = Ways::current();
    const bool intel = std::string(cpu) == "intel";
    EXPECT_EQ(w.allreduce_single_copy(size_t(2) << 20), intel) << cpu;
    EXPECT_EQ(w.allreduce_single_copy(size_t(64) << 20), intel) << cpu;
    EXPECT_FALSE(w.allreduce_single_copy((size_t(2) << 20) - 1)) << cpu;
  }
}

// Where the points hold two pairs of times (two stretches of the machine), the choice is the way
// that loses least in the worse: not the faster in one when it is far slower in the other.
TEST(CostCurves, WithTwoPairsTheChoiceLosesLeastInTheWorse) {
  ScopedEnv unset_alltoall("SHOAL_DIRECT_ALLTOALL", nullptr);
  const std::string two = "direct alltoallv 4 65536 10 8 10 30\n"      // way 1 1.25x ahead, then 3x behind
                          "direct alltoallv 4 1048576 100 50 100 60\n";  // way 1 ahead in both
  const auto t = parse_tuning(two, "test").points;
  EXPECT_DOUBLE_EQ(way_us(t, Choice::alltoallv, 4, 64 * K, 1), 8);
  EXPECT_DOUBLE_EQ(way_us(t, Choice::alltoallv, 4, 64 * K, 1, true), 30);
  const auto one = parse_tuning("direct alltoallv 4 65536 10 8\n", "test").points;
  EXPECT_DOUBLE_EQ(one[0].us2[0], 10);
  EXPECT_DOUBLE_EQ(one[0].us2[1], 8);

  int files = 0;
  auto choice = [&](const std::string& text, size_t n) {
    // A new name each time: the points are read again only when SHOAL_TUNING changes.
    const std::string path = ::testing::TempDir() + "shoal-tuning-states-" + std::to_string(files++) + ".txt";
    {
      std::ofstream f(path);
      f << text;
    }
    ScopedEnv file("SHOAL_TUNING", path.c_str());
    const int way = Ways::current().cheaper(Choice::alltoallv, n, 4);
    std::remove(path.c_str());
    return way;
  };
  EXPECT_EQ(choice(two, 64 * K), 0);
  EXPECT_EQ(choice(two, 1024 * K), 1);
  EXPECT_EQ(choice("direct alltoallv 4 65536 10 8\ndirect alltoallv 4 1048576 100 50\n", 64 * K), 1);  // one pair
}

// The built-in points parse, and cover every op at 2 ranks up to where ranks outnumber cores
// several times over; broadcast's and allgather's at 2 ranks, the only group size where they may
// take single copy.
TEST(CostCurves, BuiltInPointsCoverEveryOp) {
  ScopedEnv unset_file("SHOAL_TUNING", nullptr);
  for (const char* cpu : {"amd", "intel"}) {
    ScopedEnv kind("SHOAL_TUNING_BUILTIN", cpu);
    const auto held = tuning();
    const auto& points = held->points;
    for (Choice op : kAllChoices) {
      int lo = 1 << 30, hi = 0;
      for (const auto& q : points)
        if (q.op == op) lo = std::min(lo, q.ranks), hi = std::max(hi, q.ranks);
      EXPECT_EQ(lo, 2) << cpu << ": " << choice_name(op);
      EXPECT_GE(hi, op == Choice::broadcast || op == Choice::allgather ? 2 : 8) << cpu << ": " << choice_name(op);
    }
  }
}

// The points' keys, sorted: two tunings hold the same points whatever their order.
std::vector<decltype(point_key(CostPoint{}))> sorted(const std::vector<CostPoint>& points) {
  std::vector<decltype(point_key(CostPoint{}))> out;
  for (const auto& q : points) out.push_back(point_key(q));
  std::sort(out.begin(), out.end());
  return out;
}

// The built-in points of each CPU: Intel's for the ops its file has points of, AMD's for the
// others and for an AMD (or another maker's) CPU; the switches are AMD's file's for both. `auto`
// follows the CPU's maker. Expected values come from parsing the two files here.
TEST(CostCurves, EachCpuReadsItsOwnBuiltInPoints) {
  ScopedEnv unset_file("SHOAL_TUNING", nullptr);
  const Tuning amd = parse_tuning(kAmdFile, "amd"), intel = parse_tuning(kIntelFile, "intel");
  ASSERT_FALSE(intel.points.empty());
  auto expected = [&](bool on_intel) {
    std::vector<CostPoint> out;
    for (Choice op : kAllChoices) {
      const bool intel_has =
          std::any_of(intel.points.begin(), intel.points.end(), [&](const CostPoint& q) { return q.op == op; });
      for (const auto& q : (on_intel && intel_has ? intel : amd).points)
        if (q.op == op) out.push_back(q);
    }
    return sorted(out);
  };
  uint64_t switches[2] = {};
  for (bool on_intel : {false, true}) {
    ScopedEnv kind("SHOAL_TUNING_BUILTIN", on_intel ? "intel" : "amd");
    EXPECT_EQ(built_in_cpu(), on_intel ? BuiltInCpu::intel : BuiltInCpu::amd);
    EXPECT_EQ(sorted(tuning()->points), expected(on_intel)) << (on_intel ? "intel" : "amd");
    switches[on_intel] = Ways::current().switches_digest();
  }
  EXPECT_EQ(switches[0], switches[1]);
  bool this_cpu_intel = false;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  this_cpu_intel = __builtin_cpu_is("intel");
#endif
  for (const char* setting : {"auto", static_cast<const char*>(nullptr)}) {
    ScopedEnv kind("SHOAL_TUNING_BUILTIN", setting);
    EXPECT_EQ(sorted(tuning()->points), expected(this_cpu_intel)) << (setting ? setting : "unset");
  }
  // A file's points for one op over Intel's built-in ones: Intel's for the others.
  const std::string path = ::testing::TempDir() + "shoal-tuning-over-intel-" + std::to_string(getpid()) + ".txt";
  {
    std::ofstream f(path);
    f << "direct allreduce 2 16384 50 5\n";
  }
  {
    ScopedEnv kind("SHOAL_TUNING_BUILTIN", "intel");
    ScopedEnv file("SHOAL_TUNING", path.c_str());
    std::vector<CostPoint> want = parse_tuning("direct allreduce 2 16384 50 5\n", "file").points;
    for (const auto& q : parse_tuning(kIntelFile, "intel").points)
      if (q.op != Choice::allreduce) want.push_back(q);
    for (Choice op : kAllChoices)
      if (op != Choice::allreduce &&
          std::none_of(intel.points.begin(), intel.points.end(), [&](const CostPoint& q) { return q.op == op; }))
        for (const auto& q : amd.points)
          if (q.op == op) want.push_back(q);
    EXPECT_EQ(sorted(tuning()->points), sorted(want));
  }
  std::remove(path.c_str());
  // With a file of points for every op the CPU still decides (the alltoall's single copy,
  // direct_alltoall.cpp): it is in the digest a host's ranks compare.
  {
    std::string all_ops;
    for (Choice op : kAllChoices) all_ops += std::string("direct ") + choice_name(op) + " 2 16384 1 2\n";
    std::ofstream(path) << all_ops;
    ScopedEnv file("SHOAL_TUNING", path.c_str());
    uint64_t digests[2] = {};
    for (bool on_intel : {false, true}) {
      ScopedEnv kind("SHOAL_TUNING_BUILTIN", on_intel ? "intel" : "amd");
      const Ways w = Ways::current();
      EXPECT_EQ(w.cpu(), on_intel ? BuiltInCpu::intel : BuiltInCpu::amd);
      EXPECT_EQ(w.points().size(), std::size(kAllChoices));
      digests[on_intel] = w.digest();
    }
    EXPECT_NE(digests[0], digests[1]);
    std::remove(path.c_str());
  }
  // Where the two CPUs' tunes disagree, each takes its own: a 2 MiB scatter at 2 ranks goes
  // through the scratch on the AMD EPYC and by single copy on the Intel Xeon (BENCHMARKS.md,
  // "The built-in costs of an Intel Xeon").
  ScopedEnv unset_scatter("SHOAL_DIRECT_SCATTER", nullptr);
  {
    ScopedEnv kind("SHOAL_TUNING_BUILTIN", "amd");
    EXPECT_FALSE(Ways::current().single_copy(Choice::scatter, size_t(2) << 20, 2));
  }
  {
    ScopedEnv kind("SHOAL_TUNING_BUILTIN", "intel");
    EXPECT_TRUE(Ways::current().single_copy(Choice::scatter, size_t(2) << 20, 2));
  }
}

// SHOAL_TUNING's file replaces the built-in points, and is read again when the variable changes.
TEST(CostCurves, TheFileSHOAL_TUNINGNamesDecides) {
  ScopedEnv unset_reduce("SHOAL_DIRECT_REDUCE", nullptr), unset_alltoall("SHOAL_DIRECT_ALLTOALL", nullptr),
      unset_broadcast("SHOAL_DIRECT_BROADCAST", nullptr), unset_allgather("SHOAL_DIRECT_ALLGATHER", nullptr),
      unset_scatter("SHOAL_DIRECT_SCATTER", nullptr), unset_gather("SHOAL_DIRECT_GATHER", nullptr);
  const std::string path = ::testing::TempDir() + "shoal-tuning-test.txt";
  {
    std::ofstream f(path);
    f << "direct allreduce 2 16384 50 5\ndirect reduce 2 16384 50 5\ndirect alltoall 2 16384 5 50\n"  // way 1, way 1, way 0
      << "direct alltoallv 2 16384 50 5\ndirect broadcast 2 16384 5 50\n"                                 // way 1, way 0
      << "direct allgather 2 16384 50 5\ndirect scatter 2 16384 5 50\n"                                   // way 1, way 0
      << "direct gather 2 16384 50 5\n";                                                                // way 1
  }
  ScopedEnv unset_file("SHOAL_TUNING", nullptr);
  const bool built_in = Ways::current().reduce_one_shot(Choice::reduce, 16 * K, 2);
  {
    ScopedEnv file("SHOAL_TUNING", path.c_str());
    EXPECT_EQ(tuning()->points.size(), 8u);
    EXPECT_FALSE(Ways::current().single_copy(Choice::scatter, 16 * K, 2));
    EXPECT_TRUE(Ways::current().single_copy(Choice::gather, 16 * K, 2));
    EXPECT_FALSE(Ways::current().single_copy(Choice::broadcast, 16 * K, 2));
    EXPECT_TRUE(Ways::current().single_copy(Choice::allgather, 16 * K, 2));
    EXPECT_TRUE(Ways::current().alltoall_pairwise(Choice::alltoallv, 16 * K, 2));
    EXPECT_FALSE(Ways::current().alltoall_pairwise(Choice::alltoall, size_t(64) << 20, 16));
    EXPECT_FALSE(Ways::current().reduce_one_shot(Choice::reduce, 16 * K, 2));
    EXPECT_FALSE(Ways::current().reduce_one_shot(Choice::allreduce, 16 * K, 2));
  }
  EXPECT_EQ(Ways::current().reduce_one_shot(Choice::reduce, 16 * K, 2), built_in);
  {
    ScopedEnv missing("SHOAL_TUNING", "/nonexistent/shoal-tuning.txt");
    try {
      tuning();
      ADD_FAILURE() << "a missing SHOAL_TUNING file was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("SHOAL_TUNING='/nonexistent/shoal-tuning.txt'"), std::string::npos) << e.what();
    }
  }
  // A file with points for one op: the others keep the built-in ones.
  {
    std::ofstream f(path);
    f << "direct alltoall 2 16384 50 5\n";
  }
  {
    ScopedEnv file("SHOAL_TUNING", path.c_str());
    const auto held = tuning();
    size_t alltoall = 0, reduce = 0;
    for (const auto& q : held->points) {
      if (q.op == Choice::alltoall) ++alltoall;
      if (q.op == Choice::reduce) ++reduce;
    }
    EXPECT_EQ(alltoall, 1u);
    EXPECT_GT(reduce, 0u);
    EXPECT_TRUE(Ways::current().alltoall_pairwise(Choice::alltoall, 16 * K, 2));
    EXPECT_EQ(Ways::current().reduce_one_shot(Choice::reduce, 16 * K, 2), built_in);
  }
  std::remove(path.c_str());
}

// Switch lines: a known name, for any group size or (NAME@P) for P ranks, and a number of bytes or
// 'never', once each; anything else is an error naming the line (an unknown name lists the
// switches).
TEST(CostCurves, SwitchLinesParseAndRejectWhatTheyCannotUse) {
  const Tuning t = parse_tuning(
      "switch allreduce.mst_below 4096\nswitch hier.allgather.ring_from never  # off\n"
      "switch allreduce.mst_below@4 8192\nswitch scatter.mst_below@3 100\n",
      "test");
  EXPECT_TRUE(t.points.empty());
  EXPECT_TRUE(t.has[static_cast<size_t>(Switch::allreduce_mst_below)]);
  EXPECT_EQ(t.at(Switch::allreduce_mst_below, 2), 4096u);
  EXPECT_EQ(t.at(Switch::allreduce_mst_below, 4), 8192u);  // its line for 4 ranks
  EXPECT_EQ(t.at(Switch::allreduce_mst_below, 5), 4096u);  // exactly 4, not from 4 on
  EXPECT_EQ(t.at(Switch::hier_allgather_ring_from, 8), kNever);
  EXPECT_EQ(t.at(Switch::scatter_mst_below, 3), 100u);
  EXPECT_TRUE(t.has[static_cast<size_t>(Switch::scatter_mst_below)]);
  EXPECT_FALSE(t.has_all[static_cast<size_t>(Switch::scatter_mst_below)]);
  EXPECT_FALSE(t.has[static_cast<size_t>(Switch::gather_mst_below)]);
  const Rejected cases[] = {
      {"switch allreduce.mst_below\n", "expected: switch NAME BYTES"},
      {"switch allreduce.mst_below 4096 8192\n", "unexpected '8192'"},
      {"switch allreduce.mst_below 4K\n", "not '4K'"},
      {"switch allreduce.mst_below -1\n", "not '-1'"},
      {"switch allreduce.mst 4096\n", "the switches: allreduce.mst_below, allreduce.bde_up_to"},
      {"switch gather.mst_below 1\nswitch gather.mst_below 2\n", "line 2"},
      {"switch gather.mst_below@4 1\nswitch gather.mst_below@4 2\n", "at 4 ranks"},
      {"switch gather.mst_below@four 1\n", "not 'four'"},
      {"switch gather.mst_below@0 1\n", "not '0'"},
  };
  expect_rejected(cases);
}

// A SHOAL_TUNING file's switches move the automatic choice between ranks that do not share
// memory; the switches it does not set, and the direct points it has none of, stay built in.
TEST(CostCurves, TheFilesSwitchesMoveTheChoiceOverTheNetwork) {
  ScopedEnv unset_file("SHOAL_TUNING", nullptr);
  const Ways built_in = Ways::current();
  const size_t n_points = built_in.points().size();
  const size_t mst_below = built_in.switch_at(Switch::allreduce_mst_below, 4);
  const size_t linear_from = built_in.switch_at(Switch::gather_mst_below, 4);
  ASSERT_LT(linear_from, size_t(64) << 20);
  // Sizes past the built-in switch, where the file moves it further.
  EXPECT_NE(choose_algo(OpKind::allreduce, Algo::automatic, mst_below * 2, 4, Topo::hosts, built_in), Algo::mst);
  EXPECT_EQ(choose_algo(OpKind::gather, Algo::automatic, size_t(64) << 20, 4, Topo::hosts, built_in), Algo::linear);
  const std::string path = ::testing::TempDir() + "shoal-tuning-switches.txt";
  {
    std::ofstream f(path);
    f << "switch allreduce.mst_below " << mst_below * 4 << "\nswitch gather.mst_below never\n";
  }
  {
    ScopedEnv file("SHOAL_TUNING", path.c_str());
    const Ways w = Ways::current();
    EXPECT_EQ(choose_algo(OpKind::allreduce, Algo::automatic, mst_below * 2, 4, Topo::hosts, w), Algo::mst);
    EXPECT_EQ(choose_algo(OpKind::gather, Algo::automatic, size_t(64) << 20, 4, Topo::hosts, w), Algo::mst);
    EXPECT_EQ(w.switch_at(Switch::broadcast_mst_below, 4), built_in.switch_at(Switch::broadcast_mst_below, 4));
    EXPECT_EQ(w.points().size(), n_points);
    EXPECT_EQ(w.digest(), built_in.digest());  // what the ranks of one host compare
    EXPECT_NE(w.switches_digest(), built_in.switches_digest());  // what every rank compares
    // Shared memory between every rank: the direct algorithms, whatever the switches.
    EXPECT_EQ(choose_algo(OpKind::allreduce, Algo::automatic, mst_below * 2, 4, Topo::shm, w), Algo::direct);
  }
  // A line for one group size holds at that size only; at the others the file's switch has no
  // line, so it takes the built-in one for any size, and none of the built-in ones for one size.
  const std::string path8 = path + ".8";  // another name: a file is read again only when SHOAL_TUNING changes
  {
    std::ofstream f(path8);
    f << "switch gather.mst_below@8 never\n";
  }
  {
    ScopedEnv file("SHOAL_TUNING", path8.c_str());
    const Ways w = Ways::current();
    EXPECT_EQ(choose_algo(OpKind::gather, Algo::automatic, size_t(64) << 20, 8, Topo::hosts, w), Algo::mst);
    const size_t any = built_in.switch_at(Switch::gather_mst_below, 5);  // no built-in line for 5 ranks
    for (int p : {3, 4, 5}) EXPECT_EQ(w.switch_at(Switch::gather_mst_below, p), any) << p;
  }
  std::remove(path.c_str());
  std::remove(path8.c_str());
}

}  // namespace
