// The dialing side of a rank's TCP set-up (TcpConnector, tcp_connect.cpp, holds it): the
// connections to a lower peer (its data streams and a control connection, each sending the hello
// and waiting for the acknowledgement), retried shortly after any error but a refusal, and
// liveness probes of higher peers: a connection closed as soon as it is made, where a refusal
// means that nothing listens at the peer's address any more.
#pragma once
#include <poll.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "transport/net_address.h"
#include "transport/tcp_link.h"
#include "transport/tcp_socket.h"

namespace shoal::tcp_detail {

class TcpDialer {
 public:
  using Clock = std::chrono::steady_clock;
  // Called with a peer and why the pair with it cannot be made (the peer refused, or a
  // connection could not be made at all).
  using FailFn = std::function<void(int peer, std::string why)>;

  TcpDialer(const TcpConfig& cfg, EpollSet epoll, FailFn fail) : cfg_(cfg), epoll_(epoll), fail_(std::move(fail)) {}
  ~TcpDialer() { close(); }
  TcpDialer(const TcpDialer&) = delete;
  TcpDialer& operator=(const TcpDialer&) = delete;

  // Dials the lower peer j at `a`: its streams and the control connection.
  void dial(int j, const SockAddr& a);
  // Probes the higher peer j at `a`, unless a probe of it is under way; whether it started one.
  bool probe(int j, const SockAddr& a);

  bool empty() const { return out_.empty(); }
  // Whether a connection is being made (not waiting to retry, not done).
  bool in_flight() const;
  // Starts what is due and moves every connection in progress, without blocking. True if
  // anything moved.
  bool step(Clock::time_point now);

  // Lower peer j: how many connections are made, whether all are, and the last error seen.
  int made(int j) const;
  bool ready(int j) const;
  int last_error(int j) const;
  // Peer j's connections by stream, once ready(j); the caller owns them (still in the epoll set).
  std::vector<int> take(int j);

  // Closes every connection being made, probes included.
  void close() noexcept;

 private:
  struct Outgoing {  // a connection to a lower peer, or a probe of a higher one (stream -1)
    int peer = 0;
    int stream = 0;
    SockAddr addr;
    int fd = -1;
    enum class St { idle, connecting, hello, ack, done } st = St::idle;
    size_t sent = 0;
    Clock::time_point retry_at{};
    int last_err = 0;
  };

  void start(Outgoing& o, Clock::time_point now);
  void advance(Outgoing& o, Clock::time_point now);
  void connect_failed(Outgoing& o, int err, Clock::time_point now);
  int conns(int j) const { return tcp_streams(cfg_, j) + 1; }

  const TcpConfig& cfg_;
  const EpollSet epoll_;
  FailFn fail_;
  std::vector<Outgoing> out_;
  std::vector<pollfd> pfds_;  // scratch for step()
  std::vector<size_t> owner_;  // per pollfd: its index in out_
};

}  // namespace shoal::tcp_detail
