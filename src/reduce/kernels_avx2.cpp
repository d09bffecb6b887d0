// AVX2 (+F16C) kernels. Compiled without global -m flags: every function that uses AVX2 carries
// __attribute__((target)), and everything here is in an anonymous namespace so no AVX2 code can
// be picked by the linker for a caller elsewhere. Only called when the CPU has AVX2 and F16C.
#include "reduce/kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

namespace shoal::reduce_impl {
namespace {

#define SHOAL_AVX2 __attribute__((target("avx2,f16c")))
#define SHOAL_AVX2_INLINE __attribute__((target("avx2,f16c"), always_inline)) inline

// ---- Register traits: E element in memory, R register, W elements per register, S the scalar
// semantics used for the tail. f16 is widened to 8 x f32 per register, bf16 to two registers.

struct PsOps {
  using R = __m256;
  static constexpr size_t W = 8;
  SHOAL_AVX2_INLINE static R add(R a, R b) { return _mm256_add_ps(a, b); }
  SHOAL_AVX2_INLINE static R mul(R a, R b) { return _mm256_mul_ps(a, b); }
  SHOAL_AVX2_INLINE static R div(R a, R b) { return _mm256_div_ps(a, b); }
  // minps/maxps return the second operand when either is NaN: put a NaN `a` back.
  SHOAL_AVX2_INLINE static R min(R a, R b) {
    return _mm256_blendv_ps(_mm256_min_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  }
  SHOAL_AVX2_INLINE static R max(R a, R b) {
    return _mm256_blendv_ps(_mm256_max_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  }
  SHOAL_AVX2_INLINE static R set1(float x) { return _mm256_set1_ps(x); }
};

struct F32 : PsOps {
  using E = float;
  using S = scalar::Float<float>;
  SHOAL_AVX2_INLINE static R load(const E* p) { return _mm256_loadu_ps(p); }
  SHOAL_AVX2_INLINE static void store(E* p, R v) { _mm256_storeu_ps(p, v); }
};

struct F16 : PsOps {
  using E = uint16_t;
  using S = scalar::F16;
  SHOAL_AVX2_INLINE static R load(const E* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  SHOAL_AVX2_INLINE static void store(E* p, R v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
};

// bf16: 16 elements per step, as two f32 registers. Widening interleaves zero words below the
// bf16 words (unpack, per 128-bit lane) and narrowing packs them back (packus, per 128-bit lane):
// the lanes come back in their original order, and every source is widened the same way.
struct BF16 {
  using E = uint16_t;
  using S = scalar::BF16;
  struct R {
    __m256 lo, hi;
  };
  static constexpr size_t W = 16;
  SHOAL_AVX2_INLINE static R widen(__m256i h) {
    const __m256i z = _mm256_setzero_si256();
    return {_mm256_castsi256_ps(_mm256_unpacklo_epi16(z, h)), _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, h))};
  }
  // f32 -> bf16 bits in the low half of each 32-bit lane: nearest even; NaN stays NaN (quiet).
  SHOAL_AVX2_INLINE static __m256i round(__m256 v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i hi = _mm256_srli_epi32(u, 16);
    const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb), 16);
    const __m256i qnan = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
    return _mm256_blendv_epi8(r, qnan, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
  }
  SHOAL_AVX2_INLINE static R load(const E* p) { return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  SHOAL_AVX2_INLINE static void store(E* p, R v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_packus_epi32(round(v.lo), round(v.hi)));
  }
  SHOAL_AVX2_INLINE static R add(R a, R b) { return {PsOps::add(a.lo, b.lo), PsOps::add(a.hi, b.hi)}; }
  SHOAL_AVX2_INLINE static R mul(R a, R b) { return {PsOps::mul(a.lo, b.lo), PsOps::mul(a.hi, b.hi)}; }
  SHOAL_AVX2_INLINE static R div(R a, R b) { return {PsOps::div(a.lo, b.lo), PsOps::div(a.hi, b.hi)}; }
  SHOAL_AVX2_INLINE static R min(R a, R b) { return {PsOps::min(a.lo, b.lo), PsOps::min(a.hi, b.hi)}; }
  SHOAL_AVX2_INLINE static R max(R a, R b) { return {PsOps::max(a.lo, b.lo), PsOps::max(a.hi, b.hi)}; }
  SHOAL_AVX2_INLINE static R set1(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
};

struct F64 {
  using E = double;
  using S = scalar::Float<double>;
  using R = __m256d;
  static constexpr size_t W = 4;
  SHOAL_AVX2_INLINE static R load(const E* p) { return _mm256_loadu_pd(p); }
  SHOAL_AVX2_INLINE static void store(E* p, R v) { _mm256_storeu_pd(p, v); }
  SHOAL_AVX2_INLINE static R add(R a, R b) { return _mm256_add_pd(a, b); }
  SHOAL_AVX2_INLINE static R mul(R a, R b) { return _mm256_mul_pd(a, b); }
  SHOAL_AVX2_INLINE static R div(R a, R b) { return _mm256_div_pd(a, b); }
  SHOAL_AVX2_INLINE static R min(R a, R b) {
    return _mm256_blendv_pd(_mm256_min_pd(a, b), a, _mm256_cmp_pd(a, a, _CMP_UNORD_Q));
  }
  SHOAL_AVX2_INLINE static R max(R a, R b) {
    return _mm256_blendv_pd(_mm256_max_pd(a, b), a, _mm256_cmp_pd(a, a, _CMP_UNORD_Q));
  }
  SHOAL_AVX2_INLINE static R set1(double x) { return _mm256_set1_pd(x); }
};

template <class T>
struct IntBase {
  using E = T;
  using S = scalar::Int<T>;
  using R = __m256i;
  static constexpr size_t W = 32 / sizeof(T);
  SHOAL_AVX2_INLINE static R load(const E* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  SHOAL_AVX2_INLINE static void store(E* p, R v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
  SHOAL_AVX2_INLINE static R band(R a, R b) { return _mm256_and_si256(a, b); }
  SHOAL_AVX2_INLINE static R bor(R a, R b) { return _mm256_or_si256(a, b); }
  SHOAL_AVX2_INLINE static R bxor(R a, R b) { return _mm256_xor_si256(a, b); }
};

// No 8-bit multiply: multiply the even and the odd bytes as 16-bit lanes (the low byte of a
// 16-bit product is the 8-bit product, signed or not) and merge.
SHOAL_AVX2_INLINE __m256i mul_epi8(__m256i a, __m256i b) {
  const __m256i even = _mm256_mullo_epi16(a, b);
  const __m256i odd = _mm256_mullo_epi16(_mm256_srli_epi16(a, 8), _mm256_srli_epi16(b, 8));
  return _mm256_or_si256(_mm256_and_si256(even, _mm256_set1_epi16(0xFF)), _mm256_slli_epi16(odd, 8));
}

struct I8 : IntBase<int8_t> {
  SHOAL_AVX2_INLINE static R add(R a, R b) { return _mm256_add_epi8(a, b); }
  SHOAL_AVX2_INLINE static R mul(R a, R b) { return mul_epi8(a, b); }
  SHOAL_AVX2_INLINE static R min(R a, R b) { return _mm256_min_epi8(a, b); }
  SHOAL_AVX2_INLINE static R max(R a, R b) { return _mm256_max_epi8(a, b); }
};
struct U8 : IntBase<uint8_t> {
  SHOAL_AVX2_INLINE static R add(R a, R b) { return _mm256_add_epi8(a, b); }
  SHOAL_AVX2_INLINE static R mul(R a, R b) { return mul_epi8(a, b); }
  SHOAL_AVX2_INLINE static R min(R a, R b) { return _mm256_min_epu8(a, b); }
  SHOAL_AVX2_INLINE static R max(R a, R b) { return _mm256_max_epu8(a, b); }
};
struct I32 : IntBase<int32_t> {
  SHOAL_AVX2_INLINE static R add(R a, R b) { return _mm256_add_epi32(a, b); }
  SHOAL_AVX2_INLINE static R mul(R a, R b) { return _mm256_mullo_epi32(a, b); }
  SHOAL_AVX2_INLINE static R min(R a, R b) { return _mm256_min_epi32(a, b); }
  SHOAL_AVX2_INLINE static R max(R a, R b) { return _mm256_max_epi32(a, b); }
};
struct I64 : IntBase<int64_t> {
  SHOAL_AVX2_INLINE static R add(R a, R b) { return _mm256_add_epi64(a, b); }
  // Low 64 bits of a*b = lo*lo + ((hi_a*lo_b + lo_a*hi_b) << 32).
  SHOAL_AVX2_INLINE static R mul(R a, R b) {
    const __m256i lo = _mm256_mul_epu32(a, b);
    const __m256i c1 = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), b);
    const __m256i c2 = _mm256_mul_epu32(a, _mm256_srli_epi64(b, 32));
    return _mm256_add_epi64(lo, _mm256_slli_epi64(_mm256_add_epi64(c1, c2), 32));
  }
  SHOAL_AVX2_INLINE static R min(R a, R b) { return _mm256_blendv_epi8(a, b, _mm256_cmpgt_epi64(a, b)); }
  SHOAL_AVX2_INLINE static R max(R a, R b) { return _mm256_blendv_epi8(a, b, _mm256_cmpgt_epi64(b, a)); }
};
// Bytes normalised to 0/1 on load; then or / and / xor keep them 0/1.
struct Bool : IntBase<uint8_t> {
  using S = scalar::Bool;
  SHOAL_AVX2_INLINE static R load(const E* p) {
    return _mm256_min_epu8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), _mm256_set1_epi8(1));
  }
  SHOAL_AVX2_INLINE static R add(R a, R b) { return _mm256_or_si256(a, b); }
  SHOAL_AVX2_INLINE static R mul(R a, R b) { return _mm256_and_si256(a, b); }
  SHOAL_AVX2_INLINE static R min(R a, R b) { return _mm256_and_si256(a, b); }
  SHOAL_AVX2_INLINE static R max(R a, R b) { return _mm256_or_si256(a, b); }
};

// ---- Ops: apply<X>(a, b) works for the register traits and for their scalar tails.
#define SHOAL_DEFINE_OP(Name, fn)                                  \
  struct Name {                                                    \
    template <class X, class V>                                    \
    SHOAL_AVX2_INLINE static V apply(V a, V b) { return X::fn(a, b); } \
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
SHOAL_AVX2 void many(void* dst_, const void* const* srcs, int n, size_t count) {
  using E = typename Tr::E;
  using R = typename Tr::R;
  using S = typename Tr::S;
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
  for (; i < count; ++i) {
    auto a = S::load(p[0][i]);
    for (int k = 1; k < n; ++k) a = Op::template apply<S>(a, S::load(p[k][i]));
    dst[i] = S::store(a);
  }
}

template <class Tr>
SHOAL_AVX2 void scale(void* buf, size_t count, int divisor) {
  using E = typename Tr::E;
  using S = typename Tr::S;
  constexpr size_t W = Tr::W;
  E* b = static_cast<E*>(buf);
  const auto ds = static_cast<typename S::A>(divisor);
  const auto d = Tr::set1(ds);
  size_t i = 0;
  for (; i + W <= count; i += W) Tr::store(b + i, Tr::div(Tr::load(b + i), d));
  for (; i < count; ++i) b[i] = S::store(S::load(b[i]) / ds);
}

#include "reduce/simd_table.inc"

}  // namespace

const KernelTable* avx2_kernels() {
  static const KernelTable table = simd_table(SimdLevel::avx2, "avx2");
  return &table;
}

}  // namespace shoal::reduce_impl

#else

namespace shoal::reduce_impl {
const KernelTable* avx2_kernels() { return nullptr; }
}  // namespace shoal::reduce_impl

#endif
