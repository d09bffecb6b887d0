// The TCP Link: framing, striping over streams, flow control. Set-up is in tcp_connect.cpp; see
// tcp_link.h and link.h.
#include "transport/tcp_link.h"
#include "base/le32.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "base/call.h"
#include "base/log.h"
#include "shoal/error.h"
#include "transport/tcp_util.h"

namespace shoal {
namespace {

using namespace tcp_detail;
using Clock = std::chrono::steady_clock;

// Messages of at least this many bytes are cut into one part per stream.
constexpr size_t kSplitThreshold = 512 * 1024;
// Part boundaries are multiples of this.
constexpr size_t kPartAlign = 64;
// Queued frames of one stream written with a single sendmsg.
constexpr int kSendBatch = 16;


constexpr size_t kHdr = sizeof(FrameHeader);

struct Part {
  size_t off;
  size_t len;
};

inline bool is_split(size_t bytes, int streams) { return streams > 1 && bytes >= kSplitThreshold; }

// Part i of a `bytes`-byte message cut into `streams` parts: nearly equal, 64-byte aligned
// boundaries. Identical on both sides for the same byte count.
inline Part cut(size_t bytes, int streams, int i) {
  size_t chunk = (bytes + streams - 1) / streams;
  chunk = (chunk + kPartAlign - 1) / kPartAlign * kPartAlign;
  size_t off = std::min(bytes, chunk * static_cast<size_t>(i));
  size_t end = std::min(bytes, off + chunk);
  return {off, end - off};
}

// ---------------------------------------------------------------------------------------------
// FIFO of posted requests, addressed by a monotonically increasing sequence number. Grows by
// doubling (rarely); never allocates in steady state.
class ReqRing {
 public:
  ReqRing() : slots_(16), mask_(15) {}
  bool empty() const { return head == tail; }
  Request* at(uint64_t seq) const { return slots_[seq & mask_]; }
  void push(Request* r) {
    if (tail - head == slots_.size()) grow();
    slots_[tail & mask_] = r;
    ++tail;
  }
  void pop() { ++head; }

  uint64_t head = 0;
  uint64_t tail = 0;

 private:
  void grow() {
    std::vector<Request*> s(slots_.size() * 2);
    size_t mask = s.size() - 1;
    for (uint64_t q = head; q < tail; ++q) s[q & mask] = slots_[q & mask_];
    slots_.swap(s);
    mask_ = mask;
  }
  std::vector<Request*> slots_;
  size_t mask_;
};

// Progress of one stream in one direction: the request it works on (by sequence number) and how
// many bytes of that request's frame (header + part payload) have moved.
struct StreamState {
  int fd = -1;
  uint64_t seq = 0;
  size_t off = 0;
  FrameHeader hdr{};  // recv: the header being read
};

class TcpLink final : public Link {
 public:
  TcpLink(int peer, const std::vector<int>& fds, int control_fd)
      : peer_(peer), nstreams_(static_cast<int>(fds.size())), ctl_fd_(control_fd) {
    send_.resize(fds.size());
    recv_.resize(fds.size());
    for (size_t i = 0; i < fds.size(); ++i) send_[i].fd = recv_[i].fd = fds[i];
  }
  ~TcpLink() override { close(); }

  void post(Request* r) override {
    r->done = 0;
    r->state = 0;
    r->complete = false;
    (r->dir == Request::Dir::send ? sendq_ : recvq_).push(r);
  }

  bool progress() override {
    if (!failed_.empty()) throw PeerError(failed_);
    if (closed_) {
      if (busy()) fail(format("tcp link to rank %d is closed", peer_));
      return false;
    }
    bool moved = false;
    if (!sendq_.empty()) {
      uint64_t limit = send_limit();
      for (int s = 0; s < nstreams_; ++s) moved |= progress_send(s, limit);
      moved |= finish(sendq_);
    }
    if (!recvq_.empty()) {
      for (int s = 0; s < nstreams_; ++s) moved |= progress_recv(s);
      if (finish(recvq_)) {
        moved = true;
        report_consumed();
      }
    }
    return moved;
  }

