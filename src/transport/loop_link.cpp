// The in-process transport (loop_link.h).
#include "transport/loop_link.h"

#include <cstring>
#include <utility>

#include "base/call.h"
#include "shoal/error.h"

namespace shoal {

LoopLink::LoopLink(int peer, std::shared_ptr<LoopChannel> out, std::shared_ptr<LoopChannel> in,
                   std::function<void()> wake_peer)
    : peer_(peer), out_(std::move(out)), in_(std::move(in)), wake_peer_(std::move(wake_peer)) {}

void LoopLink::post(Request* r) { (r->dir == Request::Dir::send ? sends_ : recvs_).push_back(r); }

bool LoopLink::progress() {
  bool moved = false;
  if (!sends_.empty()) {
    {
      // The peer's close marks the direction it sends in. One lock at a time: the peer takes
      // them in the other order.
      std::lock_guard<std::mutex> in_lock(in_->mu);
      if (in_->closed)
        throw PeerError(std::string(sends_.front()->what) + ": rank " + std::to_string(peer_) + " left the group");
    }
    {
      std::lock_guard<std::mutex> lock(out_->mu);
      for (Request* r : sends_) {
        std::vector<uint8_t> m(sizeof(FrameHeader) + r->bytes);
        const FrameHeader h{kFrameMagic, 0, r->sig, r->bytes};
        std::memcpy(m.data(), &h, sizeof h);
        if (r->bytes) std::memcpy(m.data() + sizeof h, r->buf, r->bytes);
        out_->messages.push_back(std::move(m));
        r->done = r->bytes;
        r->complete = true;
      }
    }
    sends_.clear();
    wake_peer_();
    moved = true;
  }
  while (!recvs_.empty()) {
    Request* r = recvs_.front();
    std::vector<uint8_t> m;
    {
      std::lock_guard<std::mutex> lock(in_->mu);
      if (in_->messages.empty()) {
        if (in_->closed)
          throw PeerError(std::string(r->what) + ": rank " + std::to_string(peer_) + " left the group");
        break;
      }
      m = std::move(in_->messages.front());
      in_->messages.pop_front();
    }
    FrameHeader h;
    std::memcpy(&h, m.data(), sizeof h);
    if (h.sig != r->sig || h.bytes != r->bytes)
      throw CallMismatch(peer_, frame_mismatch(*r, peer_, h));
    if (r->bytes) std::memcpy(r->buf, m.data() + sizeof h, r->bytes);
    r->done = r->bytes;
    r->complete = true;
    recvs_.pop_front();
    moved = true;
  }
  return moved;
}

void LoopLink::close() noexcept {
  {
    std::lock_guard<std::mutex> lock(out_->mu);
    if (out_->closed) return;
    out_->closed = true;
  }
  wake_peer_();
}

bool LoopLink::peek(FrameHeader* h) {
  std::lock_guard<std::mutex> lock(in_->mu);
  if (in_->messages.empty()) return false;
  std::memcpy(h, in_->messages.front().data(), sizeof *h);
  return true;
}

std::vector<std::vector<std::unique_ptr<Link>>> make_loop_links(int size, const std::vector<std::function<void()>>& wake) {
  std::vector<std::vector<std::unique_ptr<Link>>> links(size);
  for (auto& l : links) l.resize(size);
  for (int a = 0; a < size; ++a)
    for (int b = a + 1; b < size; ++b) {
      auto ab = std::make_shared<LoopChannel>(), ba = std::make_shared<LoopChannel>();
      links[a][b] = std::make_unique<LoopLink>(b, ab, ba, wake[b]);
      links[b][a] = std::make_unique<LoopLink>(a, ba, ab, wake[a]);
    }
  return links;
}

}  // namespace shoal
