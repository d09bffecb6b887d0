// TCP transport set-up: listen, publish the address, connect every TCP pair and check each
// connection's hello (connect_tcp_links, tcp_link.h). The links it returns are tcp_link.cpp's.
#include "transport/tcp_link.h"
#include "core/le32.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/log.h"
#include "shoal/error.h"
#include "transport/net_address.h"
#include "transport/tcp_util.h"

namespace shoal {
namespace {

using namespace tcp_detail;
using Clock = std::chrono::steady_clock;

// Where a rank publishes the address its peers dial, or "!" and why it cannot take part.
std::string address_key(int rank) { return "tcp/" + std::to_string(rank); }

// SO_SNDBUF/SO_RCVBUF to request; 0 leaves the buffers to the kernel's autotuning. Setting them
// turns autotuning off, and on loopback (2 processes, 64 MiB messages) fixed 4 MiB buffers cost
// about 20% more CPU per byte than autotuned ones (cache footprint), while on long-haul paths
// autotuning grows past 4 MiB anyway (tcp_rmem max). Failures to set them are ignored.
constexpr int kSocketBuffer = 0;
constexpr uint32_t kHelloMagic = 0x53484f4c;  // "SHOL"
constexpr size_t kHelloBytes = kTcpHelloBytes;
constexpr uint8_t kHelloAck = 1;
// A connection must present its hello within this long, so a silent intruder cannot stall set-up.
constexpr auto kHelloTimeout = std::chrono::seconds(2);
constexpr auto kConnectRetry = std::chrono::milliseconds(20);


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

Millis remaining(Clock::time_point deadline) {
  auto now = Clock::now();
  if (now >= deadline) return Millis(0);
  return std::chrono::ceil<Millis>(deadline - now);
}

// A listening socket on every address: IPv6 with IPv4 mapped in (peers may dial either family),
// or IPv4 alone where the kernel has no IPv6.
int listen_any() {
  int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    int zero = 0;
    set_buffers(fd, 0);  // accepted sockets inherit the buffers (and the window scale that goes with them)
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    if (::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero) == 0 &&
        ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(fd, 128) == 0)
      return fd;
    close_fd(fd);
  }
  fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) throw Error("tcp set-up: socket: " + errno_string(errno));
  set_buffers(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 128) != 0) {
    const int e = errno;
    close_fd(fd);
    throw Error("tcp set-up: bind/listen: " + errno_string(e));
  }
  return fd;
}

int port_of(int fd) {
  SockAddr a;
  a.len = sizeof a.ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a.ss), &a.len) != 0)
    throw Error("tcp set-up: getsockname: " + errno_string(errno));
  return a.port();
}

// One outgoing connection (to a lower rank), driven by the set-up loop.
struct Outgoing {
  int peer = 0;
  int stream = 0;
  SockAddr addr;
  int fd = -1;
  enum class St { idle, connecting, hello, ack, done } st = St::idle;
  size_t sent = 0;
  Clock::time_point retry_at{};
  int last_err = 0;
};

// One accepted connection whose hello has not fully arrived.
struct Incoming {
  int fd = -1;
  std::string remote;
  Clock::time_point deadline;
  uint8_t buf[kHelloBytes];
  size_t got = 0;
};

// Owns every descriptor made during set-up until it is handed to a link.
struct SetupFds {
  int listener = -1;
  std::vector<Outgoing> out;
  std::vector<Incoming> pending;
  std::vector<std::vector<int>> in;  // [peer][stream]
  ~SetupFds() {
    close_fd(listener);
    for (auto& o : out) close_fd(o.fd);
    for (auto& p : pending) close_fd(p.fd);
    for (auto& v : in)
      for (int& fd : v) close_fd(fd);
  }
};

}  // namespace

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

void publish_tcp_setup_failure(Store& store, int rank, const std::string& why) {
  store.set_string(address_key(rank), "!" + why);
}

