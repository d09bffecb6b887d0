// The α-β-γ cost model of every algorithm, as code: each row of the registry (registry.cpp) holds
// its algorithm's cost function next to the function that runs it. A cost is a count of terms on
// the busiest rank's path: messages (α each: one message's latency; a barrier for the direct
// algorithms), bytes moved (β each) and bytes reduced (γ each); a hierarchical algorithm counts
// the steps inside each host apart (local α and β) from the ones between hosts.
//
// What the model is for: it says why each algorithm exists and how its cost grows with p and n,
// and `shoal-bench --model` fits α, β and γ to a run and prints how well the model explains the
// measured times. The automatic choice is not its argmin: it follows points measured on the
// machine (cost.h, select.cpp), because on our machines a model fitted to one tune misplaced the
// switches of the others (docs/algorithms.md, "Where the choice changes").
#pragma once
#include <vector>

#include "algo/algorithms.h"

namespace shoal::algo {

// Where an op runs: p ranks on `hosts` hosts (the hierarchical algorithms' l = p / hosts ranks a
// host).
struct Shape {
  int p = 1;
  int hosts = 1;
};

// Counts of each term on the busiest rank's path.
struct Terms {
  double messages = 0;        // α
  double bytes = 0;           // β
  double reduced = 0;         // γ
  double local_messages = 0;  // α inside a host (hierarchical algorithms)
  double local_bytes = 0;     // β inside a host
};
Terms operator+(const Terms& a, const Terms& b);

// Seconds per term: α and β are those of the links the group's flat algorithms use (shared
// memory on one host, unless SHOAL_TRANSPORT=tcp; the network across hosts).
struct Model {
  double alpha = 0;
  double beta = 0;
  double gamma = 0;
  double local_alpha = 0;
  double local_beta = 0;
};
double seconds(const Terms& t, const Model& m);

// A cost function: the terms of one algorithm for an op of n bytes (the op's whole message: the
// vector of allreduce, reduce and broadcast; every rank's blocks together for the others, as
// shoal-bench counts sizes).
using CostFn = Terms (*)(Shape, double n);

// The cost of algorithm `a` for op `k` (registry.cpp). Throws InvalidArgument where k lacks a.
Terms cost_of(OpKind k, Algo a, Shape s, double n);

// Helpers of the cost functions.
double lg_ceil(int p);          // ⌈lg p⌉
int pof2_floor(int p);          // the largest power of two ≤ p
// A direct op's number of chunks (pipeline phases) for `bytes` cut into pieces of `chunk`.
double direct_chunks(double bytes, double chunk);
// The data slot of the scratch SHOAL_SHM_SCRATCH sets, in bytes (direct_common.h: slot_bytes).
size_t direct_slot();
// Whether a direct op whose small test reads `bytes` runs the small protocol (no barrier).
bool direct_small(double bytes);

// The model whose predictions best match `seconds` (one time per row of `terms`), by least squares
// on the relative error, every parameter ≥ 0; a term that is zero in every row keeps 0. Rows with
// a time that is not finite and positive are left out. `rms_relative_error`: of the fitted model
// over the rows used (NaN when none). Throws InvalidArgument if the two vectors differ in length.
struct Fit {
  Model model;
  double rms_relative_error = 0;
  size_t rows = 0;  // rows used
};
Fit fit_model(const std::vector<Terms>& terms, const std::vector<double>& seconds);

}  // namespace shoal::algo
