// The accepting side of a rank's TCP set-up (TcpConnector, tcp_connect.cpp, holds it): the
// listening socket, the connections whose hello has not fully arrived, and the connections
// accepted and acknowledged, by higher peer and stream. A connection must present a valid hello
// (tcp_link.h) within 2 s, else it is dropped and logged; one that closes before sending a byte
// is a peer's probe (TcpDialer) and is closed quietly.
#pragma once
#include <poll.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "transport/tcp_link.h"
#include "transport/tcp_socket.h"

namespace shoal::tcp_detail {

class TcpAcceptor {
 public:
  using Clock = std::chrono::steady_clock;

  // Listens on every address, any port. Throws Error.
  TcpAcceptor(const TcpConfig& cfg, EpollSet epoll);
  ~TcpAcceptor() { close(); }
  TcpAcceptor(const TcpAcceptor&) = delete;
  TcpAcceptor& operator=(const TcpAcceptor&) = delete;

  int port() const;
  bool listening() const { return listener_ >= 0; }
  // Whether an accepted connection's hello is still arriving.
  bool hello_pending() const { return !pending_.empty(); }

  // Accepts what has arrived, reads and acknowledges hellos, drops the late; never blocks.
  // True if anything moved.
  bool step(Clock::time_point now);

  // Higher peer j: how many of its connections have arrived, and whether all have.
  int arrived(int j) const;
  bool ready(int j) const;
  // Peer j's connections by stream, once ready(j); the caller owns them (still in the epoll set).
  std::vector<int> take(int j);

  // Closes the listener and the connections whose hello is pending: later dials are refused.
  void stop_listening() noexcept;
  // That, and the accepted connections not taken.
  void close() noexcept;

 private:
  struct Incoming {  // accepted, hello incomplete
    int fd = -1;
    std::string remote;
    Clock::time_point deadline;
    uint8_t buf[kTcpHelloBytes];
    size_t got = 0;
  };

  void accept_new(Clock::time_point now);
  void read_hello(Incoming& c);
  void reject(Incoming& c, const char* why);

  const TcpConfig& cfg_;
  const EpollSet epoll_;
  int listener_ = -1;
  std::vector<Incoming> pending_;
  std::vector<std::vector<int>> in_;  // [higher peer][stream]: accepted and acknowledged
  std::vector<pollfd> pfds_;          // scratch for step()
};

}  // namespace shoal::tcp_detail