std::vector<std::unique_ptr<Link>> connect_tcp_links(Store& store, const TcpConfig& cfg) {
  if (cfg.size < 1 || cfg.rank < 0 || cfg.rank >= cfg.size)
    throw InvalidArgument(format("tcp set-up: rank %d out of range for size %d", cfg.rank, cfg.size));
  if (cfg.streams < 1 || cfg.streams > 64 || cfg.local_streams < 1 || cfg.local_streams > 64)
    throw InvalidArgument(
        format("tcp set-up: streams must be in [1, 64], got %d (%d on this host)", cfg.streams, cfg.local_streams));
  if (cfg.use_tcp.size() != static_cast<size_t>(cfg.size))
    throw InvalidArgument(format("tcp set-up: use_tcp has %zu entries for a group of %d", cfg.use_tcp.size(),
                                 cfg.size));
  const int rank = cfg.rank;
  auto tcp_peer = [&](int j) { return j != rank && cfg.use_tcp[j]; };
  // Connections to peer j: its data streams, then the control connection (index streams).
  auto nconns = [&](int j) { return tcp_streams(cfg, j) + 1; };

  SetupFds fds;
  fds.in.resize(cfg.size);
  for (int j = 0; j < cfg.size; ++j) fds.in[j].assign(nconns(j), -1);

  // Listen and publish.
  fds.listener = listen_any();
  std::string me = join_host_port(cfg.advertise_host.empty() ? "127.0.0.1" : cfg.advertise_host, port_of(fds.listener));
  store.set_string(address_key(rank), me);
  SHOAL_LOG(debug, "tcp: listening on %s", me.c_str());

  // Addresses of the lower peers (each published before looking up anyone else's).
  for (int j = 0; j < rank; ++j) {
    if (!tcp_peer(j)) continue;
    std::string addr;
    try {
      addr = store.get_string(address_key(j), remaining(cfg.deadline));
    } catch (const Timeout&) {
      throw Timeout(format("tcp set-up timed out: rank %d never published its address (tcp/%d)", j, j));
    }
    if (!addr.empty() && addr[0] == '!') throw Error(format("tcp set-up: rank %d failed: %s", j, addr.c_str() + 1));
    SockAddr a;
    if (std::string why = resolve_host_port(addr, &a); !why.empty())
      throw Error(format("tcp set-up: cannot resolve rank %d's address '%s': %s", j, addr.c_str(), why.c_str()));
    for (int s = 0; s < nconns(j); ++s) {
      Outgoing o;
      o.peer = j;
      o.stream = s;
      o.addr = a;
      fds.out.push_back(o);
    }
  }
  int expect_in = 0;
  for (int j = rank + 1; j < cfg.size; ++j)
    if (tcp_peer(j)) expect_in += nconns(j);
  int got_in = 0;
  size_t out_done = 0;

  auto reject = [&](Incoming& c, const char* why) {
    SHOAL_LOG(warn, "tcp set-up: dropped connection from %s: %s", c.remote.c_str(), why);
    close_fd(c.fd);
  };

  std::vector<pollfd> pfds;
  std::vector<int> owner;  // per pollfd: -1 listener, 2k outgoing k, 2k+1 pending k
  while (got_in < expect_in || out_done < fds.out.size()) {
    auto now = Clock::now();
    if (now >= cfg.deadline) {
      std::string missing;
      for (int j = 0; j < cfg.size; ++j) {
        if (!tcp_peer(j)) continue;
        int have = 0;
        int last_err = 0;
        if (j < rank) {
          for (auto& o : fds.out)
            if (o.peer == j) {
              have += o.st == Outgoing::St::done;
              if (o.last_err) last_err = o.last_err;
            }
        } else {
          for (int fd : fds.in[j]) have += fd >= 0;
        }
        if (have == nconns(j)) continue;
        if (!missing.empty()) missing += ", ";
        missing += format("rank %d (%d/%d connections%s%s)", j, have, nconns(j), last_err ? ", last error: " : "",
                          last_err ? errno_string(last_err).c_str() : "");
      }
      throw Timeout("tcp set-up timed out waiting for " + missing);
    }

    // Start (or restart) connections that are due.
    for (auto& o : fds.out) {
      if (o.st != Outgoing::St::idle || o.retry_at > now) continue;
      o.fd = ::socket(o.addr.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (o.fd < 0) throw Error("tcp set-up: socket: " + errno_string(errno));
      set_buffers(o.fd, tcp_notsent_lowat(cfg, o.peer));
      set_nodelay(o.fd);
      if (::connect(o.fd, o.addr.get(), o.addr.len) == 0) {
        o.st = Outgoing::St::hello;
      } else if (errno == EINPROGRESS || errno == EINTR) {
        o.st = Outgoing::St::connecting;
      } else {
        o.last_err = errno;
        close_fd(o.fd);
        o.retry_at = now + kConnectRetry;
      }
    }

    // Wait for something to happen.
    pfds.clear();
    owner.clear();
    pfds.push_back({fds.listener, POLLIN, 0});
    owner.push_back(-1);
    auto wake = cfg.deadline;
    for (size_t k = 0; k < fds.out.size(); ++k) {
      auto& o = fds.out[k];
      short ev = 0;
      switch (o.st) {
        case Outgoing::St::idle: wake = std::min(wake, o.retry_at); break;
        case Outgoing::St::connecting:
        case Outgoing::St::hello: ev = POLLOUT; break;
        case Outgoing::St::ack: ev = POLLIN; break;
        case Outgoing::St::done: break;
      }
      if (ev) {
        pfds.push_back({o.fd, ev, 0});
        owner.push_back(static_cast<int>(2 * k));
      }
    }
    for (size_t k = 0; k < fds.pending.size(); ++k) {
      pfds.push_back({fds.pending[k].fd, POLLIN, 0});
      owner.push_back(static_cast<int>(2 * k + 1));
      wake = std::min(wake, fds.pending[k].deadline);
    }
    int timeout_ms = static_cast<int>(std::min<int64_t>(remaining(wake).count(), 1000));
    int rc = ::poll(pfds.data(), pfds.size(), timeout_ms);
    if (rc < 0 && errno != EINTR) throw Error("tcp set-up: poll: " + errno_string(errno));
    now = Clock::now();

    for (size_t i = 0; rc > 0 && i < pfds.size(); ++i) {
      short re = pfds[i].revents;
      if (!re) continue;
      int who = owner[i];
      if (who == -1) {
        // New connections: read their hellos without blocking, alongside everything else.
        for (;;) {
          SockAddr ra;
          ra.len = sizeof ra.ss;
          int fd = ::accept4(fds.listener, reinterpret_cast<sockaddr*>(&ra.ss), &ra.len, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
              SHOAL_LOG(warn, "tcp set-up: accept: %s", errno_string(errno).c_str());
            break;
          }
          Incoming c;
          c.fd = fd;
          c.remote = ra.str();
          c.deadline = now + kHelloTimeout;
          fds.pending.push_back(c);
        }
      } else if (who % 2 == 1) {
        Incoming& c = fds.pending[who / 2];
        ssize_t n = ::recv(c.fd, c.buf + c.got, kHelloBytes - c.got, MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
        if (n <= 0) {
          reject(c, "closed before completing its hello");
          continue;
        }
        c.got += static_cast<size_t>(n);
        if (c.got < kHelloBytes) continue;
        int r = -1, s = -1;
        std::string bad = check_tcp_hello(c.buf, cfg, &r, &s);
        if (!bad.empty()) {
          reject(c, bad.c_str());
        } else if (fds.in[r][s] >= 0) {
          std::string why = format("duplicate connection for rank %d stream %d", r, s);
          reject(c, why.c_str());
        } else {
          uint8_t ack = kHelloAck;
          if (::send(c.fd, &ack, 1, MSG_NOSIGNAL | MSG_DONTWAIT) != 1) {
            reject(c, "could not acknowledge its hello");
          } else {
            set_nodelay(c.fd);
            set_buffers(c.fd, tcp_notsent_lowat(cfg, r));  // now that the peer is known
            fds.in[r][s] = c.fd;
            c.fd = -1;
            ++got_in;
          }
        }
      } else {
        Outgoing& o = fds.out[who / 2];
        if (o.st == Outgoing::St::connecting) {
          int err = 0;
          socklen_t len = sizeof err;
          ::getsockopt(o.fd, SOL_SOCKET, SO_ERROR, &err, &len);
          if (err != 0) {
            o.last_err = err;
            close_fd(o.fd);
            o.st = Outgoing::St::idle;
            o.retry_at = now + kConnectRetry;
            continue;
          }
          o.st = Outgoing::St::hello;
        }
        if (o.st == Outgoing::St::hello) {
          uint8_t hello[kHelloBytes];
          encode_tcp_hello(hello, cfg.secret, rank, o.stream);
          ssize_t n = ::send(o.fd, hello + o.sent, kHelloBytes - o.sent, MSG_NOSIGNAL | MSG_DONTWAIT);
          if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
          if (n < 0) {
            o.last_err = errno;
            close_fd(o.fd);
            o.st = Outgoing::St::idle;
            o.sent = 0;
            o.retry_at = now + kConnectRetry;
            continue;
          }
          o.sent += static_cast<size_t>(n);
          if (o.sent == kHelloBytes) o.st = Outgoing::St::ack;
        } else if (o.st == Outgoing::St::ack) {
          uint8_t ack = 0;
          ssize_t n = ::recv(o.fd, &ack, 1, MSG_DONTWAIT);
          if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
          if (n != 1 || ack != kHelloAck)
            throw PeerError(format("tcp set-up: rank %d (%s) refused our connection (stream %d): different group "
                                   "secret, or a stale address in the store",
                                   o.peer, o.addr.str().c_str(), o.stream));
          o.st = Outgoing::St::done;
          ++out_done;
        }
      }
    }

    // Drop hellos that never came, and forget closed pending slots.
    for (auto& c : fds.pending)
      if (c.fd >= 0 && now >= c.deadline) reject(c, "no hello within 2 s");
    std::erase_if(fds.pending, [](const Incoming& c) { return c.fd < 0; });
  }
  close_fd(fds.listener);
  for (auto& c : fds.pending) close_fd(c.fd);  // late intruders: set-up is over

  std::vector<std::unique_ptr<Link>> links(cfg.size);
  for (int j = 0; j < cfg.size; ++j) {
    if (!tcp_peer(j)) continue;
    std::vector<int> v(nconns(j));
    if (j < rank) {
      for (auto& o : fds.out)
        if (o.peer == j) v[o.stream] = o.fd;
    } else {
      v = fds.in[j];
    }
    const int control = v.back();
    v.pop_back();
    if (cfg.epoll_fd >= 0) {
      for (int fd : v) {
        epoll_event ev{};
        ev.events = EPOLLIN | EPOLLOUT | EPOLLET | EPOLLRDHUP;
        if (::epoll_ctl(cfg.epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0)
          throw Error("tcp set-up: epoll_ctl: " + errno_string(errno));
      }
      // Only its reports wake a waiter (a sender held by the window); its writes never wait.
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLET | EPOLLRDHUP;
      if (::epoll_ctl(cfg.epoll_fd, EPOLL_CTL_ADD, control, &ev) != 0)
        throw Error("tcp set-up: epoll_ctl: " + errno_string(errno));
    }
    links[j] = make_tcp_link(j, v, control);
    // The link owns the descriptors now.
    if (j < rank) {
      for (auto& o : fds.out)
        if (o.peer == j) o.fd = -1;
    } else {
      for (int& fd : fds.in[j]) fd = -1;
    }
  }
  SHOAL_LOG(debug, "tcp: set-up done (%d streams and a control connection per peer on another host, %d on this one)",
            cfg.streams, cfg.local_streams);
  return links;
}
}  // namespace shoal
