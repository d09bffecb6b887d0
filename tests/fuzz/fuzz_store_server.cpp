// libFuzzer target: the whole TcpStore server (src/store/tcp_store_server.cpp) fed an arbitrary client
// stream over a loopback connection. Per input: a fresh server on 127.0.0.1 (port 0), one client
// that writes the input (after a valid HELLO when the first byte is odd, so that the commands behind
// it are reached), half-closes, and reads whatever comes back until the server closes the
// connection. The server must survive (no crash, no sanitizer report), close the connection (no
// hang: -timeout), and not grow without bound (-rss_limit_mb / -malloc_limit_mb).
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <arpa/inet.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../store_frames.h"

namespace shoal::detail {
std::shared_ptr<void> start_store_server(const std::string& bind_host, uint16_t port, uint16_t* bound_port);
}

namespace {

// Writes all of [p, p + n) while draining the answers (so that neither side blocks on a full
// buffer), then half-closes and drains until the server closes.
void exchange(int fd, const uint8_t* p, size_t n) {
  bool shut = false;
  uint8_t sink[65536];
  for (;;) {
    if (n == 0 && !shut) {
      ::shutdown(fd, SHUT_WR);
      shut = true;
    }
    pollfd pfd{fd, static_cast<short>(POLLIN | (n ? POLLOUT : 0)), 0};
    int pr = ::poll(&pfd, 1, 10000);
    if (pr == 0) {
      std::fprintf(stderr, "fuzz_store_server: the server neither answered nor closed within 10 s\n");
      std::abort();
    }
    if (pr < 0) continue;
    if (pfd.revents & POLLIN || pfd.revents & (POLLHUP | POLLERR)) {
      ssize_t r = ::recv(fd, sink, sizeof sink, MSG_DONTWAIT);
      if (r == 0) return;
      if (r < 0 && errno != EAGAIN && errno != EINTR) return;  // reset: the server dropped us
    }
    if (n && (pfd.revents & POLLOUT)) {
      ssize_t w = ::send(fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (w > 0) {
        p += w;
        n -= static_cast<size_t>(w);
      } else if (w < 0 && errno != EAGAIN && errno != EINTR) {
        return;  // the server dropped the connection
      }
    }
  }
}

// A blocking connect that survives libFuzzer's SIGALRM (its -timeout watchdog): an interrupted
// connect goes on in the background, so wait for it to finish instead of failing the input.
bool connect_to(int fd, const sockaddr_in& a) {
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0) return true;
  if (errno != EINTR) return false;
  pollfd p{fd, POLLOUT, 0};
  int n;
  while ((n = ::poll(&p, 1, 10000)) < 0 && errno == EINTR) {
  }
  if (n <= 0) {
    errno = n == 0 ? ETIMEDOUT : errno;
    return false;
  }
  int err = 0;
  socklen_t len = sizeof err;
  ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
  errno = err;
  return err == 0;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("SHOAL_LOG", "error", 0);  // the server warns about every connection it drops
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> stream;
  if (size > 0 && (data[0] & 1)) stream = shoal_test::store_frames::hello();  // a valid HELLO first
  if (size > 0) stream.insert(stream.end(), data + 1, data + size);

  // Every input's server listens on the port of the first one (SO_REUSEADDR lets it bind there
  // while connections the previous server dropped sit in TIME_WAIT). A fresh port per input left
  // one TIME_WAIT bind bucket per input on a distinct port, which used up the ephemeral ports
  // after some 15,000 inputs: connect() then failed (EADDRNOTAVAIL).
  static uint16_t listen_port = 0;
  uint16_t port = 0;
  auto server = shoal::detail::start_store_server("127.0.0.1", listen_port, &port);
  listen_port = port;
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || !connect_to(fd, a)) {
    std::fprintf(stderr, "fuzz_store_server: cannot connect to the store server on port %u: %s\n", port,
                 std::strerror(errno));
    std::abort();
  }
  exchange(fd, stream.data(), stream.size());
  linger lg{1, 0};  // close with a reset: no TIME_WAIT left behind by hundreds of connections a second
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
  ::close(fd);
  server.reset();  // joins the server thread
  return 0;
}
