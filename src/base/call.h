// What a rank is calling, for the errors of mismatched calls across ranks.
//
// The communicator describes each op it runs in a CallRecord (the engine keeps it, and mirrors it
// into the rank's shared control block, where same-host peers read it); a transport or algorithm
// that finds a peer in a different call throws CallMismatch (or calls Engine::fail_mismatch), and
// the error then quotes both ranks' calls.
#pragma once
#include <cstdint>
#include <string>

#include "shoal/error.h"

namespace shoal {

// Four words, opaque below the communicator (communicator.cpp encodes and describes them).
struct CallRecord {
  uint64_t seq = 0;    // the rank's op number (0: no op yet)
  uint64_t what = 0;   // kind, dtype, reduce op, algorithm, root or peer
  uint64_t count = 0;  // elements
  uint64_t tag = 0;    // p2p: the tag
};

// A peer sent data for, or published, a different call than this rank's.
class CallMismatch : public PeerError {
 public:
  CallMismatch(int peer, const std::string& what) : PeerError(what), peer_(peer) {}
  int peer() const { return peer_; }

 private:
  int peer_;
};

}  // namespace shoal
