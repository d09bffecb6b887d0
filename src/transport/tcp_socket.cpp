// The TCP transport's sockets and hello (tcp_socket.h, tcp_link.h).
#include "transport/tcp_socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <cstring>
#include <string>

#include "base/le32.h"
#include "shoal/error.h"
#include "transport/net_address.h"
#include "transport/tcp_link.h"
#include "transport/tcp_util.h"

namespace shoal {
namespace {

// SO_SNDBUF/SO_RCVBUF to request; 0 leaves the buffers to the kernel's autotuning. Setting them
// turns autotuning off: fixed large buffers cost more CPU per byte on loopback (their cache
// footprint), and on long-haul paths autotuning grows past them anyway (tcp_rmem max). Failures
// to set them are ignored.
constexpr int kSocketBuffer = 0;
constexpr uint32_t kHelloMagic = 0x53484f4c;  // "SHOL"

}  // namespace

namespace tcp_detail {

// `lowat`: tcp_notsent_lowat of the socket's pair.
void set_buffers(int fd, int lowat) {
  // TCP_NOTSENT_LOWAT (see TcpConfig::notsent_lowat): unlike a fixed SO_SNDBUF it leaves the
  // window, and so long fat links, alone. Failure to set it costs only speed.
  if (lowat > 0) (void)::setsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &lowat, sizeof lowat);
  int v = kSocketBuffer;
  if (v <= 0) return;
  (void)::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, sizeof v);
  (void)::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof v);
}

void set_nodelay(int fd) {
  int one = 1;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int listen_any() {
  int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    int zero = 0;
    set_buffers(fd, 0);  // accepted sockets inherit the buffers (and the window scale that goes with them)
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    if (::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero) == 0 &&
        ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(fd, SOMAXCONN) == 0)
      return fd;
    close_fd(fd);
  }
  fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) throw Error("tcp set-up: socket: " + errno_string(errno));
  set_buffers(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, SOMAXCONN) != 0) {
    const int e = errno;
    close_fd(fd);
    throw Error("tcp set-up: bind/listen: " + errno_string(e));
  }
  return fd;
}

bool EpollSet::add(int s, uint32_t events) const {
  if (fd < 0 || s < 0) return true;
  epoll_event ev{};
  ev.events = events;
  return ::epoll_ctl(fd, EPOLL_CTL_ADD, s, &ev) == 0;
}

void EpollSet::watch(int s, uint32_t events) const {
  if (!add(s, events | EPOLLET)) throw Error("tcp set-up: epoll_ctl: " + errno_string(errno));
}

void EpollSet::unwatch(int s) const noexcept {
  if (fd >= 0 && s >= 0) (void)::epoll_ctl(fd, EPOLL_CTL_DEL, s, nullptr);
}

std::string fd_limit_hint(int err) {
  return err == EMFILE || err == ENFILE ? " (the limit on open files, RLIMIT_NOFILE: raise `ulimit -n`)" : "";
}

int port_of(int fd) {
  SockAddr a;
  a.len = sizeof a.ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a.ss), &a.len) != 0)
    throw Error("tcp set-up: getsockname: " + errno_string(errno));
  return a.port();
}

}  // namespace tcp_detail

using namespace tcp_detail;

void encode_tcp_hello(uint8_t* out, const std::array<uint8_t, 32>& secret, int rank, int stream) {
  put32(out, kHelloMagic);
  std::memcpy(out + 4, secret.data(), 32);
  put32(out + 36, static_cast<uint32_t>(rank));
  put32(out + 40, static_cast<uint32_t>(stream));
}

std::string check_tcp_hello(const uint8_t* hello, const TcpConfig& cfg, int* peer, int* stream) {
  uint32_t magic = get32(hello);
  int r = static_cast<int32_t>(get32(hello + 36));
  int s = static_cast<int32_t>(get32(hello + 40));
  uint8_t diff = 0;
  for (int b = 0; b < 32; ++b) diff |= hello[4 + b] ^ cfg.secret[b];
  if (magic != kHelloMagic) return "bad hello magic (not a shoal peer)";
  if (diff != 0) return "wrong group secret (another group, or not a shoal peer)";
  if (r <= cfg.rank || r >= cfg.size || static_cast<size_t>(r) >= cfg.use_tcp.size() || !cfg.use_tcp[r] || s < 0 ||
      s > tcp_streams(cfg, r))  // s == streams: the control connection
    return format("unexpected rank %d / stream %d in hello", r, s);
  *peer = r;
  *stream = s;
  return "";
}

namespace {
bool on_this_host(const TcpConfig& cfg, int peer) {
  return static_cast<size_t>(peer) < cfg.same_host.size() && cfg.same_host[peer];
}
}  // namespace

int tcp_streams(const TcpConfig& cfg, int peer) {
  return on_this_host(cfg, peer) ? cfg.local_streams : cfg.streams;
}

int tcp_notsent_lowat(const TcpConfig& cfg, int peer) {
  return on_this_host(cfg, peer) ? cfg.local_notsent_lowat : cfg.notsent_lowat;
}

}  // namespace shoal
