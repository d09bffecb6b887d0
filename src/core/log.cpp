#include "core/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace shoal {
namespace {
std::atomic<int> g_rank{-1};

LogLevel parse_level() {
  const char* s = std::getenv("SHOAL_LOG");
  if (!s) return LogLevel::warn;
  if (!std::strcmp(s, "error")) return LogLevel::error;
  if (!std::strcmp(s, "info")) return LogLevel::info;
  if (!std::strcmp(s, "debug")) return LogLevel::debug;
  if (!std::strcmp(s, "trace")) return LogLevel::trace;
  return LogLevel::warn;
}
const char* level_name(LogLevel l) {
  static const char* names[] = {"error", "warn", "info", "debug", "trace"};
  return names[static_cast<int>(l)];
}
}  // namespace

LogLevel log_level() {
  static const LogLevel level = parse_level();
  return level;
}

void set_log_rank(int rank) { g_rank.store(rank); }

void log_line(LogLevel level, const std::string& msg) {
  char line[640];
  int n = std::snprintf(line, sizeof line, "[shoal rank %d pid %d] %s: %s\n", g_rank.load(), (int)getpid(),
                        level_name(level), msg.c_str());
  if (n > 0) (void)!write(2, line, std::min<size_t>(n, sizeof line - 1));  // one write: lines do not interleave
}

}  // namespace shoal
