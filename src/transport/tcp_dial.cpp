// The dialing side of the TCP set-up (tcp_dial.h).
#include "transport/tcp_dial.h"

#include <errno.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <algorithm>
#include <utility>

#include "shoal/error.h"
#include "transport/tcp_util.h"

namespace shoal::tcp_detail {
namespace {

constexpr auto kConnectRetry = std::chrono::milliseconds(20);

}  // namespace

void TcpDialer::dial(int j, const SockAddr& a) {
  for (int s = 0; s < conns(j); ++s) out_.push_back(Outgoing{j, s, a});
}

bool TcpDialer::probe(int j, const SockAddr& a) {
  if (std::any_of(out_.begin(), out_.end(), [&](const Outgoing& o) { return o.peer == j; })) return false;
  out_.push_back(Outgoing{j, -1, a});
  return true;
}

bool TcpDialer::in_flight() const {
  return std::any_of(out_.begin(), out_.end(),
                     [](const Outgoing& o) { return o.st != Outgoing::St::done && o.st != Outgoing::St::idle; });
}

bool TcpDialer::step(Clock::time_point now) {
  std::erase_if(out_, [](const Outgoing& o) { return o.stream < 0 && o.st == Outgoing::St::done; });  // probes over
  for (Outgoing& o : out_)
    if (o.st == Outgoing::St::idle && o.retry_at <= now) start(o, now);
  pfds_.clear();
  owner_.clear();
  for (size_t k = 0; k < out_.size(); ++k) {
    short ev = 0;
    switch (out_[k].st) {
      case Outgoing::St::connecting:
      case Outgoing::St::hello: ev = POLLOUT; break;
      case Outgoing::St::ack: ev = POLLIN; break;
      default: break;
    }
    if (ev) {
      pfds_.push_back({out_[k].fd, ev, 0});
      owner_.push_back(k);
    }
  }
  int rc = pfds_.empty() ? 0 : ::poll(pfds_.data(), pfds_.size(), 0);
  if (rc < 0 && errno != EINTR) throw Error("tcp set-up: poll: " + errno_string(errno));
  bool moved = false;
  for (size_t i = 0; rc > 0 && i < pfds_.size(); ++i)
    if (pfds_[i].revents) {
      moved = true;
      advance(out_[owner_[i]], now);
    }
  return moved;
}

int TcpDialer::made(int j) const {
  return static_cast<int>(std::count_if(out_.begin(), out_.end(), [j](const Outgoing& o) {
    return o.peer == j && o.stream >= 0 && o.st == Outgoing::St::done;
  }));
}

bool TcpDialer::ready(int j) const { return made(j) == conns(j); }

int TcpDialer::last_error(int j) const {
  int err = 0;
  for (const Outgoing& o : out_)
    if (o.peer == j && o.last_err) err = o.last_err;
  return err;
}

std::vector<int> TcpDialer::take(int j) {
  std::vector<int> v(conns(j), -1);
  for (Outgoing& o : out_)
    if (o.peer == j && o.stream >= 0) v[o.stream] = std::exchange(o.fd, -1);
  std::erase_if(out_, [&](const Outgoing& o) { return o.peer == j && o.stream >= 0; });
  return v;
}

void TcpDialer::close() noexcept {
  for (Outgoing& o : out_) {
    epoll_.unwatch(o.fd);
    close_fd(o.fd);
  }
  out_.clear();
}

void TcpDialer::start(Outgoing& o, Clock::time_point now) {
  o.fd = ::socket(o.addr.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (o.fd < 0) {  // not retried: the pair fails with this
    o.retry_at = Clock::time_point::max();
    return fail_(o.peer, "tcp set-up: socket: " + errno_string(errno) + fd_limit_hint(errno));
  }
  set_buffers(o.fd, tcp_notsent_lowat(cfg_, o.peer));
  set_nodelay(o.fd);
  epoll_.watch(o.fd, EPOLLIN | EPOLLOUT);
  // Connected at once or in progress: advance() finds out which (and ends a probe there).
  if (::connect(o.fd, o.addr.get(), o.addr.len) == 0 || errno == EINPROGRESS || errno == EINTR)
    o.st = Outgoing::St::connecting;
  else
    connect_failed(o, errno, now);
}

// A refused connection: nothing listens at the address the peer published, so it has left.
// Anything else may pass (a route coming up, a full backlog): try again shortly.
void TcpDialer::connect_failed(Outgoing& o, int err, Clock::time_point now) {
  o.last_err = err;
  epoll_.unwatch(o.fd);
  close_fd(o.fd);
  o.sent = 0;
  if (err == ECONNREFUSED)
    fail_(o.peer, format("rank %d refused a connection at %s: it has exited or left the group, or that address "
                         "does not reach it (a firewall; SHOAL_HOST, SHOAL_SOCKET_IFNAME)",
                         o.peer, o.addr.str().c_str()));
  if (o.stream < 0) {
    o.st = Outgoing::St::done;  // a probe: the connector starts the next one when it is due
    return;
  }
  o.st = Outgoing::St::idle;
  o.retry_at = now + kConnectRetry;
}

void TcpDialer::advance(Outgoing& o, Clock::time_point now) {
  if (o.st == Outgoing::St::connecting) {
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(o.fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return connect_failed(o, err, now);
    if (o.stream < 0) {  // the peer is there: that was all a probe asks
      epoll_.unwatch(o.fd);
      close_fd(o.fd);
      o.st = Outgoing::St::done;
      return;
    }
    o.st = Outgoing::St::hello;
  }
  if (o.st == Outgoing::St::hello) {
    uint8_t hello[kTcpHelloBytes];
    encode_tcp_hello(hello, cfg_.secret, cfg_.rank, o.stream);
    ssize_t n = ::send(o.fd, hello + o.sent, kTcpHelloBytes - o.sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n < 0) return connect_failed(o, errno, now);
    o.sent += static_cast<size_t>(n);
    if (o.sent == kTcpHelloBytes) o.st = Outgoing::St::ack;
  } else if (o.st == Outgoing::St::ack) {
    uint8_t ack = 0;
    ssize_t n = ::recv(o.fd, &ack, 1, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n != 1 || ack != kTcpHelloAck) {
      epoll_.unwatch(o.fd);
      close_fd(o.fd);
      o.st = Outgoing::St::idle;
      o.retry_at = Clock::time_point::max();
      fail_(o.peer, format("tcp set-up: rank %d (%s) refused our connection (stream %d): different group "
                           "secret, a stale address in the store, or it has left the group",
                           o.peer, o.addr.str().c_str(), o.stream));
      return;
    }
    o.st = Outgoing::St::done;
  }
}

}  // namespace shoal::tcp_detail
