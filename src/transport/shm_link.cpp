#include "transport/shm_link.h"

#include <algorithm>
#include <string>
#include <utility>

#include "base/call.h"
#include "reduce/copy.h"
#include "shoal/error.h"

namespace shoal {
namespace {
// Publish progress to the other side at least every this many bytes, so it can copy out while
// we copy in.
constexpr uint64_t kSlice = 128 * 1024;

void copy_out(uint8_t* dst, const uint8_t* ring, uint64_t cap, uint64_t pos, uint64_t n) {
  uint64_t off = pos & (cap - 1);
  uint64_t first = std::min(n, cap - off);
  copy_bytes(dst, ring + off, first);
  if (n > first) copy_bytes(dst + first, ring, n - first);
}
}  // namespace

ShmLink::ShmLink(int rank, int peer, int my_slot, int peer_slot, const ShmSegment& mine, const ShmSegment& theirs,
                 std::shared_ptr<StoresChoice> scratch_stores)
    : rank_(rank),
      peer_(peer),
      peer_ctl_(theirs.control()),
      out_(theirs.ring(my_slot)),
      out_data_(theirs.ring_data(my_slot)),
      in_(mine.ring(peer_slot)),
      in_data_(mine.ring_data(peer_slot)),
      self_ctl_(mine.control()),
      cap_(mine.control()->ring_bytes),
      scratch_stores_(std::move(scratch_stores)),
      stores_(StoresChoice::same_settings(*scratch_stores_)) {
  out_head_ = out_->head.load(std::memory_order_relaxed);
  out_tail_seen_ = out_->tail.load(std::memory_order_relaxed);
  in_tail_ = in_->tail.load(std::memory_order_relaxed);
}

void ShmLink::copy_in(uint64_t pos, const uint8_t* src, uint64_t n) {
  const uint64_t off = pos & (cap_ - 1), first = std::min(n, cap_ - off);
  auto copy = [&](uint8_t* dst, const uint8_t* from, uint64_t len) {
    // Shorter copies take ordinary stores whatever the choice, untimed (copy.h, kStreamingMinBytes).
    if (len < kStreamingMinBytes) return copy_bytes(dst, from, len);
    copy_for_readers(stores_, pages_, out_data_, cap_, dst, from, len, scratch_stores_.get());
  };
  copy(out_data_ + off, src, first);
  if (n > first) copy(out_data_, src + first, n - first);
}

void ShmLink::post(Request* r) {
  r->done = 0;
  r->state = 0;
  r->complete = false;
  (r->dir == Request::Dir::send ? sends_ : recvs_).push_back(r);
}

void ShmLink::check_peer(const Request* r) const {
  if (peer_ctl_->state_of() != PeerState::alive)
    throw PeerError(std::string(r->what) + ": " + peer_ctl_->aborted_message(peer_));
}

void ShmLink::check_peer_stalled(const Request* r, uint64_t avail) const {
  if (peer_ctl_->state_of() == PeerState::alive) return;
  // The peer stores its state (a release) after everything it wrote into our ring, so head, read
  // again after the state (an acquire), shows all of it. A peer that sent its last bytes and
  // left (its op complete, its communicator destroyed) between our look at head and at the
  // state is no failure: the next progress pass reads what it sent.
  if (in_->head.load(std::memory_order_acquire) - in_tail_ != avail) return;
  check_peer(r);
}

bool ShmLink::peek(FrameHeader* h) {
  if (!recvs_.empty() || in_->head.load(std::memory_order_acquire) - in_tail_ < sizeof(FrameHeader)) return false;
  copy_out(reinterpret_cast<uint8_t*>(h), in_data_, cap_, in_tail_, sizeof *h);
  return true;
}

bool ShmLink::progress() {
  bool moved = false;
  if (!sends_.empty()) moved |= progress_send();
  if (!recvs_.empty()) moved |= progress_recv();
  return moved;
}

bool ShmLink::progress_send() {
  bool moved = false;
  while (!sends_.empty()) {
    Request* r = sends_.front();
    check_peer(r);
    // The peer's tail is read again only when what is left of this message does not fit in the
    // room last seen: the peer writes it after every message it takes, and a read per message
    // would pull that line over to this core and back each time.
    uint64_t space = cap_ - (out_head_ - out_tail_seen_);
    if (space < (r->state == 0 ? sizeof(FrameHeader) : 0) + (r->bytes - r->done)) {
      out_tail_seen_ = out_->tail.load(std::memory_order_acquire);
      space = cap_ - (out_head_ - out_tail_seen_);
    }
    if (r->state == 0) {
      if (space < sizeof(FrameHeader)) break;
      FrameHeader h{kFrameMagic, 0, r->sig, r->bytes};
      copy_in(out_head_, reinterpret_cast<const uint8_t*>(&h), sizeof h);
      out_head_ += sizeof h;
      space -= sizeof h;
      r->state = 1;
      moved = true;
    }
    while (r->done < r->bytes && space > 0) {
      uint64_t n = std::min<uint64_t>({space, r->bytes - r->done, kSlice});
      copy_in(out_head_, r->buf + r->done, n);
      out_head_ += n;
      space -= n;
      r->done += n;
      out_->head.store(out_head_, std::memory_order_release);
      peer_ctl_->ring();
      moved = true;
    }
    out_->head.store(out_head_, std::memory_order_release);
    if (r->done < r->bytes) break;
    r->complete = true;
    sends_.pop_front();
  }
  if (moved) peer_ctl_->ring();
  return moved;
}

bool ShmLink::progress_recv() {
  bool moved = false;
  while (!recvs_.empty()) {
    Request* r = recvs_.front();
    uint64_t avail = in_->head.load(std::memory_order_acquire) - in_tail_;
    if (r->state == 0) {
      if (avail < sizeof(FrameHeader)) {
        check_peer_stalled(r, avail);
        break;
      }
      FrameHeader h;
      copy_out(reinterpret_cast<uint8_t*>(&h), in_data_, cap_, in_tail_, sizeof h);
      if (h.magic != kFrameMagic)
        throw PeerError(std::string(r->what) + ": corrupt frame from rank " + std::to_string(peer_));
      if (h.sig != r->sig || h.bytes != r->bytes)
        throw CallMismatch(peer_, frame_mismatch(*r, peer_, h));
      in_tail_ += sizeof h;
      avail -= sizeof h;
      r->state = 1;
      moved = true;
    }
    while (r->done < r->bytes && avail > 0) {
      uint64_t n = std::min<uint64_t>({avail, r->bytes - r->done, kSlice});
      copy_out(r->buf + r->done, in_data_, cap_, in_tail_, n);
      in_tail_ += n;
      avail -= n;
      r->done += n;
      in_->tail.store(in_tail_, std::memory_order_release);
      peer_ctl_->ring();
      moved = true;
    }
    in_->tail.store(in_tail_, std::memory_order_release);
    if (r->done < r->bytes) {
      if (!avail) check_peer_stalled(r, 0);
      break;
    }
    r->complete = true;
    recvs_.pop_front();
  }
  if (moved) peer_ctl_->ring();
  return moved;
}

}  // namespace shoal
