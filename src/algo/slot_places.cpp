#include "algo/slot_places.h"

#include <algorithm>
#include <string>

#include "base/params.h"
#include "base/steady_ns.h"

namespace shoal::algo {

size_t SlotPlaces::next(size_t turns, int slot) {
  if (mode_ == Mode::fixed || turns < 2) return 0;
  uint64_t& moved = moved_[slot & 1];
  if (mode_ == Mode::moving) return static_cast<size_t>(++moved % turns);
  const uint64_t now = clock_ ? clock_() : steady_ns();
  bool fresh = true;  // whether the slot's next place may still have been written within kRevisitNs
  if (last_ns_ != 0) {
    const uint64_t gap = now - last_ns_;
    fresh = gap < kRevisitNs;
    pace_ += (static_cast<int64_t>(std::min(gap, kRevisitNs)) - pace_) / kPaceOps;
  }
  last_ns_ = now;
  // pace_ <= kRevisitNs / (2·turns), without the division
  fast_ = fresh && static_cast<uint64_t>(pace_) * 2 * turns <= kRevisitNs ? fast_ + 1 : 0;
  if (fast_ > 2 * turns) ++moved;
  return static_cast<size_t>(moved % turns);
}

SlotPlaces::Mode slot_places_setting() {
  const std::string m = params::choice("SHOAL_DIRECT_PLACES").value_or("auto");
  return m == "moving" ? SlotPlaces::Mode::moving : m == "fixed" ? SlotPlaces::Mode::fixed : SlotPlaces::Mode::automatic;
}

}  // namespace shoal::algo
