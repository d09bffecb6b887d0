// Dispatch for the reduction kernels: argument checks, then one indirect call into the kernel
// set chosen once (AVX-512 / AVX2 / scalar from the CPU, or SHOAL_SIMD clamped to the CPU).
#include "reduce/reduce.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "base/log.h"
#include "base/params.h"
#include "reduce/kernels.h"
#include "shoal/error.h"

namespace shoal {
namespace reduce_impl {

const char* level_name(SimdLevel l) {
  switch (l) {
    case SimdLevel::avx512: return "avx512";
    case SimdLevel::avx2: return "avx2";
    case SimdLevel::scalar: break;
  }
  return "scalar";
}

SimdLevel cpu_max_level() {
  static const SimdLevel level = [] {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();  // __builtin_cpu_supports also checks that the OS saves the AVX state
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
    if (avx2 && avx512_kernels() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
      return SimdLevel::avx512;
    if (avx2 && avx2_kernels()) return SimdLevel::avx2;
#endif
    return SimdLevel::scalar;
  }();
  return level;
}

SimdLevel level_for_env(const char* value, SimdLevel cpu_max, bool* recognised) {
  if (recognised) *recognised = true;
  SimdLevel want = cpu_max;
  if (value == nullptr || *value == '\0' || std::strcmp(value, "auto") == 0) {
    want = cpu_max;
  } else if (std::strcmp(value, "scalar") == 0) {
    want = SimdLevel::scalar;
  } else if (std::strcmp(value, "avx2") == 0) {
    want = SimdLevel::avx2;
  } else if (std::strcmp(value, "avx512") == 0) {
    want = SimdLevel::avx512;
  } else if (recognised) {
    *recognised = false;
  }
  return static_cast<int>(want) < static_cast<int>(cpu_max) ? want : cpu_max;
}

namespace {

const KernelTable* table_for(SimdLevel l) {
  const KernelTable* t = nullptr;
  if (l == SimdLevel::avx512) t = avx512_kernels();
  if (l == SimdLevel::avx2) t = avx2_kernels();
  return t ? t : scalar_kernels();
}

const KernelTable* select_from_env() {
  // A bad value is a warning here: the kernels are chosen on first use, with no caller to fail.
  std::optional<std::string> set;
  try {
    set = params::choice("SHOAL_SIMD");
  } catch (const InvalidArgument& e) {
    SHOAL_LOG(warn, "%s; using the best kernels the CPU has", e.what());
  }
  const char* env = set ? set->c_str() : nullptr;
  const SimdLevel cpu = cpu_max_level();
  const SimdLevel level = level_for_env(env, cpu);
  const bool forced = env != nullptr && std::strcmp(env, "auto") != 0;
  if (forced && level != level_for_env(env, SimdLevel::avx512)) {
    SHOAL_LOG(warn, "SHOAL_SIMD=%s: this CPU cannot run it; using %s", env, level_name(level));
  }
  SHOAL_LOG(debug, "reduce kernels: %s (cpu supports up to %s)", level_name(level), level_name(cpu));
  return table_for(level);
}

std::atomic<const KernelTable*> g_table{nullptr};

const KernelTable& table() {
  const KernelTable* t = g_table.load(std::memory_order_acquire);
  if (__builtin_expect(t != nullptr, 1)) return *t;
  static const KernelTable* const chosen = select_from_env();  // once, thread-safe
  const KernelTable* expected = nullptr;
  g_table.compare_exchange_strong(expected, chosen, std::memory_order_acq_rel);  // a test hook may have won
  return *g_table.load(std::memory_order_acquire);
}

}  // namespace

SimdLevel current_level() { return table().level; }

bool set_level_for_testing(SimdLevel level) {
  if (static_cast<int>(level) > static_cast<int>(cpu_max_level())) return false;
  g_table.store(table_for(level), std::memory_order_release);
  return true;
}

}  // namespace reduce_impl

namespace {

using reduce_impl::kNumDTypes;
using reduce_impl::kNumOps;

[[noreturn]] void throw_bad_kernel_args(DType dt, ReduceOp op) {
  const int d = static_cast<int>(dt), o = static_cast<int>(op);
  if (d < 0 || d >= kNumDTypes) throw InvalidArgument("reduce: invalid dtype value " + std::to_string(d));
  if (o < 0 || o >= kNumOps) throw InvalidArgument("reduce: invalid reduce op value " + std::to_string(o));
  if (op == ReduceOp::avg)
    throw InvalidArgument("reduce: avg is not a reduction kernel; reduce with sum, then call scale_avg");
  throw InvalidArgument(std::string("reduce: op ") + reduce_op_name(op) + " is not supported on dtype " +
                        dtype_name(dt) + " (bitwise ops need an integer or bool dtype)");
}

inline reduce_impl::ManyFn kernel_for(DType dt, ReduceOp op) {
  const unsigned d = static_cast<unsigned>(dt), o = static_cast<unsigned>(op);
  if (__builtin_expect(d >= static_cast<unsigned>(kNumDTypes) || o >= static_cast<unsigned>(kNumOps), 0))
    throw_bad_kernel_args(dt, op);
  const reduce_impl::ManyFn fn = reduce_impl::table().many[d][o];
  if (__builtin_expect(fn == nullptr, 0)) throw_bad_kernel_args(dt, op);
  return fn;
}

}  // namespace

void reduce_inplace(void* dst, const void* src, size_t count, DType dt, ReduceOp op) {
  const reduce_impl::ManyFn fn = kernel_for(dt, op);
  if (count == 0) return;
  if (dst == nullptr || src == nullptr) throw InvalidArgument("reduce_inplace: null buffer");
  const void* srcs[2] = {dst, src};
  fn(dst, srcs, 2, count);
}

void reduce_many(void* dst, const void* const* srcs, int n, size_t count, DType dt, ReduceOp op) {
  const reduce_impl::ManyFn fn = kernel_for(dt, op);
  if (n < 1) throw InvalidArgument("reduce_many: n must be >= 1 (got " + std::to_string(n) + ")");
  if (count == 0) return;
  if (dst == nullptr || srcs == nullptr) throw InvalidArgument("reduce_many: null buffer");
  for (int k = 0; k < n; ++k)
    if (srcs[k] == nullptr) throw InvalidArgument("reduce_many: srcs[" + std::to_string(k) + "] is null");
  fn(dst, srcs, n, count);
}

void scale_avg(void* buf, size_t count, DType dt, int divisor) {
  const unsigned d = static_cast<unsigned>(dt);
  if (d >= static_cast<unsigned>(kNumDTypes)) throw InvalidArgument("scale_avg: invalid dtype value " + std::to_string(d));
  const reduce_impl::ScaleFn fn = reduce_impl::table().scale[d];
  if (fn == nullptr) throw InvalidArgument(std::string("scale_avg: avg is not supported on dtype ") + dtype_name(dt));
  if (divisor < 1) throw InvalidArgument("scale_avg: divisor must be >= 1 (got " + std::to_string(divisor) + ")");
  if (count == 0 || divisor == 1) return;
  if (buf == nullptr) throw InvalidArgument("scale_avg: null buffer");
  fn(buf, count, divisor);
}

const char* simd_level() { return reduce_impl::table().name; }

}  // namespace shoal
