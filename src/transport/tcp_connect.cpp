// TCP transport set-up: the connector (TcpConnector), a state machine that listens, dials a pair
// when it first talks and checks each connection's hello, and the link that waits for it
// (LazyTcpLink). The sockets and the hello are tcp_socket.cpp's, the links over the connections
// tcp_link.cpp's.
#include "transport/tcp_link.h"
#include "base/le32.h"

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
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/log.h"
#include "shoal/error.h"
#include "transport/net_address.h"
#include "transport/tcp_socket.h"
#include "transport/tcp_util.h"

namespace shoal {
namespace {

using namespace tcp_detail;
using Clock = std::chrono::steady_clock;

constexpr size_t kHelloBytes = kTcpHelloBytes;
constexpr uint8_t kHelloAck = 1;
// A connection must present its hello within this long, so a silent intruder cannot stall set-up.
constexpr auto kHelloTimeout = std::chrono::seconds(2);
constexpr auto kConnectRetry = std::chrono::milliseconds(20);

// One outgoing connection (to a lower rank), or a liveness probe of a higher one (stream -1).
struct Outgoing {
  int peer = 0;
  int stream = 0;
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

}  // namespace

// The connections of one rank's TCP links, made without blocking whenever a link asks (step).
// The higher rank of a pair dials: `streams` data connections and a control connection, each
// opening with a hello the lower rank checks and acknowledges. The lower rank accepts whatever
// arrives, for any peer, whenever it steps. While it waits for a peer that has not dialed, it
// probes that peer's listener once a second: a refused probe means the peer has left (exited,
// aborted or destroyed its group), which would otherwise be seen only at the op's timeout. The
// listener closes once every TCP peer is connected.
class TcpConnector {
 public:
  explicit TcpConnector(const TcpConfig& cfg) : cfg_(cfg) {
    const int n = cfg.size;
    if (n < 1 || cfg.rank < 0 || cfg.rank >= n)
      throw InvalidArgument(format("tcp set-up: rank %d out of range for size %d", cfg.rank, n));
    if (cfg.streams < 1 || cfg.streams > 64 || cfg.local_streams < 1 || cfg.local_streams > 64)
      throw InvalidArgument(
          format("tcp set-up: streams must be in [1, 64], got %d (%d on this host)", cfg.streams, cfg.local_streams));
    if (cfg.use_tcp.size() != static_cast<size_t>(n))
      throw InvalidArgument(format("tcp set-up: use_tcp has %zu entries for a group of %d", cfg.use_tcp.size(), n));
    addr_.resize(n);
    state_.resize(n);
    in_.resize(n);
    for (int j = 0; j < n; ++j) {
      in_[j].assign(tcp_peer(j) && j > cfg.rank ? nconns(j) : 0, -1);
      if (tcp_peer(j)) ++unconnected_;
    }
    listener_ = listen_any();
    address_ = join_host_port(cfg.advertise_host.empty() ? "127.0.0.1" : cfg.advertise_host, port_of(listener_));
    SHOAL_LOG(debug, "tcp: listening on %s", address_.c_str());
    watch(listener_, EPOLLIN);
  }
  ~TcpConnector() { shutdown(); }
  TcpConnector(const TcpConnector&) = delete;
  TcpConnector& operator=(const TcpConnector&) = delete;

  const TcpConfig& config() const { return cfg_; }
  const std::string& address() const { return address_; }
  bool tcp_peer(int j) const { return j != cfg_.rank && cfg_.use_tcp[j]; }
  int nconns(int j) const { return tcp_streams(cfg_, j) + 1; }

  // Rank j's published address: a lower peer's is dialed, a higher one's probed.
  void set_address(int j, const std::string& addr) {
    if (!tcp_peer(j)) return;
    if (!addr.empty() && addr[0] == '!') throw Error(format("tcp set-up: rank %d failed: %s", j, addr.c_str() + 1));
    SockAddr a;
    if (std::string why = resolve_host_port(addr, &a); !why.empty())
      throw Error(format("tcp set-up: cannot resolve rank %d's address '%s': %s", j, addr.c_str(), why.c_str()));
    addr_[j] = a;
    state_[j].has_addr = true;
  }

  // Asks for the pair with j: dials it if j is lower; if higher, probes it while it has not dialed.
  void want(int j) {
    Peer& p = state_[j];
    if (p.wanted || !tcp_peer(j)) return;
    p.wanted = true;
    if (j < cfg_.rank) {
      for (int s = 0; s < nconns(j); ++s) out_.push_back(Outgoing{j, s});
    } else {
      p.probe_at = Clock::now() + kProbeEvery;
    }
  }

