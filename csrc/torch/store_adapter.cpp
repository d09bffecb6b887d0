#include "store_adapter.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "shoal/error.h"

namespace shoal_torch {
namespace {

// c10d stores report a missing key at the deadline with DistStoreError (or a plain c10::Error
// from older stores); shoal's rendezvous expects shoal::Timeout / shoal::Error.
template <typename F>
auto translate(const char* what, const std::string& key, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const c10::DistStoreError& e) {
    throw shoal::Timeout(std::string("store ") + what + "(" + key + "): " + e.what_without_backtrace());
  } catch (const c10::Error& e) {
    throw shoal::Error(std::string("store ") + what + "(" + key + "): " + e.what_without_backtrace());
  }
}

// The source address the kernel picks for a datagram to host:port (connect() on a UDP socket
// sends nothing): the interface that routes to the store's host, IPv4 first for a name that has
// both (as the links resolve peers' names). "" if it cannot be told.
std::string route_source_to(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res) return "";
  std::string out;
  for (int pass = 0; pass < 2 && out.empty(); ++pass) {
    for (const addrinfo* ai = res; ai && out.empty(); ai = ai->ai_next) {
      if ((ai->ai_family == AF_INET) != (pass == 0)) continue;
      int fd = ::socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
      if (fd < 0) continue;
      sockaddr_storage local{};
      socklen_t len = sizeof local;
      char buf[INET6_ADDRSTRLEN];
      if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
          ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
        const void* a = local.ss_family == AF_INET6
                            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6&>(local).sin6_addr)
                            : static_cast<const void*>(&reinterpret_cast<sockaddr_in&>(local).sin_addr);
        if (::inet_ntop(local.ss_family, a, buf, sizeof buf)) out = buf;
      }
      ::close(fd);
    }
  }
  ::freeaddrinfo(res);
  return out;
}

}  // namespace

std::string C10dStoreAdapter::local_address() const {
  c10::intrusive_ptr<c10d::Store> s = store_;
  if (auto* p = dynamic_cast<c10d::PrefixStore*>(s.get())) s = p->getUnderlyingNonPrefixStore();
  if (auto* t = dynamic_cast<c10d::TCPStore*>(s.get())) return route_source_to(t->getHost(), t->getPort());
  return "";
}

void C10dStoreAdapter::set(const std::string& key, const shoal::Bytes& value) {
  translate("set", key, [&] { store_->set(key, value); });
}

shoal::Bytes C10dStoreAdapter::get(const std::string& key, shoal::Millis timeout) {
  // c10d's get() blocks with the store's own timeout; wait with ours first.
  return translate("get", key, [&] {
    store_->wait({key}, timeout);
    return store_->get(key);
  });
}

int64_t C10dStoreAdapter::add(const std::string& key, int64_t delta) {
  return translate("add", key, [&] { return store_->add(key, delta); });
}

void C10dStoreAdapter::wait(const std::vector<std::string>& keys, shoal::Millis timeout) {
  translate("wait", keys.empty() ? std::string() : keys.front(), [&] { store_->wait(keys, timeout); });
}

bool C10dStoreAdapter::check(const std::string& key) {
  return translate("check", key, [&] { return store_->check({key}); });
}

}  // namespace shoal_torch
