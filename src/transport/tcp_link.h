// TCP links to peers on other hosts (or to every peer with SHOAL_TRANSPORT=tcp).
//
// Set-up (collective: every rank calls connect_tcp_links, even one with no TCP peer): each rank
// listens, publishes "tcp/<rank>" = advertise_host:port in the store, connects `streams` sockets
// to each lower TCP peer and accepts as many from each higher one. Every connection opens with a
// hello {magic, group secret (32 random bytes made at rendezvous and shared through the store),
// rank, stream index}; a connection that presents anything else is dropped and logged.
//
// Messages: below a split threshold a message travels on stream 0; above it, it is cut into one
// part per stream (the same deterministic cut on both sides), each part framed by its own
// FrameHeader, so several streams carry one large message at once. Sockets are non-blocking and
// registered edge-triggered (EPOLLIN|EPOLLOUT|EPOLLET) in the engine's epoll fd, which the engine
// sleeps on.
#pragma once
#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shoal/store.h"
#include "transport/link.h"

namespace shoal {

struct TcpConfig {
  int rank = 0;
  int size = 1;
  std::vector<bool> use_tcp;             // per peer: true where this pair talks TCP (symmetric)
  int streams = 4;                       // sockets per peer
  std::array<uint8_t, 32> secret{};      // the group's secret
  std::string advertise_host;            // the address peers dial (e.g. TcpStore::local_address())
  std::chrono::steady_clock::time_point deadline;  // for the whole set-up
  int epoll_fd = -1;                     // links add their sockets here
};

// Returns one Link per peer, null where use_tcp is false (and for this rank).
std::vector<std::unique_ptr<Link>> connect_tcp_links(Store& store, const TcpConfig& cfg);

}  // namespace shoal
