// Scalar f16 (IEEE binary16) and bf16 (bfloat16) <-> f32 conversion, round to nearest even.
// Used by the scalar kernels and by the scalar tails of the SIMD kernels; the SIMD bodies use
// F16C (f16) and integer shifts (bf16) with exactly the same results, NaN payloads aside.
#pragma once
#include <bit>
#include <cstdint>

namespace shoal::half {

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t man = h & 0x3FFu;
  if (exp == 0x1F) {  // inf / NaN (NaN comes back quiet, as F16C does)
    return std::bit_cast<float>(sign | 0x7F800000u | (man << 13) | (man ? 0x00400000u : 0u));
  }
  if (exp == 0) {  // zero / subnormal: man * 2^-24, exact in f32
    const float v = static_cast<float>(man) * 0x1p-24f;
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (man << 13));
}

inline uint16_t f32_to_f16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((ax >> 13) & 0x3FFu));  // NaN, quiet
  if (ax >= 0x38800000u) {  // |f| >= 2^-14: normal in f16 (or overflow)
    uint32_t r = (ax + 0xFFFu + ((ax >> 13) & 1u)) >> 13;  // round to nearest even at bit 13
    r -= 112u << 10;                                        // rebias 127 -> 15
    if (r >= 0x7C00u) r = 0x7C00u;                          // overflow (and inf) -> inf
    return static_cast<uint16_t>(sign | r);
  }
  // Subnormal or zero in f16. Adding 0.5 puts the f16 subnormal step (2^-24) at the last bit of
  // the f32 significand, so the (round-to-nearest-even) addition does the rounding for us.
  const float v = std::bit_cast<float>(ax) + 0.5f;
  return static_cast<uint16_t>(sign | (std::bit_cast<uint32_t>(v) - 0x3F000000u));
}

inline float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN stays NaN (quiet)
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);                   // nearest even
}

}  // namespace shoal::half
