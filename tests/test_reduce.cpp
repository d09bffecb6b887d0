// Reduction kernels and the streaming copy (src/reduce), and the dtype helpers (shoal/types.h).
//
// Every kernel set the CPU can run (scalar, avx2, avx512) is exercised in-process through the
// test-only hook reduce_impl::set_level_for_testing; SHOAL_SIMD itself is checked in child
// processes. With SHOAL_SIMD set (ctest runs the file so with avx2 and with scalar), every test
// runs on that one level instead, selected as the library selects it. Results are compared with a naive reference written here: double / int64 arithmetic
// then converted, with f16/bf16 converted by this file's own (frexp/nearbyint) converter.
// Float inputs are chosen so that f32 accumulation is exact (multiples of a power of two, or
// products of small significands): the kernels' f32 accumulation and the double reference then
// round the same exact value once, and results must match bit for bit.
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "reduce/copy.h"
#include "reduce/half.h"
#include "reduce/kernels.h"
#include "reduce/reduce.h"
#include "shoal/error.h"
#include "shoal/types.h"

extern char** environ;

namespace {

using namespace shoal;
namespace ri = shoal::reduce_impl;

// ---------------------------------------------------------------------------------------------
// Reference f16 / bf16 <-> double, written independently of src/reduce/half.h.

struct HalfFmt {
  int man_bits;   // 10 for f16, 7 for bf16
  int bias;       // 15, 127
  int exp_max;    // all-ones exponent field: 31, 255
};
constexpr HalfFmt kF16{10, 15, 31};
constexpr HalfFmt kBF16{7, 127, 255};

double ref_decode(uint16_t h, HalfFmt f) {
  const bool neg = h & 0x8000;
  const int e = (h >> f.man_bits) & f.exp_max;
  const int m = h & ((1 << f.man_bits) - 1);
  double v;
  if (e == f.exp_max) {
    v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (e == 0) {
    v = std::ldexp(static_cast<double>(m), 1 - f.bias - f.man_bits);
  } else {
    v = std::ldexp(static_cast<double>(m + (1 << f.man_bits)), e - f.bias - f.man_bits);
  }
  return neg ? -v : v;
}

// Round to nearest, ties to even (nearbyint in the default rounding mode), from a double.
uint16_t ref_encode(double x, HalfFmt f) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const uint16_t inf = static_cast<uint16_t>(f.exp_max << f.man_bits);
  if (std::isnan(x)) return static_cast<uint16_t>(inf | (1 << (f.man_bits - 1)));
  const double a = std::fabs(x);
  if (std::isinf(a)) return sign | inf;
  const double one_m = std::ldexp(1.0, f.man_bits);
  if (a < std::ldexp(1.0, 1 - f.bias)) {  // subnormal range: multiples of 2^(1-bias-man)
    const double r = std::nearbyint(std::ldexp(a, f.bias - 1 + f.man_bits));
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(r));  // r == 2^man is the smallest normal
  }
  int e2;
  std::frexp(a, &e2);
  int e = e2 - 1;                                           // a in [2^e, 2^(e+1))
  double r = std::nearbyint(std::ldexp(a, f.man_bits - e));  // in [2^man, 2^(man+1)]
  if (r == 2 * one_m) {
    r = one_m;
    ++e;
  }
  const int field = e + f.bias;
  if (field >= f.exp_max) return sign | inf;
  return static_cast<uint16_t>(sign | (field << f.man_bits) | static_cast<int>(r - one_m));
}

const std::vector<double>& decode_table(DType dt) {
  static const std::vector<double> f16 = [] {
    std::vector<double> t(65536);
    for (int i = 0; i < 65536; ++i) t[i] = ref_decode(static_cast<uint16_t>(i), kF16);
    return t;
  }();
  static const std::vector<double> bf16 = [] {
    std::vector<double> t(65536);
    for (int i = 0; i < 65536; ++i) t[i] = ref_decode(static_cast<uint16_t>(i), kBF16);
    return t;
  }();
  return dt == DType::f16 ? f16 : bf16;
}

bool is_float(DType dt) { return !is_integer(dt); }

// splitmix64: fast, deterministic, good enough for test data (a UniformRandomBitGenerator).
struct Rng {
  using result_type = uint64_t;
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed) {}
  static constexpr uint64_t min() { return 0; }
  static constexpr uint64_t max() { return ~uint64_t{0}; }
  uint64_t operator()() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
};

void random_bytes(uint8_t* p, size_t n, Rng& rng) {
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t r = rng();
    std::memcpy(p + i, &r, std::min<size_t>(8, n - i));
  }
}

// ---------------------------------------------------------------------------------------------
// Buffers of raw elements, decoded to double (floats) or int64 (integers, bool as stored).

using Bytes = std::vector<uint8_t>;

std::vector<double> to_doubles(DType dt, const void* p, size_t count) {
  std::vector<double> out(count);
  switch (dt) {
    case DType::f16:
    case DType::bf16: {
      const auto& t = decode_table(dt);
      const auto* q = static_cast<const uint16_t*>(p);
      for (size_t i = 0; i < count; ++i) out[i] = t[q[i]];
      break;
    }
    case DType::f32: {
      const auto* q = static_cast<const float*>(p);
      for (size_t i = 0; i < count; ++i) out[i] = q[i];
      break;
    }
    case DType::f64: if (count) std::memcpy(out.data(), p, count * 8); break;
    default: ADD_FAILURE() << "not a float dtype";
  }
  return out;
}

void from_doubles(DType dt, const std::vector<double>& v, void* p) {
  const size_t count = v.size();
  switch (dt) {
    case DType::f16:
    case DType::bf16: {
      auto* q = static_cast<uint16_t*>(p);
      const HalfFmt f = dt == DType::f16 ? kF16 : kBF16;
      for (size_t i = 0; i < count; ++i) q[i] = ref_encode(v[i], f);
      break;
    }
    case DType::f32: {
      auto* q = static_cast<float*>(p);
      for (size_t i = 0; i < count; ++i) q[i] = static_cast<float>(v[i]);
      break;
    }
    case DType::f64: if (count) std::memcpy(p, v.data(), count * 8); break;
    default: ADD_FAILURE() << "not a float dtype";
  }
}

std::vector<int64_t> to_ints(DType dt, const void* p, size_t count) {
  std::vector<int64_t> out(count);
  for (size_t i = 0; i < count; ++i) {
    switch (dt) {
      case DType::i8: out[i] = static_cast<const int8_t*>(p)[i]; break;
      case DType::u8:
      case DType::boolean: out[i] = static_cast<const uint8_t*>(p)[i]; break;
      case DType::i32: out[i] = static_cast<const int32_t*>(p)[i]; break;
      case DType::i64: out[i] = static_cast<const int64_t*>(p)[i]; break;
      default: ADD_FAILURE() << "not an integer dtype"; return out;
    }
  }
  return out;
}

