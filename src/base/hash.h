// The mixer of the ops' signatures and the direct ops' tokens (core/communicator.cpp,
// algo/direct_common.h): each value folded in changes every bit of the result, so two calls that
// differ in any argument get different signatures. Not a cryptographic hash: a signature catches
// ranks that call different ops by mistake, not a peer that forges one.
#pragma once
#include <cstdint>

namespace shoal {

inline uint64_t hash_mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h *= 0xff51afd7ed558ccdull;
  return h ^ (h >> 33);
}

// hash_mix over values one by one: Hash().add(a).add(b).value().
class Hash {
 public:
  explicit Hash(uint64_t seed = 0x5348414c44495245ull) : h_(seed) {}
  Hash& add(uint64_t v) {
    h_ = hash_mix(h_, v);
    return *this;
  }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_;
};

}  // namespace shoal
