// shoal-bench: buffers, deterministic inputs and the reference check.
//
// Every input element is a small integer that depends on (rank, index), so that every result
// (sums of p values up to 4, products of at most 6, bitwise combinations of 6-bit values) is exact
// in every dtype, f16 and bf16 included, and a misplaced block shows up as a wrong value.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "bench/bench.h"
#include "bench/dtypes.h"

namespace shoal::bench {

void Buffer::Free::operator()(uint8_t* p) const { std::free(p); }

Buffer::Buffer(size_t bytes) : n_(bytes) {
  size_t alloc = std::max<size_t>(64, (bytes + 63) / 64 * 64);
  void* p = std::aligned_alloc(64, alloc);
  if (!p) throw std::bad_alloc();
  std::memset(p, 0, alloc);  // touch every page before timing
  p_.reset(static_cast<uint8_t*>(p));
}

Buffers alloc_buffers(const Spec& s) {
  Buffers b;
  b.in = Buffer(s.in_place ? 0 : s.in_elems * s.esize);  // in place the input is in `out`
  b.out = Buffer(s.out_elems * s.esize);
  return b;
}

namespace {

enum class Pattern { data, additive, multiplicative, bitwise };

bool is_reduction(Op op) { return op == Op::allreduce || op == Op::reduce || op == Op::reduce_scatter; }

Pattern pattern_of(const Spec& s) {
  if (!is_reduction(s.op)) return Pattern::data;
  switch (s.rop) {
    case ReduceOp::prod:
      return Pattern::multiplicative;
    case ReduceOp::band:
    case ReduceOp::bor:
    case ReduceOp::bxor:
      return Pattern::bitwise;
    default:
      return Pattern::additive;
  }
}

// Input element i of rank r.
inline int64_t value(Pattern pat, bool boolean, int p, int r, size_t i) {
  switch (pat) {
    case Pattern::data:
      return boolean ? static_cast<int64_t>((r + i) & 1) : static_cast<int64_t>((r * 37 + i * 11) % 97);
    case Pattern::additive:
      return boolean ? static_cast<int64_t>((i + r) % 3 == 0) : static_cast<int64_t>(1 + (i + 3 * r) % 4);
    case Pattern::multiplicative: {
      // Product over the ranks is 6 (2 * 3) for p >= 2: exact everywhere, and never overflows i8.
      size_t k = (i + r) % static_cast<size_t>(p);
      if (boolean) return (i + r) % 5 != 0 ? 1 : 0;
      return k == 0 ? 2 : (k == 1 ? 3 : 1);
    }
    case Pattern::bitwise:
      return boolean ? static_cast<int64_t>((i * 7 + r * 13) & 1) : static_cast<int64_t>((i * 7 + r * 13) & 0x3F);
  }
  return 0;
}

// The reduction over all ranks of element i, as the result dtype would hold it.
inline double reference(const Spec& s, Pattern pat, bool integer, bool boolean, size_t i) {
  const int p = s.p;
  if (pat == Pattern::bitwise) {
    int64_t acc = value(pat, boolean, p, 0, i);
    for (int r = 1; r < p; ++r) {
      int64_t v = value(pat, boolean, p, r, i);
      if (s.rop == ReduceOp::band) acc &= v;
      else if (s.rop == ReduceOp::bor) acc |= v;
      else acc ^= v;
    }
    return static_cast<double>(acc);
  }
  double acc = static_cast<double>(value(pat, boolean, p, 0, i));
  for (int r = 1; r < p; ++r) {
    double v = static_cast<double>(value(pat, boolean, p, r, i));
    switch (s.rop) {
      case ReduceOp::sum:
      case ReduceOp::avg:
        acc += v;
        break;
      case ReduceOp::prod:
        acc *= v;
        break;
      case ReduceOp::min:
        acc = std::min(acc, v);
        break;
      case ReduceOp::max:
        acc = std::max(acc, v);
        break;
      default:
        break;
    }
  }
  if (s.rop == ReduceOp::avg) {
    acc /= p;
    if (integer) acc = std::trunc(acc);
  }
  return acc;
}

double tolerance(DType dt) {
  switch (dt) {
    case DType::f16: return 2e-3;
    case DType::bf16: return 1.6e-2;
    case DType::f32: return 1e-6;
    case DType::f64: return 1e-12;
    default: return 0;
  }
}

template <class T>
void fill_range(void* buf, size_t n, Pattern pat, bool boolean, int p, int r) {
  for (size_t i = 0; i < n; ++i) store<T>(buf, i, static_cast<double>(value(pat, boolean, p, r, i)));
}

}  // namespace

void fill_inputs(const Spec& s, Buffers& b) {
  const Pattern pat = pattern_of(s);
  const bool boolean = s.dt == DType::boolean;
  const Buffer& in = input_of(s, b);
  dispatch_dtype(s.dt, [&]<class T>() {
    if (in.size()) fill_range<T>(in.data(), s.in_elems, pat, boolean, s.p, s.rank);
  });
}

namespace {

// Which buffer of this rank holds a checked result, how many elements, and the expected value of
// each (nothing to check: n == 0).
struct Expected {
  const Spec& s;
  Pattern pat;
  bool boolean, integer;
  bool reduced = false;
  uint8_t* buf = nullptr;
  size_t n = 0;

