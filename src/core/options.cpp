// Options from the environment, and the names of algorithms.
#include <cstdlib>
#include <cstring>
#include <string>

#include "base/params.h"
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
  if (auto t = params::choice("SHOAL_TRANSPORT"))
    o.transport = *t == "tcp" ? TransportKind::tcp : *t == "shm" ? TransportKind::shm : TransportKind::automatic;
  if (auto secs = params::seconds("SHOAL_TIMEOUT"))
    o.timeout = std::chrono::milliseconds(static_cast<long long>(*secs * 1000));
  if (auto n = params::integer("SHOAL_TCP_STREAMS")) o.tcp_streams = static_cast<int>(*n);
  if (auto n = params::bytes("SHOAL_TCP_NOTSENT_LOWAT")) o.tcp_notsent_lowat = static_cast<int>(*n);
  if (auto on = params::flag("SHOAL_CMA")) o.single_copy = *on;
  return o;
}

}  // namespace shoal
