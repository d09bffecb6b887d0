// A group of `size` processes, each holding one Communicator with its own rank. Every op is
// submitted to one queue per communicator, run in submission order, and returns a Work. A
// collective runs on the thread that waits for it (Work::wait), or on the communicator's progress
// thread when nobody does: at once after Work::run_async(), else within 1-8 ms (the progress
// thread looks less often while callers wait for their ops at once).
// Point-to-point ops progress on the progress thread. Buffers must stay valid until the Work
// completes. Collectives must be called in
// the same order with matching arguments on every rank; a mismatch is detected and reported as
// PeerError on the ranks involved (never a wrong result).
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shoal/algo.h"
#include "shoal/store.h"
#include "shoal/types.h"
#include "shoal/work.h"

namespace shoal {

enum class TransportKind : uint8_t { automatic, shm, tcp };

struct Options {
  std::string group_name = "shoal";                     // keys in the store are prefixed by it
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};  // deadline of every op
  TransportKind transport = TransportKind::automatic;   // SHOAL_TRANSPORT overrides when set
  // TCP data connections per peer: 0 = SHOAL_TCP_STREAMS or the default (4 to a peer on another
  // host, 1 to a peer on this host; src/transport/tcp_link.h says why). A value set applies to
  // every peer.
  int tcp_streams = 0;
  // Bytes of not-yet-sent data each TCP socket may queue (TCP_NOTSENT_LOWAT): -1 = the default
  // (16 KiB to a peer on another host, no limit to one on this host; src/transport/tcp_link.h
  // says why), 0 = no limit (the kernel's default). A value set applies to every peer.
  int tcp_notsent_lowat = -1;
  // Ranks on one host copy between each other's buffers with one copy (Linux cross-memory
  // attach, process_vm_readv/writev) where the kernel permits it; false (SHOAL_CMA=0) keeps every
  // transfer on two copies through shared memory.
  bool single_copy = true;
  // Reads SHOAL_TRANSPORT, SHOAL_TIMEOUT (seconds), SHOAL_TCP_STREAMS, SHOAL_TCP_NOTSENT_LOWAT,
  // SHOAL_CMA (0 or 1) into a copy of `base`.
  static Options from_env(Options base);
};

struct CallOptions {
  Algo algo = Algo::automatic;  // SHOAL_ALGO applies when this is automatic
  // The call returns once the op has completed, as MPI's blocking calls do, and throws its error;
  // the Work it returns is complete. When no other op is queued or running the op runs on the
  // calling thread without a Work of its own: the cheapest way to run a small op. The Work
  // returned then is one completed Work shared by such calls, held without a reference count
  // (use_count() is 0; it lives as long as the process).
  bool blocking = false;
};

using WorkPtr = std::shared_ptr<Work>;

class Communicator {
 public:
  // Collective: every rank of the group constructs its communicator with the same store and
  // group name. Throws on rendezvous failure or timeout.
  Communicator(std::shared_ptr<Store> store, int rank, int size, Options opts = Options::from_env({}));
  // Not collective. A rank may destroy its communicator as soon as its own ops have completed,
  // while peers are still finishing those same ops: they complete normally. Peers that wait for
  // something this rank never sent fail with PeerError ("the communicator was destroyed"); ops
  // of this rank still pending fail with Error.
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const;
  int size() const;
  const Options& options() const;
  // Transport used for `peer` ("self", "shm" or "tcp"), as the handshake decided.
  std::string transport_to(int peer) const;
  // Whether the ranks may copy between each other's buffers with one copy (Options::single_copy,
  // and the kernel permitted it between every pair when the group formed); the same on every rank.
  bool single_copy() const;
  // The algorithm `op` ("allreduce", "broadcast", "reduce", "allgather", "reduce_scatter",
  // "gather", "scatter", "alltoall", "barrier") runs for a message of `bytes` (as choose_algo counts
  // them: docs/algorithms.md), given `o` and SHOAL_ALGO: what the automatic choice picks here.
  // Throws InvalidArgument for an unknown op or an algorithm the op cannot run.
  Algo algo_for(const std::string& op, size_t bytes, CallOptions o = {}) const;

  // Point to point. Messages between a pair of ranks are matched in order; the tag must match too.
  // recv from kAnySource takes the first message that arrives with this tag and dtype from any
  // rank (Work::source() says which). A send completes once its bytes are in the transport's
  // buffers: a shared-memory ring, or over TCP the kernel's socket buffers, at most 32 messages
  // (kTcpWindow) ahead of what the receiver has consumed. A program that needs more buffering
  // than that (many blocking sends before the peer posts its receives) waits: post the receives,
  // or use the Work of each send later. Gloo's sends always wait for the receiver's post.
  // CallOptions::blocking makes them MPI_Send and MPI_Recv (its algo does not apply).
  static constexpr int kAnySource = -1;
  WorkPtr send(const void* buf, size_t count, DType dt, int peer, uint64_t tag = 0, CallOptions o = {});
  WorkPtr recv(void* buf, size_t count, DType dt, int peer, uint64_t tag = 0, CallOptions o = {});

  // in == out is allowed (in place) wherever in and out have the same size.
  WorkPtr allreduce(const void* in, void* out, size_t count, DType dt, ReduceOp op, CallOptions o = {});
  WorkPtr broadcast(void* buf, size_t count, DType dt, int root, CallOptions o = {});
  // `out` is written at root only (may be null elsewhere).
  WorkPtr reduce(const void* in, void* out, size_t count, DType dt, ReduceOp op, int root, CallOptions o = {});
  // out holds size*count elements, rank r's block at r*count.
  WorkPtr allgather(const void* in, void* out, size_t count, DType dt, CallOptions o = {});
  // Rank r contributes counts[r] elements; out holds sum(counts), blocks in rank order.
  WorkPtr allgatherv(const void* in, void* out, const std::vector<size_t>& counts, DType dt, CallOptions o = {});
  // in holds size*count elements; out gets the reduction of block `rank`.
  WorkPtr reduce_scatter(const void* in, void* out, size_t count, DType dt, ReduceOp op, CallOptions o = {});
  // out (size*count) is written at root only.
  WorkPtr gather(const void* in, void* out, size_t count, DType dt, int root, CallOptions o = {});
  // in (size*count) is read at root only.
  WorkPtr scatter(const void* in, void* out, size_t count, DType dt, int root, CallOptions o = {});
  // in and out hold size*count elements; block j of in goes to rank j, block i of out came from rank i.
  // alltoall and alltoallv are different collectives, as MPI_Alltoall and MPI_Alltoallv: every rank
  // of one exchange calls the same one (over shared memory they run different algorithms, and a
  // rank in the other one is waited for until the timeout).
  WorkPtr alltoall(const void* in, void* out, size_t count, DType dt, CallOptions o = {});
  // send_counts[j] elements go to rank j, recv_counts[i] come from rank i; blocks packed in rank order.
  WorkPtr alltoallv(const void* in, const std::vector<size_t>& send_counts, void* out,
                    const std::vector<size_t>& recv_counts, DType dt, CallOptions o = {});
  WorkPtr barrier();
  // With CallOptions: `blocking` returns once every rank has arrived, as MPI_Barrier; `algo`: rd
  // (dissemination) or direct (shared memory).
  WorkPtr barrier(CallOptions o);

  // Fails every pending and later op with PeerError and tells the peers; callable from any thread.
  void abort(const std::string& why = "aborted by the user");
  bool aborted() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace shoal