  bool busy() const override { return !sendq_.empty() || !recvq_.empty(); }
  bool peek(FrameHeader* h) override {
    // With nothing posted, stream 0 is at a frame boundary: every message has its first part there.
    if (!recvq_.empty() || recv_[0].fd < 0) return false;
    return ::recv(recv_[0].fd, h, sizeof *h, MSG_PEEK | MSG_DONTWAIT) == static_cast<ssize_t>(sizeof *h);
  }

  void close() noexcept override {
    if (closed_) return;
    closed_ = true;
    for (auto& st : send_) {
      if (st.fd >= 0) {
        ::shutdown(st.fd, SHUT_RDWR);
        ::close(st.fd);
      }
    }
    for (auto& st : send_) st.fd = -1;
    for (auto& st : recv_) st.fd = -1;
    if (ctl_fd_ >= 0) {
      ::shutdown(ctl_fd_, SHUT_RDWR);
      ::close(ctl_fd_);
      ctl_fd_ = -1;
    }
  }

  const char* kind() const override { return "tcp"; }
  Wake wakes_by() const override { return Wake::fd; }
  bool kernel_moves_bytes() const override { return true; }

 private:
  bool has_part(const Request* r, int s) const { return s == 0 || is_split(r->bytes, nstreams_); }
  uint32_t nparts(const Request* r) const { return is_split(r->bytes, nstreams_) ? nstreams_ : 1; }
  Part part(const Request* r, int s) const {
    return is_split(r->bytes, nstreams_) ? cut(r->bytes, nstreams_, s) : Part{0, r->bytes};
  }

  [[noreturn]] void fail(std::string msg) {
    failed_ = std::move(msg);
    throw PeerError(failed_);
  }
  [[noreturn]] void fail_mismatch(std::string msg) {  // the peer is in another call
    failed_ = std::move(msg);
    throw CallMismatch(peer_, failed_);
  }
  [[noreturn]] void fail_io(int err, const Request* r, const char* op) {
    if (err == 0 || err == ECONNRESET || err == EPIPE || err == ENOTCONN || err == ECONNABORTED)
      fail(format("rank %d closed the connection during %s (process died or aborted)", peer_, r->what));
    fail(format("%s: %s rank %d failed: %s", r->what, op, peer_, errno_string(err).c_str()));
  }

  // Moves a stream's cursor up to the FIFO head: a stream with no part in the requests popped since
  // it last looked (streams > 0 skip small messages) may have been left behind.
  static void catch_up(StreamState& st, const ReqRing& q) {
    if (st.seq < q.head) {
      st.seq = q.head;
      st.off = 0;
    }
  }

  // Pops completed requests off the head of q, in post order.
  bool finish(ReqRing& q) {
    bool any = false;
    while (!q.empty()) {
      Request* r = q.at(q.head);
      if (r->state < nparts(r)) break;
      r->complete = true;
      q.pop();
      any = true;
    }
    return any;
  }

  // ---- Flow control (tcp_link.h) ----
  // Messages are numbered by their sequence in sendq_ on the sending side and by recvq_'s on the
  // receiving side: the same count, since both sides match messages in FIFO order.

  // The sequence number below which messages may be sent now: kTcpWindow past the peer's last
  // report. Reads the reports only once half the window is used, so a receiver that keeps up
  // costs the sender one recv per kTcpWindow/2 messages.
  uint64_t send_limit() {
    if (sendq_.tail <= credited_ + kTcpWindow / 2) return credited_ + kTcpWindow;
    read_reports();
    if (sendq_.tail > credited_ + kTcpWindow && ctl_eof_) {
      // The peer closed its end: it will consume nothing more, so these messages cannot go.
      fail(format("%s: rank %d closed the connection (process died or aborted) with %" PRIu64
                  " of this rank's messages not consumed",
                  sendq_.at(sendq_.head)->what, peer_, sendq_.tail - credited_));
    }
    return credited_ + kTcpWindow;
  }

