#include "shoal/types.h"

#include <string>

#include "shoal/error.h"

namespace shoal {
namespace {

bool valid(DType t) { return static_cast<unsigned>(t) <= static_cast<unsigned>(DType::boolean); }
bool valid(ReduceOp op) { return static_cast<unsigned>(op) <= static_cast<unsigned>(ReduceOp::bxor); }

[[noreturn]] void throw_bad_op(ReduceOp op) {
  throw InvalidArgument("invalid reduce op value " + std::to_string(static_cast<int>(op)));
}

bool is_float(DType t) { return t == DType::f16 || t == DType::bf16 || t == DType::f32 || t == DType::f64; }

}  // namespace

void detail::throw_bad_dtype(DType t) {
  throw InvalidArgument("invalid dtype value " + std::to_string(static_cast<int>(t)));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::i8: return "i8";
    case DType::u8: return "u8";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::boolean: return "bool";
  }
  detail::throw_bad_dtype(t);
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::prod: return "prod";
    case ReduceOp::min: return "min";
    case ReduceOp::max: return "max";
    case ReduceOp::avg: return "avg";
    case ReduceOp::band: return "band";
    case ReduceOp::bor: return "bor";
    case ReduceOp::bxor: return "bxor";
  }
  throw_bad_op(op);
}

DType parse_dtype(std::string_view s) {
  struct Alias {
    std::string_view name;
    DType t;
  };
  static constexpr Alias kAliases[] = {
      {"float32", DType::f32}, {"float", DType::f32},  {"float16", DType::f16}, {"bfloat16", DType::bf16},
      {"float64", DType::f64}, {"double", DType::f64}, {"int8", DType::i8},     {"uint8", DType::u8},
      {"int32", DType::i32},   {"int64", DType::i64},
  };
  for (DType t : kAllDTypes)
    if (s == dtype_name(t)) return t;
  for (const Alias& a : kAliases)
    if (s == a.name) return a.t;
  throw InvalidArgument("unknown dtype '" + std::string(s) + "' (expected f16, bf16, f32, f64, i8, u8, i32, i64 or bool)");
}

ReduceOp parse_reduce_op(std::string_view s) {
  for (ReduceOp op : kAllReduceOps)
    if (s == reduce_op_name(op)) return op;
  throw InvalidArgument("unknown reduce op '" + std::string(s) +
                        "' (expected sum, prod, min, max, avg, band, bor or bxor)");
}

bool is_integer(DType t) {
  if (!valid(t)) detail::throw_bad_dtype(t);
  return !is_float(t);
}

bool reduce_op_supported(DType t, ReduceOp op) {
  if (!valid(t) || !valid(op)) return false;
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::prod:
    case ReduceOp::min:
    case ReduceOp::max:
      return true;
    case ReduceOp::avg:  // sum then divide; meaningless on bool
      return t != DType::boolean;
    case ReduceOp::band:
    case ReduceOp::bor:
    case ReduceOp::bxor:
      return is_integer(t);
  }
  return false;
}

}  // namespace shoal
