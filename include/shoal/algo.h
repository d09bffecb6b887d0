// The collective algorithms a caller may ask for by name (CallOptions::algo, SHOAL_ALGO), shared
// by the public API and the algorithm layer.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace shoal {

enum class Algo : uint8_t {
  automatic,  // chosen by op, size, world size and topology (docs/algorithms.md)
  ring,       // allreduce, allgather, reduce-scatter, broadcast(scatter+allgather ring)
  bde,        // allreduce: recursive halving reduce-scatter + recursive doubling allgather
  mst,        // allreduce: binomial reduce + binomial broadcast; broadcast/reduce: binomial tree
  direct,     // single host: through shared memory, every rank reading its peers' segments
  rd,         // allgather: recursive doubling / Bruck; reduce-scatter: recursive halving
  scatter_allgather,  // broadcast: binomial scatter + ring allgather (large messages)
  linear,     // gather, scatter: the root exchanges with every rank directly (large messages)
  hier,       // groups spanning hosts: inside each host over shared memory, across hosts over TCP
};
const char* algo_name(Algo a);
Algo parse_algo(const std::string& s);  // "auto", "ring", ...; throws InvalidArgument
// Every algorithm collective `op` has ("allreduce", "broadcast", "reduce", "allgather",
// "reduce_scatter", "gather", "scatter", "alltoall", "barrier"), wherever it applies: direct needs
// every rank on one host over shared memory, hier ranks on several hosts
// (Communicator::algo_for says whether one applies to a group). Throws InvalidArgument for an
// unknown op.
std::vector<Algo> algorithms_of(const std::string& op);

}  // namespace shoal
