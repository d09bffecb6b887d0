// Rendezvous key-value store: how the ranks of a group find each other.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace shoal {

using Bytes = std::vector<uint8_t>;
using Millis = std::chrono::milliseconds;

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const Bytes& value) = 0;
  // Blocks until `key` exists, then returns its value; throws Timeout after `timeout`.
  virtual Bytes get(const std::string& key, Millis timeout) = 0;
  // Atomically adds `delta` to the integer stored at `key` (0 if absent); returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Blocks until every key exists; throws Timeout naming the missing keys.
  virtual void wait(const std::vector<std::string>& keys, Millis timeout) = 0;
  // Non-blocking existence check.
  virtual bool check(const std::string& key) = 0;
  // This host's address on the route to the store's server, where the store has one ("" for a
  // file store): what a rank advertises for TCP unless SHOAL_HOST says otherwise.
  virtual std::string local_address() const { return ""; }

  void set_string(const std::string& key, const std::string& v) { set(key, Bytes(v.begin(), v.end())); }
  std::string get_string(const std::string& key, Millis timeout) {
    Bytes b = get(key, timeout);
    return std::string(b.begin(), b.end());
  }
};

// Prefixes every key, so that several groups can share one store.
class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> inner);
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, Millis timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  bool check(const std::string& key) override;
  std::string local_address() const override { return inner_->local_address(); }

 private:
  std::string prefix_;
  std::shared_ptr<Store> inner_;
};

// shoal's own TCP store. With is_server the constructor starts a server thread listening on
// `port` (0 = any free port, see port()) and then connects to it like every client.
class TcpStore : public Store {
 public:
  TcpStore(const std::string& host, uint16_t port, bool is_server, Millis connect_timeout);
  ~TcpStore() override;
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, Millis timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  bool check(const std::string& key) override;
  uint16_t port() const;
  // The local IP address of this client's connection to the server: the address peers can reach us
  // on (the interface that routes to the store). Used by the TCP transport to advertise itself.
  std::string local_address() const override;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// A store in a file shared by the ranks (one host, or a shared file system). Uses flock.
class FileStore : public Store {
 public:
  explicit FileStore(std::string path);
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, Millis timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  bool check(const std::string& key) override;

 private:
  std::string path_;
};

// This process's place in the group by the environment contract (docs/launch.md): SHOAL_RANK and
// SHOAL_WORLD_SIZE. Throws InvalidArgument when either is unset or not a number.
struct Placement {
  int rank;
  int size;
};
Placement placement_from_env();

// Store from the environment contract: SHOAL_STORE=host:port (TcpStore; rank 0 runs the server
// unless SHOAL_STORE_SERVER=0, e.g. when a standalone `shoal-store` serves) or a file path
// (FileStore; anything containing '/').
std::shared_ptr<Store> store_from_env(int rank, Millis timeout);

}  // namespace shoal
