// Which place of a slot a rank's next chunked direct op takes (src/algo/slot_places.h), driven with
// chosen times.
#include <cstdint>
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
    const Got got = o.run(turns, 3000, 1000);
    // No place moves before 2·turns ops have found the pace fast enough; then every op moves on.
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

TEST(SlotPlaces, ABurstAfterAPauseStaysWhereTheOpsBeforeItWrote) {
  Ops o(Mode::automatic);
  const Got stream = o.run(8, 1000, 1000);
  ASSERT_NE(stream.back(), stream[stream.size() - 3]);  // moving
  // Bursts of 16 ops a microsecond apart, each after a second's pause (each of 8 places would come
  // back within 16 ops): every op stays where its slot's last one was.
  for (int burst = 0; burst < 10; ++burst) {
    g_now += kSecond;
    EXPECT_EQ(o.run(8, 16, 1000), (Got{stream[998], stream[999], stream[998], stream[999], stream[998], stream[999],
                                       stream[998], stream[999], stream[998], stream[999], stream[998], stream[999],
                                       stream[998], stream[999], stream[998], stream[999]}))
        << "burst " << burst;
  }
  // A stream after the pause moves again.
  const Got again = o.run(8, 1000, 1000);
  EXPECT_NE(again.back(), again[again.size() - 3]);
}

}  // namespace