  // step() for a rank that waits on something else: at once while connections are in progress,
  // else once a millisecond while the listener is open (a peer may have dialed: its first send
  // waits for this rank's acknowledgement), so that a rank's waits do not each pay a poll().
  bool step_if_due() {
    if (listener_ < 0 && out_.empty()) return false;
    const auto now = Clock::now();
    const bool in_flight = !pending_.empty() || std::any_of(out_.begin(), out_.end(), [](const Outgoing& o) {
      return o.st != Outgoing::St::done && o.st != Outgoing::St::idle;
    });
    if (!in_flight && now < next_idle_step_) return false;
    next_idle_step_ = now + std::chrono::milliseconds(1);
    return step();
  }

  // Moves every connection in progress without blocking; true if anything moved.
  bool step() {
    if (listener_ < 0 && out_.empty()) return false;
    bool moved = false;
    auto now = Clock::now();
    start_due(now);
    pfds_.clear();
    owner_.clear();
    if (listener_ >= 0) {
      pfds_.push_back({listener_, POLLIN, 0});
      owner_.push_back(-1);
    }
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
        owner_.push_back(static_cast<int>(2 * k));
      }
    }
    for (size_t k = 0; k < pending_.size(); ++k) {
      pfds_.push_back({pending_[k].fd, POLLIN, 0});
      owner_.push_back(static_cast<int>(2 * k + 1));
    }
    int rc = pfds_.empty() ? 0 : ::poll(pfds_.data(), pfds_.size(), 0);
    if (rc < 0 && errno != EINTR) throw Error("tcp set-up: poll: " + errno_string(errno));
    for (size_t i = 0; rc > 0 && i < pfds_.size(); ++i) {
      if (!pfds_[i].revents) continue;
      moved = true;
      const int who = owner_[i];
      if (who == -1) accept_new(now);
      else if (who % 2 == 1) read_hello(pending_[who / 2]);
      else advance(out_[who / 2], now);
    }
    for (auto& c : pending_)
      if (c.fd >= 0 && now >= c.deadline) reject(c, "no hello within 2 s");
    std::erase_if(pending_, [](const Incoming& c) { return c.fd < 0; });
    return moved;
  }

  bool ready(int j) const {
    if (j < cfg_.rank) {
      int done = 0;
      for (auto& o : out_) done += o.peer == j && o.stream >= 0 && o.st == Outgoing::St::done;
      return done == nconns(j);
    }
    return std::all_of(in_[j].begin(), in_[j].end(), [](int fd) { return fd >= 0; });
  }

  // Why the pair with j cannot be made ("" while it can).
  const std::string& failure(int j) const { return state_[j].failure; }

  // The link over the pair's connections, once ready(j).
  std::unique_ptr<Link> take_link(int j) {
    std::vector<int> v(nconns(j), -1);
    if (j < cfg_.rank) {
      for (auto& o : out_)
        if (o.peer == j && o.stream >= 0) v[o.stream] = std::exchange(o.fd, -1);
      std::erase_if(out_, [&](const Outgoing& o) { return o.peer == j && o.stream >= 0; });
    } else {
      for (int s = 0; s < nconns(j); ++s) v[s] = std::exchange(in_[j][s], -1);
    }
    state_[j].connected = true;
    const int control = v.back();
    v.pop_back();
    for (int fd : v) unwatch(fd);
    unwatch(control);
    std::unique_ptr<Link> link = make_tcp_link(j, v, control);  // owns the descriptors now
    if (cfg_.epoll_fd >= 0) {
      for (int fd : v)
        if (!add_to_epoll(fd, EPOLLIN | EPOLLOUT | EPOLLET | EPOLLRDHUP)) throw_epoll();
      // Only its reports wake a waiter (a sender held by the window); its writes never wait.
      if (!add_to_epoll(control, EPOLLIN | EPOLLET | EPOLLRDHUP)) throw_epoll();
    }
    if (--unconnected_ == 0) stop_connecting();  // nobody left to dial this rank, or to dial
    return link;
  }

  // "rank j (2/3 connections, last error: ...)", for a timeout.
  std::string describe(int j) const {
    int have = 0, last_err = 0;
    if (j < cfg_.rank) {
      for (auto& o : out_)
        if (o.peer == j && o.stream >= 0) {
          have += o.st == Outgoing::St::done;
          if (o.last_err) last_err = o.last_err;
        }
    } else {
      for (int fd : in_[j]) have += fd >= 0;
    }
    return format("rank %d (%d/%d connections%s%s)", j, have, nconns(j), last_err ? ", last error: " : "",
                  last_err ? errno_string(last_err).c_str() : "");
  }

