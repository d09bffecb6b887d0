// The machine-dependent part of the automatic choice, as code: where an op has two ways of
// running on one host, each has a cost curve measured on the machine, and the choice is the
// cheaper curve at the op's size.
//
// - The direct allreduce and reduce above the small protocol (direct_allreduce.cpp): way 0 is one
//   shot (every rank, or the root, reads every peer's whole input after one barrier), way 1 two
//   shot (each rank reduces one slice, then the slices are copied out, N+2 barriers for N chunks).
//   One shot saves barriers and two shot bytes.
// - alltoall and alltoallv over shared memory (direct_alltoall.cpp, direct_alltoallv.cpp): way 0
//   goes through the ranks' scratch slots (or by single copy), a barrier per phase; way 1 is the
//   pairwise exchange over the shm rings, no barrier. Barriers among many ranks sharing few cores
//   cost more than the rings' handshakes once blocks are large.
//
// Where they cross depends on what a barrier costs (tens of µs once ranks outnumber cores), on how
// fast a core reads what another just wrote, and on where the data leaves the caches, so it is
// measured, not derived: `scripts/tune_algos.py --direct` times both ways at several group sizes
// and message sizes and writes the medians to the file SHOAL_TUNING names. The built-in points
// come from the same script on our 2-core machines (docs/algorithms.md, "Measured cost curves").
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "algo/algorithms.h"

namespace shoal::algo {

// One measured point: both ways of `op` (allreduce, reduce or alltoallv, for alltoall) at `ranks`
// ranks and `bytes` (allreduce, reduce: per rank; alltoall: all blocks of a rank).
struct CostPoint {
  OpKind op = OpKind::allreduce;
  int ranks = 0;
  size_t bytes = 0;
  double us[2] = {0, 0};  // way 0, way 1 (above)
};

// The points in effect: SHOAL_TUNING's (with the built-in ones for an op it has none of), else
// the built-in ones; the file is read when first needed and again only if SHOAL_TUNING changes.
// Throws InvalidArgument naming the file if it cannot be used.
std::shared_ptr<const std::vector<CostPoint>> cost_points();

// The cost of `way` of `op` at p ranks and n bytes, from `points`. Along n:
// the straight line through the two measured sizes around n (below the smallest: its time; above
// the largest: the last segment extended). Along p: interpolated between the nearest measured
// group sizes, else scaled from the nearest by the way's structure (one shot moves (p+2)·p bytes
// in all, the others ∝ p). Throws Error if `points` has none for `op`.
double way_us(const std::vector<CostPoint>& points, OpKind op, int p, size_t n, int way);

// What the choices read, taken once when a group forms: the points in effect and the ways
// SHOAL_DIRECT_REDUCE and SHOAL_DIRECT_ALLTOALL force. Each communicator keeps its own (Ctx::ways),
// so a setting changed later in one process cannot make its ranks run one op different ways.
class Ways {
 public:
  // From the settings now. Throws InvalidArgument for a SHOAL_TUNING file that cannot be used.
  static Ways current();

  // The way `op` runs at n bytes and p ranks: the forced one, else the cheaper curve's.
  int cheaper(OpKind op, size_t n, int p) const;
  // Whether the direct allreduce (`op` allreduce) or reduce of n bytes per rank at p ranks runs in
  // one shot. The caller checks that one shot fits.
  bool reduce_one_shot(OpKind op, size_t n, int p) const { return cheaper(op, n, p) == 0; }
  // Whether an alltoall(v) of n bytes (what a rank sends; alltoallv: the most any rank sends) at p
  // ranks on one host takes the pairwise exchange over the rings rather than the scratch slots.
  bool alltoall_pairwise(size_t n, int p) const { return cheaper(OpKind::alltoallv, n, p) == 1; }

  // A digest of all of the above. Ranks with different digests could run one op different ways,
  // so the group's creation compares them (rendezvous).
  uint64_t digest() const;
  const std::vector<CostPoint>& points() const { return *points_; }

 private:
  std::shared_ptr<const std::vector<CostPoint>> points_;
  int forced_[2] = {-1, -1};  // allreduce and reduce, alltoall(v): the way, or -1 for the cheaper
};

// Parses a tuning file: '#' comments, and one line per measured point,
//   direct <allreduce|reduce|alltoall> <ranks> <bytes> <way 0 µs> <way 1 µs>
// Throws InvalidArgument naming `where` and the line.
std::vector<CostPoint> parse_tuning(const std::string& text, const std::string& where);

}  // namespace shoal::algo
