// shoal::Store over the c10d::Store that torch.distributed hands a backend (already prefixed by
// torch with the group name and device), so that shoal's rendezvous runs through torch's store.
#pragma once
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>

#include "shoal/store.h"

namespace shoal_torch {

class C10dStoreAdapter : public shoal::Store {
 public:
  explicit C10dStoreAdapter(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}

  void set(const std::string& key, const shoal::Bytes& value) override;
  shoal::Bytes get(const std::string& key, shoal::Millis timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  void wait(const std::vector<std::string>& keys, shoal::Millis timeout) override;
  bool check(const std::string& key) override;
  // For a c10d TCPStore (under any PrefixStores): the local address of a route to its host.
  std::string local_address() const override;

  const c10::intrusive_ptr<c10d::Store>& c10d_store() const { return store_; }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace shoal_torch
