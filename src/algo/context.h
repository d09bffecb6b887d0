// What an algorithm sees while it runs one op: the group (rank, size), the op's element type and
// reduce op, and point-to-point requests over whatever transport each peer uses. Algorithms are
// written once over this API (src/algo/), never over a transport.
#pragma once
#include <cstddef>
#include <cstdint>
#include <list>
#include <initializer_list>
#include <string>
#include <vector>

#include "reduce/reduce.h"
#include "shoal/types.h"
#include "transport/link.h"

namespace shoal {

class Engine;
class ShmGroup;
class Scratch;
namespace algo {
class Ways;
}

// Where the ranks are, for the automatic choice of algorithm: every rank on this host over shared
// memory (ShmGroup available); every rank on one host over point-to-point links (SHOAL_TRANSPORT=tcp,
// or a host's part of a larger group), where all bytes cost the same CPUs; several hosts, one rank
// each or no shared memory between ranks; several hosts with shared memory inside at least one of
// them (the hierarchical algorithms apply).
enum class Topo : uint8_t { shm, one_host_tcp, hosts, hosts_shm };

// Which host each rank is on, for the hierarchical algorithms. Hosts are numbered in the order of
// their lowest rank; the same on every rank.
struct HostMap {
  std::vector<int> host_of;             // by rank
  std::vector<std::vector<int>> ranks;  // by host: its ranks, ascending
  // From one host identity per rank (ranks with equal strings share a host).
  static HostMap from_ids(const std::vector<std::string>& ids);
  // Every host has the same number of ranks.
  bool uniform() const;
};

class Ctx {
 public:
  // `hosts` may be null (the group's layout is unknown: no hierarchical algorithm). `ways` is what
  // the group's automatic choices on one host read (algo/cost.h).
  // Inline: every op makes one, and a small op's whole cost is a few hundred instructions.
  Ctx(Engine& engine, ShmGroup* shm, Scratch& scratch, int rank_, int size_, DType dt_, ReduceOp op_, const char* what_,
      uint64_t sig, Topo topo_, const HostMap* hosts, const algo::Ways& ways)
      : rank(rank_),
        size(size_),
        dt(dt_),
        op(op_),
        esize(dtype_size(dt_)),
        what(what_),
        topo(topo_),
        engine_(engine),
        shm_(shm),
        scratch_(scratch),
        sig_(sig),
        hosts_(hosts),
        ways_(ways) {}
  // The subgroup `members` of `parent` (ranks of the parent; member i becomes rank i here), which
  // must include the parent's own rank: same op, engine, scratch buffers and message signature,
  // its own requests. `topo` is the subgroup's topology. Hierarchical algorithms run the flat
  // ones on such subgroups (one host's ranks, or one rank per host).
  Ctx(Ctx& parent, const std::vector<int>& members, Topo topo);
  // An algorithm that throws may leave requests posted; they must not outlive this op's buffers.
  // The engine is aborted in that case (every error path aborts it), so the links are dead.
  ~Ctx() = default;
  Ctx(const Ctx&) = delete;
  Ctx& operator=(const Ctx&) = delete;

  const int rank;
  const int size;
  const DType dt;
  const ReduceOp op;     // reductions only; avg arrives here as sum (the communicator scales)
  const size_t esize;    // bytes per element
  const char* const what;
  const Topo topo;

  // Post a send or receive of raw bytes. The request completes in the background while the
  // algorithm goes on; wait() for it. Messages to one peer arrive in post order.
  Request* isend(int peer, const void* buf, size_t bytes);
  Request* irecv(int peer, void* buf, size_t bytes);
  // Progresses every link until all of `reqs` complete. Throws PeerError / Timeout.
  void wait(std::initializer_list<Request*> reqs);
  void wait(const std::vector<Request*>& reqs);
  void wait_all();  // every request this op posted
  // Moves what the links take now, without waiting (one progress pass). Call it between posting
  // and local work (copying this rank's own block) so the bytes flow, and the peers work, while
  // this rank copies: a posted request otherwise moves only in wait(). Throws PeerError.
  void start();

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
  // The group's hosts; null in a subgroup.
  const HostMap* hosts() const { return hosts_; }
  // The measured costs and forced ways the group formed with.
  const algo::Ways& ways() const { return ways_; }
  Engine& engine() { return engine_; }
  // The op's signature: its call's arguments and number, the same on every rank of a matching call.
  uint64_t sig() const { return sig_; }

 private:
  Engine& engine_;
  ShmGroup* shm_;
  Scratch& scratch_;
  uint64_t sig_;
  const HostMap* hosts_;
  const algo::Ways& ways_;
  std::vector<int> engine_rank_;  // by rank of this context; empty: the same numbering
  int engine_rank(int peer) const { return engine_rank_.empty() ? peer : engine_rank_[peer]; }
  std::list<Request> reqs_;  // stable addresses; nothing allocated while empty (most direct ops)
};

}  // namespace shoal
