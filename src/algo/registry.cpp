// The algorithm registry (registry.h): one table per collective. Adding an algorithm to an op is
// one row here (and its file); the tests' lists come from these tables (algorithms_of).
#include "algo/registry.h"

#include "algo/common.h"
#include "shoal/error.h"

namespace shoal {
namespace {

using namespace algo;

template <class Fn>
struct Entry {
  Algo algo;
  Needs needs;
  Fn fn;
};

constexpr Entry<AllreduceFn> kAllreduce[] = {
    {Algo::ring, Needs::any, allreduce_ring},
    {Algo::bde, Needs::any, allreduce_bde},
    {Algo::mst, Needs::any, allreduce_mst},
    {Algo::direct, Needs::shm, allreduce_direct},
    {Algo::hier, Needs::several_hosts, allreduce_hier},
};
constexpr Entry<BroadcastFn> kBroadcast[] = {
    {Algo::mst, Needs::any, broadcast_binomial},
    {Algo::ring, Needs::any, broadcast_chain},
    {Algo::scatter_allgather, Needs::any, broadcast_scatter_allgather},
    {Algo::linear, Needs::any, broadcast_linear},
    {Algo::direct, Needs::shm, broadcast_direct},
    {Algo::hier, Needs::several_hosts, broadcast_hier},
};
constexpr Entry<RootedFn> kReduce[] = {
    {Algo::mst, Needs::any, reduce_binomial},
    {Algo::ring, Needs::any, reduce_ring},
    {Algo::direct, Needs::shm, reduce_direct},
    {Algo::hier, Needs::several_hosts, reduce_hier},
};
constexpr Entry<AllgathervFn> kAllgatherv[] = {
    {Algo::ring, Needs::any, allgatherv_ring},
    {Algo::rd, Needs::any, allgatherv_rd},
    {Algo::direct, Needs::shm, allgatherv_direct},
    {Algo::hier, Needs::several_hosts, allgatherv_hier},
};
constexpr Entry<ReduceScatterFn> kReduceScatter[] = {
    {Algo::ring, Needs::any, reduce_scatter_ring},
    {Algo::rd, Needs::any, reduce_scatter_halving},
    {Algo::direct, Needs::shm, reduce_scatter_direct},
};
constexpr Entry<RootedFn> kGather[] = {
    {Algo::mst, Needs::any, gather_binomial},
    {Algo::linear, Needs::any, gather_linear},
    {Algo::direct, Needs::shm, gather_direct},
};
constexpr Entry<RootedFn> kScatter[] = {
    {Algo::mst, Needs::any, scatter_binomial},
    {Algo::linear, Needs::any, scatter_linear},
    {Algo::direct, Needs::shm, scatter_direct},
};
constexpr Entry<AlltoallvFn> kAlltoallv[] = {
    {Algo::ring, Needs::any, alltoallv_pairwise},
    {Algo::direct, Needs::shm, alltoallv_direct},
};
constexpr Entry<BarrierFn> kBarrier[] = {
    {Algo::rd, Needs::any, barrier_dissemination},
    {Algo::direct, Needs::shm, barrier_direct},
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
