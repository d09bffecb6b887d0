// The machine-dependent part of the automatic choice, as code: each way of running an op has a
// cost curve measured on the machine, and the choice is the cheaper curve at the op's size.
//
// The shared-memory allreduce and reduce above the small protocol (direct_allreduce.cpp) run in
// one of two ways (their α-β-γ costs open direct_allreduce.cpp). One shot: every rank (reduce: the
// root) reads every peer's whole input after one barrier. Two shot: each rank reduces one slice,
// then the slices are copied out, with N+2 barriers for N chunks. One shot saves barriers and two
// shot saves bytes; where they cross depends on what a barrier costs (tens of µs once ranks
// outnumber cores), on how fast a core reads what another just wrote, and on where p·n leaves the
// caches, so it is measured, not derived: `scripts/tune_algos.py --direct-reduce` times both ways
// at several group sizes and message sizes and writes the medians to the file SHOAL_TUNING names.
// The built-in points come from the same script on our 2-core machines (docs/algorithms.md,
// "Measured cost curves: one shot or two shot").
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "algo/algorithms.h"

namespace shoal::algo {

// One measured point: the direct allreduce or reduce of `bytes` per rank at `ranks` ranks.
struct DirectReducePoint {
  OpKind op = OpKind::allreduce;  // allreduce or reduce
  int ranks = 0;
  size_t bytes = 0;
  double one_shot_us = 0, two_shot_us = 0;
};

// The points in effect: SHOAL_TUNING's, else the built-in ones; the file is read when first
// needed and again only if SHOAL_TUNING changes. Throws InvalidArgument naming the file if it
// cannot be used.
std::shared_ptr<const std::vector<DirectReducePoint>> direct_reduce_points();

// The cost of one way (one shot or two shot) of `op` at p ranks and n bytes, from `points`. Along n:
// the straight line through the two measured sizes around n (below the smallest: its time; above
// the largest: the last segment extended). Along p: interpolated between the nearest measured
// group sizes, else scaled from the nearest by the way's structure (one shot moves (p+2)·p bytes
// in all, two shot ∝ p). Throws Error if `points` has none for `op`.
double direct_reduce_us(const std::vector<DirectReducePoint>& points, OpKind op, int p, size_t n, bool one_shot);

// Whether the direct allreduce (`op` allreduce) or reduce of n bytes per rank at p ranks runs in
// one shot: SHOAL_DIRECT_REDUCE if set, else the cheaper curve. The caller checks that one shot fits.
bool direct_reduce_one_shot(OpKind op, size_t n, int p);

// Parses a tuning file: '#' comments, and one line per measured point,
//   direct <allreduce|reduce> <ranks> <bytes> <one-shot µs> <two-shot µs>
// Throws InvalidArgument naming `where` and the line.
std::vector<DirectReducePoint> parse_tuning(const std::string& text, const std::string& where);

}  // namespace shoal::algo
