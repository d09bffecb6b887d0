// PrefixStore: every key becomes prefix + "/" + key in the inner store.
#include <utility>

#include "shoal/error.h"
#include "shoal/store.h"

namespace shoal {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> inner)
    : prefix_(std::move(prefix)), inner_(std::move(inner)) {
  if (!inner_) throw InvalidArgument("PrefixStore: null inner store");
}

void PrefixStore::set(const std::string& key, const Bytes& value) { inner_->set(prefix_ + "/" + key, value); }

Bytes PrefixStore::get(const std::string& key, Millis timeout) { return inner_->get(prefix_ + "/" + key, timeout); }

int64_t PrefixStore::add(const std::string& key, int64_t delta) { return inner_->add(prefix_ + "/" + key, delta); }

void PrefixStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (auto& k : keys) full.push_back(prefix_ + "/" + k);
  inner_->wait(full, timeout);
}

bool PrefixStore::check(const std::string& key) { return inner_->check(prefix_ + "/" + key); }

}  // namespace shoal
