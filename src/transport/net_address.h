// The address a rank advertises for its TCP links, and the socket addresses of its peers.
//
// A rank advertises, in this order:
//   1. SHOAL_HOST, as given (a name or an address);
//   2. with SHOAL_SOCKET_IFNAME set, the address of the first interface it admits, in NCCL's
//      syntax (NCCL_SOCKET_IFNAME): a comma-separated list of name prefixes ("eth,ib"), "=" before
//      the list for exact names ("=eth0"), "^" before it to exclude ("^docker,lo", "^=eth1");
//   3. the address its connection to the store leaves from (Store::local_address), unless that is
//      loopback and a peer is outside this network namespace (on another host: a host whose name
//      resolves to 127.0.x.x must not tell other hosts to dial loopback), or of another family
//      than SHOAL_SOCKET_FAMILY;
//   4. the address of the first interface NCCL's default admits ("^docker,lo") when a peer is
//      outside this network namespace, else loopback (::1 with SHOAL_SOCKET_FAMILY=AF_INET6).
// Among an interface's addresses IPv4 comes first, unless SHOAL_SOCKET_FAMILY=AF_INET6 (NCCL's
// NCCL_SOCKET_FAMILY); AF_INET takes IPv4 only. IPv6 link-local addresses are never used.
#pragma once
#include <sys/socket.h>

#include <string>
#include <vector>

namespace shoal {

struct NetInterface {
  std::string name;  // "eth0"
  std::string addr;  // "10.0.0.2", "fd00::2"
  int family = 0;    // AF_INET or AF_INET6
  bool loopback = false;
};

// Interfaces that are up, with their IPv4 and (not link-local) IPv6 addresses, in the kernel's order.
std::vector<NetInterface> list_interfaces();

// Whether the interface `name` is admitted by `spec` (NCCL_SOCKET_IFNAME's syntax, above).
bool ifname_matches(const std::string& spec, const std::string& name);

// The address a rank advertises (rules 1-4 above). `store_address` is Store::local_address() ("" if
// none); `peer_elsewhere`: some peer is outside this rank's network namespace. Throws shoal::Error naming the
// interfaces when none fits.
std::string advertise_address(const std::string& store_address, bool peer_elsewhere);

bool is_loopback_address(const std::string& addr);

// "host:port" for an address or name (IPv6 literals in brackets), and the reverse.
std::string join_host_port(const std::string& host, int port);
bool split_host_port(const std::string& hostport, std::string* host, std::string* port);

// A resolved peer address, IPv4 or IPv6.
struct SockAddr {
  sockaddr_storage ss{};
  socklen_t len = 0;
  int family() const { return ss.ss_family; }
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&ss); }
  int port() const;
  std::string str() const;  // "10.0.0.2:5000", "[fd00::2]:5000"
};

// Resolves "host:port"; "" on success, else the reason.
std::string resolve_host_port(const std::string& hostport, SockAddr* out);

}  // namespace shoal
