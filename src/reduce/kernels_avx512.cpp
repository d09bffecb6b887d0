// AVX-512 (F, BW, DQ, VL + F16C) kernels. Compiled without global -m flags: every function that
// uses AVX-512 carries __attribute__((target)), and everything here is in an anonymous namespace
// so no AVX-512 code can be picked by the linker for a caller elsewhere. Tails use masked loads
// and stores. Only called when the CPU has all of those extensions.
#include "reduce/kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

// GCC 12's AVX-512 intrinsics build "undefined" registers as `__m512i __Y = __Y;`, which trips
// -Wmaybe-uninitialized once inlined here (a false positive, GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace shoal::reduce_impl {
namespace {

#define SHOAL_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,f16c")))
#define SHOAL_AVX512_INLINE \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,f16c"), always_inline)) inline

// ---- Register traits: E element in memory, R register, W elements per register; load_tail /
// store_tail touch only the first m < W elements. f16 is widened to 16 x f32 per register, bf16
// to two registers.

struct PsOps {
  using R = __m512;
  static constexpr size_t W = 16;
  SHOAL_AVX512_INLINE static __mmask16 mask(size_t m) { return static_cast<__mmask16>((1u << m) - 1); }
  SHOAL_AVX512_INLINE static R add(R a, R b) { return _mm512_add_ps(a, b); }
  SHOAL_AVX512_INLINE static R mul(R a, R b) { return _mm512_mul_ps(a, b); }
  SHOAL_AVX512_INLINE static R div(R a, R b) { return _mm512_div_ps(a, b); }
  // minps/maxps return the second operand when either is NaN: put a NaN `a` back.
  SHOAL_AVX512_INLINE static R min(R a, R b) {
    return _mm512_mask_mov_ps(_mm512_min_ps(a, b), _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), a);
  }
  SHOAL_AVX512_INLINE static R max(R a, R b) {
    return _mm512_mask_mov_ps(_mm512_max_ps(a, b), _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), a);
  }
  SHOAL_AVX512_INLINE static R set1(float x) { return _mm512_set1_ps(x); }
};

struct F32 : PsOps {
  using E = float;
  using A = float;
  SHOAL_AVX512_INLINE static R load(const E* p) { return _mm512_loadu_ps(p); }
  SHOAL_AVX512_INLINE static void store(E* p, R v) { _mm512_storeu_ps(p, v); }
  SHOAL_AVX512_INLINE static R load_tail(const E* p, size_t m) { return _mm512_maskz_loadu_ps(mask(m), p); }
  SHOAL_AVX512_INLINE static void store_tail(E* p, R v, size_t m) { _mm512_mask_storeu_ps(p, mask(m), v); }
};

