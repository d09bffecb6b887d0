// The round trip of a cache line between two CPUs of this host, measured once a second by two
// threads of this process pinned to them: what tells the far-core state (stores.h) where a
// rank's own copies cannot, with more ranks than cores. Started on first use; after a fork, the
// child starts its own.
#pragma once
#include <cstdint>

namespace shoal {

// The least round trip of the last measurement, ns; 0 until one has finished (or where the
// process may run on one CPU only). Cheap: two loads once started.
uint32_t core_round_trip_ns();

}  // namespace shoal
