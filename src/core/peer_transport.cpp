#include "core/peer_transport.h"

#include <unistd.h>

#include <algorithm>
#include <cstddef>

#include "base/log.h"
#include "shoal/error.h"
#include "transport/cma.h"
#include "transport/shm_link.h"

namespace shoal {

// ---- Shared memory -------------------------------------------------------------------------------

ShmPeers::ShmPeers(int rank, std::string host_id, std::string group_id, std::vector<int> local, size_t ring,
                   size_t scratch, bool single_copy, uint64_t nonce, std::shared_ptr<StoresChoice> stores,
                   std::vector<ShmSegment>& segs)
    : rank_(rank),
      host_id_(std::move(host_id)),
      group_id_(std::move(group_id)),
      local_(std::move(local)),
      ring_(ring),
      scratch_(scratch),
      single_copy_(single_copy),
      nonce_(nonce),
      stores_(std::move(stores)),
      segs_(segs) {}

int ShmPeers::slot_of(int r) const {
  return static_cast<int>(std::find(local_.begin(), local_.end(), r) - local_.begin());
}

// info: host identity | segment name | nonce.
std::string ShmPeers::prepare(const std::vector<bool>&) {
  ShmSegment::remove_stale_segments();
  const std::string name = ShmSegment::make_name(getpid(), group_id_, rank_);
  segs_[rank_] = ShmSegment::create(name, static_cast<int>(local_.size()), ring_, scratch_, nonce_);
  return host_id_ + "|" + name + "|" + std::to_string(nonce_);
}

char ShmPeers::can_connect(int r, const std::string& info) {
  const auto a = info.find('|'), b = info.rfind('|');
  if (a == std::string::npos || info.substr(0, a) != host_id_) return '0';
  try {
    ShmSegment s = ShmSegment::open_existing(info.substr(a + 1, b - a - 1));
    const ShmControl* pc = s.control();
    if (std::to_string(pc->nonce) != info.substr(b + 1) || pc->size != static_cast<int>(local_.size())) return '0';
    // Ranks that read and write each other's rings and scratch areas must lay them out alike:
    // else a chunked op would run past the end of the smaller segment.
    if (pc->ring_bytes != ring_ || pc->scratch_bytes != scratch_) {
      SHOAL_LOG(warn,
                "rank %d's shared-memory segment has %llu-byte rings and a %llu-byte scratch area, this rank's %llu "
                "and %llu (SHOAL_SHM_RING or SHOAL_SHM_SCRATCH differs between the ranks): they talk over TCP",
                r, static_cast<unsigned long long>(pc->ring_bytes), static_cast<unsigned long long>(pc->scratch_bytes),
                static_cast<unsigned long long>(ring_), static_cast<unsigned long long>(scratch_));
      return '0';
    }
    // '2': the peer's own memory is readable too (its control block, where it maps it).
    const bool cma = single_copy_ && cma::probe(pc->pid, pc->self_addr + offsetof(ShmControl, nonce), pc->nonce);
    segs_[r] = std::move(s);
    return cma ? '2' : '1';
  } catch (const Error& e) {
    SHOAL_LOG(info, "shared-memory probe of rank %d failed: %s", r, e.what());
    return '0';
  }
}

void ShmPeers::agreed(const std::vector<std::string>& reach, const std::vector<bool>& mine) {
  const int size = static_cast<int>(reach.size());
  single_copy_all_ = true;
  for (int a = 0; a < size; ++a)
    for (int b = 0; b < size; ++b)
      if (a != b) single_copy_all_ = single_copy_all_ && reach[a][b] == '2';
  for (int r = 0; r < size; ++r)
    if (r != rank_ && !mine[r]) segs_[r] = ShmSegment();
  // Every peer published its answers, so every peer has mapped what it needs: remove the name so
  // that nothing is left in /dev/shm.
  segs_[rank_].unlink();
}

std::unique_ptr<Link> ShmPeers::connect(int r) {
  return std::make_unique<ShmLink>(rank_, r, slot_of(rank_), slot_of(r), segs_[rank_], segs_[r], stores_);
}

// ---- TCP -----------------------------------------------------------------------------------------

std::string TcpPeers::prepare(const std::vector<bool>& wanted) {
  cfg_.use_tcp = wanted;
  conn_ = tcp_listen(cfg_);
  return tcp_listen_address(*conn_);
}

char TcpPeers::can_connect(int r, const std::string& info) {
  addresses_[r] = info;
  return '1';
}

std::unique_ptr<Link> TcpPeers::connect(int r) {
  if (links_.empty()) links_ = make_tcp_links(conn_, addresses_);
  return std::move(links_[r]);
}

}  // namespace shoal
