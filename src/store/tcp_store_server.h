// TcpStore's server: one thread, epoll, level-triggered, non-blocking sockets (the protocol:
// tcp_store_wire.h). A TcpStore on the serving rank owns one; so does shoal-store.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "shoal/store.h"

namespace shoal {

class StoreServer {
 public:
  // Listens on `bind_host` ("" for every interface) at `port` (0: any free one) and serves on a
  // thread of its own. Throws Error when it cannot listen.
  StoreServer(const std::string& bind_host, uint16_t port);
  ~StoreServer();  // stops the thread and closes every connection
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  uint16_t port() const;
  // Waits until no client is connected, for at most `max`. Returns whether that happened.
  bool wait_no_clients(Millis max);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace shoal
