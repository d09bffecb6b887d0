// A link to a peer on the same host: two single-producer single-consumer byte rings, ours in
// the peer's segment (we write) and the peer's in ours (we read). Messages are framed as on
// every transport (link.h). Large messages stream through the ring in slices, so the receiver
// copies out while the sender copies in. The sender's copies into the ring store as
// transport/stores.h chooses for this ring's reader.
#pragma once
#include <deque>
#include <memory>

#include "transport/link.h"
#include "transport/shm_segment.h"
#include "transport/stores.h"

namespace shoal {

class ShmLink : public Link {
 public:
  // `mine` is this rank's segment, `theirs` the peer's (mapped here); `my_slot` and `peer_slot`
  // the two ranks' ring slots (their places among the ranks of the host); copies into the ring
  // store as a choice of this link's decides (stores.h), with the settings of the rank's choice
  // for its scratch, `scratch_stores`, which takes non-temporal stores when the link's choice does.
  ShmLink(int rank, int peer, int my_slot, int peer_slot, const ShmSegment& mine, const ShmSegment& theirs,
          std::shared_ptr<StoresChoice> scratch_stores);
  void post(Request* r) override;
  bool progress() override;
  bool busy() const override { return !sends_.empty() || !recvs_.empty(); }
  void close() noexcept override {}
  const char* kind() const override { return "shm"; }
  Wake wakes_by() const override { return Wake::doorbell; }
  bool peek(FrameHeader* h) override;

 private:
  bool progress_send();
  bool progress_recv();
  // Throws PeerError if the peer aborted or left. A send pending to such a peer always fails:
  // the peer cannot have finished the op without it. A receive stalled with `avail` bytes in the
  // ring fails only if the peer wrote nothing more before it left (see the .cpp).
  void check_peer(const Request* r) const;
  void check_peer_stalled(const Request* r, uint64_t avail) const;
  // Copies n bytes from src into the peer's ring at position pos (wrapping around).
  void copy_in(uint64_t pos, const uint8_t* src, uint64_t n);

  int rank_, peer_;
  ShmControl* peer_ctl_;
  ShmRing* out_;      // in the peer's segment
  uint8_t* out_data_;
  ShmRing* in_;       // in ours
  uint8_t* in_data_;
  ShmControl* self_ctl_;
  uint64_t cap_;      // ring bytes (power of two), same both ways
  uint64_t out_head_ = 0;  // our copy of out_->head
  uint64_t out_tail_seen_ = 0;  // out_->tail when last read (the room the peer had freed then)
  uint64_t in_tail_ = 0;   // our copy of in_->tail
  std::deque<Request*> sends_, recvs_;
  std::shared_ptr<StoresChoice> scratch_stores_;
  StoresChoice stores_;  // for the copies into out_data_
  FreshPages pages_;  // of out_data_
};

}  // namespace shoal
