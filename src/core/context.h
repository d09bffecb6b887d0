// What an algorithm sees while it runs one op: the group (rank, size), the op's element type and
// reduce op, and point-to-point requests over whatever transport each peer uses. Algorithms are
// written once over this API (src/algo/), never over a transport.
#pragma once
#include <cstddef>
#include <cstdint>
#include <deque>
#include <initializer_list>
#include <vector>

#include "reduce/reduce.h"
#include "shoal/types.h"
#include "transport/link.h"

namespace shoal {

class Engine;
class ShmGroup;
class Scratch;

class Ctx {
 public:
  Ctx(Engine& engine, ShmGroup* shm, Scratch& scratch, int rank, int size, DType dt, ReduceOp op, const char* what,
      uint64_t sig);
  ~Ctx();
  Ctx(const Ctx&) = delete;
  Ctx& operator=(const Ctx&) = delete;

  const int rank;
  const int size;
  const DType dt;
  const ReduceOp op;     // reductions only; avg arrives here as sum (the communicator scales)
  const size_t esize;    // bytes per element
  const char* const what;

  // Post a send or receive of raw bytes. The request completes in the background while the
  // algorithm goes on; wait() for it. Messages to one peer arrive in post order.
  Request* isend(int peer, const void* buf, size_t bytes);
  Request* irecv(int peer, void* buf, size_t bytes);
  // Progresses every link until all of `reqs` complete. Throws PeerError / Timeout.
  void wait(std::initializer_list<Request*> reqs);
  void wait(const std::vector<Request*>& reqs);
  void wait_all();  // every request this op posted

  void send(int peer, const void* buf, size_t bytes) { wait({isend(peer, buf, bytes)}); }
  void recv(int peer, void* buf, size_t bytes) { wait({irecv(peer, buf, bytes)}); }
  void sendrecv(int to, const void* sbuf, size_t sbytes, int from, void* rbuf, size_t rbytes) {
    wait({isend(to, sbuf, sbytes), irecv(from, rbuf, rbytes)});
  }

  // dst = dst OP src over `count` elements of this op's dtype.
  void reduce(void* dst, const void* src, size_t count) const { reduce_inplace(dst, src, count, dt, op); }

  // Scratch memory owned by the communicator, reused across ops (grows as needed). Index picks
  // one of a few independent buffers so an algorithm can hold two at once.
  uint8_t* scratch(size_t bytes, int index = 0);

  // Non-null when every rank of the group is on this host and reachable by shared memory: the
  // direct algorithms use it. Null otherwise.
  ShmGroup* shm() const { return shm_; }
  Engine& engine() { return engine_; }

 private:
  Engine& engine_;
  ShmGroup* shm_;
  Scratch& scratch_;
  uint64_t sig_;
  std::deque<Request> reqs_;  // stable addresses
};

}  // namespace shoal
