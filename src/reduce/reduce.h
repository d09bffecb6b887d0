// Reduction kernels: dst[i] = dst[i] OP src[i], vectorised, with runtime CPU dispatch
// (AVX-512 / AVX2 / scalar, chosen once at start-up; SHOAL_SIMD=scalar|avx2|avx512 forces one).
// f16 and bf16 are accumulated in f32 and rounded back (round to nearest even).
// avg is not a kernel: callers reduce with sum and then call scale_avg once at the end.
#pragma once
#include <cstddef>

#include "shoal/types.h"

namespace shoal {

// dst = dst OP src, `count` elements. op must not be avg (use sum, then scale_avg).
void reduce_inplace(void* dst, const void* src, size_t count, DType dt, ReduceOp op);
// dst = srcs[0] OP srcs[1] OP ... OP srcs[n-1] (n >= 1), one pass; dst may alias any of srcs
// (element by element: the same range).
// Used by the direct shared-memory algorithms, which read every peer's slice at once.
void reduce_many(void* dst, const void* const* srcs, int n, size_t count, DType dt, ReduceOp op);
// buf[i] = buf[i] / divisor (integers: truncating division, as torch does for avg on ints).
void scale_avg(void* buf, size_t count, DType dt, int divisor);
// Name of the kernel set in use: "avx512", "avx2" or "scalar".
const char* simd_level();

}  // namespace shoal