  // Drains the control connection; the last whole report wins. Never throws for a closed
  // connection (a peer may leave once it has consumed everything it needed): send_limit decides.
  void read_reports() {
    while (!ctl_eof_ && ctl_fd_ >= 0) {
      ssize_t n = ::recv(ctl_fd_, ctl_in_ + ctl_in_len_, sizeof ctl_in_ - ctl_in_len_, MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (n <= 0) {
        ctl_eof_ = true;
        return;
      }
      size_t have = ctl_in_len_ + static_cast<size_t>(n), whole = have / 8 * 8;
      for (size_t i = 0; i < whole; i += 8) {
        uint64_t v = get64(ctl_in_ + i);
        // Consumed counts only grow, and only messages this rank has started can be consumed.
        if (v < credited_ || v > sendq_.tail)
          fail(format("rank %d sent a corrupt flow-control report (%" PRIu64 " consumed; %" PRIu64
                      " reported before, %" PRIu64 " sent): not a shoal peer of this version",
                      peer_, v, credited_, sendq_.tail));
        credited_ = v;
      }
      ctl_in_len_ = have - whole;
      std::memmove(ctl_in_, ctl_in_ + whole, ctl_in_len_);
    }
  }

  // Tells the peer how many messages this rank has consumed, once kTcpWindow/2 more have been
  // since the last report. Best effort: a closed or failing connection is the data streams' to
  // report. The socket cannot fill: its reader drains it before using half its window, so at most
  // a few reports are ever unread; a short write is finished on the next call.
  void report_consumed() {
    if (ctl_fd_ < 0) return;
    if (ctl_out_off_ == sizeof ctl_out_) {
      if (recvq_.head - reported_ < kTcpWindow / 2) return;
      reported_ = recvq_.head;
      put64(ctl_out_, reported_);
      ctl_out_off_ = 0;
    }
    while (ctl_out_off_ < sizeof ctl_out_) {
      ssize_t n = ::send(ctl_fd_, ctl_out_ + ctl_out_off_, sizeof ctl_out_ - ctl_out_off_, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK) ctl_out_off_ = sizeof ctl_out_;  // gone: drop it
        return;
      }
      ctl_out_off_ += static_cast<size_t>(n);
    }
  }

  // Sends the frames of this stream's part of messages below `limit` (send_limit()).
  bool progress_send(int s, uint64_t limit) {
    StreamState& st = send_[s];
    catch_up(st, sendq_);
    bool moved = false;
    iovec iov[2 * kSendBatch];
    FrameHeader hdrs[kSendBatch];
    const uint64_t end = std::min(sendq_.tail, limit);
    for (;;) {
      while (st.seq < end && !has_part(sendq_.at(st.seq), s)) ++st.seq;
      if (st.seq >= end) break;
      // Gather the rest of the current frame and the frames queued behind it on this stream.
      int niov = 0, k = 0;
      size_t off = st.off;
      for (uint64_t q = st.seq; q < end && k < kSendBatch; ++q) {
        Request* r = sendq_.at(q);
        if (!has_part(r, s)) continue;
        Part p = part(r, s);
        if (off < kHdr) {
          hdrs[k] = FrameHeader{kFrameMagic, static_cast<uint32_t>(s), r->sig, p.len};
          iov[niov++] = {reinterpret_cast<char*>(&hdrs[k]) + off, kHdr - off};
          if (p.len) iov[niov++] = {r->buf + p.off, p.len};
        } else {
          iov[niov++] = {r->buf + p.off + (off - kHdr), p.len - (off - kHdr)};
        }
        off = 0;
        ++k;
      }
      msghdr mh{};
      mh.msg_iov = iov;
      mh.msg_iovlen = niov;
      ssize_t n = ::sendmsg(st.fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        fail_io(errno, sendq_.at(st.seq), "send to");
      }
      moved = true;
      // Account the written bytes frame by frame.
      size_t left = static_cast<size_t>(n);
      while (left > 0) {
        while (!has_part(sendq_.at(st.seq), s)) ++st.seq;
        Request* r = sendq_.at(st.seq);
        size_t frame = kHdr + part(r, s).len;
        size_t take = std::min(left, frame - st.off);
        size_t before = st.off > kHdr ? st.off - kHdr : 0;
        st.off += take;
        r->done += (st.off > kHdr ? st.off - kHdr : 0) - before;
        left -= take;
        if (st.off == frame) {
          ++r->state;
          ++st.seq;
          st.off = 0;
        }
      }
    }
    return moved;
  }

