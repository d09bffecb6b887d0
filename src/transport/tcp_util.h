// Helpers shared by the TCP transport's set-up (tcp_connect.cpp) and its link (tcp_link.cpp).
#pragma once
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <string>

namespace shoal::tcp_detail {

inline std::string errno_string(int err) {
  char buf[128];
  // GNU strerror_r returns the message (possibly not in buf).
  return std::string(strerror_r(err, buf, sizeof buf));
}

inline std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline std::string format(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

inline void close_fd(int& fd) noexcept {
  if (fd >= 0) {
    ::close(fd);
    fd = -1;
  }
}

}  // namespace shoal::tcp_detail
