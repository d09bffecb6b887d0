// Forms a group: agrees on a group id and secret through the store, decides per peer between
// shared memory and TCP by a handshake (same hostname and boot id, and a probe of the peer's
// shared segment that must succeed both ways), and connects the links into the engine.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "algo/algorithms.h"
#include "algo/context.h"
#include "algo/cost.h"
#include "engine/engine.h"
#include "shoal/communicator.h"
#include "transport/shm_segment.h"

namespace shoal {

struct Topology {
  std::vector<ShmSegment> segs;         // by rank: mapped where the pair uses shm (and our own)
  std::vector<std::string> transport;   // by rank: "self", "shm" or "tcp"
  bool shm_all = false;                 // every rank reachable through shared memory
  bool single_copy = false;             // shm_all, and every rank may read every other's memory (CMA)
  Topo topo = Topo::hosts;              // for the automatic choice of algorithm
  HostMap hosts;                        // which host each rank is on
  int machine_ranks = 1;                // ranks on this machine (its host identities' ranks)
  int machine_cpus = 1;                 // CPUs they may run on between them (base/cpus.h)
  algo::Ways ways;                      // what the automatic choices on one host read, as the group formed
};

// What a rank's shared-memory segment holds in a group with `local_ranks` ranks on its host, under
// the SHOAL_SHM_* settings (InvalidArgument for a bad one): each inbound ring, the scratch area,
// and the whole segment a rank reserves in /dev/shm.
struct ShmSizes {
  size_t ring = 0;
  size_t scratch = 0;
  size_t segment = 0;
};
ShmSizes shm_sizes(int local_ranks);

// `store` is already prefixed for this instance of the group; `store_address` is the address this
// rank's connection to the store leaves from ("" if none), one candidate for the address peers dial
// for TCP (transport/net_address.h chooses).
Topology rendezvous(Store& store, Engine& engine, const Options& opts, const std::string& store_address);

}  // namespace shoal