void from_ints(DType dt, const std::vector<int64_t>& v, void* p) {  // truncates (two's complement)
  for (size_t i = 0; i < v.size(); ++i) {
    const uint64_t u = static_cast<uint64_t>(v[i]);
    switch (dt) {
      case DType::i8: static_cast<int8_t*>(p)[i] = static_cast<int8_t>(u); break;
      case DType::u8:
      case DType::boolean: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(u); break;
      case DType::i32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(u); break;
      case DType::i64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(u); break;
      default: ADD_FAILURE() << "not an integer dtype"; return;
    }
  }
}

double ref_fop(ReduceOp op, double a, double b) {
  switch (op) {
    case ReduceOp::sum: return a + b;
    case ReduceOp::prod: return a * b;
    case ReduceOp::min: return std::isnan(a) || std::isnan(b) ? std::numeric_limits<double>::quiet_NaN() : (a < b ? a : b);
    case ReduceOp::max: return std::isnan(a) || std::isnan(b) ? std::numeric_limits<double>::quiet_NaN() : (a > b ? a : b);
    default: ADD_FAILURE() << "bad float op"; return 0;
  }
}

int64_t ref_iop(ReduceOp op, int64_t a, int64_t b) {
  const uint64_t ua = static_cast<uint64_t>(a), ub = static_cast<uint64_t>(b);
  switch (op) {
    case ReduceOp::sum: return static_cast<int64_t>(ua + ub);
    case ReduceOp::prod: return static_cast<int64_t>(ua * ub);
    case ReduceOp::min: return std::min(a, b);
    case ReduceOp::max: return std::max(a, b);
    case ReduceOp::band: return static_cast<int64_t>(ua & ub);
    case ReduceOp::bor: return static_cast<int64_t>(ua | ub);
    case ReduceOp::bxor: return static_cast<int64_t>(ua ^ ub);
    default: ADD_FAILURE() << "bad int op"; return 0;
  }
}

int64_t ref_bop(ReduceOp op, int64_t a, int64_t b) {  // a, b already 0/1
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::max:
    case ReduceOp::bor: return a | b;
    case ReduceOp::prod:
    case ReduceOp::min:
    case ReduceOp::band: return a & b;
    case ReduceOp::bxor: return a ^ b;
    default: ADD_FAILURE() << "bad bool op"; return 0;
  }
}

// Reference dst = srcs[0] OP ... OP srcs[n-1], computed in double / int64 then converted.
Bytes reference(DType dt, ReduceOp op, const std::vector<const void*>& srcs, size_t count) {
  Bytes out(count * dtype_size(dt) + 1);
  if (count == 0) return out;
  if (is_float(dt)) {
    std::vector<double> acc = to_doubles(dt, srcs[0], count);
    for (size_t k = 1; k < srcs.size(); ++k) {
      const std::vector<double> x = to_doubles(dt, srcs[k], count);
      for (size_t i = 0; i < count; ++i) acc[i] = ref_fop(op, acc[i], x[i]);
    }
    from_doubles(dt, acc, out.data());
  } else {
    const bool b = dt == DType::boolean;
    std::vector<int64_t> acc = to_ints(dt, srcs[0], count);
    if (b)
      for (auto& v : acc) v = v != 0;
    for (size_t k = 1; k < srcs.size(); ++k) {
      std::vector<int64_t> x = to_ints(dt, srcs[k], count);
      for (size_t i = 0; i < count; ++i) acc[i] = b ? ref_bop(op, acc[i], x[i] != 0) : ref_iop(op, acc[i], x[i]);
    }
    from_ints(dt, acc, out.data());
  }
  return out;
}

std::string describe(DType dt, const void* p, size_t i) {
  if (is_float(dt)) return std::to_string(to_doubles(dt, static_cast<const uint8_t*>(p) + i * dtype_size(dt), 1)[0]);
  return std::to_string(to_ints(dt, static_cast<const uint8_t*>(p) + i * dtype_size(dt), 1)[0]);
}

// "" when equal bit for bit (NaN matching any NaN), else a description of the first difference.
std::string compare(DType dt, const void* got, const void* want, size_t count) {
  const size_t es = dtype_size(dt);
  if (std::memcmp(got, want, count * es) == 0) return "";
  for (size_t i = 0; i < count; ++i) {
    const auto* g = static_cast<const uint8_t*>(got) + i * es;
    const auto* w = static_cast<const uint8_t*>(want) + i * es;
    if (std::memcmp(g, w, es) == 0) continue;
    if (is_float(dt) && std::isnan(to_doubles(dt, g, 1)[0]) && std::isnan(to_doubles(dt, w, 1)[0])) continue;
    return "element " + std::to_string(i) + " of " + std::to_string(count) + ": got " + describe(dt, got, i) +
           ", want " + describe(dt, want, i);
  }
  return "";
}

// Raw bytes for `count` elements of dt whose reductions by `op` are exact in f32 (see top).
Bytes gen_inputs(DType dt, ReduceOp op, size_t count, Rng& rng) {
  Bytes out(count * dtype_size(dt) + 1);
  if (is_float(dt)) {
    std::vector<double> v(count);
    for (auto& x : v) {
      if (op == ReduceOp::sum) {
        switch (dt) {
          case DType::f16: x = std::ldexp(static_cast<double>(static_cast<int64_t>(rng() % 2049) - 1024), -8); break;
          case DType::bf16: x = std::ldexp(static_cast<double>(static_cast<int64_t>(rng() % 257) - 128), -4); break;
          case DType::f32: x = std::ldexp(static_cast<double>(static_cast<int64_t>(rng() % 2097153) - 1048576), -10); break;
          default: x = std::uniform_real_distribution<double>(-1e3, 1e3)(rng); break;  // f64: same order as the kernels
        }
      } else if (op == ReduceOp::prod) {
        static constexpr double kSig[] = {0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0};
        x = dt == DType::f64 ? std::uniform_real_distribution<double>(0.5, 2.0)(rng) : kSig[rng() % 7];
        if (rng() & 1) x = -x;
      } else {  // min / max: anything but NaN, infinities included
        const uint64_t r = rng() % 64;
        x = r == 0 ? std::numeric_limits<double>::infinity()
            : r == 1 ? -std::numeric_limits<double>::infinity()
                     : std::uniform_real_distribution<double>(-100.0, 100.0)(rng);
      }
    }
    from_doubles(dt, v, out.data());
  } else if (dt == DType::boolean) {
    for (size_t i = 0; i < count; ++i) out[i] = rng() & 1;
  } else {
    random_bytes(out.data(), out.size(), rng);
  }
  return out;
}

std::vector<ReduceOp> kernel_ops(DType dt) {
  std::vector<ReduceOp> ops;
  for (ReduceOp op : kAllReduceOps)
    if (op != ReduceOp::avg && reduce_op_supported(dt, op)) ops.push_back(op);
  return ops;
}

// SHOAL_SIMD when set to a level (ctest's simd_avx2.* and simd_scalar.* runs of this file), else null.
const char* simd_env() {
  const char* v = std::getenv("SHOAL_SIMD");
  return v && *v && std::strcmp(v, "auto") != 0 ? v : nullptr;
}

