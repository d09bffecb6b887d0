// The accepting side of the TCP set-up (tcp_accept.h).
#include "transport/tcp_accept.h"

#include <errno.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <algorithm>
#include <utility>

#include "base/log.h"
#include "shoal/error.h"
#include "transport/net_address.h"
#include "transport/tcp_util.h"

namespace shoal::tcp_detail {
namespace {

// A connection must present its hello within this long, so a silent intruder cannot stall set-up.
constexpr auto kHelloTimeout = std::chrono::seconds(2);

}  // namespace

TcpAcceptor::TcpAcceptor(const TcpConfig& cfg, EpollSet epoll) : cfg_(cfg), epoll_(epoll) {
  in_.resize(cfg.size);
  for (int j = cfg.rank + 1; j < cfg.size; ++j)
    if (cfg.use_tcp[j]) in_[j].assign(tcp_streams(cfg, j) + 1, -1);
  listener_ = listen_any();
  epoll_.watch(listener_, EPOLLIN);
}

int TcpAcceptor::port() const { return port_of(listener_); }

bool TcpAcceptor::step(Clock::time_point now) {
  if (listener_ < 0) return false;
  pfds_.clear();
  pfds_.push_back({listener_, POLLIN, 0});
  for (const Incoming& c : pending_) pfds_.push_back({c.fd, POLLIN, 0});
  int rc = ::poll(pfds_.data(), pfds_.size(), 0);
  if (rc < 0 && errno != EINTR) throw Error("tcp set-up: poll: " + errno_string(errno));
  bool moved = false;
  // Pending connections first: accept_new() appends to pending_, past the polled ones.
  for (size_t i = 1; rc > 0 && i < pfds_.size(); ++i)
    if (pfds_[i].revents) {
      moved = true;
      read_hello(pending_[i - 1]);
    }
  if (rc > 0 && pfds_[0].revents) {
    moved = true;
    accept_new(now);
  }
  for (Incoming& c : pending_)
    if (c.fd >= 0 && now >= c.deadline) reject(c, "no hello within 2 s");
  std::erase_if(pending_, [](const Incoming& c) { return c.fd < 0; });
  return moved;
}

int TcpAcceptor::arrived(int j) const {
  return static_cast<int>(std::count_if(in_[j].begin(), in_[j].end(), [](int fd) { return fd >= 0; }));
}

bool TcpAcceptor::ready(int j) const {
  return std::all_of(in_[j].begin(), in_[j].end(), [](int fd) { return fd >= 0; });
}

std::vector<int> TcpAcceptor::take(int j) {
  std::vector<int> v(in_[j].size(), -1);
  for (size_t s = 0; s < v.size(); ++s) v[s] = std::exchange(in_[j][s], -1);
  return v;
}

void TcpAcceptor::stop_listening() noexcept {
  epoll_.unwatch(listener_);
  close_fd(listener_);
  for (Incoming& c : pending_) {
    epoll_.unwatch(c.fd);
    close_fd(c.fd);
  }
  pending_.clear();
}

void TcpAcceptor::close() noexcept {
  stop_listening();
  for (auto& v : in_)
    for (int& fd : v) close_fd(fd);
}

void TcpAcceptor::accept_new(Clock::time_point now) {
  for (;;) {
    SockAddr ra;
    ra.len = sizeof ra.ss;
    int fd = ::accept4(listener_, reinterpret_cast<sockaddr*>(&ra.ss), &ra.len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        SHOAL_LOG(warn, "tcp set-up: accept: %s%s", errno_string(errno).c_str(), fd_limit_hint(errno).c_str());
      return;
    }
    Incoming c;
    c.fd = fd;
    c.remote = ra.str();
    c.deadline = now + kHelloTimeout;
    epoll_.watch(fd, EPOLLIN);
    // Read at once: the hello has usually arrived with the connection.
    pending_.push_back(c);
    read_hello(pending_.back());
  }
}

void TcpAcceptor::reject(Incoming& c, const char* why) {
  SHOAL_LOG(warn, "tcp set-up: dropped connection from %s: %s", c.remote.c_str(), why);
  epoll_.unwatch(c.fd);
  close_fd(c.fd);
}

void TcpAcceptor::read_hello(Incoming& c) {
  if (c.fd < 0) return;
  ssize_t n = ::recv(c.fd, c.buf + c.got, kTcpHelloBytes - c.got, MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  if (n <= 0) {
    if (c.got == 0 && n == 0) {  // a peer's probe (or anyone's) that only looked whether we listen
      epoll_.unwatch(c.fd);
      close_fd(c.fd);
      return;
    }
    return reject(c, "closed before completing its hello");
  }
  c.got += static_cast<size_t>(n);
  if (c.got < kTcpHelloBytes) return;
  int r = -1, s = -1;
  std::string bad = check_tcp_hello(c.buf, cfg_, &r, &s);
  if (!bad.empty()) return reject(c, bad.c_str());
  if (in_[r][s] >= 0) return reject(c, format("duplicate connection for rank %d stream %d", r, s).c_str());
  uint8_t ack = kTcpHelloAck;
  if (::send(c.fd, &ack, 1, MSG_NOSIGNAL | MSG_DONTWAIT) != 1) return reject(c, "could not acknowledge its hello");
  set_nodelay(c.fd);
  set_buffers(c.fd, tcp_notsent_lowat(cfg_, r));  // now that the peer is known
  in_[r][s] = std::exchange(c.fd, -1);
}

}  // namespace shoal::tcp_detail
