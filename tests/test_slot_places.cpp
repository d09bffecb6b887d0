// Which place of a slot a rank's next chunked direct op takes (src/algo/slot_places.h), driven with
// chosen times.
#include <cstdint>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "algo/slot_places.h"

namespace {

using shoal::algo::SlotPlaces;
using Mode = SlotPlaces::Mode;
using Got = std::vector<size_t>;

uint64_t g_now = 0;
uint64_t read_clock() { return g_now; }

// Ops that alternate slots, as chunked direct ops do (the first in slot 0), each of `turns` places
// and started `gap_ns` after the one before (the first, after g_now): their places.
struct Ops {
  explicit Ops(Mode m) : s(m, read_clock) { g_now = 1; }
  Got run(size_t turns, int ops, uint64_t gap_ns) {
    Got got;
    for (int i = 0; i < ops; ++i) {
      g_now += gap_ns;
      got.push_back(s.next(turns, n++ % 2));
    }
    return got;
  }
  SlotPlaces s;
  int n = 0;
};

// The greatest gap between ops at which a place still comes back within kRevisitNs: 2·turns ops.
uint64_t bound(size_t turns) { return SlotPlaces::kRevisitNs / (2 * turns); }
constexpr uint64_t kSecond = 1000000000;

TEST(SlotPlaces, MovingTakesEachSlotsNextPlaceWhateverTheGaps) {
  Ops o(Mode::moving);
  EXPECT_EQ(o.run(3, 8, kSecond), (Got{1, 1, 2, 2, 0, 0, 1, 1}));
}

TEST(SlotPlaces, EachSlotMovesByItsOwnOps) {
  // Ops that take a chunked number without asking (single copy) can leave every op that asks in
  // one slot: each still goes to the next place of that slot.
  SlotPlaces s(Mode::moving, read_clock);
  EXPECT_EQ((Got{s.next(3, 0), s.next(3, 0), s.next(3, 0), s.next(3, 1)}), (Got{1, 2, 0, 1}));
}

TEST(SlotPlaces, FixedStaysAtTheStart) {
  Ops o(Mode::fixed);
  EXPECT_EQ(o.run(4, 6, 100), Got(6, 0));
}

// The ops, from `from` on, take each slot's next place at every op: 1, 1, 2, 2, ... from the places
// the two ops at `from` took.
void expect_moving(const Got& got, size_t from, size_t turns) {
  for (size_t i = from + 2; i < got.size(); ++i)
    EXPECT_EQ(got[i], (got[i - 2] + 1) % turns) << "op " << i;
}

TEST(SlotPlaces, AutomaticMovesOnceOpsHaveComeFastForACycle) {
  for (size_t turns : {2, 8, 128}) {
    Ops o(Mode::automatic);
    // Half the greatest gap that brings a place back within kRevisitNs. No place moves before
    // 2·turns ops have found the pace fast enough; then every op moves on.
    const Got got = o.run(turns, 3000, bound(turns) / 2);
    size_t first = 0;
    while (first < got.size() && got[first] == 0) ++first;
    ASSERT_LT(first, 2000u) << turns << " places";
    EXPECT_GT(first, 2 * turns) << turns << " places";
    expect_moving(got, first, turns);
  }
}

TEST(SlotPlaces, AutomaticStaysWhileOpsComeSlower) {
  // Twice the greatest gap that brings a place back within kRevisitNs, or a millisecond apart with
  // 128 places: no op moves, however long they go on.
  Ops o(Mode::automatic);
  EXPECT_EQ(o.run(4, 2000, 2 * bound(4)), Got(2000, 0));
  EXPECT_EQ(o.run(128, 2000, 1000000), Got(2000, 0));
  // A millisecond apart with 2 places (a place comes back after 4 ms): they move.
  const Got got = o.run(2, 2000, 1000000);
  EXPECT_NE(got.back(), got[got.size() - 3]);
}

TEST(SlotPlaces, AMomentsDelayInAStreamDoesNotStopIt) {
  Ops o(Mode::automatic);
  Got got = o.run(128, 2000, 1000);
  g_now += 200000;  // one gap of 200 µs (a rank off its core): on the pace of 1 µs, 13 µs more
  const Got more = o.run(128, 40, 1000);
  got.insert(got.end(), more.begin(), more.end());
  expect_moving(got, 1000, 128);
}

// The places of a stream of `ops` ops 1 µs apart after a pause of `pause_ns`, following a stream
// that moved; `before` gets each slot's place before the pause, by slot (the run's first op is
// in slot o.n % 2).
Got after_pause(Ops& o, size_t turns, uint64_t pause_ns, int ops, size_t before[2]) {
  const Got stream = o.run(turns, 2000, 1000);
  EXPECT_NE(stream.back(), stream[stream.size() - 3]) << "the stream before the pause moves";
  before[o.n % 2] = stream[stream.size() - 2];
  before[(o.n + 1) % 2] = stream.back();
  g_now += pause_ns - 1000;
  return o.run(turns, ops, 1000);
}

TEST(SlotPlaces, AGapOfTheBoundOrMoreStartsTheCountAgain) {
  // With 2 places a pace of 2.5 ms is fast enough, so the average alone (625 µs after any pause)
  // would go on moving: the gap itself stops it. The op after the gap and the 4 after it stay;
  // then each moves on.
  for (uint64_t pause : {SlotPlaces::kRevisitNs, kSecond}) {
    Ops o(Mode::automatic);
    size_t before[2];
    const Got got = after_pause(o, 2, pause, 8, before);
    EXPECT_EQ(got, (Got{before[0], before[1], before[0], before[1], before[0], 1 - before[1], 1 - before[0], before[1]}))
        << pause << " ns";
  }
  // Just under the bound, the average decides: a stream of 2 places goes on moving.
  Ops o(Mode::automatic);
  size_t before[2];
  const Got got = after_pause(o, 2, SlotPlaces::kRevisitNs - 1, 2, before);
  EXPECT_EQ(got, (Got{1 - before[0], 1 - before[1]}));
}

TEST(SlotPlaces, ABurstAfterAPauseStaysWhereTheOpsBeforeItWrote) {
  // Bursts of 2·turns + 1 ops a microsecond apart, each after a pause of 20 ms, stay; a stream
  // after them moves again.
  for (size_t turns : {2, 4, 8, 128}) {
    Ops o(Mode::automatic);
    size_t before[2];
    const int burst = static_cast<int>(2 * turns + 1);
    Got got = after_pause(o, turns, 20000000, burst, before);
    for (int b = 0; b < 5; ++b) {
      for (int i = 0; i < burst; ++i) EXPECT_EQ(got[i], before[i % 2]) << turns << " places, burst " << b << ", op " << i;
      g_now += 20000000;
      got = o.run(turns, burst, 1000);
      if (burst % 2) std::swap(before[0], before[1]);  // the next burst starts in the other slot
    }
    const Got again = o.run(turns, 1000, 1000);
    EXPECT_NE(again.back(), again[again.size() - 3]) << turns << " places";
  }
}

TEST(SlotPlaces, APauseCountsAsTheBoundInThePace) {
  // After a second's pause, ops 1 µs apart bring a pace capped at 10 ms under 39 µs (128 places)
  // in about 44 ops, and the places move 2·128 ops after that; uncapped, the pace would take
  // about 115.
  Ops o(Mode::automatic);
  size_t before[2];
  const Got got = after_pause(o, 128, kSecond, 400, before);
  size_t first = 0;
  while (first < got.size() && got[first] == before[first % 2]) ++first;
  EXPECT_GT(first, 2 * 128u + 30);
  EXPECT_LT(first, 2 * 128u + 60);
}

}  // namespace
