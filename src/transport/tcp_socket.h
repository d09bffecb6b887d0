// What every connection of the TCP transport is made with: socket options, the listening socket,
// the hello a connection opens with, and each pair's streams and unsent watermark (the last two
// declared in tcp_link.h). The connector (tcp_connect.cpp) makes the connections; the link
// (tcp_link.cpp) moves messages over them.
#pragma once

namespace shoal::tcp_detail {

// Socket options of a connection of a pair whose tcp_notsent_lowat is `lowat` (0: the kernel's).
void set_buffers(int fd, int lowat);
void set_nodelay(int fd);
// A listening socket on every address: IPv6 with IPv4 mapped in (peers may dial either family),
// or IPv4 alone where the kernel has no IPv6. Throws Error.
int listen_any();
// The port a socket is bound to. Throws Error.
int port_of(int fd);

}  // namespace shoal::tcp_detail
