// The automatic choice of algorithm and the check of a requested one (docs/algorithms.md has
// the table and the reasoning). Pure: the same answer on every rank for the same arguments.
#include <string>

#include "algo/algorithms.h"
#include "algo/registry.h"
#include "shoal/error.h"

namespace shoal {
namespace {

// Thresholds (bytes of the op's message: allgatherv the total gathered, reduce_scatter / gather /
// scatter the whole size·count vector, alltoallv the larger of sent and received).
// allreduce over TCP, measured with scripts/tune_algos.py (docs/algorithms.md): the binomial
// tree wins while latency dominates; BDE up to several MiB when p is a power of two (its fold
// costs an extra full-vector exchange otherwise); ring above.
constexpr size_t kAllreduceMstBelow = size_t(32) << 10;         // allreduce: mst below this
constexpr size_t kAllreduceBdeUpTo = size_t(8) << 20;           //   bde up to this (p = 2^k), ring above
constexpr size_t kAllreduceBdeUpToOddP = size_t(256) << 10;     //   bde up to this otherwise
// The rest, measured the same way (4 ranks over TCP; docs/algorithms.md has the tables).
constexpr size_t kBroadcastBinomialBelow = size_t(2) << 20;     // broadcast: mst below; above scatter_allgather
constexpr size_t kBroadcastChainFrom = size_t(32) << 20;        //   (one host over TCP: linear, fewest bytes, and
                                                                //   the chain from here: as few bytes, the copies
                                                                //   spread over the ranks; docs/algorithms.md)
constexpr size_t kReduceBinomialBelow = SIZE_MAX;               // reduce: mst everywhere (ring never won clearly)
constexpr size_t kAllgatherRdBelow = size_t(8) << 20;           // allgather: rd below, ring above
constexpr size_t kReduceScatterHalvingBelow = 0;                // reduce_scatter: ring everywhere (halving never won)
constexpr size_t kGatherLinearFrom = size_t(64) << 10;          // gather/scatter: mst below, linear above

}  // namespace

const char* op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::allreduce: return "allreduce";
    case OpKind::broadcast: return "broadcast";
    case OpKind::reduce: return "reduce";
    case OpKind::allgatherv: return "allgather";
    case OpKind::reduce_scatter: return "reduce_scatter";
    case OpKind::gather: return "gather";
    case OpKind::scatter: return "scatter";
    case OpKind::alltoallv: return "alltoall";
    case OpKind::barrier: return "barrier";
  }
  return "op";
}

Algo choose_algo(OpKind kind, Algo requested, size_t bytes, int size, Topo topo) {
  const bool shm_all = topo == Topo::shm;
  const bool several_hosts = topo == Topo::hosts || topo == Topo::hosts_shm;
  // Hosts with shared memory inside: the hierarchical algorithms (hierarchical.cpp) keep most
  // bytes inside each host.
  const bool hier = topo == Topo::hosts_shm;
  if (static_cast<unsigned>(kind) > static_cast<unsigned>(OpKind::barrier))
    throw InvalidArgument("choose_algo: unknown op kind " + std::to_string(static_cast<int>(kind)));
  if (requested != Algo::automatic) {
    if (static_cast<unsigned>(requested) > static_cast<unsigned>(Algo::hier))
      throw InvalidArgument(std::string(op_kind_name(kind)) + ": unknown algorithm " +
                            std::to_string(static_cast<int>(requested)));
    if (!has_algo(kind, requested))
      throw InvalidArgument(std::string(op_kind_name(kind)) + ": algorithm '" + algo_name(requested) +
                            "' does not apply (it has: " + algos_of(kind) + ")");
    const Needs needs = needs_of(kind, requested);
    if (needs == Needs::shm && !shm_all)
      throw InvalidArgument(std::string(op_kind_name(kind)) + ": algorithm '" + algo_name(requested) +
                            "' needs every rank on this host over shared memory");
    if (needs == Needs::several_hosts && !several_hosts)
      throw InvalidArgument(std::string(op_kind_name(kind)) + ": algorithm '" + algo_name(requested) +
                            "' needs ranks on several hosts");
    return requested;
  }
  switch (kind) {
    case OpKind::allreduce:
      if (shm_all) return Algo::direct;
      if (hier) return Algo::hier;
      if (bytes < kAllreduceMstBelow) return Algo::mst;
      return bytes <= ((size & (size - 1)) == 0 ? kAllreduceBdeUpTo : kAllreduceBdeUpToOddP) ? Algo::bde : Algo::ring;
    case OpKind::broadcast:
      if (shm_all) return Algo::direct;
      if (hier) return Algo::hier;
      if (bytes < kBroadcastBinomialBelow) return Algo::mst;
      if (topo == Topo::one_host_tcp) return bytes < kBroadcastChainFrom ? Algo::linear : Algo::ring;
      return Algo::scatter_allgather;
    case OpKind::reduce:
      if (shm_all) return Algo::direct;
      if (hier) return Algo::hier;
      return bytes < kReduceBinomialBelow ? Algo::mst : Algo::ring;
    case OpKind::allgatherv:
      if (shm_all) return Algo::direct;
      if (hier) return Algo::hier;
      return bytes < kAllgatherRdBelow ? Algo::rd : Algo::ring;
    case OpKind::reduce_scatter:
      if (shm_all) return Algo::direct;
      return bytes < kReduceScatterHalvingBelow ? Algo::rd : Algo::ring;
    case OpKind::gather:
    case OpKind::scatter:
      if (shm_all) return Algo::direct;
      return bytes < kGatherLinearFrom ? Algo::mst : Algo::linear;
    case OpKind::alltoallv: return shm_all ? Algo::direct : Algo::ring;
    case OpKind::barrier: return shm_all ? Algo::direct : Algo::rd;
  }
  return Algo::ring;
}

}  // namespace shoal
