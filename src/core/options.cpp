// Options from the environment, and the names of algorithms.
#include <cstdlib>
#include <cstring>
#include <string>

#include "shoal/communicator.h"
#include "shoal/error.h"

namespace shoal {
namespace {
const char* const kAlgoNames[] = {"auto", "ring", "bde", "mst", "direct", "rd", "scatter_allgather", "linear", "hier"};
}

const char* algo_name(Algo a) {
  auto i = static_cast<size_t>(a);
  return i < std::size(kAlgoNames) ? kAlgoNames[i] : "unknown";
}

Algo parse_algo(const std::string& s) {
  for (size_t i = 0; i < std::size(kAlgoNames); ++i)
    if (s == kAlgoNames[i]) return static_cast<Algo>(i);
  if (s == "automatic" || s.empty()) return Algo::automatic;
  if (s == "tree" || s == "binomial") return Algo::mst;
  if (s == "bruck" || s == "halving") return Algo::rd;
  if (s == "hierarchical") return Algo::hier;
  throw InvalidArgument("unknown algorithm '" + s + "' (auto, ring, bde, mst, direct, rd, scatter_allgather, linear, hier)");
}

Options Options::from_env(Options o) {
  if (const char* t = std::getenv("SHOAL_TRANSPORT"); t && *t) {
    if (!std::strcmp(t, "tcp")) o.transport = TransportKind::tcp;
    else if (!std::strcmp(t, "shm")) o.transport = TransportKind::shm;
    else if (!std::strcmp(t, "auto")) o.transport = TransportKind::automatic;
    else throw InvalidArgument(std::string("SHOAL_TRANSPORT=") + t + ": expected auto, shm or tcp");
  }
  if (const char* t = std::getenv("SHOAL_TIMEOUT"); t && *t) {
    double secs = std::atof(t);
    if (secs <= 0) throw InvalidArgument(std::string("SHOAL_TIMEOUT=") + t + ": expected seconds > 0");
    o.timeout = std::chrono::milliseconds(static_cast<long long>(secs * 1000));
  }
  if (const char* t = std::getenv("SHOAL_TCP_STREAMS"); t && *t) {
    int n = std::atoi(t);
    if (n < 1 || n > 64) throw InvalidArgument(std::string("SHOAL_TCP_STREAMS=") + t + ": expected 1..64");
    o.tcp_streams = n;
  }
  if (const char* t = std::getenv("SHOAL_TCP_NOTSENT_LOWAT"); t && *t) {
    char* end = nullptr;
    long n = std::strtol(t, &end, 10);
    if (*end || n < 0 || n > (1L << 30))
      throw InvalidArgument(std::string("SHOAL_TCP_NOTSENT_LOWAT=") + t + ": expected bytes, 0..2^30 (0 = no limit)");
    o.tcp_notsent_lowat = static_cast<int>(n);
  }
  if (const char* t = std::getenv("SHOAL_CMA"); t && *t) {
    if (!std::strcmp(t, "0")) o.single_copy = false;
    else if (!std::strcmp(t, "1")) o.single_copy = true;
    else throw InvalidArgument(std::string("SHOAL_CMA=") + t + ": expected 0 or 1");
  }
  return o;
}

}  // namespace shoal
