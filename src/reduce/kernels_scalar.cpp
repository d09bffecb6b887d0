// Portable kernels (no ISA extensions beyond the build's baseline). The reference semantics for
// the SIMD kernel sets, and what runs when the CPU has neither AVX2 nor AVX-512.
#include "reduce/kernels.h"

namespace shoal::reduce_impl {
namespace {

using namespace scalar;

struct OpSum {
  template <class S>
  static typename S::A apply(typename S::A a, typename S::A b) { return S::add(a, b); }
};
struct OpProd {
  template <class S>
  static typename S::A apply(typename S::A a, typename S::A b) { return S::mul(a, b); }
};
struct OpMin {
  template <class S>
  static typename S::A apply(typename S::A a, typename S::A b) { return S::min(a, b); }
};
struct OpMax {
  template <class S>
  static typename S::A apply(typename S::A a, typename S::A b) { return S::max(a, b); }
};
struct OpBand {
  template <class S>
  static typename S::A apply(typename S::A a, typename S::A b) { return S::band(a, b); }
};
struct OpBor {
  template <class S>
  static typename S::A apply(typename S::A a, typename S::A b) { return S::bor(a, b); }
};
struct OpBxor {
  template <class S>
  static typename S::A apply(typename S::A a, typename S::A b) { return S::bxor(a, b); }
};

// One tile of m elements: the accumulator tile stays in L1; each source is read once, dst
// written once. Inlined with m == kTile for full tiles, so the compiler sees fixed-length loops
// it can vectorise with the baseline ISA (SSE2 on x86-64) at -O2.
template <class S, class Op>
__attribute__((always_inline)) inline void tile(typename S::A* acc, const SrcPtrs<typename S::E>& p, int n,
                                                size_t i0, size_t m, typename S::E* dst) {
  using E = typename S::E;
  const E* s0 = p[0] + i0;
  for (size_t j = 0; j < m; ++j) acc[j] = S::load(s0[j]);
  for (int k = 1; k < n; ++k) {
    const E* s = p[k] + i0;
    for (size_t j = 0; j < m; ++j) acc[j] = Op::template apply<S>(acc[j], S::load(s[j]));
  }
  E* d = dst + i0;
  for (size_t j = 0; j < m; ++j) d[j] = S::store(acc[j]);
}

template <class S, class Op>
void many(void* dst_, const void* const* srcs, int n, size_t count) {
  using E = typename S::E;
  constexpr size_t kTile = 512;
  const SrcPtrs<E> p(srcs, n);
  E* dst = static_cast<E*>(dst_);
  alignas(64) typename S::A acc[kTile];
  size_t i0 = 0;
  for (; i0 + kTile <= count; i0 += kTile) tile<S, Op>(acc, p, n, i0, kTile, dst);
  if (i0 < count) tile<S, Op>(acc, p, n, i0, count - i0, dst);
}

template <class S>
void scale_float(void* buf, size_t count, int divisor) {
  using A = typename S::A;
  auto* b = static_cast<typename S::E*>(buf);
  const A d = static_cast<A>(divisor);
  for (size_t i = 0; i < count; ++i) b[i] = S::store(S::load(b[i]) / d);
}

// Truncating division. For types up to 32 bits, a double quotient truncated is exact: when x/d
// is not an integer it is at least 1/d away from one, more than the rounding error of the
// double quotient (|x/d| * 2^-53 < 2^-21 / d); doubles divide far faster than integers.
template <class T>
void scale_int(void* buf, size_t count, int divisor) {
  auto* b = static_cast<T*>(buf);
  if constexpr (sizeof(T) <= 4) {
    const double d = divisor;
    for (size_t i = 0; i < count; ++i) b[i] = static_cast<T>(static_cast<double>(b[i]) / d);
  } else {
    const T d = divisor;
    for (size_t i = 0; i < count; ++i) b[i] = static_cast<T>(b[i] / d);
  }
}

template <class S>
void fill_arith(KernelTable& t, DType dt) {
  auto& row = t.many[static_cast<int>(dt)];
  row[static_cast<int>(ReduceOp::sum)] = &many<S, OpSum>;
  row[static_cast<int>(ReduceOp::prod)] = &many<S, OpProd>;
  row[static_cast<int>(ReduceOp::min)] = &many<S, OpMin>;
  row[static_cast<int>(ReduceOp::max)] = &many<S, OpMax>;
}
template <class S>
void fill_bitwise(KernelTable& t, DType dt) {
  auto& row = t.many[static_cast<int>(dt)];
  row[static_cast<int>(ReduceOp::band)] = &many<S, OpBand>;
  row[static_cast<int>(ReduceOp::bor)] = &many<S, OpBor>;
  row[static_cast<int>(ReduceOp::bxor)] = &many<S, OpBxor>;
}

KernelTable build() {
  KernelTable t;
  t.level = SimdLevel::scalar;
  t.name = "scalar";
  fill_arith<F16>(t, DType::f16);
  fill_arith<BF16>(t, DType::bf16);
  fill_arith<Float<float>>(t, DType::f32);
  fill_arith<Float<double>>(t, DType::f64);
  fill_arith<Int<int8_t>>(t, DType::i8);
  fill_arith<Int<uint8_t>>(t, DType::u8);
  fill_arith<Int<int32_t>>(t, DType::i32);
  fill_arith<Int<int64_t>>(t, DType::i64);
  fill_arith<Bool>(t, DType::boolean);
  fill_bitwise<Int<int8_t>>(t, DType::i8);
  fill_bitwise<Int<uint8_t>>(t, DType::u8);
  fill_bitwise<Int<int32_t>>(t, DType::i32);
  fill_bitwise<Int<int64_t>>(t, DType::i64);
  fill_bitwise<Bool>(t, DType::boolean);
  t.scale[static_cast<int>(DType::f16)] = &scale_float<F16>;
  t.scale[static_cast<int>(DType::bf16)] = &scale_float<BF16>;
  t.scale[static_cast<int>(DType::f32)] = &scale_float<Float<float>>;
  t.scale[static_cast<int>(DType::f64)] = &scale_float<Float<double>>;
  t.scale[static_cast<int>(DType::i8)] = &scale_int<int8_t>;
  t.scale[static_cast<int>(DType::u8)] = &scale_int<uint8_t>;
  t.scale[static_cast<int>(DType::i32)] = &scale_int<int32_t>;
  t.scale[static_cast<int>(DType::i64)] = &scale_int<int64_t>;
  return t;
}

}  // namespace

const KernelTable* scalar_kernels() {
  static const KernelTable table = build();
  return &table;
}

}  // namespace shoal::reduce_impl