struct F16 : PsOps {
  using E = uint16_t;
  using A = float;
  SHOAL_AVX512_INLINE static R load(const E* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  SHOAL_AVX512_INLINE static void store(E* p, R v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  SHOAL_AVX512_INLINE static R load_tail(const E* p, size_t m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask(m), p));
  }
  SHOAL_AVX512_INLINE static void store_tail(E* p, R v, size_t m) {
    _mm256_mask_storeu_epi16(p, mask(m), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
};

// bf16: 32 elements per step, as two f32 registers. Widening interleaves zero words below the
// bf16 words (unpack, per 128-bit lane) and narrowing packs them back (packus, per 128-bit lane):
// the lanes come back in their original order, and every source is widened the same way.
struct BF16 {
  using E = uint16_t;
  using A = float;
  struct R {
    __m512 lo, hi;
  };
  static constexpr size_t W = 32;
  SHOAL_AVX512_INLINE static __mmask32 mask(size_t m) { return static_cast<__mmask32>((uint64_t{1} << m) - 1); }
  SHOAL_AVX512_INLINE static R widen(__m512i h) {
    const __m512i z = _mm512_setzero_si512();
    return {_mm512_castsi512_ps(_mm512_unpacklo_epi16(z, h)), _mm512_castsi512_ps(_mm512_unpackhi_epi16(z, h))};
  }
  // f32 -> bf16 bits in the low half of each 32-bit lane: nearest even; NaN stays NaN (quiet).
  SHOAL_AVX512_INLINE static __m512i round(__m512 v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i hi = _mm512_srli_epi32(u, 16);
    const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), 16);
    return _mm512_mask_or_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), hi, _mm512_set1_epi32(0x40));
  }
  SHOAL_AVX512_INLINE static __m512i narrow(R v) { return _mm512_packus_epi32(round(v.lo), round(v.hi)); }
  SHOAL_AVX512_INLINE static R load(const E* p) { return widen(_mm512_loadu_si512(p)); }
  SHOAL_AVX512_INLINE static void store(E* p, R v) { _mm512_storeu_si512(p, narrow(v)); }
  SHOAL_AVX512_INLINE static R load_tail(const E* p, size_t m) { return widen(_mm512_maskz_loadu_epi16(mask(m), p)); }
  SHOAL_AVX512_INLINE static void store_tail(E* p, R v, size_t m) { _mm512_mask_storeu_epi16(p, mask(m), narrow(v)); }
  SHOAL_AVX512_INLINE static R add(R a, R b) { return {PsOps::add(a.lo, b.lo), PsOps::add(a.hi, b.hi)}; }
  SHOAL_AVX512_INLINE static R mul(R a, R b) { return {PsOps::mul(a.lo, b.lo), PsOps::mul(a.hi, b.hi)}; }
  SHOAL_AVX512_INLINE static R div(R a, R b) { return {PsOps::div(a.lo, b.lo), PsOps::div(a.hi, b.hi)}; }
  SHOAL_AVX512_INLINE static R min(R a, R b) { return {PsOps::min(a.lo, b.lo), PsOps::min(a.hi, b.hi)}; }
  SHOAL_AVX512_INLINE static R max(R a, R b) { return {PsOps::max(a.lo, b.lo), PsOps::max(a.hi, b.hi)}; }
  SHOAL_AVX512_INLINE static R set1(float x) { return {_mm512_set1_ps(x), _mm512_set1_ps(x)}; }
};

struct F64 {
  using E = double;
  using A = double;
  using R = __m512d;
  static constexpr size_t W = 8;
  SHOAL_AVX512_INLINE static __mmask8 mask(size_t m) { return static_cast<__mmask8>((1u << m) - 1); }
  SHOAL_AVX512_INLINE static R load(const E* p) { return _mm512_loadu_pd(p); }
  SHOAL_AVX512_INLINE static void store(E* p, R v) { _mm512_storeu_pd(p, v); }
  SHOAL_AVX512_INLINE static R load_tail(const E* p, size_t m) { return _mm512_maskz_loadu_pd(mask(m), p); }
  SHOAL_AVX512_INLINE static void store_tail(E* p, R v, size_t m) { _mm512_mask_storeu_pd(p, mask(m), v); }
  SHOAL_AVX512_INLINE static R add(R a, R b) { return _mm512_add_pd(a, b); }
  SHOAL_AVX512_INLINE static R mul(R a, R b) { return _mm512_mul_pd(a, b); }
  SHOAL_AVX512_INLINE static R div(R a, R b) { return _mm512_div_pd(a, b); }
  SHOAL_AVX512_INLINE static R min(R a, R b) {
    return _mm512_mask_mov_pd(_mm512_min_pd(a, b), _mm512_cmp_pd_mask(a, a, _CMP_UNORD_Q), a);
  }
  SHOAL_AVX512_INLINE static R max(R a, R b) {
    return _mm512_mask_mov_pd(_mm512_max_pd(a, b), _mm512_cmp_pd_mask(a, a, _CMP_UNORD_Q), a);
  }
  SHOAL_AVX512_INLINE static R set1(double x) { return _mm512_set1_pd(x); }
};

