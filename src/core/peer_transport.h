// The ways the rendezvous reaches a peer, tried in order for every peer (shared memory, then TCP),
// as NCCL's transports are: each sets this rank up and says what its peers need to reach it
// (prepare), says per peer whether it can reach it (can_connect: both sides of a pair must), and
// makes the link of each pair it got (connect). rendezvous.cpp runs the rounds through the store.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "transport/link.h"
#include "transport/shm_segment.h"
#include "transport/stores.h"
#include "transport/tcp_link.h"

namespace shoal {

class PeerTransport {
 public:
  virtual ~PeerTransport() = default;
  // Its name: the store key of its round, and what Communicator::transport_to says.
  virtual const char* name() const = 0;
  // Sets this rank up for the peers still without a transport (`wanted`, by rank); returns what a
  // peer needs to reach it. Throws Error when it cannot (every peer then fails at once with the
  // reason).
  virtual std::string prepare(const std::vector<bool>& wanted) = 0;
  // Whether peer r, whose prepare() gave `info`, can be reached this way from here: '0' if not,
  // else another character of the transport's own (the shared-memory transport: '2' when the
  // peer's memory can be read by single copy too).
  virtual char can_connect(int r, const std::string& info) = 0;
  // Whether can_connect says yes to every peer (then the rendezvous gathers no answers).
  virtual bool reaches_all() const { return false; }
  // Every rank's answers are known (reach[a][b]: rank a's about rank b); `mine[r]`: whether this
  // rank's pair with r takes this transport (both said yes and no earlier transport has it).
  virtual void agreed(const std::vector<std::string>& reach, const std::vector<bool>& mine) = 0;
  // The link to peer r, a pair this transport got.
  virtual std::unique_ptr<Link> connect(int r) = 0;
};

// Shared memory between ranks of one host: each rank makes a segment, and a peer can connect if
// it is on the same host (`host_id`) and can map that segment, whose nonce and sizes match.
class ShmPeers final : public PeerTransport {
 public:
  // `segs` (by rank) receives this rank's segment and those of the peers it keeps; `local` is the
  // ranks of this host, in rank order (a rank's slot in the rings is its index there); `nonce`, a
  // random number, tells this group's segment from a stale one of the same name; `stores` is this
  // rank's choice of stores for its scratch (transport/stores.h), whose settings the rings'
  // choices take and which they turn non-temporal stores on for.
  ShmPeers(int rank, std::string host_id, std::string group_id, std::vector<int> local, size_t ring, size_t scratch,
           bool single_copy, uint64_t nonce, std::shared_ptr<StoresChoice> stores, std::vector<ShmSegment>& segs);
  const char* name() const override { return "shm"; }
  std::string prepare(const std::vector<bool>& wanted) override;
  char can_connect(int r, const std::string& info) override;
  void agreed(const std::vector<std::string>& reach, const std::vector<bool>& mine) override;
  std::unique_ptr<Link> connect(int r) override;
  // After agreed(): whether every pair of the group may read each other's memory (CMA).
  bool single_copy_all() const { return single_copy_all_; }

 private:
  int slot_of(int r) const;
  int rank_;
  std::string host_id_, group_id_;
  std::vector<int> local_;
  size_t ring_, scratch_;
  bool single_copy_;
  uint64_t nonce_;
  std::shared_ptr<StoresChoice> stores_;
  std::vector<ShmSegment>& segs_;
  bool single_copy_all_ = false;
};

// TCP to any peer: each rank listens and publishes its address; the connections are made when a
// pair first talks (make_tcp_links).
class TcpPeers final : public PeerTransport {
 public:
  explicit TcpPeers(const TcpConfig& cfg) : cfg_(cfg), addresses_(cfg.size) {}
  const char* name() const override { return "tcp"; }
  // Listens for the `wanted` peers (a TCP pair is symmetric: every rank wants the same pairs).
  std::string prepare(const std::vector<bool>& wanted) override;
  char can_connect(int r, const std::string& info) override;  // any peer: its address
  bool reaches_all() const override { return true; }
  void agreed(const std::vector<std::string>&, const std::vector<bool>&) override {}
  std::unique_ptr<Link> connect(int r) override;
  // After prepare(): the listener, whose accept step the engine runs in the background.
  const std::shared_ptr<TcpConnector>& listener() const { return conn_; }

 private:
  TcpConfig cfg_;
  std::shared_ptr<TcpConnector> conn_;
  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<Link>> links_;
};

}  // namespace shoal
