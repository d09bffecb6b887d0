// The algorithm registry (registry.h): one table per collective. Adding an algorithm to an op is
// one row here (and its file); the tests' lists come from these tables (algorithms_of).
#include "algo/registry.h"

#include <algorithm>
#include <cmath>

#include "algo/common.h"
#include "algo/direct_common.h"
#include "algo/model.h"
#include "base/cpus.h"
#include "shoal/error.h"

namespace shoal {
namespace {

using namespace algo;

template <class Fn>
struct Entry {
  Algo algo;
  Needs needs;
  Fn fn;
  CostFn cost;  // its α-β-γ cost (model.h): the formulas of docs/algorithms.md's table
};

// Helpers of the cost functions: (p-1)/p, a host's ranks, a direct op's chunk bytes and its
// pipelining (direct_common.h: chunk_target, chunk_in_l2, two_shot_chunk, reduce_scatter_piece),
// cut by this process's L2 (base/cpus.h).
double share(int p) { return (p - 1.0) / p; }
double target(int p) { return static_cast<double>(direct::chunk_target(direct_slot(), p)); }
double in_l2(int p) { return static_cast<double>(direct::chunk_in_l2(direct_slot(), p, l2_bytes())); }
int local(Shape s) { return std::max(1, s.p / std::max(1, s.hosts)); }
// The part of a hierarchical op inside each host (a flat cost counted with the local α and β).
Terms in_host(Terms t) { return {0, 0, t.reduced, t.messages, t.bytes}; }

// The direct ops: the small protocol (one round, no barrier) where their small test passes, else
// one barrier per chunk (pipeline phase) and one more, chunks cut as each op's file cuts them.
// Allreduce and reduce: one shot or two shot is a measured choice (cost.h); the model is two
// shot's.
// `copies`: n's copied in and out by the busiest rank (allreduce: every rank copies the result
// out, 3; reduce: only the root, 2).
Terms two_shot_cost(Shape s, double n, double copies) {
  const int p = s.p;
  if (direct_small(n)) return {1, (p + 1) * n, (p - 1) * n};
  // Ranks share cores where they outnumber this process's CPUs: these stand in for the union of
  // the ranks' CPUs that ShmGroup::shares_cores counts, the same where the ranks share one mask
  // (shoal-bench's launcher), not where each is held to a CPU of its own.
  double chunk = static_cast<double>(
      direct::two_shot_chunk(direct_slot(), p, static_cast<size_t>(n), l2_bytes(), p > cpus_of_this_thread()));
  if (chunk == 0) chunk = static_cast<double>(direct_slot()) * p / (p + 1);  // no whole lines fit: p elements
  return {direct_chunks(n, chunk) + 2, copies * n, share(p) * n};
}
Terms allreduce_direct_cost(Shape s, double n) { return two_shot_cost(s, n, 3); }
Terms reduce_direct_cost(Shape s, double n) { return two_shot_cost(s, n, 2); }
Terms broadcast_direct_cost(Shape s, double n) {
  return {direct_small(n) ? 1 : direct_chunks(n, target(s.p)) + 1, 2 * n, 0};
}
// Allgather and gather, `copied` by the busiest rank: allgather's copies its block in (and into
// its own output) and every other block out, n + n/p; gather's root its own and the others' out, n.
// `piece`: the bytes of each block that one phase moves.
Terms blocks_direct_cost(Shape s, double n, double copied, double piece) {
  const double block = n / s.p;
  return {direct_small(block) ? 1 : direct_chunks(block, piece) + 1, copied, 0};
}
Terms allgather_direct_cost(Shape s, double n) {
  return blocks_direct_cost(s, n, n + n / s.p, in_l2(s.p));
}
Terms gather_direct_cost(Shape s, double n) { return blocks_direct_cost(s, n, n, target(s.p)); }
Terms bde_cost(Shape s, double n) {  // allreduce: recursive halving, recursive doubling; others folded in
  const int q = pof2_floor(s.p);
  Terms t{2 * lg_ceil(q), 2 * share(q) * n, share(q) * n};
  if (q != s.p) t = t + Terms{2, 2 * n, n};
  return t;
}
Terms allreduce_ring_cost(Shape s, double n) { return {2.0 * (s.p - 1), 2 * share(s.p) * n, share(s.p) * n}; }
Terms broadcast_binomial_cost(Shape s, double n) { return {lg_ceil(s.p), lg_ceil(s.p) * n, 0}; }
Terms reduce_binomial_cost(Shape s, double n) { return {lg_ceil(s.p), lg_ceil(s.p) * n, lg_ceil(s.p) * n}; }
// A binomial gather or scatter of n in all: lg p steps, the root's (p-1)/p·n.
Terms blocks_binomial_cost(Shape s, double n) { return {lg_ceil(s.p), share(s.p) * n, 0}; }
// p - 1 steps in which each rank moves its (p-1)/p share of n once: the ring allgather, the
// pairwise exchange, a linear gather's or scatter's root.
Terms steps_cost(Shape s, double n) { return {s.p - 1.0, share(s.p) * n, 0}; }

// The hierarchical ops' steps inside a host run the flat point-to-point algorithms of a subgroup
// over links (hierarchical.cpp), modelled here by the binomial trees.
constexpr Entry<AllreduceFn> kAllreduce[] = {
    {Algo::ring, Needs::any, allreduce_ring, allreduce_ring_cost},
    {Algo::bde, Needs::any, allreduce_bde, bde_cost},
    {Algo::mst, Needs::any, allreduce_mst,
     [](Shape s, double n) { return reduce_binomial_cost(s, n) + broadcast_binomial_cost(s, n); }},
    {Algo::direct, Needs::shm, allreduce_direct, allreduce_direct_cost},
    // Leader form: reduce inside each host, allreduce between the hosts' leaders, broadcast inside
    // each host (hierarchical.cpp has the split form too).
    {Algo::hier, Needs::several_hosts, allreduce_hier,
     [](Shape s, double n) {
       const Shape l{local(s), 1}, h{s.hosts, s.hosts};
       return in_host(reduce_binomial_cost(l, n)) + bde_cost(h, n) + in_host(broadcast_binomial_cost(l, n));
     }},
};
constexpr Entry<BroadcastFn> kBroadcast[] = {
    {Algo::mst, Needs::any, broadcast_binomial, broadcast_binomial_cost},
    // The chain, pipelined in kChunkBytes messages: (p - 2 + n/c)·(α + c·β).
    {Algo::ring, Needs::any, broadcast_chain,
     [](Shape s, double n) {
       const double c = static_cast<double>(kChunkBytes), steps = std::max(0, s.p - 2) + std::ceil(n / c);
       return Terms{steps, steps * std::min(c, n), 0};
     }},
    {Algo::scatter_allgather, Needs::any, broadcast_scatter_allgather,
     [](Shape s, double n) { return Terms{lg_ceil(s.p) + s.p - 1, 2 * share(s.p) * n, 0}; }},
    {Algo::linear, Needs::any, broadcast_linear, [](Shape s, double n) { return Terms{s.p - 1.0, (s.p - 1) * n, 0}; }},
    {Algo::direct, Needs::shm, broadcast_direct, broadcast_direct_cost},
    // One tree pipelined end to end in kChunkBytes messages: the root's network link carries
    // ⌈lg h⌉·n; the tree inside each host adds ⌈lg l⌉ steps of one chunk.
    {Algo::hier, Needs::several_hosts, broadcast_hier,
     [](Shape s, double n) {
       const double lh = lg_ceil(s.hosts), ll = lg_ceil(local(s)), c = std::min(n, static_cast<double>(kChunkBytes));
       return Terms{lh, lh * n, 0, ll, ll * c};
     }},
};
constexpr Entry<RootedFn> kReduce[] = {
    {Algo::mst, Needs::any, reduce_binomial, reduce_binomial_cost},
    // Ring reduce-scatter, then the blocks gathered at the root: the ring allreduce's terms.
    {Algo::ring, Needs::any, reduce_ring, allreduce_ring_cost},
    {Algo::direct, Needs::shm, reduce_direct, reduce_direct_cost},
    {Algo::hier, Needs::several_hosts, reduce_hier,
     [](Shape s, double n) {
       return in_host(reduce_binomial_cost({local(s), 1}, n)) + reduce_binomial_cost({s.hosts, s.hosts}, n);
     }},
};
constexpr Entry<AllgathervFn> kAllgatherv[] = {
    {Algo::ring, Needs::any, allgatherv_ring, steps_cost},
    // Recursive doubling; Bruck for p not a power of two (two local copies of n more).
    {Algo::rd, Needs::any, allgatherv_rd,
     [](Shape s, double n) {
       return Terms{lg_ceil(s.p), share(s.p) * n + (pof2_floor(s.p) == s.p ? 0 : 2 * n), 0};
     }},
    {Algo::direct, Needs::shm, allgatherv_direct, allgather_direct_cost},
    // Leader form: gather inside each host, a ring allgather between the leaders, broadcast inside
    // each host.
    {Algo::hier, Needs::several_hosts, allgatherv_hier,
     [](Shape s, double n) {
       const Shape l{local(s), 1};
       return in_host(blocks_binomial_cost(l, n / std::max(1, s.hosts))) + steps_cost({s.hosts, s.hosts}, n) +
              in_host(broadcast_binomial_cost(l, n));
     }},
};
constexpr Entry<ReduceScatterFn> kReduceScatter[] = {
    {Algo::ring, Needs::any, reduce_scatter_ring,
     [](Shape s, double n) { return Terms{s.p - 1.0, share(s.p) * n, share(s.p) * n}; }},
    // Recursive halving; for p not a power of two the extra ranks fold in first (α + n·β + n·γ)
    // and get their block after (α + n/p·β).
    {Algo::rd, Needs::any, reduce_scatter_halving,
     [](Shape s, double n) {
       const int q = pof2_floor(s.p);
       Terms t{lg_ceil(q), share(q) * n, share(q) * n};
       if (q != s.p) t = t + Terms{2, n + n / s.p, n};
       return t;
     }},
    {Algo::direct, Needs::shm, reduce_scatter_direct,
     [](Shape s, double n) {
       // p pieces a phase, one of each block (direct_reduce_scatter.cpp)
       const double chunk = s.p * static_cast<double>(direct::reduce_scatter_piece(direct_slot(), s.p, l2_bytes()));
       return Terms{direct_small(n) ? 1 : direct_chunks(n, chunk) + 1, 2 * n, share(s.p) * n};
     }},
};
// Gather and scatter: n is the root's whole buffer.
constexpr Entry<RootedFn> kGather[] = {
    {Algo::mst, Needs::any, gather_binomial, blocks_binomial_cost},
    {Algo::linear, Needs::any, gather_linear, steps_cost},
    {Algo::direct, Needs::shm, gather_direct, gather_direct_cost},
};
constexpr Entry<RootedFn> kScatter[] = {
    {Algo::mst, Needs::any, scatter_binomial, blocks_binomial_cost},
    {Algo::linear, Needs::any, scatter_linear, steps_cost},
    // The root copies the others' blocks in, each rank copies its own out.
    {Algo::direct, Needs::shm, scatter_direct,
     [](Shape s, double n) {
       const double block = n / s.p, piece = std::min(static_cast<double>(direct_slot()) / s.p, target(s.p));
       return Terms{direct_small(n) ? 1 : direct_chunks(block, piece) + 1, 2 * share(s.p) * n, 0};
     }},
};
// alltoall(v): n is what each rank sends in all.
constexpr Entry<AlltoallvFn> kAlltoallv[] = {
    {Algo::ring, Needs::any, alltoallv_pairwise, steps_cost},
    // Equal blocks: a piece of each block a phase (direct_alltoall.cpp: alltoall_piece).
    {Algo::direct, Needs::shm, alltoallv_direct,
     [](Shape s, double n) {
       const double block = n / s.p;
       const double piece = static_cast<double>(
           direct::alltoall_piece(direct::chunk_target(direct_slot(), s.p), s.p, static_cast<size_t>(block)));
       return Terms{direct_small(n) ? 1 : direct_chunks(block, piece) + 1, 2 * n, 0};
     }},
};
constexpr Entry<BarrierFn> kBarrier[] = {
    {Algo::rd, Needs::any, barrier_dissemination, [](Shape s, double) { return Terms{lg_ceil(s.p), 0, 0}; }},
    {Algo::direct, Needs::shm, barrier_direct, [](Shape, double) { return Terms{1, 0, 0}; }},
};

template <class Fn, size_t N>
const Entry<Fn>* find(const Entry<Fn> (&t)[N], Algo a) {
  for (const auto& e : t)
    if (e.algo == a) return &e;
  return nullptr;
}

template <class Fn, size_t N>
Fn fn_of(const Entry<Fn> (&t)[N], Algo a) {
  const Entry<Fn>* e = find(t, a);
  return e ? e->fn : nullptr;
}

// Calls f with op k's table.
template <class F>
auto with_table(OpKind k, F f) {
  switch (k) {
    case OpKind::allreduce: return f(kAllreduce);
    case OpKind::broadcast: return f(kBroadcast);
    case OpKind::reduce: return f(kReduce);
    case OpKind::allgatherv: return f(kAllgatherv);
    case OpKind::reduce_scatter: return f(kReduceScatter);
    case OpKind::gather: return f(kGather);
    case OpKind::scatter: return f(kScatter);
    case OpKind::alltoallv: return f(kAlltoallv);
    case OpKind::barrier: return f(kBarrier);
  }
  throw InvalidArgument("unknown op kind " + std::to_string(static_cast<int>(k)));
}

}  // namespace

bool has_algo(OpKind k, Algo a) {
  return with_table(k, [a](const auto& t) { return find(t, a) != nullptr; });
}

Needs needs_of(OpKind k, Algo a) {
  return with_table(k, [a](const auto& t) {
    const auto* e = find(t, a);
    return e ? e->needs : Needs::any;
  });
}

std::vector<Algo> algos_list(OpKind k) {
  return with_table(k, [](const auto& t) {
    std::vector<Algo> v;
    for (const auto& e : t) v.push_back(e.algo);
    return v;
  });
}

std::string algos_of(OpKind k) {
  std::string s;
  for (Algo a : algos_list(k)) s += (s.empty() ? "" : ", ") + std::string(algo_name(a));
  return s;
}

std::vector<Algo> algorithms_of(const std::string& op) {
  for (int k = 0; k <= static_cast<int>(OpKind::barrier); ++k)
    if (op == op_kind_name(static_cast<OpKind>(k))) return algos_list(static_cast<OpKind>(k));
  throw InvalidArgument("algorithms_of: unknown op '" + op + "'");
}

namespace algo {
Terms cost_of(OpKind k, Algo a, Shape s, double n) {
  return with_table(k, [&](const auto& t) {
    const auto* e = find(t, a);
    if (!e) throw InvalidArgument(std::string(op_kind_name(k)) + " has no algorithm '" + algo_name(a) + "'");
    return e->cost(s, n);
  });
}

AllreduceFn allreduce_fn(Algo a) { return fn_of(kAllreduce, a); }
BroadcastFn broadcast_fn(Algo a) { return fn_of(kBroadcast, a); }
RootedFn reduce_fn(Algo a) { return fn_of(kReduce, a); }
RootedFn gather_fn(Algo a) { return fn_of(kGather, a); }
RootedFn scatter_fn(Algo a) { return fn_of(kScatter, a); }
AllgathervFn allgatherv_fn(Algo a) { return fn_of(kAllgatherv, a); }
ReduceScatterFn reduce_scatter_fn(Algo a) { return fn_of(kReduceScatter, a); }
AlltoallvFn alltoallv_fn(Algo a) { return fn_of(kAlltoallv, a); }
BarrierFn barrier_fn(Algo a) { return fn_of(kBarrier, a); }
}  // namespace algo

}  // namespace shoal
