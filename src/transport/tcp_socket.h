// What every connection of the TCP transport is made with: socket options, the listening socket,
// the hello a connection opens with, and each pair's streams and unsent watermark (the last two
// declared in tcp_link.h). The connector (tcp_connect.cpp) makes the connections; the link
// (tcp_link.cpp) moves messages over them.
#pragma once
#include <cstdint>
#include <string>

namespace shoal::tcp_detail {

// The byte with which the accepting rank acknowledges a valid hello (tcp_link.h).
inline constexpr uint8_t kTcpHelloAck = 1;

// The engine's epoll set (fd -1: none), which set-up sockets wake too, edge-triggered: whoever
// watches a socket reads it until it would block.
struct EpollSet {
  int fd = -1;
  bool add(int s, uint32_t events) const;  // false (errno set) if epoll_ctl fails; true without a set
  void watch(int s, uint32_t events) const;  // add(s, events | EPOLLET), or throws Error
  void unwatch(int s) const noexcept;
};

// Socket options of a connection of a pair whose tcp_notsent_lowat is `lowat` (0: the kernel's).
void set_buffers(int fd, int lowat);
void set_nodelay(int fd);
// A listening socket on every address: IPv6 with IPv4 mapped in (peers may dial either family),
// or IPv4 alone where the kernel has no IPv6. Throws Error.
int listen_any();
// The port a socket is bound to. Throws Error.
int port_of(int fd);
// " (the limit on open files ...)" where `err` says a socket could not be made for that limit.
std::string fd_limit_hint(int err);

}  // namespace shoal::tcp_detail
