// TCP transport set-up: the connector (TcpConnector), which asks for a pair's connections when
// the pair first talks, and the link that waits for them (LazyTcpLink). The connector's accepting
// side is tcp_accept.cpp's, its dialing side tcp_dial.cpp's, the sockets and the hello
// tcp_socket.cpp's, the links over the connections tcp_link.cpp's.
#include "transport/tcp_link.h"

#include <sys/epoll.h>

#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/log.h"
#include "shoal/error.h"
#include "transport/net_address.h"
#include "transport/tcp_accept.h"
#include "transport/tcp_dial.h"
#include "transport/tcp_socket.h"
#include "transport/tcp_util.h"

namespace shoal {

using namespace tcp_detail;
using Clock = std::chrono::steady_clock;

// The connections of one rank's TCP links, made without blocking whenever a link asks (step).
// The higher rank of a pair dials (TcpDialer): `streams` data connections and a control
// connection, each opening with a hello the lower rank checks and acknowledges. The lower rank
// accepts whatever arrives, for any peer, whenever it steps (TcpAcceptor). While it waits for a
// peer that has not dialed, it probes that peer's listener once a second: a refused probe means
// the peer has left (exited, aborted or destroyed its group), which would otherwise be seen only
// at the op's timeout. The listener closes once every TCP peer is connected.
class TcpConnector {
 public:
  explicit TcpConnector(const TcpConfig& cfg)
      : cfg_(checked(cfg)),
        epoll_{cfg.epoll_fd},
        acceptor_(cfg_, epoll_),
        dialer_(cfg_, epoll_, [this](int j, std::string why) { fail(j, std::move(why)); }) {
    addr_.resize(cfg_.size);
    state_.resize(cfg_.size);
    for (int j = 0; j < cfg_.size; ++j) unconnected_ += tcp_peer(j);
    address_ = join_host_port(cfg_.advertise_host.empty() ? "127.0.0.1" : cfg_.advertise_host, acceptor_.port());
    SHOAL_LOG(debug, "tcp: listening on %s", address_.c_str());
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
    if (j > cfg_.rank) {
      p.probe_at = Clock::now() + kProbeEvery;
    } else if (!p.has_addr) {
      fail(j, format("tcp set-up: no address of rank %d", j));
    } else {
      dialer_.dial(j, addr_[j]);
    }
  }

  // step() for a rank that waits on something else: at once while connections are in progress,
  // else once a millisecond while the listener is open (a peer may have dialed: its first send
  // waits for this rank's acknowledgement), so that a rank's waits do not each pay a poll().
  bool step_if_due() {
    if (!acceptor_.listening() && dialer_.empty()) return false;
    const auto now = Clock::now();
    if (!acceptor_.hello_pending() && !dialer_.in_flight() && now < next_idle_step_) return false;
    next_idle_step_ = now + std::chrono::milliseconds(1);
    return step();
  }

  // Moves every connection in progress without blocking; true if anything moved.
  bool step() {
    if (!acceptor_.listening() && dialer_.empty()) return false;
    const auto now = Clock::now();
    start_probes(now);
    const bool accepted = acceptor_.step(now);
    return dialer_.step(now) || accepted;
  }

  bool ready(int j) const { return j < cfg_.rank ? dialer_.ready(j) : acceptor_.ready(j); }

  // Why the pair with j cannot be made ("" while it can).
  const std::string& failure(int j) const { return state_[j].failure; }

  // The link over the pair's connections, once ready(j).
  std::unique_ptr<Link> take_link(int j) {
    std::vector<int> v = j < cfg_.rank ? dialer_.take(j) : acceptor_.take(j);
    state_[j].connected = true;
    const int control = v.back();
    v.pop_back();
    for (int fd : v) epoll_.unwatch(fd);
    epoll_.unwatch(control);
    std::unique_ptr<Link> link = make_tcp_link(j, v, control);  // owns the descriptors now
    for (int fd : v)
      if (!epoll_.add(fd, EPOLLIN | EPOLLOUT | EPOLLET | EPOLLRDHUP)) throw_epoll();
    // Only its reports wake a waiter (a sender held by the window); its writes never wait.
    if (!epoll_.add(control, EPOLLIN | EPOLLET | EPOLLRDHUP)) throw_epoll();
    if (--unconnected_ == 0) stop_connecting();  // nobody left to dial this rank, or to dial
    return link;
  }

  // "rank j (2/3 connections, last error: ...)", for a timeout.
  std::string describe(int j) const {
    const int have = j < cfg_.rank ? dialer_.made(j) : acceptor_.arrived(j);
    const int last_err = j < cfg_.rank ? dialer_.last_error(j) : 0;
    return format("rank %d (%d/%d connections%s%s)", j, have, nconns(j), last_err ? ", last error: " : "",
                  last_err ? errno_string(last_err).c_str() : "");
  }

  // Stops accepting and dialing (this rank is leaving): peers that dial it are refused at once.
  void shutdown() noexcept {
    stop_connecting();
    acceptor_.close();
  }

 private:
  static constexpr auto kProbeEvery = std::chrono::seconds(1);

  struct Peer {
    bool has_addr = false;
    bool wanted = false;
    bool connected = false;        // its link is made
    Clock::time_point probe_at{};  // a higher peer that has not dialed: when to look whether it is there
    std::string failure;
  };

  static const TcpConfig& checked(const TcpConfig& cfg) {
    const int n = cfg.size;
    if (n < 1 || cfg.rank < 0 || cfg.rank >= n)
      throw InvalidArgument(format("tcp set-up: rank %d out of range for size %d", cfg.rank, n));
    if (cfg.streams < 1 || cfg.streams > 64 || cfg.local_streams < 1 || cfg.local_streams > 64)
      throw InvalidArgument(
          format("tcp set-up: streams must be in [1, 64], got %d (%d on this host)", cfg.streams, cfg.local_streams));
    if (cfg.use_tcp.size() != static_cast<size_t>(n))
      throw InvalidArgument(format("tcp set-up: use_tcp has %zu entries for a group of %d", cfg.use_tcp.size(), n));
    return cfg;
  }
  [[noreturn]] static void throw_epoll() { throw Error("tcp set-up: epoll_ctl: " + errno_string(errno)); }

  // Closes the listener and every connection still being made (probes included).
  void stop_connecting() noexcept {
    acceptor_.stop_listening();
    dialer_.close();
  }

  void fail(int j, std::string why) {
    if (state_[j].failure.empty()) state_[j].failure = std::move(why);
  }

  // Probes the higher peers that are due: wanted, not yet dialed in, not failed.
  void start_probes(Clock::time_point now) {
    for (int j = cfg_.rank + 1; j < cfg_.size; ++j) {
      Peer& p = state_[j];
      if (!p.wanted || p.connected || !p.has_addr || p.probe_at > now || acceptor_.ready(j) || !p.failure.empty()) continue;
      if (dialer_.probe(j, addr_[j])) p.probe_at = now + kProbeEvery;
    }
  }

  const TcpConfig cfg_;
  const EpollSet epoll_;
  TcpAcceptor acceptor_;
  TcpDialer dialer_;
  std::string address_;
  std::vector<SockAddr> addr_;  // by rank
  std::vector<Peer> state_;     // by rank
  int unconnected_ = 0;         // TCP peers without a link yet
  Clock::time_point next_idle_step_{};
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
