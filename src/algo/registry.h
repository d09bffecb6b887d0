// The algorithm registry: for each collective, the algorithms it has, where each applies, and the
// function that runs it (registry.cpp holds the tables). Dispatch (dispatch.cpp), the check of a
// requested algorithm and the automatic choice (select.cpp), SHOAL_ALGO's parser, the public
// listing (algorithms_of) and the tests' lists of algorithms all read it.
#pragma once
#include <string>
#include <vector>

#include "algo/algorithms.h"

namespace shoal {

// Where an algorithm applies.
enum class Needs : uint8_t {
  any,           // any group
  shm,           // every rank on this host over shared memory (Topo::shm)
  several_hosts  // ranks on several hosts (Topo::hosts, Topo::hosts_shm)
};

// Whether op `k` has algorithm `a` (wherever it applies), what it needs, and the algorithms it
// has, in the registry's order ("ring, bde, ..." for messages).
bool has_algo(OpKind k, Algo a);
Needs needs_of(OpKind k, Algo a);  // Needs::any if k lacks a
std::vector<Algo> algos_list(OpKind k);
std::string algos_of(OpKind k);

namespace algo {
// The function of `a` for each op (null if the op lacks it). allgather and alltoall of equal
// blocks have their own direct versions (dispatch.cpp).
using AllreduceFn = void (*)(Ctx&, const void*, void*, size_t);
using BroadcastFn = void (*)(Ctx&, void*, size_t, int);
using RootedFn = void (*)(Ctx&, const void*, void*, size_t, int);  // reduce, gather, scatter
using AllgathervFn = void (*)(Ctx&, const void*, void*, const std::vector<size_t>&);
using ReduceScatterFn = void (*)(Ctx&, const void*, void*, size_t);
using AlltoallvFn = void (*)(Ctx&, const void*, const std::vector<size_t>&, void*, const std::vector<size_t>&);
using BarrierFn = void (*)(Ctx&);
AllreduceFn allreduce_fn(Algo a);
BroadcastFn broadcast_fn(Algo a);
RootedFn reduce_fn(Algo a);
RootedFn gather_fn(Algo a);
RootedFn scatter_fn(Algo a);
AllgathervFn allgatherv_fn(Algo a);
ReduceScatterFn reduce_scatter_fn(Algo a);
AlltoallvFn alltoallv_fn(Algo a);
BarrierFn barrier_fn(Algo a);
}  // namespace algo

}  // namespace shoal