// The kernel sets to test: every one this CPU runs; under SHOAL_SIMD only the one it selects, as
// the library selects it (from the environment, not the test hook), so the whole file runs on it.
std::vector<ri::SimdLevel> levels() {
  if (simd_env()) return {ri::current_level()};
  std::vector<ri::SimdLevel> out;
  for (ri::SimdLevel l : {ri::SimdLevel::scalar, ri::SimdLevel::avx2, ri::SimdLevel::avx512})
    if (static_cast<int>(l) <= static_cast<int>(ri::cpu_max_level())) out.push_back(l);
  return out;
}

// Selects one kernel set for the enclosing scope; puts back the one in use before afterwards.
class UseLevel {
 public:
  explicit UseLevel(ri::SimdLevel l) : before_(ri::current_level()) {
    EXPECT_TRUE(ri::set_level_for_testing(l));
    EXPECT_STREQ(simd_level(), ri::level_name(l));
  }
  ~UseLevel() { ri::set_level_for_testing(before_); }

 private:
  ri::SimdLevel before_;
};

// A buffer whose payload starts `offset` elements after a 64-byte boundary, with guard bytes
// before and after it that the kernels must not touch.
class Guarded {
 public:
  static constexpr uint8_t kGuard = 0xA5;
  static constexpr size_t kGuardBytes = 64;
  Guarded(DType dt, size_t count, size_t offset) : es_(dtype_size(dt)), count_(count) {
    storage_.assign(64 + kGuardBytes + (offset + count) * es_ + kGuardBytes, kGuard);
    const auto base = reinterpret_cast<uintptr_t>(storage_.data()) + kGuardBytes;
    data_ = reinterpret_cast<uint8_t*>((base + 63) & ~uintptr_t{63}) + offset * es_;
  }
  uint8_t* data() { return data_; }
  void fill(const Bytes& b) { std::memcpy(data_, b.data(), count_ * es_); }
  bool guards_intact() const {
    const uint8_t* end = data_ + count_ * es_;
    for (const uint8_t* p = storage_.data(); p < data_; ++p)
      if (*p != kGuard) return false;
    for (const uint8_t* p = end; p < storage_.data() + storage_.size(); ++p)
      if (*p != kGuard) return false;
    return true;
  }

 private:
  size_t es_, count_;
  Bytes storage_;
  uint8_t* data_;
};

constexpr size_t kCounts[] = {0, 1, 7, 15, 16, 17, 63, 4097, 100003};

std::string where(ri::SimdLevel l, DType dt, ReduceOp op, size_t count) {
  return std::string("level ") + ri::level_name(l) + ", " + dtype_name(dt) + " " + reduce_op_name(op) +
         ", count " + std::to_string(count);
}

// ---------------------------------------------------------------------------------------------
// dtype helpers

TEST(DTypes, SizesNamesAndParsing) {
  const std::pair<DType, size_t> sizes[] = {{DType::f16, 2}, {DType::bf16, 2}, {DType::f32, 4},
                                            {DType::f64, 8}, {DType::i8, 1},   {DType::u8, 1},
                                            {DType::i32, 4}, {DType::i64, 8},  {DType::boolean, 1}};
  for (auto [dt, size] : sizes) {
    EXPECT_EQ(dtype_size(dt), size) << dtype_name(dt);
    EXPECT_EQ(parse_dtype(dtype_name(dt)), dt);
  }
  const char* names[] = {"f16", "bf16", "f32", "f64", "i8", "u8", "i32", "i64", "bool"};
  for (size_t i = 0; i < 9; ++i) EXPECT_STREQ(dtype_name(kAllDTypes[i]), names[i]);
  const std::pair<const char*, DType> aliases[] = {
      {"float32", DType::f32}, {"float", DType::f32}, {"float16", DType::f16}, {"bfloat16", DType::bf16},
      {"float64", DType::f64}, {"double", DType::f64}, {"int8", DType::i8},    {"uint8", DType::u8},
      {"int32", DType::i32},   {"int64", DType::i64}};
  for (auto [s, dt] : aliases) EXPECT_EQ(parse_dtype(s), dt) << s;
  for (const char* bad : {"", "f17", "F32", "int16", "f32 "}) EXPECT_THROW(parse_dtype(bad), InvalidArgument) << bad;

  const char* ops[] = {"sum", "prod", "min", "max", "avg", "band", "bor", "bxor"};
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_STREQ(reduce_op_name(kAllReduceOps[i]), ops[i]);
    EXPECT_EQ(parse_reduce_op(ops[i]), kAllReduceOps[i]);
  }
  for (const char* bad : {"", "add", "SUM", "and", "mean"}) EXPECT_THROW(parse_reduce_op(bad), InvalidArgument) << bad;

  EXPECT_THROW(dtype_size(static_cast<DType>(42)), InvalidArgument);
  EXPECT_THROW(dtype_name(static_cast<DType>(42)), InvalidArgument);
  EXPECT_THROW(reduce_op_name(static_cast<ReduceOp>(42)), InvalidArgument);
}

TEST(DTypes, IntegerAndSupportedOps) {
  for (DType dt : kAllDTypes) {
    const bool flt = dt == DType::f16 || dt == DType::bf16 || dt == DType::f32 || dt == DType::f64;
    EXPECT_EQ(is_integer(dt), !flt) << dtype_name(dt);
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max})
      EXPECT_TRUE(reduce_op_supported(dt, op)) << dtype_name(dt) << " " << reduce_op_name(op);
    for (ReduceOp op : {ReduceOp::band, ReduceOp::bor, ReduceOp::bxor})
      EXPECT_EQ(reduce_op_supported(dt, op), !flt) << dtype_name(dt) << " " << reduce_op_name(op);
    EXPECT_EQ(reduce_op_supported(dt, ReduceOp::avg), dt != DType::boolean) << dtype_name(dt);
    EXPECT_FALSE(reduce_op_supported(dt, static_cast<ReduceOp>(42)));
  }
  EXPECT_FALSE(reduce_op_supported(static_cast<DType>(42), ReduceOp::sum));
}

// ---------------------------------------------------------------------------------------------
// Level selection

TEST(ReduceKernelLevels, EveryAvailableLevelIsSelectable) {
  const auto ls = levels();
  std::string names;
  for (auto l : ls) {
    UseLevel use(l);
    names += std::string(" ") + simd_level();
    EXPECT_EQ(ri::current_level(), l);
  }
  std::printf("kernel sets exercised by these tests:%s (cpu supports up to %s)\n", names.c_str(),
              ri::level_name(ri::cpu_max_level()));
  if (ri::cpu_max_level() != ri::SimdLevel::avx512) {
    EXPECT_FALSE(ri::set_level_for_testing(ri::SimdLevel::avx512));
  }
}

TEST(ReduceKernelLevels, SimdEnvSelectsLevelInUse) {
  const char* v = simd_env();
  if (!v) GTEST_SKIP() << "SHOAL_SIMD is not set";
  const ri::SimdLevel want = ri::level_for_env(v, ri::cpu_max_level());
  EXPECT_EQ(ri::current_level(), want) << "SHOAL_SIMD=" << v;
  EXPECT_STREQ(simd_level(), ri::level_name(want));
  if (want != ri::level_for_env(v, ri::SimdLevel::avx512))
    std::printf("SHOAL_SIMD=%s: this CPU runs at most %s; testing that\n", v, ri::level_name(want));
}

