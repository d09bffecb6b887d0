#include "store_adapter.h"

#include <c10/util/Exception.h>

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

}  // namespace

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
