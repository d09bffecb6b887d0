// shoal-bench: element types as C++ types (f16 and bf16 as raw 16-bit patterns with conversions),
// and a dispatch from shoal::DType to them. Independent of shoal's own kernels on purpose: the
// benchmark's reference results must not come from the code under test.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <type_traits>

#include "shoal/types.h"

namespace shoal::bench {

struct F16 {
  uint16_t bits;
};
struct BF16 {
  uint16_t bits;
};

inline float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t man = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x400u) == 0);
      man &= 0x3FFu;
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | man << 13;
    }
  } else if (exp == 0x1F) {
    bits = sign | 0x7F800000u | man << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even.
inline uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7FFFFFFFu;
  if (ax >= 0x7F800000u) return static_cast<uint16_t>(sign | 0x7C00u | (ax > 0x7F800000u ? 0x200u : 0));
  if (ax >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // overflow to inf
  if (ax < 0x38800000u) {  // subnormal or zero in f16
    if (ax < 0x33000000u) return static_cast<uint16_t>(sign);
    uint32_t e = ax >> 23;
    uint32_t m = (ax & 0x7FFFFFu) | 0x800000u;
    uint32_t shift = 126 - e;  // 14 + (113 - e) ... bits to drop beyond the 13 of the mantissa
    uint32_t kept = m >> (shift);
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (kept & 1))) ++kept;
    return static_cast<uint16_t>(sign | kept);
  }
  uint32_t r = ax + 0xC8000FFFu + ((ax >> 13) & 1);  // rebias exponent (-112 << 23) and round
  return static_cast<uint16_t>(sign | (r >> 13));
}

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  x += 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

// Element i of a buffer of T, as a double, and back (values are small integers when exact).
template <class T>
inline double load(const void* p, size_t i) {
  const T* t = static_cast<const T*>(p);
  if constexpr (std::is_same_v<T, F16>) return f16_to_f32(t[i].bits);
  else if constexpr (std::is_same_v<T, BF16>) return bf16_to_f32(t[i].bits);
  else if constexpr (std::is_same_v<T, bool>) return t[i] ? 1.0 : 0.0;
  else return static_cast<double>(t[i]);
}

template <class T>
inline void store(void* p, size_t i, double v) {
  T* t = static_cast<T*>(p);
  if constexpr (std::is_same_v<T, F16>) t[i].bits = f32_to_f16(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, BF16>) t[i].bits = f32_to_bf16(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, bool>) t[i] = v != 0;
  else t[i] = static_cast<T>(v);
}

// Calls f.template operator()<T>() with the C++ type of `dt`.
template <class F>
decltype(auto) dispatch_dtype(DType dt, F&& f) {
  switch (dt) {
    case DType::f16: return f.template operator()<F16>();
    case DType::bf16: return f.template operator()<BF16>();
    case DType::f32: return f.template operator()<float>();
    case DType::f64: return f.template operator()<double>();
    case DType::i8: return f.template operator()<int8_t>();
    case DType::u8: return f.template operator()<uint8_t>();
    case DType::i32: return f.template operator()<int32_t>();
    case DType::i64: return f.template operator()<int64_t>();
    case DType::boolean: return f.template operator()<bool>();
  }
  throw std::invalid_argument("unknown dtype");
}

}  // namespace shoal::bench
