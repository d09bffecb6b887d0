// Element types and reduction operators shared by every layer.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace shoal {

enum class DType : uint8_t { f16, bf16, f32, f64, i8, u8, i32, i64, boolean };
enum class ReduceOp : uint8_t { sum, prod, min, max, avg, band, bor, bxor };

inline constexpr DType kAllDTypes[] = {DType::f16, DType::bf16, DType::f32, DType::f64, DType::i8,
                                       DType::u8,  DType::i32,  DType::i64, DType::boolean};
inline constexpr ReduceOp kAllReduceOps[] = {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max,
                                             ReduceOp::avg, ReduceOp::band, ReduceOp::bor, ReduceOp::bxor};

namespace detail {
[[noreturn]] void throw_bad_dtype(DType t);  // InvalidArgument naming the value
}  // namespace detail

// Bytes per element; throws InvalidArgument for unknown values. Inline: every call checks it.
inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::f16:
    case DType::bf16: return 2;
    case DType::f32:
    case DType::i32: return 4;
    case DType::f64:
    case DType::i64: return 8;
    case DType::i8:
    case DType::u8:
    case DType::boolean: return 1;
  }
  detail::throw_bad_dtype(t);
}
const char* dtype_name(DType t);     // "f32", ...
const char* reduce_op_name(ReduceOp op);
DType parse_dtype(std::string_view s);        // accepts the names above; throws InvalidArgument
ReduceOp parse_reduce_op(std::string_view s); // "sum", ...; throws InvalidArgument
bool is_integer(DType t);            // i8, u8, i32, i64, boolean
// Whether `op` is defined on `t` (bitwise ops only on integers/bool). Same answer on every rank.
bool reduce_op_supported(DType t, ReduceOp op);

}  // namespace shoal
