// An in-process transport: Links between ranks that are threads of one process, each message a
// copy in a queue. It is the test seam below the communicator: the algorithms run over it on
// engines and contexts of their own (tests/loop_group.h), with no fork, store or socket, so a
// test can call one algorithm's function directly at many group sizes in milliseconds, and the
// sanitizers see every rank. Framing and mismatch errors are those of the other links.
#pragma once
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/link.h"

namespace shoal {

// One direction between two ranks: the messages in flight, each a FrameHeader and its payload.
struct LoopChannel {
  std::mutex mu;
  std::deque<std::vector<uint8_t>> messages;
  bool closed = false;  // the sender left
};

class LoopLink final : public Link {
 public:
  // `out` carries this rank's messages to `peer`, `in` the peer's to this rank; `wake_peer` wakes
  // the peer's engine after a message or the first close (Engine::wake): the peer's engine must
  // outlive both, so close every link of a group before its engines go.
  LoopLink(int peer, std::shared_ptr<LoopChannel> out, std::shared_ptr<LoopChannel> in, std::function<void()> wake_peer);
  void post(Request* r) override;
  bool progress() override;
  bool busy() const override { return !sends_.empty() || !recvs_.empty(); }
  void close() noexcept override;
  const char* kind() const override { return "loop"; }
  Wake wakes_by() const override { return Wake::doorbell; }
  bool peek(FrameHeader* h) override;

 private:
  int peer_;
  std::shared_ptr<LoopChannel> out_, in_;
  std::function<void()> wake_peer_;
  std::deque<Request*> sends_, recvs_;
};

// Links for `size` ranks of this process, every pair connected: links[r][j] is rank r's link to
// rank j (null for j == r). wake[r] wakes rank r's engine.
std::vector<std::vector<std::unique_ptr<Link>>> make_loop_links(int size, const std::vector<std::function<void()>>& wake);

}  // namespace shoal
