#include "transport/net_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>

#include <cstdlib>
#include <cstring>

#include "base/log.h"
#include "base/params.h"
#include "shoal/error.h"

namespace shoal {
namespace {

std::string env(const char* name) { return params::text(name).value_or(""); }

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    if (end > start) out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

std::string numeric_host(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (sa->sa_family == AF_INET)
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof buf);
  else if (sa->sa_family == AF_INET6) {
    const in6_addr& a = reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(&a)) inet_ntop(AF_INET, &a.s6_addr[12], buf, sizeof buf);  // an IPv4 peer of a dual-stack listener
    else inet_ntop(AF_INET6, &a, buf, sizeof buf);
  }
  return buf;
}

// The preferred family: 0 (IPv4 first, then IPv6), AF_INET or AF_INET6.
int family_preference() {
  const auto f = params::choice("SHOAL_SOCKET_FAMILY");
  return !f ? 0 : *f == "AF_INET" ? AF_INET : AF_INET6;
}

// The first address of an interface `spec` admits, in the preferred family's order; "" if none.
std::string pick(const std::vector<NetInterface>& ifs, const std::string& spec, int family) {
  for (int want : family ? std::vector<int>{family} : std::vector<int>{AF_INET, AF_INET6})
    for (const auto& i : ifs)
      if (i.family == want && ifname_matches(spec, i.name)) return i.addr;
  return "";
}

std::string describe(const std::vector<NetInterface>& ifs) {
  std::string s;
  for (const auto& i : ifs) s += (s.empty() ? "" : ", ") + i.name + " " + i.addr;
  return s.empty() ? "none" : s;
}

}  // namespace

std::vector<NetInterface> list_interfaces() {
  std::vector<NetInterface> out;
  ifaddrs* all = nullptr;
  if (getifaddrs(&all) != 0) return out;
  for (ifaddrs* i = all; i; i = i->ifa_next) {
    if (!i->ifa_addr || !(i->ifa_flags & IFF_UP)) continue;
    const int fam = i->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    if (fam == AF_INET6 && IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr))
      continue;  // needs a scope id to dial: not an address to hand to other hosts
    out.push_back({i->ifa_name, numeric_host(i->ifa_addr), fam, (i->ifa_flags & IFF_LOOPBACK) != 0});
  }
  freeifaddrs(all);
  return out;
}

bool ifname_matches(const std::string& spec, const std::string& name) {
  std::string s = spec;
  bool exclude = false, exact = false;
  if (!s.empty() && s[0] == '^') exclude = true, s.erase(0, 1);
  if (!s.empty() && s[0] == '=') exact = true, s.erase(0, 1);
  bool listed = false;
  for (const auto& p : split_commas(s))
    if (exact ? name == p : name.compare(0, p.size(), p) == 0) listed = true;
  return listed != exclude;
}

bool is_loopback_address(const std::string& addr) {
  in_addr a4{};
  in6_addr a6{};
  if (inet_pton(AF_INET, addr.c_str(), &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
  if (inet_pton(AF_INET6, addr.c_str(), &a6) == 1)
    return IN6_IS_ADDR_LOOPBACK(&a6) || (IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127);
  return addr == "localhost";
}

namespace {

// The family of a numeric address (0 for a name).
int family_of(const std::string& addr) {
  in_addr a4{};
  in6_addr a6{};
  if (inet_pton(AF_INET, addr.c_str(), &a4) == 1) return AF_INET;
  if (inet_pton(AF_INET6, addr.c_str(), &a6) == 1) return AF_INET6;
  return 0;
}

std::string unbracketed(const std::string& h) {
  return h.size() > 2 && h.front() == '[' && h.back() == ']' ? h.substr(1, h.size() - 2) : h;
}

}  // namespace

std::string advertise_address(const std::string& store_address, bool peer_elsewhere) {
  if (std::string h = env("SHOAL_HOST"); !h.empty()) return unbracketed(h);
  const int family = family_preference();
  const std::string spec = env("SHOAL_SOCKET_IFNAME");
  if (!spec.empty()) {
    const auto ifs = list_interfaces();
    std::string a = pick(ifs, spec, family);
    if (a.empty())
      throw Error("SHOAL_SOCKET_IFNAME=" + spec + " admits no interface that is up with an address" +
                  (family ? std::string(" of SHOAL_SOCKET_FAMILY") : std::string()) + "; interfaces here: " +
                  describe(ifs));
    return a;
  }
  const bool store_fits = !store_address.empty() && (!family || family_of(store_address) == family) &&
                          !(peer_elsewhere && is_loopback_address(store_address));
  if (store_fits) return store_address;
  if (!peer_elsewhere) return family == AF_INET6 ? "::1" : "127.0.0.1";
  const auto ifs = list_interfaces();
  std::string a = pick(ifs, "^docker,lo", family);
  if (a.empty())
    throw Error("this rank has peers on other hosts but no address they can reach (interfaces here: " + describe(ifs) +
                "): set SHOAL_SOCKET_IFNAME to the interface that reaches them, or SHOAL_HOST to its address");
  if (!store_address.empty())
    SHOAL_LOG(info, "the store is reached over loopback (%s); advertising %s to peers on other hosts",
              store_address.c_str(), a.c_str());
  return a;
}

std::string join_host_port(const std::string& host, int port) {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

bool split_host_port(const std::string& hostport, std::string* host, std::string* port) {
  if (!hostport.empty() && hostport[0] == '[') {
    const size_t close = hostport.find("]:");
    if (close == std::string::npos) return false;
    *host = hostport.substr(1, close - 1);
    *port = hostport.substr(close + 2);
  } else {
    const size_t colon = hostport.rfind(':');
    if (colon == std::string::npos || colon == 0) return false;
    *host = hostport.substr(0, colon);
    *port = hostport.substr(colon + 1);
  }
  return !host->empty() && !port->empty();
}

int SockAddr::port() const {
  return family() == AF_INET ? ntohs(reinterpret_cast<const sockaddr_in&>(ss).sin_port)
                             : ntohs(reinterpret_cast<const sockaddr_in6&>(ss).sin6_port);
}

std::string SockAddr::str() const { return join_host_port(numeric_host(get()), port()); }

std::string resolve_host_port(const std::string& hostport, SockAddr* out) {
  std::string host, port;
  if (!split_host_port(hostport, &host, &port)) return "malformed address";
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res); rc != 0 || !res) return gai_strerror(rc);
  // IPv4 first for a name that has both: the listener takes both, and IPv4 is what most hosts route.
  const addrinfo* pickd = res;
  for (const addrinfo* ai = res; ai; ai = ai->ai_next)
    if (ai->ai_family == AF_INET) {
      pickd = ai;
      break;
    }
  std::memcpy(&out->ss, pickd->ai_addr, pickd->ai_addrlen);
  out->len = pickd->ai_addrlen;
  freeaddrinfo(res);
  return "";
}

}  // namespace shoal
