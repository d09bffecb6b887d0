// Internal to src/reduce: the per-ISA kernel tables behind reduce.h, the scalar element
// semantics every kernel set shares, and the level selection (plus a hook for the tests).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>

#include "reduce/half.h"
#include "shoal/types.h"

namespace shoal::reduce_impl {

inline constexpr int kNumDTypes = 9;
inline constexpr int kNumOps = 8;

enum class SimdLevel : int { scalar = 0, avx2 = 1, avx512 = 2 };

// dst = srcs[0] OP ... OP srcs[n-1]; arguments already validated (n >= 1, count >= 1). dst may
// alias any source exactly (each block of every source is loaded before dst's block is stored).
using ManyFn = void (*)(void* dst, const void* const* srcs, int n, size_t count);
// buf /= divisor (divisor >= 2).
using ScaleFn = void (*)(void* buf, size_t count, int divisor);

struct KernelTable {
  SimdLevel level = SimdLevel::scalar;
  const char* name = nullptr;
  ManyFn many[kNumDTypes][kNumOps] = {};  // null where the combination is unsupported (and for avg)
  ScaleFn scale[kNumDTypes] = {};         // null for boolean
};

// Each returns null when that kernel set is not compiled in (non-x86 builds).
const KernelTable* scalar_kernels();
const KernelTable* avx2_kernels();
const KernelTable* avx512_kernels();

const char* level_name(SimdLevel l);
// Highest level this CPU (and OS) supports.
SimdLevel cpu_max_level();
// Level for a SHOAL_SIMD value (null/empty/"auto": the CPU's best), clamped to `cpu_max`.
// Sets *recognised to false for a value it does not know (it then picks the CPU's best).
SimdLevel level_for_env(const char* value, SimdLevel cpu_max, bool* recognised = nullptr);
// Level in use (selected on first use from SHOAL_SIMD and the CPU).
SimdLevel current_level();
// Test-only: switch the kernels in use. Returns false (and changes nothing) when the CPU lacks
// `level`. Not meant to be called while other threads are reducing.
bool set_level_for_testing(SimdLevel level);

// ---- Scalar element semantics, shared by the scalar kernels and the SIMD tails -----------------
namespace scalar {

// NaN if either is NaN (like torch). Otherwise exactly what minps/maxps do (b when a == b, so
// min(-0, +0) is +0 here as in the SIMD kernels): every kernel set gives identical bits.
template <class T>
inline T nan_min(T a, T b) {
  if (a != a) return a;
  return a < b ? a : b;  // b when b is NaN
}
template <class T>
inline T nan_max(T a, T b) {
  if (a != a) return a;
  return a > b ? a : b;
}

template <class T>  // float / double
struct Float {
  using E = T;
  using A = T;
  static A load(E x) { return x; }
  static E store(A a) { return a; }
  static A add(A a, A b) { return a + b; }
  static A mul(A a, A b) { return a * b; }
  static A min(A a, A b) { return nan_min(a, b); }
  static A max(A a, A b) { return nan_max(a, b); }
};
struct F16 : Float<float> {
  using E = uint16_t;
  static A load(E x) { return half::f16_to_f32(x); }
  static E store(A a) { return half::f32_to_f16(a); }
};
struct BF16 : Float<float> {
  using E = uint16_t;
  static A load(E x) { return half::bf16_to_f32(x); }
  static E store(A a) { return half::f32_to_bf16(a); }
};

template <class T>  // two's complement wrap-around, computed in unsigned (no UB)
struct Int {
  using E = T;
  using A = T;
  using U = std::make_unsigned_t<T>;
  static A load(E x) { return x; }
  static E store(A a) { return a; }
  static A add(A a, A b) { return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b))); }
  static A mul(A a, A b) {
    // u8 * u8 promotes to int (fits); wider types multiply as unsigned.
    using W = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, U>;
    return static_cast<T>(static_cast<U>(static_cast<W>(static_cast<U>(a)) * static_cast<W>(static_cast<U>(b))));
  }
  static A min(A a, A b) { return std::min(a, b); }
  static A max(A a, A b) { return std::max(a, b); }
  static A band(A a, A b) { return static_cast<T>(a & b); }
  static A bor(A a, A b) { return static_cast<T>(a | b); }
  static A bxor(A a, A b) { return static_cast<T>(a ^ b); }
};

// 1 byte, any non-zero input counts as true; results are always 0 or 1.
struct Bool {
  using E = uint8_t;
  using A = uint8_t;
  static A load(E x) { return x != 0; }
  static E store(A a) { return a; }
  static A band(A a, A b) { return a & b; }
  static A bor(A a, A b) { return a | b; }
  static A bxor(A a, A b) { return a ^ b; }
  static A add(A a, A b) { return bor(a, b); }
  static A mul(A a, A b) { return band(a, b); }
  static A min(A a, A b) { return band(a, b); }
  static A max(A a, A b) { return bor(a, b); }
};

}  // namespace scalar

// The srcs array copied into typed pointers (on the stack for the usual small n).
template <class E>
class SrcPtrs {
 public:
  SrcPtrs(const void* const* srcs, int n) {
    ptrs_ = local_;
    if (n > kLocal) {
      heap_ = std::make_unique<const E*[]>(static_cast<size_t>(n));
      ptrs_ = heap_.get();
    }
    for (int k = 0; k < n; ++k) ptrs_[k] = static_cast<const E*>(srcs[k]);
  }
  const E* operator[](int k) const { return ptrs_[k]; }

 private:
  static constexpr int kLocal = 32;
  const E* local_[kLocal];
  std::unique_ptr<const E*[]> heap_;
  const E** ptrs_;
};

}  // namespace shoal::reduce_impl