  bool progress_recv(int s) {
    StreamState& st = recv_[s];
    catch_up(st, recvq_);
    bool moved = false;
    for (;;) {
      while (st.seq < recvq_.tail && !has_part(recvq_.at(st.seq), s)) ++st.seq;
      if (st.seq == recvq_.tail) break;
      Request* r = recvq_.at(st.seq);
      Part p = part(r, s);
      // Header and payload in one read; the payload lands straight in the user's buffer.
      iovec iov[2];
      int niov = 0;
      if (st.off < kHdr) {
        iov[niov++] = {reinterpret_cast<char*>(&st.hdr) + st.off, kHdr - st.off};
        if (p.len) iov[niov++] = {r->buf + p.off, p.len};
      } else {
        iov[niov++] = {r->buf + p.off + (st.off - kHdr), p.len - (st.off - kHdr)};
      }
      ssize_t n = ::readv(st.fd, iov, niov);
      if (n == 0) fail_io(0, r, "recv from");
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        fail_io(errno, r, "recv from");
      }
      moved = true;
      size_t before = st.off;
      st.off += static_cast<size_t>(n);
      if (before < kHdr && st.off >= kHdr) check_header(st.hdr, r, s, p);
      r->done += (st.off > kHdr ? st.off - kHdr : 0) - (before > kHdr ? before - kHdr : 0);
      if (st.off == kHdr + p.len) {
        ++r->state;
        ++st.seq;
        st.off = 0;
      }
    }
    return moved;
  }

  void check_header(const FrameHeader& h, const Request* r, int s, Part p) {
    if (h.magic != kFrameMagic)
      fail(format("%s: rank %d sent a corrupt frame on stream %d (magic 0x%08" PRIx32 ", expected 0x%08" PRIx32
                  "; not a shoal peer of this version, or the stream is out of sync)",
                  r->what, peer_, s, h.magic, kFrameMagic));
    if (h.bytes != p.len) {
      if (!is_split(r->bytes, nstreams_))
        fail_mismatch(format("%s: rank %d sent %" PRIu64 " bytes but this rank expects %zu (mismatched call across ranks)",
                    r->what, peer_, h.bytes, p.len));
      fail_mismatch(format("%s: rank %d sent %" PRIu64 " bytes on stream %d but this rank expects %zu there (part %d of a "
                  "%zu-byte message; mismatched call across ranks)",
                  r->what, peer_, h.bytes, s, p.len, s, r->bytes));
    }
    if (h.sig != r->sig)
      fail_mismatch(format("%s: rank %d sent a message of op signature 0x%016" PRIx64 " but this rank expects 0x%016" PRIx64
                  " (mismatched call across ranks: a different op, dtype, count, root or tag)",
                  r->what, peer_, h.sig, r->sig));
    if (h.part != static_cast<uint32_t>(s))
      fail(format("%s: rank %d sent part %" PRIu32 " on stream %d (streams out of sync)", r->what, peer_, h.part, s));
  }

  const int peer_;
  const int nstreams_;
  int ctl_fd_;                  // the control connection (flow-control reports, both ways)
  uint64_t credited_ = 0;       // messages the peer has reported consumed
  uint64_t reported_ = 0;       // what this rank last reported consuming (recvq_.head then)
  uint8_t ctl_in_[128];         // reports being read; a partial one is kept at the front
  size_t ctl_in_len_ = 0;
  uint8_t ctl_out_[8];          // the report being written
  size_t ctl_out_off_ = sizeof ctl_out_;  // == size: nothing being written
  bool ctl_eof_ = false;        // the peer closed the control connection
  std::vector<StreamState> send_;
  std::vector<StreamState> recv_;
  ReqRing sendq_;
  ReqRing recvq_;
  bool closed_ = false;
  std::string failed_;
};

}  // namespace

std::unique_ptr<Link> make_tcp_link(int peer, const std::vector<int>& data_fds, int control_fd) {
  return std::make_unique<TcpLink>(peer, data_fds, control_fd);
}

}  // namespace shoal