  Expected(const Spec& spec, const Buffers& b)
      : s(spec), pat(pattern_of(spec)), boolean(spec.dt == DType::boolean), integer(is_integer(spec.dt)) {
    const size_t blk = s.block;
    const bool root = s.rank == 0;
    switch (s.op) {
      case Op::allreduce: buf = b.out.data(), n = blk, reduced = true; break;
      case Op::reduce: if (root) buf = b.out.data(), n = blk, reduced = true; break;
      case Op::reduce_scatter: buf = b.out.data(), n = blk, reduced = true; break;
      case Op::broadcast: buf = b.in.data(), n = blk; break;
      case Op::allgather: buf = b.out.data(), n = blk * s.p; break;
      case Op::gather: if (root) buf = b.out.data(), n = blk * s.p; break;
      case Op::scatter:
      case Op::alltoall:
      case Op::alltoallv: buf = b.out.data(), n = s.out_elems; break;
      case Op::sendrecv: if (s.rank == 1) buf = b.out.data(), n = blk; break;
      case Op::barrier: break;
    }
  }

  double operator()(size_t i) const {
    const size_t blk = s.block;
    if (reduced) {
      size_t idx = s.op == Op::reduce_scatter ? static_cast<size_t>(s.rank) * blk + i : i;
      return reference(s, pat, integer, boolean, idx);
    }
    int r = 0;  // source rank and index of output element i (roots are rank 0)
    size_t j = i;
    switch (s.op) {
      case Op::allgather:
      case Op::gather: r = static_cast<int>(i / blk), j = i % blk; break;
      case Op::scatter: j = static_cast<size_t>(s.rank) * blk + i; break;
      case Op::alltoall:
      case Op::alltoallv: r = static_cast<int>(i / blk), j = static_cast<size_t>(s.rank) * blk + i % blk; break;
      default: break;  // broadcast, sendrecv: from rank 0, same index
    }
    return static_cast<double>(value(pat, boolean, s.p, r, j));
  }
};

}  // namespace

void fill_sentinel(const Spec& s, Buffers& b) {
  // A value no correct result has: results are >= 0, so -7 (u8: 251); bool: the negation of the
  // expected value. Broadcast is in place: its non-root inputs already differ from the root's; so
  // is an allreduce in place (Spec::in_place), whose output holds its input.
  if (s.in_place) return;
  Expected want(s, b);
  dispatch_dtype(s.dt, [&]<class T>() {
    if (std::is_same_v<T, bool>) {
      if (want.buf != b.out.data()) return;
      for (size_t i = 0; i < want.n; ++i) store<T>(b.out.data(), i, want(i) != 0 ? 0.0 : 1.0);
      return;
    }
    double sentinel = std::is_same_v<T, uint8_t> ? 251.0 : -7.0;
    for (size_t i = 0; i < s.out_elems; ++i) store<T>(b.out.data(), i, sentinel);
  });
}

std::string verify(const Spec& s, const Buffers& b) {
  Expected want(s, b);
  if (want.n == 0) return "ok";
  const double tol = tolerance(s.dt);
  return dispatch_dtype(s.dt, [&]<class T>() -> std::string {
    size_t bad = 0, first = 0;
    double first_got = 0, first_want = 0;
    for (size_t i = 0; i < want.n; ++i) {
      double w = want(i);
      double got = load<T>(want.buf, i);
      bool okv;
      if (want.boolean) okv = (got != 0) == (w != 0);
      else if (want.integer) okv = got == w;
      else okv = std::fabs(got - w) <= tol * std::max(1.0, std::fabs(w));
      if (!okv) {
        if (bad == 0) first = i, first_got = got, first_want = w;
        ++bad;
      }
    }
    if (bad == 0) return "ok";
    std::ostringstream os;
    os << "rank " << s.rank << ": " << bad << " of " << want.n << " wrong, first [" << first << "] = " << first_got
       << " want " << first_want;
    return os.str();
  });
}

}  // namespace shoal::bench