TEST(ReduceKernelLevels, EnvValueParsingClampsToCpu) {
  using L = ri::SimdLevel;
  bool ok = false;
  EXPECT_EQ(ri::level_for_env(nullptr, L::avx512, &ok), L::avx512);
  EXPECT_TRUE(ok);
  EXPECT_EQ(ri::level_for_env("", L::avx2, &ok), L::avx2);
  EXPECT_EQ(ri::level_for_env("auto", L::avx2, &ok), L::avx2);
  EXPECT_EQ(ri::level_for_env("scalar", L::avx512, &ok), L::scalar);
  EXPECT_EQ(ri::level_for_env("avx2", L::avx512, &ok), L::avx2);
  EXPECT_EQ(ri::level_for_env("avx512", L::avx512, &ok), L::avx512);
  EXPECT_EQ(ri::level_for_env("avx512", L::avx2, &ok), L::avx2);
  EXPECT_EQ(ri::level_for_env("avx2", L::scalar, &ok), L::scalar);
  EXPECT_TRUE(ok);
  EXPECT_EQ(ri::level_for_env("sse9", L::avx2, &ok), L::avx2);
  EXPECT_FALSE(ok);
}

// Child side of SimdEnvForcesLevel: only does something when spawned by it.
TEST(ReduceKernelLevels, ChildReportsLevel) {
  if (!std::getenv("SHOAL_REDUCE_TEST_CHILD")) GTEST_SKIP() << "runs only as a child of SimdEnvForcesLevel";
  float a[37], b[37];
  for (int i = 0; i < 37; ++i) a[i] = static_cast<float>(i), b[i] = 1.0f;
  reduce_inplace(a, b, 37, DType::f32, ReduceOp::sum);
  for (int i = 0; i < 37; ++i) ASSERT_EQ(a[i], static_cast<float>(i + 1));
  std::printf("SHOAL_TEST_SIMD_LEVEL=%s\n", simd_level());
  std::fflush(stdout);
}

// Runs ChildReportsLevel in a child with SHOAL_SIMD=value (unset when null) and warnings logged.
// Returns the level it reports and whether it warned about SHOAL_SIMD, or the failure.
struct ChildLevel {
  std::string level, error;
  bool warned = false;
};