template <class T>
struct IntBase {
  using E = T;
  using R = __m512i;
  static constexpr size_t W = 64 / sizeof(T);
  SHOAL_AVX512_INLINE static R load(const E* p) { return _mm512_loadu_si512(p); }
  SHOAL_AVX512_INLINE static void store(E* p, R v) { _mm512_storeu_si512(p, v); }
  SHOAL_AVX512_INLINE static R load_tail(const E* p, size_t m) {
    if constexpr (sizeof(T) == 1) return _mm512_maskz_loadu_epi8(static_cast<__mmask64>((uint64_t{1} << m) - 1), p);
    if constexpr (sizeof(T) == 4) return _mm512_maskz_loadu_epi32(static_cast<__mmask16>((1u << m) - 1), p);
    if constexpr (sizeof(T) == 8) return _mm512_maskz_loadu_epi64(static_cast<__mmask8>((1u << m) - 1), p);
  }
  SHOAL_AVX512_INLINE static void store_tail(E* p, R v, size_t m) {
    if constexpr (sizeof(T) == 1) _mm512_mask_storeu_epi8(p, static_cast<__mmask64>((uint64_t{1} << m) - 1), v);
    if constexpr (sizeof(T) == 4) _mm512_mask_storeu_epi32(p, static_cast<__mmask16>((1u << m) - 1), v);
    if constexpr (sizeof(T) == 8) _mm512_mask_storeu_epi64(p, static_cast<__mmask8>((1u << m) - 1), v);
  }
  SHOAL_AVX512_INLINE static R band(R a, R b) { return _mm512_and_si512(a, b); }
  SHOAL_AVX512_INLINE static R bor(R a, R b) { return _mm512_or_si512(a, b); }
  SHOAL_AVX512_INLINE static R bxor(R a, R b) { return _mm512_xor_si512(a, b); }
};

// No 8-bit multiply: multiply the even and the odd bytes as 16-bit lanes (the low byte of a
// 16-bit product is the 8-bit product, signed or not) and merge.
SHOAL_AVX512_INLINE __m512i mul_epi8(__m512i a, __m512i b) {
  const __m512i even = _mm512_mullo_epi16(a, b);
  const __m512i odd = _mm512_mullo_epi16(_mm512_srli_epi16(a, 8), _mm512_srli_epi16(b, 8));
  return _mm512_or_si512(_mm512_and_si512(even, _mm512_set1_epi16(0xFF)), _mm512_slli_epi16(odd, 8));
}

struct I8 : IntBase<int8_t> {
  SHOAL_AVX512_INLINE static R add(R a, R b) { return _mm512_add_epi8(a, b); }
  SHOAL_AVX512_INLINE static R mul(R a, R b) { return mul_epi8(a, b); }
  SHOAL_AVX512_INLINE static R min(R a, R b) { return _mm512_min_epi8(a, b); }
  SHOAL_AVX512_INLINE static R max(R a, R b) { return _mm512_max_epi8(a, b); }
};
struct U8 : IntBase<uint8_t> {
  SHOAL_AVX512_INLINE static R add(R a, R b) { return _mm512_add_epi8(a, b); }
  SHOAL_AVX512_INLINE static R mul(R a, R b) { return mul_epi8(a, b); }
  SHOAL_AVX512_INLINE static R min(R a, R b) { return _mm512_min_epu8(a, b); }
  SHOAL_AVX512_INLINE static R max(R a, R b) { return _mm512_max_epu8(a, b); }
};
struct I32 : IntBase<int32_t> {
  SHOAL_AVX512_INLINE static R add(R a, R b) { return _mm512_add_epi32(a, b); }
  SHOAL_AVX512_INLINE static R mul(R a, R b) { return _mm512_mullo_epi32(a, b); }
  SHOAL_AVX512_INLINE static R min(R a, R b) { return _mm512_min_epi32(a, b); }
  SHOAL_AVX512_INLINE static R max(R a, R b) { return _mm512_max_epi32(a, b); }
};
struct I64 : IntBase<int64_t> {
  SHOAL_AVX512_INLINE static R add(R a, R b) { return _mm512_add_epi64(a, b); }
  SHOAL_AVX512_INLINE static R mul(R a, R b) { return _mm512_mullo_epi64(a, b); }
  SHOAL_AVX512_INLINE static R min(R a, R b) { return _mm512_min_epi64(a, b); }
  SHOAL_AVX512_INLINE static R max(R a, R b) { return _mm512_max_epi64(a, b); }
};
// Bytes normalised to 0/1 on load; then or / and / xor keep them 0/1.
struct Bool : IntBase<uint8_t> {
  SHOAL_AVX512_INLINE static R load(const E* p) { return _mm512_min_epu8(_mm512_loadu_si512(p), _mm512_set1_epi8(1)); }
  SHOAL_AVX512_INLINE static R load_tail(const E* p, size_t m) {
    return _mm512_min_epu8(IntBase<uint8_t>::load_tail(p, m), _mm512_set1_epi8(1));
  }
  SHOAL_AVX512_INLINE static R add(R a, R b) { return _mm512_or_si512(a, b); }
  SHOAL_AVX512_INLINE static R mul(R a, R b) { return _mm512_and_si512(a, b); }
  SHOAL_AVX512_INLINE static R min(R a, R b) { return _mm512_and_si512(a, b); }
  SHOAL_AVX512_INLINE static R max(R a, R b) { return _mm512_or_si512(a, b); }
};