  // Stops accepting and dialing (this rank is leaving): peers that dial it are refused at once.
  void shutdown() noexcept {
    stop_connecting();
    for (auto& v : in_)
      for (int& fd : v) close_fd(fd);
  }

 private:
  static constexpr auto kProbeEvery = std::chrono::seconds(1);

  struct Peer {
    bool has_addr = false;
    bool wanted = false;
    bool connected = false;  // its link is made
    Clock::time_point probe_at{};  // a higher peer that has not dialed: when to look whether it is there
    std::string failure;
  };

  bool add_to_epoll(int fd, uint32_t events) {
    epoll_event ev{};
    ev.events = events;
    return ::epoll_ctl(cfg_.epoll_fd, EPOLL_CTL_ADD, fd, &ev) == 0;
  }
  [[noreturn]] static void throw_epoll() { throw Error("tcp set-up: epoll_ctl: " + errno_string(errno)); }
  // Set-up sockets wake the engine's sleep too (edge-triggered: step() reads each until it would block).
  void watch(int fd, uint32_t events) {
    if (cfg_.epoll_fd >= 0 && fd >= 0 && !add_to_epoll(fd, events | EPOLLET)) throw_epoll();
  }
  void unwatch(int fd) noexcept {
    if (cfg_.epoll_fd >= 0 && fd >= 0) (void)::epoll_ctl(cfg_.epoll_fd, EPOLL_CTL_DEL, fd, nullptr);
  }

  // Closes the listener and every connection still being made (probes included).
  void stop_connecting() noexcept {
    unwatch(listener_);
    close_fd(listener_);
    for (auto& c : pending_) close_fd(c.fd);
    pending_.clear();
    for (auto& o : out_) close_fd(o.fd);
    out_.clear();
  }

  void fail(int j, std::string why) {
    if (state_[j].failure.empty()) state_[j].failure = std::move(why);
  }

