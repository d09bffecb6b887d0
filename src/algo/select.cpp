// The automatic choice of algorithm and the check of a requested one (docs/algorithms.md has
// the table and the reasoning). Between ranks that do not share memory the choice changes where
// the group's tuning says (cost.h, Switch: measured points, built in or SHOAL_TUNING's). Pure:
// the same answer on every rank for the same arguments and tuning.
#include <string>

#include "algo/algorithms.h"
#include "algo/cost.h"
#include "algo/registry.h"
#include "shoal/error.h"

namespace shoal {

Algo choose_algo(OpKind kind, Algo requested, size_t bytes, int size, Topo topo, const algo::Ways& ways) {
  using algo::Switch;
  auto below = [&](Switch s) { return bytes < ways.switch_at(s, size); };
  const bool pow2 = (size & (size - 1)) == 0;  // halving and BDE fold a rank in otherwise
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
      if (below(Switch::allreduce_mst_below)) return Algo::mst;
      return bytes <= ways.switch_at(pow2 ? Switch::allreduce_bde_up_to : Switch::allreduce_bde_up_to_odd_p, size)
                 ? Algo::bde
                 : Algo::ring;
    case OpKind::broadcast:
      if (shm_all) return Algo::direct;
      if (hier) return Algo::hier;
      if (topo == Topo::one_host_tcp) {
        if (below(Switch::broadcast_one_host_mst_below)) return Algo::mst;
        return below(Switch::broadcast_chain_from) ? Algo::linear : Algo::ring;
      }
      return below(Switch::broadcast_mst_below) ? Algo::mst : Algo::scatter_allgather;
    case OpKind::reduce:
      if (shm_all) return Algo::direct;
      if (hier) return Algo::hier;
      return below(Switch::reduce_mst_below) ? Algo::mst : Algo::ring;
    case OpKind::allgatherv:
      if (shm_all) return Algo::direct;
      if (hier) return Algo::hier;
      return below(Switch::allgather_rd_below) ? Algo::rd : Algo::ring;
    case OpKind::reduce_scatter:
      if (shm_all) return Algo::direct;
      return below(pow2 ? Switch::reduce_scatter_halving_below : Switch::reduce_scatter_halving_below_odd_p)
                 ? Algo::rd
                 : Algo::ring;
    case OpKind::gather:
      if (shm_all) return Algo::direct;
      return below(Switch::gather_mst_below) ? Algo::mst : Algo::linear;
    case OpKind::scatter:
      if (shm_all) return Algo::direct;
      return below(Switch::scatter_mst_below) ? Algo::mst : Algo::linear;
    case OpKind::alltoallv: return shm_all ? Algo::direct : Algo::ring;
    case OpKind::barrier: return shm_all ? Algo::direct : Algo::rd;
  }
  return Algo::ring;
}

}  // namespace shoal