#define SHOAL_DEFINE_OP(Name, fn)                                     \
  struct Name {                                                       \
    template <class X, class V>                                       \
    SHOAL_AVX512_INLINE static V apply(V a, V b) { return X::fn(a, b); } \
  };
SHOAL_DEFINE_OP(OpSum, add)
SHOAL_DEFINE_OP(OpProd, mul)
SHOAL_DEFINE_OP(OpMin, min)
SHOAL_DEFINE_OP(OpMax, max)
SHOAL_DEFINE_OP(OpBand, band)
SHOAL_DEFINE_OP(OpBor, bor)
SHOAL_DEFINE_OP(OpBxor, bxor)
#undef SHOAL_DEFINE_OP

// One pass over all n sources, four registers per source per step, accumulators in registers.
// Every source block is loaded before dst is stored, so dst may alias any source.
template <class Tr, class Op>
SHOAL_AVX512 void many(void* dst_, const void* const* srcs, int n, size_t count) {
  using E = typename Tr::E;
  using R = typename Tr::R;
  constexpr size_t W = Tr::W;
  const SrcPtrs<E> p(srcs, n);
  E* dst = static_cast<E*>(dst_);
  size_t i = 0;
  for (; i + 4 * W <= count; i += 4 * W) {
    const E* s = p[0] + i;
    R a0 = Tr::load(s), a1 = Tr::load(s + W), a2 = Tr::load(s + 2 * W), a3 = Tr::load(s + 3 * W);
    for (int k = 1; k < n; ++k) {
      s = p[k] + i;
      a0 = Op::template apply<Tr>(a0, Tr::load(s));
      a1 = Op::template apply<Tr>(a1, Tr::load(s + W));
      a2 = Op::template apply<Tr>(a2, Tr::load(s + 2 * W));
      a3 = Op::template apply<Tr>(a3, Tr::load(s + 3 * W));
    }
    Tr::store(dst + i, a0);
    Tr::store(dst + i + W, a1);
    Tr::store(dst + i + 2 * W, a2);
    Tr::store(dst + i + 3 * W, a3);
  }
  for (; i + W <= count; i += W) {
    R a = Tr::load(p[0] + i);
    for (int k = 1; k < n; ++k) a = Op::template apply<Tr>(a, Tr::load(p[k] + i));
    Tr::store(dst + i, a);
  }
  if (i < count) {
    const size_t m = count - i;
    R a = Tr::load_tail(p[0] + i, m);
    for (int k = 1; k < n; ++k) a = Op::template apply<Tr>(a, Tr::load_tail(p[k] + i, m));
    Tr::store_tail(dst + i, a, m);
  }
}

template <class Tr>
SHOAL_AVX512 void scale(void* buf, size_t count, int divisor) {
  using E = typename Tr::E;
  constexpr size_t W = Tr::W;
  E* b = static_cast<E*>(buf);
  const auto d = Tr::set1(static_cast<typename Tr::A>(divisor));
  size_t i = 0;
  for (; i + W <= count; i += W) Tr::store(b + i, Tr::div(Tr::load(b + i), d));
  if (i < count) Tr::store_tail(b + i, Tr::div(Tr::load_tail(b + i, count - i), d), count - i);
}

#include "reduce/simd_table.inc"

}  // namespace

const KernelTable* avx512_kernels() {
  static const KernelTable table = simd_table(SimdLevel::avx512, "avx512");
  return &table;
}

}  // namespace shoal::reduce_impl

#else

namespace shoal::reduce_impl {
const KernelTable* avx512_kernels() { return nullptr; }
}  // namespace shoal::reduce_impl

#endif