  // Starts (or restarts) the connections that are due, and the probes of higher peers.
  void start_due(Clock::time_point now) {
    for (int j = cfg_.rank + 1; j < cfg_.size; ++j) {
      Peer& p = state_[j];
      if (!p.wanted || p.connected || !p.has_addr || p.probe_at > now || ready(j) || !p.failure.empty()) continue;
      if (std::any_of(out_.begin(), out_.end(), [&](const Outgoing& o) { return o.peer == j; })) continue;
      out_.push_back(Outgoing{j, -1});
      p.probe_at = now + kProbeEvery;
    }
    for (auto& o : out_) {
      if (o.st != Outgoing::St::idle || o.retry_at > now) continue;
      if (!state_[o.peer].has_addr) {
        fail(o.peer, format("tcp set-up: no address of rank %d", o.peer));
        continue;
      }
      const SockAddr& a = addr_[o.peer];
      o.fd = ::socket(a.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (o.fd < 0) {
        fail(o.peer, "tcp set-up: socket: " + errno_string(errno) + fd_hint(errno));
        continue;
      }
      set_buffers(o.fd, tcp_notsent_lowat(cfg_, o.peer));
      set_nodelay(o.fd);
      watch(o.fd, EPOLLIN | EPOLLOUT);
      if (::connect(o.fd, a.get(), a.len) == 0) {
        o.st = Outgoing::St::connecting;  // advance() finds it connected (and ends a probe there)
      } else if (errno == EINPROGRESS || errno == EINTR) {
        o.st = Outgoing::St::connecting;
      } else {
        connect_failed(o, errno, now);
      }
    }
    std::erase_if(out_, [](const Outgoing& o) { return o.stream < 0 && o.st == Outgoing::St::done; });
  }

  static std::string fd_hint(int err) {
    return err == EMFILE || err == ENFILE ? " (the limit on open files, RLIMIT_NOFILE: raise `ulimit -n`)" : "";
  }

  // A refused connection: nothing listens at the address the peer published, so it has left.
  // Anything else may pass (a route coming up, a full backlog): try again shortly.
  void connect_failed(Outgoing& o, int err, Clock::time_point now) {
    o.last_err = err;
    unwatch(o.fd);
    close_fd(o.fd);
    o.sent = 0;
    if (err == ECONNREFUSED)
      fail(o.peer, format("rank %d refused a connection at %s: it has exited or left the group, or that address "
                          "does not reach it (a firewall; SHOAL_HOST, SHOAL_SOCKET_IFNAME)",
                          o.peer, addr_[o.peer].str().c_str()));
    if (o.stream < 0) {
      o.st = Outgoing::St::done;  // a probe: the next one is due at probe_at
      return;
    }
    o.st = Outgoing::St::idle;
    o.retry_at = now + kConnectRetry;
  }

  void advance(Outgoing& o, Clock::time_point now) {
    if (o.st == Outgoing::St::connecting) {
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(o.fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) return connect_failed(o, err, now);
      if (o.stream < 0) {  // the peer is there: that was all a probe asks
        unwatch(o.fd);
        close_fd(o.fd);
        o.st = Outgoing::St::done;
        return;
      }
      o.st = Outgoing::St::hello;
    }
    if (o.st == Outgoing::St::hello) {
      uint8_t hello[kHelloBytes];
      encode_tcp_hello(hello, cfg_.secret, cfg_.rank, o.stream);
      ssize_t n = ::send(o.fd, hello + o.sent, kHelloBytes - o.sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
      if (n < 0) return connect_failed(o, errno, now);
      o.sent += static_cast<size_t>(n);
      if (o.sent == kHelloBytes) o.st = Outgoing::St::ack;
    } else if (o.st == Outgoing::St::ack) {
      uint8_t ack = 0;
      ssize_t n = ::recv(o.fd, &ack, 1, MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
      if (n != 1 || ack != kHelloAck) {
        unwatch(o.fd);
        close_fd(o.fd);
        o.st = Outgoing::St::idle;
        o.retry_at = Clock::time_point::max();
        fail(o.peer, format("tcp set-up: rank %d (%s) refused our connection (stream %d): different group "
                            "secret, a stale address in the store, or it has left the group",
                            o.peer, addr_[o.peer].str().c_str(), o.stream));
        return;
      }
      o.st = Outgoing::St::done;
    }
  }

  void accept_new(Clock::time_point now) {
    for (;;) {
      SockAddr ra;
      ra.len = sizeof ra.ss;
      int fd = ::accept4(listener_, reinterpret_cast<sockaddr*>(&ra.ss), &ra.len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
          SHOAL_LOG(warn, "tcp set-up: accept: %s%s", errno_string(errno).c_str(), fd_hint(errno).c_str());
        return;
      }
      Incoming c;
      c.fd = fd;
      c.remote = ra.str();
      c.deadline = now + kHelloTimeout;
      watch(fd, EPOLLIN);
      // Read at once: the hello has usually arrived with the connection.
      pending_.push_back(c);
      read_hello(pending_.back());
    }
  }

  void reject(Incoming& c, const char* why) {
    SHOAL_LOG(warn, "tcp set-up: dropped connection from %s: %s", c.remote.c_str(), why);
    unwatch(c.fd);
    close_fd(c.fd);
  }

  void read_hello(Incoming& c) {
    if (c.fd < 0) return;
    ssize_t n = ::recv(c.fd, c.buf + c.got, kHelloBytes - c.got, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n <= 0) {
      if (c.got == 0 && n == 0) {  // a peer's probe (or anyone's) that only looked whether we listen
        unwatch(c.fd);
        close_fd(c.fd);
        return;
      }
      return reject(c, "closed before completing its hello");
    }
    c.got += static_cast<size_t>(n);
    if (c.got < kHelloBytes) return;
    int r = -1, s = -1;
    std::string bad = check_tcp_hello(c.buf, cfg_, &r, &s);
    if (!bad.empty()) return reject(c, bad.c_str());
    if (in_[r][s] >= 0) return reject(c, format("duplicate connection for rank %d stream %d", r, s).c_str());
    uint8_t ack = kHelloAck;
    if (::send(c.fd, &ack, 1, MSG_NOSIGNAL | MSG_DONTWAIT) != 1) return reject(c, "could not acknowledge its hello");
    set_nodelay(c.fd);
    set_buffers(c.fd, tcp_notsent_lowat(cfg_, r));  // now that the peer is known
    in_[r][s] = std::exchange(c.fd, -1);
  }

  TcpConfig cfg_;
  int listener_ = -1;
  std::string address_;
  std::vector<SockAddr> addr_;       // by rank
  std::vector<Peer> state_;          // by rank
  std::vector<Outgoing> out_;        // connections to lower peers, probes of higher ones
  std::vector<Incoming> pending_;    // accepted, hello incomplete
  std::vector<std::vector<int>> in_; // [higher peer][stream]: accepted and acknowledged
  int unconnected_ = 0;              // TCP peers without a link yet
  Clock::time_point next_idle_step_{};
  std::vector<pollfd> pfds_;         // scratch for step()
  std::vector<int> owner_;           // per pollfd: -1 listener, 2k outgoing k, 2k+1 pending k
};

namespace {

// A TCP link that connects when its pair first talks: posts wait in order until the connections
// are made, then go to the TcpLink over them.
class LazyTcpLink final : public Link {
 public:
  LazyTcpLink(std::shared_ptr<TcpConnector> conn, int peer) : conn_(std::move(conn)), peer_(peer) {}

  void post(Request* r) override {
    if (link_) return link_->post(r);
    queued_.push_back(r);
    conn_->want(peer_);
  }
  bool progress() override {
    bool moved = false;
    if (!link_) {
      moved = connect();
      if (!link_) return moved;
    }
    return link_->progress() || moved;
  }
  bool busy() const override { return link_ ? link_->busy() : !queued_.empty(); }
  void close() noexcept override {
    if (link_) link_->close();
    conn_->shutdown();
  }
  const char* kind() const override { return "tcp"; }
  Wake wakes_by() const override { return Wake::fd; }
  bool kernel_moves_bytes() const override { return true; }
  std::string stalled() const override { return link_ ? "" : "not connected to " + conn_->describe(peer_); }
  bool peek(FrameHeader* h) override {
    if (!link_) {
      // A receive from any source may be waiting for this peer. A peer that cannot be connected
      // has sent nothing: a request posted to it raises that (progress()), a look does not.
      conn_->want(peer_);
      conn_->step();
      if (!conn_->failure(peer_).empty() || !conn_->ready(peer_)) return false;
      connect();
    }
    return link_->peek(h);
  }

 private:
  // Steps the connector; makes the link once this pair's connections are there. True if anything moved.
  bool connect() {
    const bool moved = conn_->step();
    if (!conn_->failure(peer_).empty()) throw PeerError(conn_->failure(peer_));
    if (!conn_->ready(peer_)) return moved;
    link_ = conn_->take_link(peer_);
    for (Request* r : queued_) link_->post(r);
    queued_.clear();
    return true;
  }

  std::shared_ptr<TcpConnector> conn_;
  const int peer_;
  std::unique_ptr<Link> link_;
  std::vector<Request*> queued_;
};

}  // namespace

std::shared_ptr<TcpConnector> tcp_listen(const TcpConfig& cfg) { return std::make_shared<TcpConnector>(cfg); }

const std::string& tcp_listen_address(const TcpConnector& c) { return c.address(); }

bool tcp_accept_step(TcpConnector& c) { return c.step_if_due(); }

std::vector<std::unique_ptr<Link>> make_tcp_links(const std::shared_ptr<TcpConnector>& conn,
                                                  const std::vector<std::string>& addresses) {
  const TcpConfig& cfg = conn->config();
  std::vector<std::unique_ptr<Link>> links(cfg.size);
  for (int j = 0; j < cfg.size; ++j) {
    if (!conn->tcp_peer(j)) continue;
    conn->set_address(j, addresses.at(j));
    links[j] = std::make_unique<LazyTcpLink>(conn, j);
  }
  return links;
}

std::vector<std::unique_ptr<Link>> connect_tcp_links(const std::shared_ptr<TcpConnector>& conn,
                                                     const std::vector<std::string>& addresses) {
  const TcpConfig& cfg = conn->config();
  const int rank = cfg.rank;
  for (int j = 0; j < rank; ++j) {
    if (!conn->tcp_peer(j)) continue;
    conn->set_address(j, addresses.at(j));
    conn->want(j);
  }
  // Every pair now, not when it first talks.
  for (;;) {
    conn->step();
    bool all = true;
    for (int j = 0; j < cfg.size; ++j) {
      if (!conn->tcp_peer(j)) continue;
      if (!conn->failure(j).empty()) throw PeerError(conn->failure(j));
      all = all && conn->ready(j);
    }
    if (all) break;
    if (Clock::now() >= cfg.deadline) {
      std::string missing;
      for (int j = 0; j < cfg.size; ++j)
        if (conn->tcp_peer(j) && !conn->ready(j)) missing += (missing.empty() ? "" : ", ") + conn->describe(j);
      throw Timeout("tcp set-up timed out waiting for " + missing);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  std::vector<std::unique_ptr<Link>> links(cfg.size);
  for (int j = 0; j < cfg.size; ++j)
    if (conn->tcp_peer(j)) links[j] = conn->take_link(j);
  SHOAL_LOG(debug, "tcp: set-up done (%d streams and a control connection per peer on another host, %d on this one)",
            cfg.streams, cfg.local_streams);
  return links;
}
}  // namespace shoal
