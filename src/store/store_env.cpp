// store_from_env: the environment contract of docs/launch.md.
//   SHOAL_STORE=host:port   TcpStore; rank 0 runs the server unless SHOAL_STORE_SERVER=0
//   SHOAL_STORE=/some/path  FileStore (any value containing '/')
#include <cstdlib>
#include <string>

#include "base/log.h"
#include "base/params.h"
#include "shoal/error.h"
#include "shoal/store.h"

namespace shoal {
namespace {

const char* kContract =
    "set SHOAL_STORE=host:port (a TCP store: rank 0 serves it unless SHOAL_STORE_SERVER=0, e.g. when "
    "shoal-store or shoal-run serves it) or SHOAL_STORE=/path/to/file (a file store on a shared file "
    "system); shoal-run sets it for you (see docs/launch.md)";

uint16_t parse_port(const std::string& s, const std::string& value) {
  bool digits = !s.empty() && s.size() <= 5;
  for (char c : s) digits = digits && c >= '0' && c <= '9';
  long p = digits ? std::strtol(s.c_str(), nullptr, 10) : -1;
  if (p < 1 || p > 65535) {
    throw InvalidArgument("SHOAL_STORE='" + value + "': the port must be a number from 1 to 65535; " + kContract);
  }
  return static_cast<uint16_t>(p);
}

}  // namespace

Placement placement_from_env() {
  const auto n = params::integer("SHOAL_WORLD_SIZE");
  const auto r = params::integer("SHOAL_RANK");
  if (!r || !n) throw InvalidArgument("SHOAL_RANK and SHOAL_WORLD_SIZE must be set (docs/launch.md)");
  return Placement{static_cast<int>(*r), static_cast<int>(*n)};
}

std::shared_ptr<Store> store_from_env(int rank, Millis timeout) {
  const auto env = params::text("SHOAL_STORE");
  if (!env) throw InvalidArgument(std::string("SHOAL_STORE is not set: ") + kContract);
  std::string value = *env;
  if (value.find('/') != std::string::npos) {
    SHOAL_LOG(debug, "store: file store %s", value.c_str());
    return std::make_shared<FileStore>(value);
  }

  std::string host, port_s;
  if (!value.empty() && value[0] == '[') {  // [ipv6]:port
    size_t close = value.find(']');
    if (close == std::string::npos || close + 1 >= value.size() || value[close + 1] != ':') {
      throw InvalidArgument("SHOAL_STORE='" + value + "' is not [ipv6-address]:port; " + kContract);
    }
    host = value.substr(1, close - 1);
    port_s = value.substr(close + 2);
  } else {
    size_t colon = value.rfind(':');
    if (colon == std::string::npos || colon == 0) {
      throw InvalidArgument("SHOAL_STORE='" + value + "' is neither host:port nor a file path; " + kContract);
    }
    host = value.substr(0, colon);
    port_s = value.substr(colon + 1);
  }
  uint16_t port = parse_port(port_s, value);

  // Read on every rank, so that a bad value fails them all, not rank 0 alone.
  const bool rank0_serves = params::flag("SHOAL_STORE_SERVER").value_or(true);
  const bool serve = rank == 0 && rank0_serves;
  if (rank < 0) throw InvalidArgument("store_from_env: negative rank " + std::to_string(rank));
  SHOAL_LOG(debug, "store: TCP store %s:%u%s", host.c_str(), port, serve ? " (serving it)" : "");
  return std::make_shared<TcpStore>(host, port, serve, timeout);
}

}  // namespace shoal
