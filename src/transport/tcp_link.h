// TCP links to peers on other hosts (or to every peer with SHOAL_TRANSPORT=tcp). The set-up is in
// tcp_connect.cpp (the connector) and tcp_socket.cpp (sockets, the hello), the link (framing,
// striping, flow control) in tcp_link.cpp.
//
// Set-up: each rank listens (tcp_listen) and publishes its address; a group gathers them at
// rendezvous. The connections of a pair are made when the pair first talks (a post, or a receive
// from any source looking at the peer): the higher rank dials `streams` sockets and a control
// connection, the lower accepts them while any of its TCP links progresses. So a rank holds
// sockets only for the peers its ops reach (a ring's neighbours, a tree's parent and children).
// Every connection opens with a hello {magic, group secret (32 random bytes made at rendezvous and
// shared through the store), rank, stream index}; a connection that presents anything else is
// dropped and logged. The listener closes once every TCP peer is connected.
//
// Messages: below a split threshold a message travels on stream 0; above it, it is cut into one
// part per stream (the same deterministic cut on both sides), each part framed by its own
// FrameHeader, so several streams carry one large message at once. Sockets are non-blocking and
// registered edge-triggered (EPOLLIN|EPOLLOUT|EPOLLET) in the engine's epoll fd, which the engine
// sleeps on.
//
// Flow control: besides its data streams, each pair has one control connection, on which a
// receiver reports how many messages it has consumed (a cumulative u64, little-endian, sent after
// every kTcpWindow/2 messages). A sender starts a message only while it is fewer than kTcpWindow
// messages ahead of that count. Without it, a rank that only sends small messages (a gather's
// leaves, a broadcast's root in a loop) ran ahead of its receiver until the receiver's socket
// queue, a few hundred KiB of small segments, filled: the kernel then pruned it, and the window
// closed until a ~200 ms retransmission timer fired (BENCHMARKS.md, "Flow control over TCP").
// Gloo goes further: it sends only after the receiver has posted. The control connection is read
// apart from the data streams, so a report never waits behind data the receiver has not posted
// for.
#pragma once
#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "transport/link.h"

namespace shoal {

// Messages a sender may have started ahead of what its receiver has consumed (see above). A
// message larger than a socket's buffers waits for its receiver anyway; this bounds how many small
// ones queue in the kernel.
constexpr uint64_t kTcpWindow = 32;

struct TcpConfig {
  int rank = 0;
  int size = 1;
  std::vector<bool> use_tcp;             // per peer: true where this pair talks TCP (symmetric)
  // Per peer: true where the peer runs on this host (the same host identity: TCP over loopback,
  // as with SHOAL_TRANSPORT=tcp). Empty: every peer is on another host. Symmetric.
  std::vector<bool> same_host;
  // Data sockets per peer on another host (plus one control connection).
  int streams = 4;
  // TCP_NOTSENT_LOWAT in bytes for peers on another host (0: the kernel's default, no limit): how
  // much not-yet-sent data the kernel may queue per socket. Autotuning otherwise queues megabytes
  // per socket, and copying the caller's buffer into kernel memory that large runs out of cache:
  // across two hosts on veth links, 16 KiB doubled large sendrecv (docs/multihost.md). The
  // window, and so throughput on long links, is not limited by it.
  int notsent_lowat = 16384;
  // The same two for a peer on this host. Loopback TCP has no link to fill, only CPU: striping
  // adds sockets and system calls, and a small unsent watermark ties a sender to its receiver
  // being on a core, which with ranks outnumbering cores stalls both (BENCHMARKS.md, "TCP between
  // ranks of one host").
  int local_streams = 1;
  int local_notsent_lowat = 0;
  std::array<uint8_t, 32> secret{};      // the group's secret
  std::string advertise_host;            // the address peers dial (e.g. TcpStore::local_address())
  std::chrono::steady_clock::time_point deadline;  // connect_tcp_links: for the whole set-up
  int epoll_fd = -1;                     // links add their sockets here
};

class TcpConnector;
// Listens (every address, any port) for the links of cfg.rank; throws Error if it cannot.
std::shared_ptr<TcpConnector> tcp_listen(const TcpConfig& cfg);
// What peers dial: cfg.advertise_host (127.0.0.1 if empty) and the listener's port.
const std::string& tcp_listen_address(const TcpConnector& c);
// For the engine's every progress pass: accepts and acknowledges connections peers have dialed
// (a peer's first send to this rank waits for that) whatever this rank itself waits on; at most
// once a millisecond unless connections are in progress. True if anything moved.
bool tcp_accept_step(TcpConnector& c);
// One Link per peer, null where use_tcp is false (and for this rank); each connects when it is
// first used. addresses[j] is rank j's tcp_listen_address; one that starts with '!' is that rank's
// failure to set up, raised here as an Error naming it.
std::vector<std::unique_ptr<Link>> make_tcp_links(const std::shared_ptr<TcpConnector>& conn,
                                                  const std::vector<std::string>& addresses);

// The same, with every pair connected before it returns (tests): this rank dials the lower ranks,
// so addresses[j] is needed for j < cfg.rank only. Throws Timeout at cfg.deadline naming the
// peers still missing.
std::vector<std::unique_ptr<Link>> connect_tcp_links(const std::shared_ptr<TcpConnector>& conn,
                                                     const std::vector<std::string>& addresses);

// The data streams, and the TCP_NOTSENT_LOWAT, of the pair with `peer` (the same on both sides).
int tcp_streams(const TcpConfig& cfg, int peer);
int tcp_notsent_lowat(const TcpConfig& cfg, int peer);

// The hello every connection opens with: u32 magic, the group's 32-byte secret, u32 rank,
// u32 stream (little-endian). Stream number streams (of that pair: tcp_streams) is the control
// connection.
constexpr size_t kTcpHelloBytes = 4 + 32 + 4 + 4;
void encode_tcp_hello(uint8_t* out, const std::array<uint8_t, 32>& secret, int rank, int stream);
// Checks a hello received by rank cfg.rank: "" when it is from a stream of a higher TCP peer of this
// group (*peer and *stream say which), else why the connection is refused.
std::string check_tcp_hello(const uint8_t* hello, const TcpConfig& cfg, int* peer, int* stream);

// The TCP Link over already connected sockets (one per data stream and the control connection,
// owned by the link from now on): what connect_tcp_links makes; for tests and the fuzzer
// (tests/fuzz/fuzz_tcp_frames.cpp).
std::unique_ptr<Link> make_tcp_link(int peer, const std::vector<int>& data_fds, int control_fd);

}  // namespace shoal
