#include "base/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>

#include "base/params.h"

namespace shoal {
namespace {
std::atomic<int> g_rank{-1};

const char* level_name(LogLevel l) {
  static const char* names[] = {"error", "warn", "info", "debug", "trace"};
  return names[static_cast<int>(l)];
}
}  // namespace

LogLevel read_log_level() {
  std::optional<std::string> s;
  try {
    s = params::choice("SHOAL_LOG");
  } catch (const std::exception& e) {  // logging goes on, at its default level
    std::fprintf(stderr, "shoal: %s; logging at warn\n", e.what());
  }
  if (!s || *s == "warn") return LogLevel::warn;
  if (*s == "error") return LogLevel::error;
  if (*s == "info") return LogLevel::info;
  if (*s == "debug") return LogLevel::debug;
  return LogLevel::trace;
}

void set_log_rank(int rank) { g_rank.store(rank); }

void log_line(LogLevel level, const std::string& msg) {
  char prefix[96];
  std::snprintf(prefix, sizeof prefix, "[shoal rank %d pid %d] %s: ", g_rank.load(), (int)getpid(), level_name(level));
  std::string out;  // every line of a message gets the prefix (an error that quotes calls spans several)
  for (size_t at = 0; at <= msg.size();) {
    size_t end = msg.find('\n', at);
    if (end == std::string::npos) end = msg.size();
    out.append(prefix).append(msg, at, end - at).push_back('\n');
    at = end + 1;
  }
  (void)!write(2, out.data(), out.size());  // one write: lines do not interleave
}

}  // namespace shoal
