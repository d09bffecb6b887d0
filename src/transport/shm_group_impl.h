// ShmGroup over the segments mapped at rendezvous; its barrier waits through the engine (a
// Waiter), so a dead or aborted peer and the op's deadline end the wait.
#pragma once
#include <chrono>
#include <utility>
#include <vector>

#include "transport/shm_group.h"
#include "transport/shm_segment.h"
#include "transport/waiter.h"

namespace shoal {

class ShmGroupImpl : public ShmGroup {
 public:
  // segs[r] is rank r's segment mapped here (segs[rank] is this rank's own); single_copy: the
  // group's probe found that every rank may read every other's memory; cores: the CPUs the ranks
  // of this machine may run on between them (Topology::machine_cpus); timeout: the group's, the
  // longest quiesce_writes() waits for a writer that is alive.
  ShmGroupImpl(Waiter& waiter, int rank, const std::vector<ShmSegment>& segs, bool single_copy, int cores,
               std::chrono::milliseconds timeout);
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(ctl_.size()); }
  void arrive() override;
  void complete() override;
  void wait(bool (*done)(void*), void* arg, int peer) override;
  void ring_peers() override;
  bool single_copy() const override { return single_copy_; }
  bool shares_cores() const override { return size() > cores_; }
  void read(int r, const void* remote, void* local, size_t n) override;
  void write(int r, const void* local, void* remote, size_t n) override;
  void quiesce_writes() override;
  // Maps the `areas` (offset, bytes) of this rank's scratch area into this process now, for
  // writing, and of every peer's in a small group (kPrefaultPeersUpTo): an op's first touch of a
  // page costs a fault, and the first ops of a group each touch pages of their own (the small
  // slots rotate, and so do the chunked ops' places in the data slots).
  void prefault(const std::vector<std::pair<size_t, size_t>>& areas);

 private:
  Waiter& waiter_;
  int rank_;
  std::vector<ShmControl*> ctl_;
  std::vector<int> others_;
  bool single_copy_;
  int cores_;
  std::chrono::milliseconds timeout_;
  // read() and write(): n bytes between `local` and `remote` (in rank r's process), in pieces,
  // to the peer or from it; a failure is the PeerError that says why.
  void transfer(int r, bool to_peer, uint8_t* local, uint8_t* remote, size_t n);
  uint64_t seq_ = 0;
};

}  // namespace shoal
