// Which place of a slot a rank's next chunked direct op takes (direct_common.h, Places).
//
// With a core for each rank, successive ops on a slot move through a share of one L2 so that a
// writer's stores go to lines its readers have let go (BENCHMARKS.md, "Direct ops: each op's place
// in the slot"). A place then comes back only after `turns` ops on its slot, and on a virtual
// machine a page left unwritten for a while may cost a trap to the host at its next write:
// 100-300 µs for a few pieces of 16 KiB in a thousand after 10 ms, one in twenty after 100 ms
// (BENCHMARKS.md, "Writes after a pause"). So the places move only while ops come fast enough that
// a place comes back within kRevisitNs, and only once they have come that fast for more ops than
// the two slots have places: a burst after a pause (gradient buckets after a backward pass) stays
// where the ops before the pause wrote, and a stream of ops writes each place stale once, then
// finds it written within kRevisitNs. How fast ops come is an average over about kPaceOps of
// them: a rank that loses its core for a moment (ranks that wait for it see the gap too) comes
// back within the bound, and its stream goes on moving. A gap of kRevisitNs or more starts the
// count again whatever the average: the next place has gone that long unwritten. Each rank chooses for its own slots and publishes its place
// with the op (Places), so no rank needs to choose as another does.
#pragma once
#include <cstddef>
#include <cstdint>

namespace shoal::algo {

class SlotPlaces {
 public:
  enum class Mode { automatic, moving, fixed };
  // What the automatic mode reads as the time, ns (the steady clock where none is given: tests
  // give one).
  using Clock = uint64_t (*)();
  static constexpr uint64_t kRevisitNs = 10'000'000;
  static constexpr int64_t kPaceOps = 16;

  explicit SlotPlaces(Mode m = Mode::automatic, Clock clock = nullptr) : mode_(m), clock_(clock) {}

  // The place, 0 to turns - 1, of the op that starts now in slot `slot` (0 or 1), among the
  // `turns` of that slot (fewer than 2: place 0, and the op is not counted). Each slot counts its
  // moves, and its place is that count modulo turns: `moving` counts every op of the slot,
  // `fixed` stays at place 0, `automatic` counts an op where, at it and the 2·turns ops before it,
  // the gap from the op before was under kRevisitNs and the ops' pace (those gaps, each at most
  // kRevisitNs, averaged over kPaceOps) was within kRevisitNs / (2·turns); else the slot keeps its
  // count, and ops of one size keep their place.
  size_t next(size_t turns, int slot);

 private:
  Mode mode_;
  Clock clock_;
  uint64_t moved_[2] = {0, 0};  // by slot: the times its place moved on (its place: moved_ % turns)
  int64_t pace_ = kRevisitNs;   // automatic: the gap between ops' starts, averaged, ns
  uint64_t fast_ = 0;           // automatic: the ops in a row that found the pace fast enough
  uint64_t last_ns_ = 0;        // automatic: when the last op asked (0: none yet)
};

// The mode SHOAL_DIRECT_PLACES sets (`auto`, the default: automatic).
SlotPlaces::Mode slot_places_setting();

}  // namespace shoal::algo
