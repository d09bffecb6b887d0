// A Link moves framed messages to and from one peer. Algorithms never see a Link: they post
// Requests through the Engine (src/engine/engine.h), which progresses every link of the group.
//
// Framing, the same on every transport: each message (or each part of one, see tcp_link) is a
// FrameHeader followed by `bytes` of payload. The receiver posts what it expects (bytes and an op
// signature); a header that disagrees is a mismatched call across ranks and fails with PeerError
// naming the peer: never a wrong result.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace shoal {

constexpr uint32_t kFrameMagic = 0x5348414c;  // "SHAL"

struct FrameHeader {
  uint32_t magic;
  uint32_t part;   // tcp: index of this stream's part; shm: 0
  uint64_t sig;    // signature of the op (kind, dtype, count, root, algo, tag), same on every rank
  uint64_t bytes;  // payload bytes that follow
};
static_assert(sizeof(FrameHeader) == 24);

struct Request {
  enum class Dir : uint8_t { send, recv };
  Dir dir;
  int peer;
  uint8_t* buf;     // send: read from; recv: written to
  size_t bytes;
  uint64_t sig;
  const char* what; // the op's name for errors ("allreduce"), static storage
  // Owned by the link while posted:
  size_t done = 0;
  uint32_t state = 0;  // link-private progress state
  bool complete = false;
};

// What a link whose frames carry whole messages (shm, loop) says of a frame from `peer` that does
// not match the posted receive `r`: the ranks called mismatched ops.
std::string frame_mismatch(const Request& r, int peer, const FrameHeader& h);

class Link {
 public:
  virtual ~Link() = default;
  // Appends r to this link's FIFO for r->dir. Requests of one direction complete in post order.
  virtual void post(Request* r) = 0;
  // Moves bytes for the posted requests without blocking, marking finished ones complete and
  // dropping them from the FIFO. Returns true if anything moved. Throws PeerError if the peer
  // died, aborted, closed the connection or sent a frame that does not match the posted request.
  virtual bool progress() = 0;
  virtual bool busy() const = 0;       // any request posted and not complete
  // Tells the peer this rank is gone (best effort, never throws).
  virtual void close() noexcept = 0;
  virtual const char* kind() const = 0;  // "shm" or "tcp": for people (logs, errors), not for decisions
  // How a waiter hears news from this link: its peer rings this rank's doorbell (the futex in its
  // control block), or a file descriptor the link registered in the engine's epoll set becomes
  // ready.
  enum class Wake { doorbell, fd };
  virtual Wake wakes_by() const = 0;
  // Whether the kernel moves this link's bytes (sockets): a rank that only sends, or only
  // receives, a large message over it has nothing to do until the kernel says more can move, and
  // sleeps instead of yielding (Engine::one_way_bulk).
  virtual bool kernel_moves_bytes() const { return false; }
  // With no receive posted: whether the header of the next message from the peer has arrived,
  // without consuming it (for receives from any source, which look before they post).
  virtual bool peek(FrameHeader* h) = 0;
  // For a timeout's message: what this link still lacks before it can move anything ("" if
  // nothing: then the peer is simply late).
  virtual std::string stalled() const { return ""; }
};

}  // namespace shoal