ChildLevel run_child_with_simd(const char* value) {
  ChildLevel r;
  int fds[2];
  if (pipe(fds) != 0) return {"", "pipe failed"};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  std::vector<std::string> env_store;
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, "SHOAL_SIMD=", 11) != 0 && std::strncmp(*e, "SHOAL_LOG=", 10) != 0 &&
        std::strncmp(*e, "GTEST_", 6) != 0)
      env_store.emplace_back(*e);
  if (value) env_store.push_back(std::string("SHOAL_SIMD=") + value);
  env_store.push_back("SHOAL_REDUCE_TEST_CHILD=1");
  env_store.push_back("SHOAL_LOG=warn");
  std::vector<char*> envp;
  for (auto& s : env_store) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string exe = "/proc/self/exe", filter = "--gtest_filter=ReduceKernelLevels.ChildReportsLevel";
  char* argv[] = {exe.data(), filter.data(), nullptr};
  pid_t pid;
  const int rc = posix_spawn(&pid, "/proc/self/exe", &fa, nullptr, argv, envp.data());
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    return {"", "spawn failed"};
  }
  std::string out;
  char buf[4096];
  ssize_t got;
  while ((got = read(fds[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(got));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return {"", "child failed: " + out};
  const std::string key = "SHOAL_TEST_SIMD_LEVEL=";
  const size_t at = out.find(key);
  if (at == std::string::npos) return {"", "no level in child output: " + out};
  r.level = out.substr(at + key.size(), out.find('\n', at) - at - key.size());
  r.warned = out.find("warn: SHOAL_SIMD") != std::string::npos;
  return r;
}

// The level SHOAL_SIMD asks for, clamped to the CPU; a warning exactly when the value is not a
// level or asks for more than the CPU has (never when it is unset, empty or "auto").
TEST(ReduceKernelLevels, SimdEnvForcesLevel) {
  const ri::SimdLevel cpu = ri::cpu_max_level();
  for (const char* v : {static_cast<const char*>(nullptr), "", "scalar", "avx2", "avx512", "auto", "bogus"}) {
    const std::string name = v ? std::string("SHOAL_SIMD=") + v : "SHOAL_SIMD unset";
    const ChildLevel got = run_child_with_simd(v);
    ASSERT_EQ(got.error, "") << name;
    EXPECT_EQ(got.level, ri::level_name(ri::level_for_env(v, cpu))) << name;
    bool recognised = true;
    const bool clamped = ri::level_for_env(v, cpu, &recognised) != ri::level_for_env(v, ri::SimdLevel::avx512);
    const bool want_warning = v && *v && std::strcmp(v, "auto") != 0 && (!recognised || clamped);
    EXPECT_EQ(got.warned, want_warning) << name;
  }
}

// ---------------------------------------------------------------------------------------------
// Argument checking

TEST(ReduceKernels, UnsupportedCombinationsThrow) {
  for (auto l : levels()) {
    UseLevel use(l);
    for (DType dt : kAllDTypes) {
      for (ReduceOp op : kAllReduceOps) {
        alignas(64) uint8_t a[256] = {}, b[256] = {};
        const void* srcs[3] = {a, b, b};
        if (op != ReduceOp::avg && reduce_op_supported(dt, op)) {
          EXPECT_NO_THROW(reduce_inplace(a, b, 16, dt, op));
          EXPECT_NO_THROW(reduce_many(a, srcs, 3, 16, dt, op));
          continue;
        }
        for (size_t count : {size_t{0}, size_t{16}}) {
          EXPECT_THROW(reduce_inplace(a, b, count, dt, op), InvalidArgument) << dtype_name(dt) << " " << reduce_op_name(op);
          EXPECT_THROW(reduce_many(a, srcs, 3, count, dt, op), InvalidArgument) << dtype_name(dt) << " " << reduce_op_name(op);
        }
      }
    }
    float x[4] = {};
    const void* one[1] = {x};
    const void* with_null[2] = {x, nullptr};
    EXPECT_THROW(reduce_inplace(x, x, 4, static_cast<DType>(42), ReduceOp::sum), InvalidArgument);
    EXPECT_THROW(reduce_inplace(x, x, 4, DType::f32, static_cast<ReduceOp>(42)), InvalidArgument);
    EXPECT_THROW(reduce_inplace(nullptr, x, 4, DType::f32, ReduceOp::sum), InvalidArgument);
    EXPECT_THROW(reduce_inplace(x, nullptr, 4, DType::f32, ReduceOp::sum), InvalidArgument);
    EXPECT_NO_THROW(reduce_inplace(nullptr, nullptr, 0, DType::f32, ReduceOp::sum));
    EXPECT_THROW(reduce_many(x, one, 0, 4, DType::f32, ReduceOp::sum), InvalidArgument);
    EXPECT_THROW(reduce_many(x, nullptr, 1, 4, DType::f32, ReduceOp::sum), InvalidArgument);
    EXPECT_THROW(reduce_many(x, with_null, 2, 4, DType::f32, ReduceOp::sum), InvalidArgument);
    EXPECT_THROW(reduce_many(nullptr, one, 1, 4, DType::f32, ReduceOp::sum), InvalidArgument);
    EXPECT_THROW(scale_avg(x, 4, DType::boolean, 2), InvalidArgument);
    EXPECT_THROW(scale_avg(x, 4, static_cast<DType>(42), 2), InvalidArgument);
    EXPECT_THROW(scale_avg(x, 4, DType::f32, 0), InvalidArgument);
    EXPECT_THROW(scale_avg(x, 4, DType::f32, -3), InvalidArgument);
    EXPECT_THROW(scale_avg(nullptr, 4, DType::f32, 2), InvalidArgument);
    try {
      reduce_inplace(x, x, 4, DType::f32, ReduceOp::bxor);
      ADD_FAILURE() << "no throw";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("bxor"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("f32"), std::string::npos) << e.what();
    }
  }
}

// ---------------------------------------------------------------------------------------------
// reduce_inplace: every dtype x supported op x count x alignment x level

TEST(ReduceKernels, InplaceMatchesReference) {
  Rng rng(12345);
  const auto ls = levels();
  for (DType dt : kAllDTypes) {
    for (ReduceOp op : kernel_ops(dt)) {
      for (size_t count : kCounts) {
        const Bytes a = gen_inputs(dt, op, count, rng), b = gen_inputs(dt, op, count, rng);
        const Bytes want = reference(dt, op, {a.data(), b.data()}, count);
        for (auto l : ls) {
          UseLevel use(l);
          for (size_t offset : {0, 1}) {
            Guarded d(dt, count, offset), s(dt, count, offset);
            d.fill(a);
            s.fill(b);
            reduce_inplace(d.data(), s.data(), count, dt, op);
            const std::string diff = compare(dt, d.data(), want.data(), count);
            ASSERT_EQ(diff, "") << where(l, dt, op, count) << ", offset " << offset;
            ASSERT_TRUE(d.guards_intact() && s.guards_intact()) << where(l, dt, op, count) << ", offset " << offset;
            ASSERT_EQ(std::memcmp(s.data(), b.data(), count * dtype_size(dt)), 0) << "src modified";
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// reduce_many: n = 1..8, separate dst (odd alignment) and dst aliasing srcs[0]; sources at
// alternating alignments.

TEST(ReduceKernels, ManyMatchesReference) {
  Rng rng(777);
  const auto ls = levels();
  for (DType dt : kAllDTypes) {
    for (ReduceOp op : kernel_ops(dt)) {
      for (int n = 1; n <= 8; ++n) {
        for (size_t count : kCounts) {
          if (count == 100003 && n != 1 && n != 4 && n != 8) continue;  // keep the run short
          std::vector<Bytes> in;
          std::vector<const void*> ptrs;
          for (int k = 0; k < n; ++k) in.push_back(gen_inputs(dt, op, count, rng));
          for (auto& v : in) ptrs.push_back(v.data());
          const Bytes want = reference(dt, op, ptrs, count);
          for (auto l : ls) {
            UseLevel use(l);
            for (bool alias : {false, true}) {
              std::vector<Guarded> bufs;
              for (int k = 0; k < n; ++k) bufs.emplace_back(dt, count, static_cast<size_t>(k % 2));
              std::vector<const void*> srcs;
              for (int k = 0; k < n; ++k) {
                bufs[k].fill(in[k]);
                srcs.push_back(bufs[k].data());
              }
              Guarded sep(dt, count, 1);
              void* dst = alias ? bufs[0].data() : sep.data();
              reduce_many(dst, srcs.data(), n, count, dt, op);
              const std::string w = where(l, dt, op, count) + ", n " + std::to_string(n) + (alias ? ", aliased" : "");
              ASSERT_EQ(compare(dt, dst, want.data(), count), "") << w;
              for (int k = 0; k < n; ++k) {
                ASSERT_TRUE(bufs[k].guards_intact()) << w;
                if (k > 0 || !alias) {
                  ASSERT_EQ(std::memcmp(bufs[k].data(), in[k].data(), count * dtype_size(dt)), 0) << w << ", src modified";
                }
              }
              ASSERT_TRUE(sep.guards_intact()) << w;
            }
          }
        }
      }
    }
  }
}

TEST(ReduceKernels, ManyWithManySources) {  // more sources than the kernels keep on the stack
  const int n = 40;
  const size_t count = 1000;
  std::vector<std::vector<int32_t>> in(n, std::vector<int32_t>(count));
  std::vector<const void*> srcs;
  for (int k = 0; k < n; ++k) {
    for (size_t i = 0; i < count; ++i) in[k][i] = static_cast<int32_t>(k * 1000 + i);
    srcs.push_back(in[k].data());
  }
  for (auto l : levels()) {
    UseLevel use(l);
    std::vector<int32_t> dst(count);
    reduce_many(dst.data(), srcs.data(), n, count, DType::i32, ReduceOp::sum);
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(dst[i], static_cast<int32_t>(1000 * (n * (n - 1) / 2) + n * i)) << i;
    reduce_many(dst.data(), srcs.data(), n, count, DType::i32, ReduceOp::max);
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(dst[i], static_cast<int32_t>((n - 1) * 1000 + i)) << i;
  }
}

// Buffers that end exactly at an inaccessible page: a kernel reading or writing one element past
// the end crashes the test.
class PageEnd {
 public:
  PageEnd() {
    page_ = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    void* m = mmap(nullptr, 2 * page_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(m, MAP_FAILED);
    base_ = static_cast<uint8_t*>(m);
    EXPECT_EQ(mprotect(base_ + page_, page_, PROT_NONE), 0);
  }
  ~PageEnd() { munmap(base_, 2 * page_); }
  uint8_t* last(size_t bytes) { return base_ + page_ - bytes; }  // `bytes` ending at the guard page

 private:
  size_t page_;
  uint8_t* base_;
};

// copy_streaming (large outputs of the shm algorithms): non-temporal stores from the avx2 level,
// memcpy below it; every length around the 4 KiB cut-over, the 128-byte blocks and the 32-byte
// aligned head, at every destination alignment within a cache line.
TEST(CopyStreaming, CopiesExactlyAtEveryLevel) {
  Rng rng(23);
  const size_t lengths[] = {0, 1, 31, 4095, 4096, 4097, 4096 + 127, 4096 + 160, 65536 + 33, (size_t(1) << 20) + 5};
  for (auto l : levels()) {
    UseLevel use(l);
    for (size_t n : lengths) {
      Bytes src(n + 64);
      random_bytes(src.data(), src.size(), rng);
      for (size_t dst_off : {size_t(0), size_t(1), size_t(17), size_t(32), size_t(63)}) {
        Guarded dst(DType::u8, n, dst_off);
        const uint8_t* from = src.data() + (dst_off * 7) % 64;  // the source misaligned too
        copy_streaming(dst.data(), from, n);
        ASSERT_EQ(std::memcmp(dst.data(), from, n), 0) << ri::level_name(l) << ", " << n << " bytes, offset " << dst_off;
        ASSERT_TRUE(dst.guards_intact()) << ri::level_name(l) << ", " << n << " bytes, offset " << dst_off;
      }
    }
  }
}

// copy_bytes (every ordinary copy of the shm paths): the vector loop where the destination lies
// 1-15 bytes past the source modulo a page, memmove elsewhere. Every length around the cuts
// (kShortDistanceFrom, kShortDistanceUntil), every distance in a page's first line and a few past
// it, destinations at several alignments, every level, against the source; the vector loop's
// shortest lengths through copy_short_distance itself; and overlapping ranges at short page
// distances both ways, which must copy as memmove does.
TEST(CopyBytes, CopiesExactlyAtEveryDistanceInAPage) {
  Rng rng(29);
  const size_t lengths[] = {0, 1, 2047, 2048, 2049, 4096 + 7, 65536 + 33,
                            (size_t(1) << 20) - 1, size_t(1) << 20, (size_t(1) << 20) + 5};
  std::vector<size_t> distances;
  for (size_t d = 0; d <= 64; ++d) distances.push_back(d);
  for (size_t d : {100, 2048, 4032, 4095}) distances.push_back(d);
  for (auto l : levels()) {
    UseLevel use(l);
    for (size_t n : lengths) {
      const size_t span = (n + 8192 + 4095) / 4096 * 4096;  // aligned_alloc takes whole pages
      std::unique_ptr<uint8_t, decltype(&std::free)> src_page(static_cast<uint8_t*>(std::aligned_alloc(4096, span)), &std::free);
      ASSERT_NE(src_page, nullptr);
      random_bytes(src_page.get(), span, rng);
      for (size_t d : distances) {
        for (size_t dst_off : {size_t(0), size_t(17), size_t(32)}) {
          Guarded dst(DType::u8, n, dst_off);
          const uint8_t* from = src_page.get() + ((reinterpret_cast<uintptr_t>(dst.data()) - d) & 4095);
          ASSERT_EQ(short_page_distance(dst.data(), from), d >= 1 && d <= 15) << d;
          copy_bytes(dst.data(), from, n);
          ASSERT_EQ(std::memcmp(dst.data(), from, n), 0) << ri::level_name(l) << ", " << n << " bytes, distance " << d << ", offset " << dst_off;
          ASSERT_TRUE(dst.guards_intact()) << ri::level_name(l) << ", " << n << " bytes, distance " << d << ", offset " << dst_off;
        }
      }
    }
    for (size_t n : {size_t(64), size_t(65), size_t(95), size_t(127), size_t(128), size_t(161)}) {
      Bytes src(n + 64);
      random_bytes(src.data(), src.size(), rng);
      for (size_t dst_off = 0; dst_off < 64; ++dst_off) {
        Guarded dst(DType::u8, n, dst_off);
        copy_short_distance(dst.data(), src.data() + 5, n);
        ASSERT_EQ(std::memcmp(dst.data(), src.data() + 5, n), 0) << ri::level_name(l) << ", " << n << " bytes, offset " << dst_off;
        ASSERT_TRUE(dst.guards_intact()) << ri::level_name(l) << ", " << n << " bytes, offset " << dst_off;
      }
    }
    for (size_t n : {size_t(5000), size_t(70000)}) {
      for (size_t d = 1; d <= 15; ++d) {
        for (size_t apart : {d, 4096 + d}) {  // dst this far past src: overlapping, a short page distance
          Bytes buf(n + 4200), want;
          random_bytes(buf.data(), buf.size(), rng);
          want = buf;
          std::memmove(want.data() + apart, want.data(), n);
          copy_bytes(buf.data() + apart, buf.data(), n);
          ASSERT_EQ(buf, want) << ri::level_name(l) << ", " << n << " bytes, " << apart << " forward";
          const size_t back = 4096 - d;  // src this far past dst: dst - src is d modulo a page
          std::memmove(want.data(), want.data() + back, n);
          copy_bytes(buf.data(), buf.data() + back, n);
          ASSERT_EQ(buf, want) << ri::level_name(l) << ", " << n << " bytes, " << back << " back";
        }
      }
    }
  }
}

TEST(ReduceKernels, NothingTouchedPastTheEnd) {
  PageEnd a, b, c, d;
  Rng rng(17);
  for (auto l : levels()) {
    UseLevel use(l);
    for (DType dt : kAllDTypes) {
      const size_t es = dtype_size(dt);
      for (ReduceOp op : kernel_ops(dt)) {
        for (size_t count = 1; count <= 200; count += (count < 70 ? 1 : 13)) {
          uint8_t* pa = a.last(count * es);
          uint8_t* pb = b.last(count * es);
          uint8_t* pc = c.last(count * es);
          uint8_t* pd = d.last(count * es);
          const Bytes x = gen_inputs(dt, op, count, rng), y = gen_inputs(dt, op, count, rng), z = gen_inputs(dt, op, count, rng);
          std::memcpy(pa, x.data(), count * es);
          std::memcpy(pb, y.data(), count * es);
          std::memcpy(pc, z.data(), count * es);
          const void* srcs[3] = {pa, pb, pc};
          reduce_many(pd, srcs, 3, count, dt, op);
          ASSERT_EQ(compare(dt, pd, reference(dt, op, {x.data(), y.data(), z.data()}, count).data(), count), "")
              << where(l, dt, op, count);
          reduce_inplace(pa, pb, count, dt, op);
          ASSERT_EQ(compare(dt, pa, reference(dt, op, {x.data(), y.data()}, count).data(), count), "")
              << where(l, dt, op, count);
          if (op == ReduceOp::sum && reduce_op_supported(dt, ReduceOp::avg)) scale_avg(pa, count, dt, 3);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// f16 / bf16: every bit pattern (NaN and infinities included) against a random partner. With two
// operands the f32 result rounded once is the correctly rounded result, so bits must match.

TEST(ReduceKernels, HalfAllBitPatterns) {
  Rng rng(99);
  for (DType dt : {DType::f16, DType::bf16}) {
    const HalfFmt f = dt == DType::f16 ? kF16 : kBF16;
    const size_t count = 65536;
    std::vector<uint16_t> a(count);
    for (size_t i = 0; i < count; ++i) a[i] = static_cast<uint16_t>(i);
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max}) {
      std::vector<uint16_t> b(count);
      for (auto& x : b) {
        if (op == ReduceOp::prod && dt == DType::bf16) {  // keep products out of f32's subnormals
          x = ref_encode(std::uniform_real_distribution<double>(0.5, 2.0)(rng) * (rng() & 1 ? -1 : 1), f);
        } else {
          do x = static_cast<uint16_t>(rng()); while (std::isnan(ref_decode(x, f)));
        }
      }
      const Bytes want = reference(dt, op, {a.data(), b.data()}, count);
      for (auto l : levels()) {
        UseLevel use(l);
        std::vector<uint16_t> d = a;
        reduce_inplace(d.data(), b.data(), count, dt, op);
        ASSERT_EQ(compare(dt, d.data(), want.data(), count), "") << where(l, dt, op, count);
        d = b;  // NaN in the second operand too
        reduce_inplace(d.data(), a.data(), count, dt, op);
        const Bytes want2 = reference(dt, op, {b.data(), a.data()}, count);
        ASSERT_EQ(compare(dt, d.data(), want2.data(), count), "") << where(l, dt, op, count) << " (swapped)";
      }
    }
  }
}

TEST(ReduceKernels, HalfRoundingTiesAndOverflow) {
  struct Case {
    DType dt;
    double a, b, want;  // want < 0 marks infinity
  };
  const Case cases[] = {
      {DType::f16, 1.0, 0x1p-11, 1.0},                             // tie -> even (down)
      {DType::f16, 1.0 + 0x1p-10, 0x1p-11, 1.0 + 0x1p-9},          // tie -> even (up)
      {DType::f16, 1.0, 0x1p-11 + 0x1p-20, 1.0 + 0x1p-10},         // above the tie
      {DType::f16, 65504.0, 8.0, 65504.0},                         // below half an ulp
      {DType::f16, 65504.0, 16.0, -1},                             // max + half ulp: ties to even = inf
      {DType::f16, 65504.0, 32.0, -1},                             // overflow
      {DType::f16, 0x1p-24, 0x1p-24, 0x1p-23},                     // subnormals
      {DType::bf16, 1.0, 0x1p-8, 1.0},                             // tie -> even (down)
      {DType::bf16, 1.0 + 0x1p-7, 0x1p-8, 1.0 + 0x1p-6},           // tie -> even (up)
      {DType::bf16, 0x1.fep127, 0x1p119, -1},                      // max + half ulp = inf
  };
  for (auto l : levels()) {
    UseLevel use(l);
    for (const Case& c : cases) {
      const HalfFmt f = c.dt == DType::f16 ? kF16 : kBF16;
      for (size_t count : {size_t{1}, size_t{40}}) {  // tail path and vector path
        std::vector<uint16_t> a(count, ref_encode(c.a, f)), b(count, ref_encode(c.b, f));
        ASSERT_EQ(ref_decode(a[0], f), c.a);
        ASSERT_EQ(ref_decode(b[0], f), c.b);
        reduce_inplace(a.data(), b.data(), count, c.dt, ReduceOp::sum);
        const double got = ref_decode(a[count - 1], f);
        if (c.want < 0) {
          EXPECT_TRUE(std::isinf(got)) << ri::level_name(l) << " " << c.a << " + " << c.b << " = " << got;
        } else {
          EXPECT_EQ(got, c.want) << ri::level_name(l) << " " << c.a << " + " << c.b;
        }
      }
    }
  }
}

// The scalar converters in half.h against the reference ones: every f16/bf16 -> f32, and
// f32 -> f16/bf16 over special values and many random floats.
TEST(ReduceKernels, HalfConvertersMatchReference) {
  for (int i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const double r16 = ref_decode(h, kF16), rb = ref_decode(h, kBF16);
    if (std::isnan(r16)) EXPECT_TRUE(std::isnan(half::f16_to_f32(h)));
    else EXPECT_EQ(half::f16_to_f32(h), r16) << i;
    if (std::isnan(rb)) EXPECT_TRUE(std::isnan(half::bf16_to_f32(h)));
    else EXPECT_EQ(half::bf16_to_f32(h), rb) << i;
  }
  Rng rng(5);
  std::vector<float> fs = {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, 1e-8f, 2.98e-8f, 0x1p-25f, 0x1.8p-25f,
                           0x1p-14f, 0x1.ffcp-15f, std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::max(),
                           std::numeric_limits<float>::denorm_min(), 0x1.fep127f, 0x1.ffp127f};
  for (int i = 0; i < 200000; ++i) fs.push_back(std::bit_cast<float>(static_cast<uint32_t>(rng())));
  for (int i = 0; i < 200000; ++i) fs.push_back(std::ldexp(std::uniform_real_distribution<float>(-2, 2)(rng), static_cast<int>(rng() % 50) - 30));
  for (float x : fs) {
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(ref_decode(half::f32_to_f16(x), kF16)));
      EXPECT_TRUE(std::isnan(ref_decode(half::f32_to_bf16(x), kBF16)));
      continue;
    }
    ASSERT_EQ(half::f32_to_f16(x), ref_encode(x, kF16)) << x;
    ASSERT_EQ(half::f32_to_bf16(x), ref_encode(x, kBF16)) << x;
  }
}

// ---------------------------------------------------------------------------------------------
// NaN propagation, on any operand position, for min/max (and sum/prod).

TEST(ReduceKernels, MinMaxPropagateNaN) {
  Rng rng(31);
  for (DType dt : {DType::f16, DType::bf16, DType::f32, DType::f64}) {
    for (ReduceOp op : {ReduceOp::min, ReduceOp::max, ReduceOp::sum, ReduceOp::prod}) {
      for (int n : {2, 3, 5}) {
        const size_t count = 203;
        std::vector<Bytes> in;
        std::vector<const void*> ptrs;
        for (int k = 0; k < n; ++k) {
          std::vector<double> v(count);
          for (auto& x : v) {  // small values: exact in f32 whatever the op (see the top of the file)
            x = op == ReduceOp::prod ? 0.25 * static_cast<double>(rng() % 9) : static_cast<double>(static_cast<int>(rng() % 200) - 100);
            if (rng() % 5 == 0) x = std::numeric_limits<double>::quiet_NaN();
          }
          Bytes b(count * dtype_size(dt));
          from_doubles(dt, v, b.data());
          in.push_back(std::move(b));
        }
        for (auto& b : in) ptrs.push_back(b.data());
        const Bytes want = reference(dt, op, ptrs, count);
        for (auto l : levels()) {
          UseLevel use(l);
          Bytes dst(count * dtype_size(dt));
          reduce_many(dst.data(), ptrs.data(), n, count, dt, op);
          std::vector<double> got = to_doubles(dt, dst.data(), count);
          for (size_t i = 0; i < count; ++i) {
            bool any_nan = false;
            for (int k = 0; k < n; ++k) any_nan |= std::isnan(to_doubles(dt, static_cast<const uint8_t*>(ptrs[k]) + i * dtype_size(dt), 1)[0]);
            ASSERT_EQ(std::isnan(got[i]), any_nan) << where(l, dt, op, count) << ", n " << n << ", element " << i;
          }
          ASSERT_EQ(compare(dt, dst.data(), want.data(), count), "") << where(l, dt, op, count) << ", n " << n;
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Integers wrap around (two's complement); bool results stay 0/1.

template <class T>
void check_int_case(DType dt, ReduceOp op, T a, T b, T want) {
  for (auto l : levels()) {
    UseLevel use(l);
    for (size_t count : {size_t{1}, size_t{33}, size_t{200}}) {
      std::vector<T> x(count, a), y(count, b);
      reduce_inplace(x.data(), y.data(), count, dt, op);
      for (size_t i = 0; i < count; ++i)
        ASSERT_EQ(+x[i], +want) << where(l, dt, op, count) << " element " << i << ": " << +a << " op " << +b;
    }
  }
}

TEST(ReduceKernels, IntegersWrapAround) {
  check_int_case<int8_t>(DType::i8, ReduceOp::sum, 127, 1, -128);
  check_int_case<int8_t>(DType::i8, ReduceOp::sum, -128, -1, 127);
  check_int_case<int8_t>(DType::i8, ReduceOp::prod, -128, -1, -128);
  check_int_case<int8_t>(DType::i8, ReduceOp::prod, 100, 3, 44);
  check_int_case<int8_t>(DType::i8, ReduceOp::prod, -7, 9, -63);
  check_int_case<uint8_t>(DType::u8, ReduceOp::sum, 255, 1, 0);
  check_int_case<uint8_t>(DType::u8, ReduceOp::prod, 16, 16, 0);
  check_int_case<uint8_t>(DType::u8, ReduceOp::prod, 255, 255, 1);
  check_int_case<uint8_t>(DType::u8, ReduceOp::max, 200, 100, 200);  // unsigned compare
  check_int_case<int8_t>(DType::i8, ReduceOp::max, -56, 100, 100);    // signed compare
  check_int_case<int32_t>(DType::i32, ReduceOp::sum, INT32_MAX, 1, INT32_MIN);
  check_int_case<int32_t>(DType::i32, ReduceOp::prod, 65536, 65536, 0);
  check_int_case<int32_t>(DType::i32, ReduceOp::prod, INT32_MIN, -1, INT32_MIN);
  check_int_case<int64_t>(DType::i64, ReduceOp::sum, INT64_MAX, 1, INT64_MIN);
  check_int_case<int64_t>(DType::i64, ReduceOp::prod, INT64_MIN, -1, INT64_MIN);
  check_int_case<int64_t>(DType::i64, ReduceOp::prod, (int64_t{1} << 32) + 1, (int64_t{1} << 32) + 1, (int64_t{1} << 33) + 1);
  check_int_case<int64_t>(DType::i64, ReduceOp::prod, -3, int64_t{0x5555555555555556}, -2);  // 3 * that = 2^64 + 2
  check_int_case<int64_t>(DType::i64, ReduceOp::min, INT64_MIN, INT64_MAX, INT64_MIN);
  check_int_case<int64_t>(DType::i64, ReduceOp::max, -1, 1, 1);
}

TEST(ReduceKernels, BoolResultsStayZeroOne) {
  Rng rng(4242);
  const uint8_t values[] = {0, 1, 2, 0x80, 0xFF, 0, 1};
  for (ReduceOp op : kernel_ops(DType::boolean)) {
    for (int n : {1, 2, 3, 5}) {
      for (size_t count : {size_t{1}, size_t{63}, size_t{64}, size_t{1000}}) {
        std::vector<Bytes> in(n, Bytes(count));
        std::vector<const void*> ptrs;
        for (auto& b : in) {
          for (auto& x : b) x = values[rng() % 7];
          ptrs.push_back(b.data());
        }
        const Bytes want = reference(DType::boolean, op, ptrs, count);
        for (auto l : levels()) {
          UseLevel use(l);
          Bytes d(count);
          reduce_many(d.data(), ptrs.data(), n, count, DType::boolean, op);
          for (uint8_t x : d) ASSERT_LE(x, 1) << where(l, DType::boolean, op, count);
          ASSERT_EQ(compare(DType::boolean, d.data(), want.data(), count), "") << where(l, DType::boolean, op, count);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Every level gives identical bits to the scalar kernels on arbitrary data (any float bit
// pattern, NaN, infinities and subnormals included).

TEST(ReduceKernels, LevelsAgreeOnArbitraryBits) {
  Rng rng(2024);
  const size_t count = 1037;
  const int n = 3;
  for (DType dt : kAllDTypes) {
    std::vector<Bytes> in(n, Bytes(count * dtype_size(dt)));
    std::vector<const void*> ptrs;
    for (auto& b : in) {
      random_bytes(b.data(), b.size(), rng);
      ptrs.push_back(b.data());
    }
    for (ReduceOp op : kernel_ops(dt)) {
      Bytes scalar_out(count * dtype_size(dt));
      {
        UseLevel use(ri::SimdLevel::scalar);
        reduce_many(scalar_out.data(), ptrs.data(), n, count, dt, op);
      }
      for (auto l : levels()) {
        UseLevel use(l);
        Bytes d(count * dtype_size(dt));
        reduce_many(d.data(), ptrs.data(), n, count, dt, op);
        ASSERT_EQ(compare(dt, d.data(), scalar_out.data(), count), "") << where(l, dt, op, count);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// scale_avg: floats divide (f16/bf16 through f32), integers truncate.

TEST(ReduceKernels, ScaleAvg) {
  Rng rng(8);
  for (DType dt : kAllDTypes) {
    if (!reduce_op_supported(dt, ReduceOp::avg)) continue;
    for (size_t count : kCounts) {
      if (count == 100003) continue;
      for (int divisor : {1, 2, 3, 7, 8, 1000}) {
        Bytes in(count * dtype_size(dt) + 1);
        Bytes want(count * dtype_size(dt) + 1);
        if (is_float(dt)) {
          std::vector<double> v(count);
          for (auto& x : v) x = std::uniform_real_distribution<double>(-1e4, 1e4)(rng) * (rng() % 8 == 0 ? 1e-6 : 1.0);
          if (count > 3) v[0] = std::numeric_limits<double>::infinity(), v[1] = -0.0, v[2] = 1e-30;
          from_doubles(dt, v, in.data());
          std::vector<double> r = to_doubles(dt, in.data(), count);
          for (auto& x : r) x /= divisor;
          from_doubles(dt, r, want.data());
        } else {
          random_bytes(in.data(), in.size(), rng);
          std::vector<int64_t> r = to_ints(dt, in.data(), count);
          for (auto& x : r) x /= divisor;  // C++ division truncates toward zero
          from_ints(dt, r, want.data());
        }
        for (auto l : levels()) {
          UseLevel use(l);
          Guarded d(dt, count, 1);
          d.fill(in);
          scale_avg(d.data(), count, dt, divisor);
          ASSERT_EQ(compare(dt, d.data(), want.data(), count), "")
              << "level " << ri::level_name(l) << " " << dtype_name(dt) << " count " << count << " / " << divisor;
          ASSERT_TRUE(d.guards_intact());
        }
      }
    }
  }
  // Truncation toward zero, explicitly.
  int32_t v[5] = {-7, 7, -1, INT32_MIN, INT32_MAX};
  scale_avg(v, 5, DType::i32, 2);
  EXPECT_EQ(v[0], -3);
  EXPECT_EQ(v[1], 3);
  EXPECT_EQ(v[2], 0);
  EXPECT_EQ(v[3], INT32_MIN / 2);
  EXPECT_EQ(v[4], INT32_MAX / 2);
  int64_t w[3] = {INT64_MIN, INT64_MAX, -9};
  scale_avg(w, 3, DType::i64, 4);
  EXPECT_EQ(w[0], INT64_MIN / 4);
  EXPECT_EQ(w[1], INT64_MAX / 4);
  EXPECT_EQ(w[2], -2);
}

}  // namespace
