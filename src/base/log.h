// SHOAL_LOG=warn|info|debug|trace: one line per event on stderr, prefixed with the rank.
#pragma once
#include <cstdio>
#include <string>

namespace shoal {

enum class LogLevel : int { error = 0, warn = 1, info = 2, debug = 3, trace = 4 };

// From SHOAL_LOG, read once, when first asked (default warn). Inline: every call of the library
// asks, and a small op's whole cost is a few hundred instructions.
LogLevel read_log_level();
inline LogLevel log_level() {
  static const LogLevel level = read_log_level();
  return level;
}
void set_log_rank(int rank);    // prefix for this process's lines
void log_line(LogLevel level, const std::string& msg);

// printf-style; arguments are evaluated only when the level is enabled.
#define SHOAL_LOG(level, ...)                                                   \
  do {                                                                          \
    if (static_cast<int>(::shoal::LogLevel::level) <=                           \
        static_cast<int>(::shoal::log_level())) {                               \
      char shoal_log_buf_[512];                                                 \
      std::snprintf(shoal_log_buf_, sizeof shoal_log_buf_, __VA_ARGS__);        \
      ::shoal::log_line(::shoal::LogLevel::level, shoal_log_buf_);              \
    }                                                                           \
  } while (0)

}  // namespace shoal
