// Correctness of every collective against references computed here, independently of the
// library: every op x algorithm x transport (shm, forced tcp) x dtype x reduce op x size x world
// size. One forked group per gtest (world size, transport, op family) loops over all of that
// family's cases with one communicator; a case that gives a wrong result is recorded and the loop
// goes on (the first failures are reported at the end), an op that fails with an error ends the
// group (the communicator is aborted by then).
//
// Inputs are chosen so that every result is exact in every dtype: small integers for sum/avg
// (|sum| <= 40, and for avg on floats the sum is a multiple of the world size), {1, 2, -1} with at
// most three 2s for prod, small integers for min/max, bit patterns for the bitwise ops; bool sum
// is logical or, bool prod logical and. avg on integers truncates toward zero.
//
// The full dtype x op matrix runs at 7 and 4097 elements for every algorithm; 0 and 1 elements at
// every dtype with sum (reductions) or plain data; 1 Mi + 3 elements (per rank block: about
// (1 Mi + 3) / size, odd) for f32, bf16, i64 with sum and max. SHOAL_TEST_FULL=1 runs the full
// matrix at every size.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <sched.h>
#include <time.h>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "base/cpus.h"
#include "harness.h"
#include "reduce/kernels.h"
#include "reduce/reduce.h"

using namespace shoal;
using namespace shoal_test;

namespace {

constexpr size_t kLarge = (size_t(1) << 20) + 3;
constexpr size_t kSmallSizes[] = {0, 1, 7, 4097};
constexpr DType kLargeDTypes[] = {DType::f32, DType::bf16, DType::i64};
constexpr ReduceOp kLargeOps[] = {ReduceOp::sum, ReduceOp::max};

bool full_matrix() {
  const char* s = std::getenv("SHOAL_TEST_FULL");
  return s && *s && std::strcmp(s, "0") != 0;
}

size_t block_large(int n) { return (kLarge / size_t(n)) | 1; }

// ---- Reduction inputs and their reference ----------------------------------------------------

// The generator runs over every element of every buffer (a million per large case, times the
// world size for the expected values), so the reduce op is a template parameter: one switch per
// buffer (by_op) rather than per element, and the element's code inlined into the loop.

// What the generator needs to know of a dtype, looked up once per buffer.
struct Kind {
  bool boolean, sgn, flt;
};
SHOAL_TEST_REFERENCE Kind kind_of(DType dt) { return {dt == DType::boolean, is_signed(dt), is_float(dt)}; }

// Rank r's input element i for `Op` on a dtype of kind `k` among n ranks (see the file comment).
template <ReduceOp Op>
SHOAL_TEST_REFERENCE inline int64_t red_input_of(DType dt, Kind k, int r, int n, size_t i, uint64_t seed) {
  const uint64_t h = uint64_t(i) * 7 + uint64_t(r) * 13 + seed * 3;
  if constexpr (Op == ReduceOp::sum) {
    if (k.boolean) return (i + size_t(r) + seed) % 3 == 0;
    int64_t v = int64_t(h % 11);
    return k.sgn ? v - 5 : v;
  } else if constexpr (Op == ReduceOp::prod) {
    if (k.boolean) return (h % 5) != 0;
    if ((i + size_t(r) + seed) % 3 == 0) return 2;
    if (k.sgn && (i * 5 + size_t(r) + seed) % 4 == 1) return -1;
    return 1;
  } else if constexpr (Op == ReduceOp::min || Op == ReduceOp::max) {
    if (k.boolean) return h % 3 == 0;
    int64_t v = int64_t(h % 23);
    return k.sgn ? v - 11 : v;
  } else if constexpr (Op == ReduceOp::avg) {
    if (k.boolean) return r == int((i + seed) % uint64_t(n)) && (i + seed) % 2 == 0;
    if (k.flt) {
      // The sum over ranks is n * (i % 7): the average is exact.
      auto e = [&](int q) { return int64_t((size_t(q) + i + seed) % 3); };
      if (r < n - 1) return int64_t(i % 7) + e(r);
      int64_t s = 0;
      for (int q = 0; q < n - 1; ++q) s += e(q);
      return int64_t(i % 7) - s;
    }
    int64_t v = int64_t(h % 9);
    return k.sgn ? v - 4 : v;
  } else {  // band, bor, bxor
    const uint64_t key = mix64(seed * 1000003 + i * 16 + uint64_t(r));
    uint64_t x;
    if constexpr (Op == ReduceOp::band) {
      if (k.boolean) return key % 4 != 0;
      x = mix64(seed * 7 + i) | (key & mix64(key + 1));  // a common part survives the and
    } else if constexpr (Op == ReduceOp::bor) {
      if (k.boolean) return key % 4 == 0;
      x = key & mix64(key + 1) & mix64(key + 2);  // sparse bits: the or is not all ones
    } else {
      if (k.boolean) return key & 1;
      x = key;
    }
    switch (dt) {
      case DType::i8: return int8_t(uint8_t(x));
      case DType::u8: return int64_t(x & 0xff);
      case DType::i32: return int32_t(uint32_t(x));
      default: return int64_t(x);
    }
  }
}

template <ReduceOp Op>
SHOAL_TEST_REFERENCE inline int64_t combine_of(Kind k, int64_t a, int64_t b) {
  if constexpr (Op == ReduceOp::sum) return k.boolean ? (a | b) : a + b;
  if constexpr (Op == ReduceOp::avg) return a + b;
  if constexpr (Op == ReduceOp::prod) return k.boolean ? (a & b) : a * b;
  if constexpr (Op == ReduceOp::min) return std::min(a, b);
  if constexpr (Op == ReduceOp::max) return std::max(a, b);
  if constexpr (Op == ReduceOp::band) return a & b;
  if constexpr (Op == ReduceOp::bor) return a | b;
  if constexpr (Op == ReduceOp::bxor) return a ^ b;
}

template <ReduceOp Op>
SHOAL_TEST_REFERENCE inline int64_t red_expected_of(DType dt, Kind k, int n, size_t i, uint64_t seed) {
  int64_t acc = red_input_of<Op>(dt, k, 0, n, i, seed);
  for (int r = 1; r < n; ++r) acc = combine_of<Op>(k, acc, red_input_of<Op>(dt, k, r, n, i, seed));
  if constexpr (Op == ReduceOp::avg) acc = acc / n;  // truncates toward zero
  return acc;
}

// F<op>::run(args...) for the op known at run time.
template <template <ReduceOp> class F, class... A>
SHOAL_TEST_REFERENCE auto by_op(ReduceOp op, A... a) {
  switch (op) {
    case ReduceOp::sum: return F<ReduceOp::sum>::run(a...);
    case ReduceOp::prod: return F<ReduceOp::prod>::run(a...);
    case ReduceOp::min: return F<ReduceOp::min>::run(a...);
    case ReduceOp::max: return F<ReduceOp::max>::run(a...);
    case ReduceOp::avg: return F<ReduceOp::avg>::run(a...);
    case ReduceOp::band: return F<ReduceOp::band>::run(a...);
    case ReduceOp::bor: return F<ReduceOp::bor>::run(a...);
    case ReduceOp::bxor: return F<ReduceOp::bxor>::run(a...);
  }
  std::abort();
}

template <ReduceOp Op>
struct InputAt {
  SHOAL_TEST_REFERENCE static int64_t run(DType dt, int r, int n, size_t i, uint64_t seed) {
    return red_input_of<Op>(dt, kind_of(dt), r, n, i, seed);
  }
};
template <ReduceOp Op>
struct ExpectedAt {
  SHOAL_TEST_REFERENCE static int64_t run(DType dt, int n, size_t i, uint64_t seed) {
    return red_expected_of<Op>(dt, kind_of(dt), n, i, seed);
  }
};
// buf[k] = input of global element first+k.
template <ReduceOp Op>
struct FillInput {
  SHOAL_TEST_REFERENCE static void run(DType dt, int r, int n, size_t first, size_t count, uint64_t seed, void* buf) {
    const Kind k = kind_of(dt);
    for (size_t j = 0; j < count; ++j) put_value(dt, buf, j, red_input_of<Op>(dt, k, r, n, first + j, seed));
  }
};
// buf[k] = expected result of global element first+k.
template <ReduceOp Op>
struct FillExpected {
  SHOAL_TEST_REFERENCE static void run(DType dt, int n, size_t first, size_t count, uint64_t seed, void* buf) {
    const Kind k = kind_of(dt);
    for (size_t j = 0; j < count; ++j) put_value(dt, buf, j, red_expected_of<Op>(dt, k, n, first + j, seed));
  }
};

SHOAL_TEST_REFERENCE int64_t red_input(ReduceOp op, DType dt, int r, int n, size_t i, uint64_t seed) {
  return by_op<InputAt>(op, dt, r, n, i, seed);
}
SHOAL_TEST_REFERENCE int64_t red_expected(ReduceOp op, DType dt, int n, size_t i, uint64_t seed) {
  return by_op<ExpectedAt>(op, dt, n, i, seed);
}
SHOAL_TEST_REFERENCE void fill_red_input(ReduceOp op, DType dt, int r, int n, size_t first, size_t count, uint64_t seed, void* buf) {
  by_op<FillInput>(op, dt, r, n, first, count, seed, buf);
}
SHOAL_TEST_REFERENCE void fill_red_expected(ReduceOp op, DType dt, int n, size_t first, size_t count, uint64_t seed, void* buf) {
  by_op<FillExpected>(op, dt, n, first, count, seed, buf);
}
// buf[k] = data element first+k of stream `seed`.
void fill_data_at(DType dt, void* buf, size_t count, uint64_t seed, size_t first) {
  for (size_t k = 0; k < count; ++k) put_value(dt, buf, k, data_value(dt, data_key(seed, first + k)));
}

std::string desc_of(const char* what, Algo a, DType dt, const char* op, size_t count, int root = -1,
                    bool inplace = false) {
  std::string s = std::string(what) + " algo=" + algo_name(a) + " dt=" + dt_name(dt);
  if (op) s += std::string(" op=") + op;
  s += " count=" + std::to_string(count);
  if (root >= 0) s += " root=" + std::to_string(root);
  if (inplace) s += " in-place";
  return s;
}

// The reduction cases of a family: full matrix at 7 and 4097, sum at 0 and 1, large subset. Of
// the large (dtype, op) pairs an algorithm runs half, every dtype with sum or max, the other half
// going to the next algorithm (`turn`): every pair runs in every family, at half the cost
// (SHOAL_TEST_FULL: every pair for every algorithm).
template <class F>
void for_reduction_cases(int turn, F&& f) {
  const bool full = full_matrix();
  for (size_t count : kSmallSizes) {
    for (DType dt : kAllDTypes) {
      for (ReduceOp op : kAllReduceOps) {
        if (!reduce_op_supported(dt, op)) continue;
        if (!full && count < 7 && op != ReduceOp::sum) continue;
        f(dt, op, count, false);
      }
    }
  }
  for (size_t d = 0; d < std::size(kLargeDTypes); ++d)
    for (size_t o = 0; o < std::size(kLargeOps); ++o)
      if (full || (d + o + size_t(turn)) % 2 == 0) f(kLargeDTypes[d], kLargeOps[o], kLarge, true);
}

template <class F>
void for_data_cases(F&& f) {
  for (size_t count : kSmallSizes)
    for (DType dt : kAllDTypes) f(dt, count, false);
  for (DType dt : kLargeDTypes) f(dt, kLarge, true);
}

// ---- Families ---------------------------------------------------------------------------------

// Where the ranks of a group are: one host over shared memory, one host over TCP, or several
// (simulated) hosts with shared memory inside each (SHOAL_HOST_ID per rank).
enum class Where { shm, tcp, hosts };

// Each family's algorithms come from the registry (shoal::algorithms_of): those that apply where
// it runs (direct: every rank on one host over shm; hier: several hosts), then the automatic choice.
std::vector<Algo> algos_for(const std::string& family, Where w) {
  std::vector<std::string> ops = {family};
  if (family == "allgatherv") ops = {"allgather"};
  if (family == "gather_scatter") ops = {"gather", "scatter"};
  std::vector<Algo> v;
  for (const std::string& op : ops)
    for (Algo a : algorithms_of(op))
      if ((a != Algo::direct || w == Where::shm) && (a != Algo::hier || w == Where::hosts) &&
          std::find(v.begin(), v.end(), a) == v.end())
        v.push_back(a);
  v.push_back(Algo::automatic);
  return v;
}

void family_allreduce(Suite& s, Where w) {
  int turn = 0;
  for (Algo a : algos_for("allreduce", w)) {
    int k = 0;
    for_reduction_cases(turn++, [&](DType dt, ReduceOp op, size_t count, bool) {
      const bool inplace = (k++ % 2) == 1;
      s.run(desc_of("allreduce", a, dt, reduce_op_name(op), count, -1, inplace), [&]() -> std::string {
        const uint64_t seed = s.seed();
        Buf in(dt, count), out(dt, count), expect(dt, count), orig(dt, count);
        fill_red_input(op, dt, s.rank, s.n, 0, count, seed, in.data());
        std::memcpy(orig.data(), in.data(), count * esize(dt));
        fill_red_expected(op, dt, s.n, 0, count, seed, expect.data());
        uint8_t* o = inplace ? in.data() : out.data();
        s.c.allreduce(in.data(), o, count, dt, op, s.opts(a))->wait();
        return first_err({compare_buffers(dt, o, expect.data(), count),
                          inplace ? "" : compare_buffers(dt, in.data(), orig.data(), count).empty() ? "" : "modified its input",
                          in.guards(), out.guards()});
      });
    });
  }
}

void family_broadcast(Suite& s, Where w) {
  for (Algo a : algos_for("broadcast", w)) {
    int k = 0;
    for_data_cases([&](DType dt, size_t count, bool) {
      const int root = (k++ * 3 + 1) % s.n;
      s.run(desc_of("broadcast", a, dt, nullptr, count, root), [&]() -> std::string {
        const uint64_t seed = s.seed();
        Buf buf(dt, count), expect(dt, count);
        fill_data(dt, expect.data(), count, seed);
        if (s.rank == root) fill_data(dt, buf.data(), count, seed);
        s.c.broadcast(buf.data(), count, dt, root, s.opts(a))->wait();
        return first_err({compare_buffers(dt, buf.data(), expect.data(), count), buf.guards()});
      });
    });
  }
}

void family_reduce(Suite& s, Where w) {
  int turn = 0;
  for (Algo a : algos_for("reduce", w)) {
    int k = 0;
    for_reduction_cases(turn++, [&](DType dt, ReduceOp op, size_t count, bool) {
      const int kk = k++;
      const int root = (kk * 3 + 2) % s.n;
      const bool inplace = kk % 3 == 1;     // at the root
      const bool null_out = kk % 3 != 2;    // elsewhere: null out, or a buffer left untouched
      s.run(desc_of("reduce", a, dt, reduce_op_name(op), count, root, inplace), [&]() -> std::string {
        const uint64_t seed = s.seed();
        Buf in(dt, count), out(dt, count), expect(dt, count), orig(dt, count);
        fill_red_input(op, dt, s.rank, s.n, 0, count, seed, in.data());
        std::memcpy(orig.data(), in.data(), count * esize(dt));
        const bool is_root = s.rank == root;
        uint8_t* o = is_root ? (inplace ? in.data() : out.data()) : (null_out ? nullptr : out.data());
        s.c.reduce(in.data(), o, count, dt, op, root, s.opts(a))->wait();
        std::string err;
        if (is_root) {
          fill_red_expected(op, dt, s.n, 0, count, seed, expect.data());
          err = compare_buffers(dt, o, expect.data(), count);
        } else if (!null_out && !out.all_fill(count)) {
          err = "wrote the output buffer of a non-root rank";
        }
        if (err.empty() && !(is_root && inplace) && !compare_buffers(dt, in.data(), orig.data(), count).empty())
          err = "modified its input";
        return first_err({err, in.guards(), out.guards()});
      });
    });
  }
}

void family_allgather(Suite& s, Where w) {
  for (Algo a : algos_for("allgather", w)) {
    for_data_cases([&](DType dt, size_t count, bool large) {
      if (large) count = block_large(s.n);
      s.run(desc_of("allgather", a, dt, nullptr, count), [&]() -> std::string {
        const uint64_t seed = s.seed();
        Buf in(dt, count), out(dt, count * s.n), expect(dt, count * s.n);
        fill_data(dt, in.data(), count, seed + s.rank);
        for (int r = 0; r < s.n; ++r) fill_data(dt, expect.data() + r * count * esize(dt), count, seed + r);
        s.c.allgather(in.data(), out.data(), count, dt, s.opts(a))->wait();
        return first_err({compare_buffers(dt, out.data(), expect.data(), count * s.n), in.guards(), out.guards()});
      });
    });
  }
}

std::vector<size_t> allgatherv_counts(int pattern, int n) {
  std::vector<size_t> c(size_t(n), 0);
  for (int r = 0; r < n; ++r) {
    switch (pattern) {
      case 0: c[r] = 5; break;
      case 1: c[r] = (r % 2 == 0) ? 0 : size_t(r) * 3 + 1; break;
      case 2: c[r] = (r == n - 1) ? 4097 : 0; break;
      case 3: c[r] = 0; break;
      case 4: c[r] = r == 0 ? 4097 : (size_t(r) * 7 + 1) % 5; break;
      case 5: c[r] = r == 1 ? 0 : block_large(n) + size_t(r); break;  // large
    }
  }
  return c;
}

void family_allgatherv(Suite& s, Where w) {
  for (Algo a : algos_for("allgatherv", w)) {
    for (int pattern = 0; pattern <= 5; ++pattern) {
      for (DType dt : kAllDTypes) {
        if (pattern == 5 && std::find(std::begin(kLargeDTypes), std::end(kLargeDTypes), dt) == std::end(kLargeDTypes))
          continue;
        auto counts = allgatherv_counts(pattern, s.n);
        std::string cs;
        for (size_t x : counts) cs += (cs.empty() ? "" : ",") + std::to_string(x);
        if (cs.size() > 60) cs = cs.substr(0, 60) + "...";
        s.run(std::string("allgatherv algo=") + algo_name(a) + " dt=" + dt_name(dt) + " counts=" + cs,
              [&]() -> std::string {
                const uint64_t seed = s.seed();
                size_t total = 0;
                for (size_t x : counts) total += x;
                Buf in(dt, counts[s.rank]), out(dt, total), expect(dt, total);
                fill_data(dt, in.data(), counts[s.rank], seed + s.rank);
                size_t off = 0;
                for (int r = 0; r < s.n; ++r) {
                  fill_data(dt, expect.data() + off * esize(dt), counts[r], seed + r);
                  off += counts[r];
                }
                s.c.allgatherv(in.data(), out.data(), counts, dt, s.opts(a))->wait();
                return first_err({compare_buffers(dt, out.data(), expect.data(), total), in.guards(), out.guards()});
              });
      }
    }
  }
  // Equal counts: allgather on odd ranks and allgatherv on even ones are one op.
  for (size_t count : {size_t(3), size_t(3000), size_t(70001)}) {
    s.run("allgather on odd ranks, allgatherv on even ones, count=" + std::to_string(count), [&]() -> std::string {
      const uint64_t seed = s.seed();
      const DType dt = DType::i32;
      Buf in(dt, count), out(dt, count * s.n), expect(dt, count * s.n);
      fill_data(dt, in.data(), count, seed + s.rank);
      for (int r = 0; r < s.n; ++r) fill_data(dt, expect.data() + r * count * esize(dt), count, seed + r);
      if (s.rank % 2)
        s.c.allgather(in.data(), out.data(), count, dt, s.opts(Algo::automatic))->wait();
      else
        s.c.allgatherv(in.data(), out.data(), std::vector<size_t>(s.n, count), dt, s.opts(Algo::automatic))->wait();
      return first_err({compare_buffers(dt, out.data(), expect.data(), count * s.n), in.guards(), out.guards()});
    });
  }
}

void family_reduce_scatter(Suite& s, Where w) {
  int turn = 0;
  for (Algo a : algos_for("reduce_scatter", w)) {
    for_reduction_cases(turn++, [&](DType dt, ReduceOp op, size_t count, bool large) {
      if (large) count = block_large(s.n);
      s.run(desc_of("reduce_scatter", a, dt, reduce_op_name(op), count), [&]() -> std::string {
        const uint64_t seed = s.seed();
        const size_t total = count * size_t(s.n);
        Buf in(dt, total), out(dt, count), expect(dt, count), orig(dt, total);
        fill_red_input(op, dt, s.rank, s.n, 0, total, seed, in.data());
        std::memcpy(orig.data(), in.data(), total * esize(dt));
        fill_red_expected(op, dt, s.n, size_t(s.rank) * count, count, seed, expect.data());
        s.c.reduce_scatter(in.data(), out.data(), count, dt, op, s.opts(a))->wait();
        return first_err({compare_buffers(dt, out.data(), expect.data(), count),
                          compare_buffers(dt, in.data(), orig.data(), total).empty() ? "" : "modified its input",
                          in.guards(), out.guards()});
      });
    });
  }
}

void family_gather_scatter(Suite& s, Where w) {
  for (Algo a : algos_for("gather_scatter", w)) {
  int k = 0;
  for_data_cases([&](DType dt, size_t count, bool large) {
    if (large) count = block_large(s.n);
    const int root = (k++ * 5 + 1) % s.n;
    const bool is_root = s.rank == root;
    s.run(desc_of("gather", a, dt, nullptr, count, root), [&]() -> std::string {
      const uint64_t seed = s.seed();
      const size_t total = count * size_t(s.n);
      Buf in(dt, count), out(dt, total), expect(dt, total);
      fill_data(dt, in.data(), count, seed + s.rank);
      s.c.gather(in.data(), is_root ? out.data() : nullptr, count, dt, root, s.opts(a))->wait();
      if (!is_root) return in.guards();
      for (int r = 0; r < s.n; ++r) fill_data(dt, expect.data() + r * count * esize(dt), count, seed + r);
      return first_err({compare_buffers(dt, out.data(), expect.data(), total), in.guards(), out.guards()});
    });
    s.run(desc_of("scatter", a, dt, nullptr, count, root), [&]() -> std::string {
      const uint64_t seed = s.seed();
      const size_t total = count * size_t(s.n);
      Buf in(dt, total), out(dt, count), expect(dt, count);
      if (is_root) fill_data(dt, in.data(), total, seed);
      fill_data_at(dt, expect.data(), count, seed, size_t(s.rank) * count);
      s.c.scatter(is_root ? in.data() : nullptr, out.data(), count, dt, root, s.opts(a))->wait();
      return first_err({compare_buffers(dt, out.data(), expect.data(), count), in.guards(), out.guards()});
    });
  });
  }
}

size_t a2av_count(int pattern, int from, int to, int n) {
  switch (pattern) {
    case 0: return ((from * 3 + to * 5) % 4 == 0) ? 0 : size_t(from + 2 * to) % 9 + 1;
    case 1: return from == to ? 4097 : size_t(from + to) % 3;
    case 2: return 0;
    case 3: return (kLarge / size_t(n * n)) + size_t(from == 0 ? 0 : to + 1);  // large
    // Blocks on both sides of the pairwise exchange's 1 MiB bulk block (f32/i64: 1-2 MiB against a
    // few elements), so one call mixes overlapped steps with steps that run alone.
    case 4: return (from + to) % 2 ? (size_t(1) << 18) + size_t(from + to) : size_t(from * 3 + to) % 5;
  }
  return 0;
}

void family_alltoall(Suite& s, Where) {
  const int n = s.n;
  for_data_cases([&](DType dt, size_t count, bool large) {
    if (large) count = (kLarge / size_t(n * n)) | 1;
    s.run(desc_of("alltoall", Algo::automatic, dt, nullptr, count), [&]() -> std::string {
      const uint64_t seed = s.seed();
      const size_t es = esize(dt), total = count * size_t(n);
      Buf in(dt, total), out(dt, total), expect(dt, total);
      for (int j = 0; j < n; ++j) fill_data(dt, in.data() + j * count * es, count, seed + s.rank * 1000 + j);
      for (int i = 0; i < n; ++i) fill_data(dt, expect.data() + i * count * es, count, seed + i * 1000 + s.rank);
      s.c.alltoall(in.data(), out.data(), count, dt, s.opts(Algo::automatic))->wait();
      return first_err({compare_buffers(dt, out.data(), expect.data(), total), in.guards(), out.guards()});
    });
  });
  for (int pattern = 0; pattern <= 4; ++pattern) {
    for (DType dt : kAllDTypes) {
      if (pattern >= 3 && dt != DType::f32 && dt != DType::i64) continue;
      s.run(std::string("alltoallv dt=") + dt_name(dt) + " pattern=" + std::to_string(pattern), [&]() -> std::string {
        const uint64_t seed = s.seed();
        const size_t es = esize(dt);
        std::vector<size_t> sc(n), rc(n);
        size_t st = 0, rt = 0;
        for (int j = 0; j < n; ++j) st += sc[j] = a2av_count(pattern, s.rank, j, n);
        for (int i = 0; i < n; ++i) rt += rc[i] = a2av_count(pattern, i, s.rank, n);
        Buf in(dt, st), out(dt, rt), expect(dt, rt);
        size_t off = 0;
        for (int j = 0; j < n; ++j) {
          fill_data(dt, in.data() + off * es, sc[j], seed + s.rank * 1000 + j);
          off += sc[j];
        }
        off = 0;
        for (int i = 0; i < n; ++i) {
          fill_data(dt, expect.data() + off * es, rc[i], seed + i * 1000 + s.rank);
          off += rc[i];
        }
        s.c.alltoallv(in.data(), sc, out.data(), rc, dt, s.opts(Algo::automatic))->wait();
        return first_err({compare_buffers(dt, out.data(), expect.data(), rt), in.guards(), out.guards()});
      });
    }
  }
}

void family_barrier(Suite& s, Where) {
  // Round k: every rank counts itself in (shared memory), one rank arrives late, and nobody may
  // leave the barrier before all n have arrived: a Work waited for, a blocking call, and a blocking
  // call of the dissemination barrier in turn.
  auto* counters = static_cast<uint32_t*>(shared_area());
  constexpr int kRounds = 40;
  for (int k = 0; k < kRounds; ++k) {
    s.run("barrier round " + std::to_string(k), [&]() -> std::string {
      if (k % 4 == 0 && s.rank == (k / 4) % s.n) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      __atomic_fetch_add(&counters[k], 1u, __ATOMIC_SEQ_CST);
      if (k % 3 == 0) s.c.barrier()->wait();
      else s.c.barrier({.algo = k % 3 == 1 ? Algo::automatic : Algo::rd, .blocking = true});
      uint32_t seen = __atomic_load_n(&counters[k], __ATOMIC_SEQ_CST);
      if (seen != uint32_t(s.n))
        return "left the barrier when " + std::to_string(seen) + " of " + std::to_string(s.n) + " had arrived";
      return "";
    });
  }
}

// Several ops in flight at once, test() polling, wait(timeout), on_complete; in-place ops.
void family_async(Suite& s, Where) {
  const int n = s.n, rank = s.rank;
  s.run("several ops submitted, then test() until all complete", [&]() -> std::string {
    const uint64_t seed = s.seed();
    const size_t cnt = 4097;
    // allreduce f32 sum, out of place
    Buf ar_in(DType::f32, cnt), ar_out(DType::f32, cnt), ar_exp(DType::f32, cnt);
    fill_red_input(ReduceOp::sum, DType::f32, rank, n, 0, cnt, seed, ar_in.data());
    fill_red_expected(ReduceOp::sum, DType::f32, n, 0, cnt, seed, ar_exp.data());
    // broadcast i32 from the last rank
    Buf bc(DType::i32, 1000), bc_exp(DType::i32, 1000);
    fill_data(DType::i32, bc_exp.data(), 1000, seed + 1);
    if (rank == n - 1) fill_data(DType::i32, bc.data(), 1000, seed + 1);
    // allgather u8
    Buf ag_in(DType::u8, 33), ag_out(DType::u8, 33 * n), ag_exp(DType::u8, 33 * n);
    fill_data(DType::u8, ag_in.data(), 33, seed + 2 + rank);
    for (int r = 0; r < n; ++r) fill_data(DType::u8, ag_exp.data() + 33 * r, 33, seed + 2 + r);
    // reduce_scatter f64 max
    Buf rs_in(DType::f64, 100 * n), rs_out(DType::f64, 100), rs_exp(DType::f64, 100);
    fill_red_input(ReduceOp::max, DType::f64, rank, n, 0, 100 * n, seed + 3, rs_in.data());
    fill_red_expected(ReduceOp::max, DType::f64, n, 100 * rank, 100, seed + 3, rs_exp.data());
    // allreduce i64 bxor in place
    Buf ip(DType::i64, 517), ip_exp(DType::i64, 517);
    fill_red_input(ReduceOp::bxor, DType::i64, rank, n, 0, 517, seed + 4, ip.data());
    fill_red_expected(ReduceOp::bxor, DType::i64, n, 0, 517, seed + 4, ip_exp.data());
    // reduce bf16 min to rank 1 % n
    const int rroot = 1 % n;
    Buf rd_in(DType::bf16, 300), rd_out(DType::bf16, 300), rd_exp(DType::bf16, 300);
    fill_red_input(ReduceOp::min, DType::bf16, rank, n, 0, 300, seed + 5, rd_in.data());
    fill_red_expected(ReduceOp::min, DType::bf16, n, 0, 300, seed + 5, rd_exp.data());

    std::vector<WorkPtr> works;
    works.push_back(s.c.allreduce(ar_in.data(), ar_out.data(), cnt, DType::f32, ReduceOp::sum));
    works.push_back(s.c.broadcast(bc.data(), 1000, DType::i32, n - 1));
    works.push_back(s.c.allgather(ag_in.data(), ag_out.data(), 33, DType::u8));
    works.push_back(s.c.barrier());
    works.push_back(s.c.reduce_scatter(rs_in.data(), rs_out.data(), 100, DType::f64, ReduceOp::max));
    works.push_back(s.c.allreduce(ip.data(), ip.data(), 517, DType::i64, ReduceOp::bxor));
    works.push_back(s.c.reduce(rd_in.data(), rank == rroot ? rd_out.data() : nullptr, 300, DType::bf16,
                               ReduceOp::min, rroot));
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (;;) {
      bool all = true;
      for (auto& w : works) all = all && w->test();
      if (all) break;
      if (std::chrono::steady_clock::now() > deadline) return "test() still false after 60 s";
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    for (auto& w : works) {
      if (w->error()) std::rethrow_exception(w->error());
      if (!w->wait()) return "wait() returned false after test() returned true";
    }
    return first_err({compare_buffers(DType::f32, ar_out.data(), ar_exp.data(), cnt),
                      compare_buffers(DType::i32, bc.data(), bc_exp.data(), 1000),
                      compare_buffers(DType::u8, ag_out.data(), ag_exp.data(), 33 * n),
                      compare_buffers(DType::f64, rs_out.data(), rs_exp.data(), 100),
                      compare_buffers(DType::i64, ip.data(), ip_exp.data(), 517),
                      rank == rroot ? compare_buffers(DType::bf16, rd_out.data(), rd_exp.data(), 300) : ""});
  });

  s.run("32 allreduces in flight, waited in reverse order", [&]() -> std::string {
    const uint64_t seed = s.seed();
    constexpr int kOps = 32;
    std::vector<std::unique_ptr<Buf>> bufs, exps;
    std::vector<WorkPtr> works;
    for (int k = 0; k < kOps; ++k) {
      size_t cnt = size_t(k) * 37 + (k % 3 == 0 ? 5000 : 0);
      bufs.push_back(std::make_unique<Buf>(DType::i32, cnt));
      exps.push_back(std::make_unique<Buf>(DType::i32, cnt));
      fill_red_input(ReduceOp::sum, DType::i32, rank, n, 0, cnt, seed + k, bufs.back()->data());
      fill_red_expected(ReduceOp::sum, DType::i32, n, 0, cnt, seed + k, exps.back()->data());
      works.push_back(s.c.allreduce(bufs.back()->data(), bufs.back()->data(), cnt, DType::i32, ReduceOp::sum));
    }
    for (int k = kOps; k-- > 0;) works[k]->wait();
    for (int k = 0; k < kOps; ++k) {
      auto e = compare_buffers(DType::i32, bufs[k]->data(), exps[k]->data(), bufs[k]->count());
      if (!e.empty()) return "op " + std::to_string(k) + ": " + e;
    }
    return "";
  });

  if (n > 1) {
    s.run("wait(timeout) returns false while a peer is late; on_complete runs once", [&]() -> std::string {
      const uint64_t seed = s.seed();
      Buf b(DType::f64, 64), e(DType::f64, 64);
      fill_red_input(ReduceOp::sum, DType::f64, rank, n, 0, 64, seed, b.data());
      fill_red_expected(ReduceOp::sum, DType::f64, n, 0, 64, seed, e.data());
      // Set by the last rank just before its call (past family_barrier's counters), so that rank 0
      // judges by what the late rank has done, not by how long things take on a loaded machine.
      auto* late_called = static_cast<uint32_t*>(shared_area()) + 1024;
      if (rank == n - 1) {
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        __atomic_store_n(late_called, 1u, __ATOMIC_SEQ_CST);
      }
      const double t0 = now_seconds();
      auto w = s.c.allreduce(b.data(), b.data(), 64, DType::f64, ReduceOp::sum);
      const double submit_s = now_seconds() - t0;
      auto calls = std::make_shared<std::atomic<int>>(0);
      w->on_complete([calls] { calls->fetch_add(1); });
      if (rank == 0) {
        auto late_has_called = [&] { return __atomic_load_n(late_called, __ATOMIC_SEQ_CST) != 0; };
        if (late_has_called() && submit_s > 0.2)
          return "the allreduce() call itself blocked for " + std::to_string(submit_s) +
                 " s, until the late rank called: the op did not run asynchronously";
        if (w->wait(std::chrono::milliseconds(50)) && !late_has_called())
          return "wait(50 ms) returned true before the last rank called the op";
        if (w->test() && !late_has_called()) return "test() returned true before the last rank called the op";
      }
      if (!w->wait()) return "wait() returned false";
      auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (calls->load() == 0 && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (calls->load() != 1) return "on_complete ran " + std::to_string(calls->load()) + " times";
      auto late = std::make_shared<std::atomic<int>>(0);
      w->on_complete([late] { late->fetch_add(1); });
      if (late->load() != 1) return "on_complete on a finished Work did not run at once";
      if (w->error()) return "error() not null after success";
      return compare_buffers(DType::f64, b.data(), e.data(), 64);
    });
  }

  s.run("a blocking call behind a queued op runs after it; its Work is complete", [&]() -> std::string {
    const uint64_t seed = s.seed();
    Buf a(DType::f32, 333), ae(DType::f32, 333), b(DType::i32, 77), be(DType::i32, 77);
    fill_red_input(ReduceOp::max, DType::f32, rank, n, 0, 333, seed, a.data());
    fill_red_expected(ReduceOp::max, DType::f32, n, 0, 333, seed, ae.data());
    fill_data(DType::i32, be.data(), 77, seed + 1);
    if (rank == n - 1) fill_data(DType::i32, b.data(), 77, seed + 1);
    auto queued = s.c.allreduce(a.data(), a.data(), 333, DType::f32, ReduceOp::max);  // not waited for
    shoal::CallOptions blocking;
    blocking.blocking = true;
    auto w = s.c.broadcast(b.data(), 77, DType::i32, n - 1, blocking);
    if (!queued->test()) return "the op queued before the blocking call had not completed when it returned";
    if (!w->test() || w->error()) return "a blocking call returned a Work that is not complete, or failed";
    int ran = 0;
    w->on_complete([&ran] { ++ran; });
    if (ran != 1) return "on_complete on a blocking call's Work did not run at once";
    auto err = compare_buffers(DType::f32, a.data(), ae.data(), 333);
    if (!err.empty()) return "queued allreduce: " + err;
    err = compare_buffers(DType::i32, b.data(), be.data(), 77);
    if (!err.empty()) return "blocking broadcast: " + err;
    // Alone in the queue, the blocking call runs at once on this thread: many in a row.
    for (int k = 0; k < 50; ++k) {
      Buf c(DType::i64, 5), ce(DType::i64, 5);
      fill_red_input(ReduceOp::sum, DType::i64, rank, n, 0, 5, seed + k, c.data());
      fill_red_expected(ReduceOp::sum, DType::i64, n, 0, 5, seed + k, ce.data());
      s.c.allreduce(c.data(), c.data(), 5, DType::i64, ReduceOp::sum, blocking);
      err = compare_buffers(DType::i64, c.data(), ce.data(), 5);
      if (!err.empty()) return "blocking allreduce " + std::to_string(k) + ": " + err;
    }
    return "";
  });

  s.run("in-place allreduce and broadcast, every root", [&]() -> std::string {
    for (int root = 0; root < n; ++root) {
      const uint64_t seed = s.seed() + uint64_t(root) * 7;
      Buf b(DType::f16, 999), e(DType::f16, 999);
      fill_red_input(ReduceOp::sum, DType::f16, rank, n, 0, 999, seed, b.data());
      fill_red_expected(ReduceOp::sum, DType::f16, n, 0, 999, seed, e.data());
      s.c.allreduce(b.data(), b.data(), 999, DType::f16, ReduceOp::sum)->wait();
      auto err = compare_buffers(DType::f16, b.data(), e.data(), 999);
      if (!err.empty()) return "allreduce: " + err;
      Buf c(DType::i8, 4099), ce(DType::i8, 4099);
      fill_data(DType::i8, ce.data(), 4099, seed + 1);
      if (rank == root) fill_data(DType::i8, c.data(), 4099, seed + 1);
      s.c.broadcast(c.data(), 4099, DType::i8, root)->wait();
      err = compare_buffers(DType::i8, c.data(), ce.data(), 4099);
      if (!err.empty()) return "broadcast root " + std::to_string(root) + ": " + err;
    }
    return "";
  });
}

// Requested algorithms that do not apply raise InvalidArgument (the same on every rank) and leave
// the communicator usable.
void family_algo_args(Suite& s, Where w) {
  const int n = s.n, rank = s.rank;
  std::vector<float> in(64 * n, 1.0f), out(64 * n, 0.0f);
  auto check_ok = [&]() -> std::string {
    const uint64_t seed = s.seed();
    Buf b(DType::i32, 10), e(DType::i32, 10);
    fill_red_input(ReduceOp::sum, DType::i32, rank, n, 0, 10, seed, b.data());
    fill_red_expected(ReduceOp::sum, DType::i32, n, 0, 10, seed, e.data());
    s.c.allreduce(b.data(), b.data(), 10, DType::i32, ReduceOp::sum)->wait();
    auto err = compare_buffers(DType::i32, b.data(), e.data(), 10);
    return err.empty() ? "" : "allreduce after the InvalidArgument: " + err;
  };
  auto expect_invalid = [&](const std::string& what, const std::function<WorkPtr()>& call) {
    s.run(what + " raises InvalidArgument", [&]() -> std::string {
      std::string e = expect_kind("InvalidArgument", [&] { call()->wait(); });
      if (!e.empty()) return "got " + e;
      return check_ok();
    });
  };
  float* I = in.data();
  float* O = out.data();
  const DType f = DType::f32;
  const auto sum = ReduceOp::sum;
  expect_invalid("gather algo=bde", [&] { return s.c.gather(I, O, 64, f, 0, {Algo::bde}); });
  expect_invalid("scatter algo=bde", [&] { return s.c.scatter(I, O, 64, f, 0, {Algo::bde}); });
  expect_invalid("alltoall algo=bde", [&] { return s.c.alltoall(I, O, 64, f, {Algo::bde}); });
  expect_invalid("broadcast algo=bde", [&] { return s.c.broadcast(O, 64, f, 0, {Algo::bde}); });
  expect_invalid("allgather algo=bde", [&] { return s.c.allgather(I, O, 64, f, {Algo::bde}); });
  expect_invalid("allgather algo=mst", [&] { return s.c.allgather(I, O, 64, f, {Algo::mst}); });
  expect_invalid("reduce_scatter algo=mst", [&] { return s.c.reduce_scatter(I, O, 64, f, sum, {Algo::mst}); });
  expect_invalid("allreduce algo=scatter_allgather",
                 [&] { return s.c.allreduce(I, O, 64, f, sum, {Algo::scatter_allgather}); });
  if (w != Where::hosts)
    expect_invalid("one host: allreduce algo=hier", [&] { return s.c.allreduce(I, O, 64, f, sum, {Algo::hier}); });
  else
    expect_invalid("alltoall algo=hier", [&] { return s.c.alltoall(I, O, 64, f, {Algo::hier}); });
  if (w != Where::shm && n > 1) {
    expect_invalid("tcp allreduce algo=direct", [&] { return s.c.allreduce(I, O, 64, f, sum, {Algo::direct}); });
    expect_invalid("tcp broadcast algo=direct", [&] { return s.c.broadcast(O, 64, f, 0, {Algo::direct}); });
    expect_invalid("tcp reduce algo=direct", [&] { return s.c.reduce(I, O, 64, f, sum, 0, {Algo::direct}); });
    expect_invalid("tcp allgather algo=direct", [&] { return s.c.allgather(I, O, 64, f, {Algo::direct}); });
    expect_invalid("tcp reduce_scatter algo=direct",
                   [&] { return s.c.reduce_scatter(I, O, 64, f, sum, {Algo::direct}); });
  }
}

void check_transport(Communicator& c, const std::string& transport) {
  SH_CHECK_EQ(c.size(), my_size());
  SH_CHECK_EQ(c.rank(), my_rank());
  for (int p = 0; p < c.size(); ++p) {
    std::string t = c.transport_to(p);
    std::string want = p == c.rank() ? "self" : transport;
    SH_CHECK(t == want) << "transport_to(" << p << ") = " << t << ", expected " << want;
  }
}

// Under SHOAL_SIMD (ctest's simd_avx2.* and simd_scalar.* runs of part of this matrix): the kernel
// level in use is the one the variable selects, so those runs test what they are named for.
void check_simd_level() {
  const char* v = std::getenv("SHOAL_SIMD");
  if (v == nullptr || *v == '\0') return;
  namespace ri = shoal::reduce_impl;
  const char* want = ri::level_name(ri::level_for_env(v, ri::cpu_max_level()));
  SH_CHECK(std::string(simd_level()) == want) << "SHOAL_SIMD=" << v << ": kernels in use " << simd_level()
                                              << ", expected " << want;
}

// The families by name, as the suites below are instantiated: "others" runs the ones the
// several-host suite groups into one test.
void family_others(Suite& s, Where w) {
  family_reduce_scatter(s, w);
  family_gather_scatter(s, w);
  family_alltoall(s, w);
  family_barrier(s, w);
  family_algo_args(s, w);
}
struct Family {
  const char* name;
  void (*run)(Suite&, Where);
};
constexpr Family kFamilies[] = {
    {"allreduce", family_allreduce},   {"broadcast", family_broadcast},
    {"reduce", family_reduce},         {"allgather", family_allgather},
    {"allgatherv", family_allgatherv}, {"reduce_scatter", family_reduce_scatter},
    {"gather_scatter", family_gather_scatter}, {"alltoall", family_alltoall},
    {"barrier", family_barrier},       {"async", family_async},
    {"algo_args", family_algo_args},   {"others", family_others},
};
void run_family(const std::string& name, Suite& s, Where w) {
  for (const Family& f : kFamilies)
    if (name == f.name) return f.run(s, w);
  SH_CHECK(false) << "unknown family " << name;
}

using Param = std::tuple<int, std::string, std::string>;  // world size, transport, family

class Collectives : public ::testing::TestWithParam<Param> {};

TEST_P(Collectives, Matrix) {
  const auto& [n, transport, family] = GetParam();
  RunConfig cfg = timed_config(transport, std::chrono::seconds(60), std::chrono::seconds(280));
  const Where w = transport == "shm" ? Where::shm : Where::tcp;
  auto start = std::chrono::steady_clock::now();
  run_ranks(n, cfg, [&, family = family, transport = transport](Communicator& c) {
    check_transport(c, transport);
    check_simd_level();
    Suite s(c);
    run_family(family, s, w);
    s.finish();
  });
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  RecordProperty("seconds", std::to_string(secs));
}

INSTANTIATE_TEST_SUITE_P(
    All, Collectives,
    ::testing::Combine(::testing::Values(1, 2, 3, 4, 5, 8), ::testing::Values("shm", "tcp"),
                       ::testing::Values("allreduce", "broadcast", "reduce", "allgather", "allgatherv",
                                         "reduce_scatter", "gather_scatter", "alltoall", "barrier", "async",
                                         "algo_args")),
    [](const ::testing::TestParamInfo<Param>& info) {
      return "n" + std::to_string(std::get<0>(info.param)) + "_" + std::get<1>(info.param) + "_" +
             std::get<2>(info.param);
    });

// Groups spanning (simulated) hosts: each rank gets SHOAL_HOST_ID from the layout, so ranks on
// one "host" talk shared memory and ranks on different ones TCP, as on real hosts; the
// hierarchical algorithms run (automatic and requested) next to the flat ones. Layouts: two hosts
// of two and of four; consecutive and interleaved ranks; hosts of unequal sizes; a host of one.
using HostsParam = std::tuple<std::string, std::string>;  // layout (host of each rank), family

std::vector<std::string> split_layout(const std::string& layout) {
  std::vector<std::string> v;
  size_t a = 0;
  while (a <= layout.size()) {
    size_t b = layout.find(',', a);
    if (b == std::string::npos) b = layout.size();
    v.push_back(layout.substr(a, b - a));
    a = b + 1;
  }
  return v;
}

class CollectivesHosts : public ::testing::TestWithParam<HostsParam> {};

TEST_P(CollectivesHosts, Matrix) {
  const auto& [layout, family] = GetParam();
  const std::vector<std::string> host = split_layout(layout);
  RunConfig cfg = timed_config("shm", std::chrono::seconds(60), std::chrono::seconds(280));
  cfg.before_construct = [host](int rank) { setenv("SHOAL_HOST_ID", ("test-host-" + host[rank]).c_str(), 1); };
  run_ranks(static_cast<int>(host.size()), cfg, [&, family = family](Communicator& c) {
    check_simd_level();
    for (int p = 0; p < c.size(); ++p) {
      std::string want = p == c.rank() ? "self" : host[p] == host[c.rank()] ? "shm" : "tcp";
      SH_CHECK(c.transport_to(p) == want) << "transport_to(" << p << ") = " << c.transport_to(p) << ", expected " << want;
    }
    // Several hosts with shared memory inside some: the automatic choice is hierarchical where
    // there is one (every host of one rank: flat).
    const bool shared = std::any_of(host.begin(), host.end(), [&](auto& h) { return std::count(host.begin(), host.end(), h) > 1; });
    for (const char* op : {"allreduce", "broadcast", "reduce", "allgather"})
      for (size_t bytes : {size_t(0), size_t(4096), size_t(64) << 20}) {
        Algo a = c.algo_for(op, bytes);
        SH_CHECK((a == Algo::hier) == shared) << op << " of " << bytes << " bytes: automatic choice " << algo_name(a);
      }
    SH_CHECK(c.algo_for("alltoall", 4096) != Algo::hier);
    Suite s(c);
    run_family(family, s, Where::hosts);
    s.finish();
  });
}

INSTANTIATE_TEST_SUITE_P(
    All, CollectivesHosts,
    ::testing::Combine(::testing::Values("0,0,1,1", "0,1,0,1,0", "0,0,1,1,1,2", "0,0,0,0,1,1,1,1"),
                       ::testing::Values("allreduce", "broadcast", "reduce", "allgather", "allgatherv", "others")),
    [](const ::testing::TestParamInfo<HostsParam>& info) {
      std::string l = std::get<0>(info.param);
      std::replace(l.begin(), l.end(), ',', '_');
      return "hosts_" + l + "_" + std::get<1>(info.param);
    });

// The same group set up through a TcpStore (rank 0 serves it on a free port) instead of a
// FileStore: a few families, both transports.
TEST(CollectivesTcpStore, Families) {
  for (const std::string transport : {"shm", "tcp"}) {
    SCOPED_TRACE(transport);
    RunConfig cfg = timed_config(transport, std::chrono::seconds(60), std::chrono::seconds(120));
    cfg.store = StoreKind::tcp;
    run_ranks(4, cfg, [transport](Communicator& c) {
      check_transport(c, transport);
      Suite s(c);
      const Where w = transport == "shm" ? Where::shm : Where::tcp;
      family_async(s, w);
      family_gather_scatter(s, w);
      family_barrier(s, w);
      s.finish();
    });
  }
}

// Two groups over the same ranks, their ops submitted in opposite orders on the two ranks and
// only then waited for: each communicator progresses on its own, so both complete (the
// pattern of several process groups issuing async ops in different orders).
TEST(CollectivesAsync, TwoGroupsOppositeOrder) {
  for (const std::string transport : {"shm", "tcp"}) {
    SCOPED_TRACE(transport);
    RunConfig cfg = timed_config(transport, std::chrono::seconds(10), std::chrono::seconds(60), false);
    run_ranks(2, cfg, [](Communicator& a) {
      Options o = a.options();
      o.group_name = "second";
      Communicator b(std::make_shared<FileStore>(run_dir() + "/store"), a.rank(), a.size(), o);
      const int me = a.rank();
      std::vector<int32_t> xa(1000, me + 1), xb(1000, 10 * (me + 1));
      const double t0 = now_seconds();
      WorkPtr wa, wb;
      if (me == 0) {
        wa = a.allreduce(xa.data(), xa.data(), 1000, DType::i32, ReduceOp::sum);
        wb = b.allreduce(xb.data(), xb.data(), 1000, DType::i32, ReduceOp::sum);
      } else {
        wb = b.allreduce(xb.data(), xb.data(), 1000, DType::i32, ReduceOp::sum);
        wa = a.allreduce(xa.data(), xa.data(), 1000, DType::i32, ReduceOp::sum);
      }
      const double submit_s = now_seconds() - t0;
      wa->wait();
      wb->wait();
      SH_CHECK(submit_s < 1.0) << "submitting two ops took " << submit_s << " s";
      SH_CHECK_EQ(xa[999], 3);
      SH_CHECK_EQ(xb[0], 30);
    });
  }
}

// How a collective reaches the thread that runs it (Communicator::Impl::submit): a caller that
// waits at once runs it itself; one that never waits still gets it run, by the progress thread,
// in submission order; a wait on a later op runs the earlier ones first on the caller's thread.
TEST(CollectivesAsync, WhoRunsTheOp) {
  for (const std::string transport : {"shm", "tcp"}) {
    SCOPED_TRACE(transport);
    RunConfig cfg = timed_config(transport, std::chrono::seconds(20), std::chrono::seconds(60), false);
    run_ranks(3, cfg, [](Communicator& c) {
      const auto me = std::this_thread::get_id();
      struct Done {
        std::atomic<int> order{-1};
        std::thread::id thread;  // that ran the op; none when it had completed before on_complete
        std::atomic<bool> registering{false};  // read by the thread that runs the op
      };
      std::atomic<int> finished{0};
      auto watch = [&](const WorkPtr& w, Done& d) {
        d.registering = true;
        w->on_complete([&d, &finished, me] {
          // on_complete of a finished op calls at once, here: the op ran elsewhere, earlier.
          if (!(d.registering && std::this_thread::get_id() == me)) d.thread = std::this_thread::get_id();
          d.order.store(finished.fetch_add(1));
        });
        d.registering = false;
      };
      // on_complete runs after the Work is marked done: a waiter may return before it has run.
      auto called = [](const Done& d) {
        const double t0 = now_seconds();
        while (d.order.load() < 0 && now_seconds() - t0 < 10) std::this_thread::sleep_for(std::chrono::microseconds(100));
        return d.order.load() >= 0;
      };
      auto check_sum = [&](const std::vector<int32_t>& v, int32_t base) {
        const int32_t want = base * c.size() + c.size() * (c.size() - 1) / 2;
        SH_CHECK(v[0] == want && v.back() == want) << "got " << v[0] << ", want " << want;
      };

      // 1. Waited at once: run on this thread (the progress thread may take an op whose caller
      //    was preempted between the call and the wait for kClaimGrace: most, not all).
      int inline_runs = 0;
      for (int k = 0; k < 20; ++k) {
        std::vector<int32_t> a(100, k + c.rank());
        Done da;
        auto wa = c.allreduce(a.data(), a.data(), a.size(), DType::i32, ReduceOp::sum);
        watch(wa, da);
        wa->wait();
        check_sum(a, k);
        SH_CHECK(called(da)) << "on_complete did not run";
        inline_runs += da.thread == me;
      }
      SH_CHECK(inline_runs >= 10) << "only " << inline_runs << " of 20 collectives waited for at once ran on the caller's thread";

      // 2. Never waited for (nor tested): completes by itself, on the progress thread.
      std::vector<int32_t> b(100, 10 + c.rank());
      Done db;
      auto wb = c.allreduce(b.data(), b.data(), b.size(), DType::i32, ReduceOp::sum);
      watch(wb, db);
      SH_CHECK(called(db)) << "a collective nobody waited for did not complete within 10 s";
      SH_CHECK(db.thread != me) << "the op ran on the caller's thread, which never waited for it";
      check_sum(b, 10);

      // 3. Two async ops, then a wait on the second: both complete, in submission order.
      std::vector<int32_t> x(100, 20 + c.rank()), y(100, 30 + c.rank());
      Done dx, dy;
      const int before = finished.load();
      auto wx = c.allreduce(x.data(), x.data(), x.size(), DType::i32, ReduceOp::sum);
      watch(wx, dx);
      auto wy = c.allreduce(y.data(), y.data(), y.size(), DType::i32, ReduceOp::sum);
      watch(wy, dy);
      wy->wait();
      SH_CHECK(wx->test()) << "the earlier op is not complete after a wait on the later one";
      SH_CHECK(called(dx) && called(dy)) << "on_complete did not run";
      SH_CHECK(dx.order.load() == before && dy.order.load() == before + 1)
          << "completion order " << dx.order.load() << ", " << dy.order.load();
      check_sum(x, 20);
      check_sum(y, 30);

      // 4. run_async(): completes without a wait, and the group goes on as usual afterwards.
      std::vector<int32_t> z(100, 40 + c.rank());
      Done dz;
      auto wz = c.allreduce(z.data(), z.data(), z.size(), DType::i32, ReduceOp::sum);
      watch(wz, dz);
      wz->run_async();
      const double t1 = now_seconds();
      while (!wz->test() && now_seconds() - t1 < 10) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      SH_CHECK(wz->test() && called(dz)) << "run_async(): not complete within 10 s";
      SH_CHECK(dz.thread != me) << "run_async(): the op ran on the caller's thread";
      check_sum(z, 40);
      for (int k = 0; k < 20; ++k) {
        std::vector<int32_t> v(7, k + c.rank());
        c.allreduce(v.data(), v.data(), v.size(), DType::i32, ReduceOp::sum)->wait();
        check_sum(v, k);
      }
    });
  }
}

// How often this process's one communicator's progress thread has slept (voluntary context
// switches, /proc): each sleep ends in a wake-up.
long progress_thread_sleeps() {
  std::string status_path;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(e.path() / "comm");
    std::string name;
    std::getline(comm, name);
    if (name == "shoal-progress") {
      SH_CHECK(status_path.empty()) << "two threads named shoal-progress";
      status_path = e.path() / "status";
    }
  }
  SH_CHECK(!status_path.empty()) << "no thread named shoal-progress";
  std::ifstream f(status_path);
  for (std::string line; std::getline(f, line);)
    if (line.rfind("voluntary_ctxt_switches:", 0) == 0) return std::stol(line.substr(line.find(':') + 1));
  SH_CHECK(false) << "no voluntary_ctxt_switches in " << status_path;
  return 0;
}

// The idle progress thread looks at the queue on a tick that starts at 1 ms and doubles up to
// 8 ms until it takes an op (communicator.cpp, kTick and kMaxTick): callers that wait for their
// ops at once leave it none, and each tick wakes it on a core a rank's op needs. Over
// 400 ms of such calls it wakes (voluntary switches, /proc) less than half as often as a steady
// 1 ms tick would; and after them an op nobody waits for is still run, by that thread.
TEST(CollectivesAsync, TheIdleProgressThreadTicksLessWhileCallersWaitAtOnce) {
  for (const std::string transport : {"shm", "tcp"}) {
    SCOPED_TRACE(transport);
    RunConfig cfg = timed_config(transport, std::chrono::seconds(20), std::chrono::seconds(60), false);
    run_ranks(2, cfg, [](Communicator& c) {
      std::vector<int32_t> v(256);
      auto allreduce_at_once = [&](int k) {
        std::fill(v.begin(), v.end(), k + c.rank());
        c.allreduce(v.data(), v.data(), v.size(), DType::i32, ReduceOp::sum)->wait();
        SH_CHECK(v[0] == 2 * k + 1 && v.back() == 2 * k + 1) << "got " << v[0] << " at op " << k;
      };
      int k = 0;
      for (; k < 50; ++k) allreduce_at_once(k);
      // Both ranks leave the loop after the same number of ops: rank 0 decides by its clock.
      const long before = progress_thread_sleeps();
      const double t0 = now_seconds();
      for (bool more = true; more; ++k) {
        allreduce_at_once(k);
        int32_t go = c.rank() == 0 && now_seconds() - t0 < 0.4;
        c.broadcast(&go, 1, DType::i32, 0)->wait();
        more = go != 0;
      }
      const double secs = now_seconds() - t0;
      const long wakes = progress_thread_sleeps() - before;
      note("wakes=" + std::to_string(wakes) + " in " + std::to_string(secs) + " s, " + std::to_string(k) + " ops");
      SH_CHECK(wakes < 0.5 * secs * 1000) << "the progress thread woke " << wakes << " times in " << secs
                                          << " s of ops waited for at once";

      // Not waited for, nor tested. The buffer and the flags outlive this function if the check
      // below fails (the communicator then still runs the op as it closes).
      struct Unwaited {
        std::vector<int32_t> b;
        std::atomic<bool> done{false};
        std::thread::id thread;
      };
      auto u = std::make_shared<Unwaited>();
      u->b.assign(100, 10 + c.rank());
      auto wb = c.allreduce(u->b.data(), u->b.data(), u->b.size(), DType::i32, ReduceOp::sum);
      wb->on_complete([u] {
        u->thread = std::this_thread::get_id();
        u->done = true;
      });
      const double t1 = now_seconds();
      while (!u->done && now_seconds() - t1 < 10) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      SH_CHECK(u->done) << "an op nobody waited for did not complete within 10 s after the loop";
      SH_CHECK(u->thread != std::this_thread::get_id()) << "the op nobody waited for ran on the caller's thread";
      SH_CHECK(u->b[0] == 21 && u->b.back() == 21) << "got " << u->b[0];
    });
  }
}

// After an op its caller was 20 ms late to (so the progress thread took it, and the communicator
// wakes that thread at each submit), `rounds` rounds of that and of `ops` ops with `between`
// done between submit and wait. Returns how many of those ops ran on another thread than the
// caller's (an op finished before on_complete, as in WhoRunsTheOp, ran elsewhere); checks that
// the thread took at least one late op, or the rounds test nothing.
int ops_run_elsewhere(Communicator& c, int rounds, int ops, const std::function<void()>& between) {
  const auto me = std::this_thread::get_id();
  std::vector<int32_t> v(64);
  auto allreduce = [&](int k, bool late) {
    std::fill(v.begin(), v.end(), k + c.rank());
    auto w = c.allreduce(v.data(), v.data(), v.size(), DType::i32, ReduceOp::sum);
    auto elsewhere = std::make_shared<std::atomic<bool>>(false);
    auto registering = std::make_shared<std::atomic<bool>>(true);
    w->on_complete([elsewhere, registering, me] { *elsewhere = std::this_thread::get_id() != me || *registering; });
    *registering = false;
    if (late)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // past kMaxTick + kClaimGrace
    else
      between();
    w->wait();
    SH_CHECK(v[0] == 2 * k + 1 && v.back() == 2 * k + 1) << "got " << v[0] << " at op " << k;
    return elsewhere->load();
  };
  for (int k = 0; k < 50; ++k) allreduce(k, false);
  int late_taken = 0, elsewhere = 0;
  for (int round = 0; round < rounds; ++round) {
    late_taken += allreduce(1000 + round, true);
    for (int k = 0; k < ops; ++k) elsewhere += allreduce(k, false);
  }
  note("late ops taken by the progress thread: " + std::to_string(late_taken) + " of " + std::to_string(rounds) +
       "; ops it ran after them: " + std::to_string(elsewhere) + " of " + std::to_string(rounds * ops));
  SH_CHECK(late_taken > 0) << "the progress thread took none of the " << rounds << " ops their callers were 20 ms late to";
  return elsewhere;
}

// Uses `t` of this thread's CPU time, however long that takes.
void spin_cpu(std::chrono::microseconds t) {
  auto cpu_ns = [] {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
  };
  const int64_t end = cpu_ns() + t / std::chrono::nanoseconds(1);
  while (cpu_ns() < end) {
  }
}

// A caller late to its op (descheduled past kClaimGrace, as ranks that outnumber cores are) lets
// the progress thread take it, and the communicator then wakes that thread at each submit. Once
// the caller waits for its ops at once again, they run on its own thread again: here each caller
// yields between submit and wait, and the thread a submit woke, on the rank's one CPU, would run
// the op first every time if the communicator stayed in that state. Runs alone (CMakeLists.txt,
// SHOAL_SERIAL_TESTS): other tests' ranks on the same CPUs make callers late.
TEST(CollectivesAsync, OpsWaitedForAtOnceRunOnTheCallersThreadAfterOneTheCallerWasLateTo) {
  const std::vector<int> cpus = shoal::allowed_cpus();
  for (const std::string transport : {"shm", "tcp"}) {
    SCOPED_TRACE(transport);
    RunConfig cfg = timed_config(transport, std::chrono::seconds(20), std::chrono::seconds(60));
    cfg.before_construct = [cpus](int rank) {  // both threads of a rank on one CPU
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(cpus[rank % cpus.size()], &one);
      if (sched_setaffinity(0, sizeof one, &one) != 0) throw std::runtime_error("sched_setaffinity");
    };
    run_ranks(2, cfg, [](Communicator& c) {
      // As a caller descheduled before its wait: the thread a submit woke runs first.
      const int elsewhere = ops_run_elsewhere(c, 5, 200, [] { std::this_thread::yield(); });
      SH_CHECK(elsewhere < 300) << elsewhere << " of 1000 ops waited for at once ran on the progress thread";
    });
  }
}

// A caller that computes (500 µs of its CPU time) or blocks (a 500 µs sleep) between its submit
// and its wait keeps the communicator eager: its ops start on the progress thread meanwhile. The
// counts depend on the thread finding a CPU within those 500 µs, which other programs decide:
// run by hand, on a quiet machine (BENCHMARKS.md, "A late caller left every op to the progress
// thread"): build/shoal-tests --gtest_also_run_disabled_tests --gtest_filter='*ComputeOrBlock*'
TEST(CollectivesAsync, DISABLED_OpsOfCallersThatComputeOrBlockStartOnTheProgressThread) {
  for (const bool computes : {true, false}) {
    for (const std::string transport : {"shm", "tcp"}) {
      SCOPED_TRACE(transport + (computes ? ", computing" : ", blocking"));
      RunConfig cfg = timed_config(transport, std::chrono::seconds(20), std::chrono::seconds(60));
      run_ranks(2, cfg, [computes](Communicator& c) {
        const int elsewhere = ops_run_elsewhere(c, 10, 30, [computes] {
          if (computes)
            spin_cpu(std::chrono::microseconds(500));
          else
            std::this_thread::sleep_for(std::chrono::microseconds(500));
        });
        fprintf(stderr, "rank %d %s: %d of 300 ops ran on the progress thread\n", c.rank(), computes ? "computing" : "blocking",
                elsewhere);
        SH_CHECK(elsewhere > (computes ? 150 : 200)) << "only " << elsewhere << " of 300 ops waited for after 500 µs of "
                                                     << (computes ? "computing" : "blocking") << " ran on the progress thread";
      });
    }
  }
}

// Small direct ops (direct_small.cpp) let ranks run up to a few ops apart: ranks that sleep at
// random before some ops, so that roots run ahead and readers lag, still get every result right
// (no slot is reused while a peer may read it), on the rotation of roots of broadcast, reduce,
// gather and scatter, with allreduces between.
TEST(CollectivesSmall, RanksApartGetEveryResult) {
  RunConfig cfg = timed_config("shm", std::chrono::seconds(30), std::chrono::seconds(90));
  run_ranks(3, cfg, [](Communicator& c) {
    const int n = c.size(), me = c.rank();
    std::mt19937 rng(1234 + me);
    constexpr size_t kCount = 7;
    for (int k = 0; k < 200; ++k) {
      if (rng() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2000));
      const int root = k % n;
      auto value = [&](int rank, size_t i) { return int32_t(1000 * k + 10 * rank + int32_t(i)); };
      std::vector<int32_t> in(kCount * n), out(kCount * n, -1);
      for (size_t i = 0; i < in.size(); ++i) in[i] = value(me, i);
      switch (k % 5) {
        case 0: {  // broadcast from root
          std::vector<int32_t> b(kCount);
          for (size_t i = 0; i < kCount; ++i) b[i] = me == root ? value(root, i) : -1;
          c.broadcast(b.data(), kCount, DType::i32, root)->wait();
          for (size_t i = 0; i < kCount; ++i) SH_CHECK_EQ(b[i], value(root, i)) << "op " << k;
          break;
        }
        case 1: {  // reduce to root
          c.reduce(in.data(), out.data(), kCount, DType::i32, ReduceOp::sum, root)->wait();
          if (me == root)
            for (size_t i = 0; i < kCount; ++i) {
              int32_t want = 0;
              for (int r = 0; r < n; ++r) want += value(r, i);
              SH_CHECK_EQ(out[i], want) << "op " << k;
            }
          break;
        }
        case 2: {  // gather to root
          c.gather(in.data(), out.data(), kCount, DType::i32, root)->wait();
          if (me == root) {
            for (int r = 0; r < n; ++r)
              for (size_t i = 0; i < kCount; ++i) SH_CHECK_EQ(out[r * kCount + i], value(r, i)) << "op " << k;
          }
          break;
        }
        case 3: {  // scatter from root
          c.scatter(in.data(), out.data(), kCount, DType::i32, root)->wait();
          for (size_t i = 0; i < kCount; ++i) SH_CHECK_EQ(out[i], value(root, me * kCount + i)) << "op " << k;
          break;
        }
        case 4: {  // allreduce
          c.allreduce(in.data(), out.data(), kCount, DType::i32, ReduceOp::sum)->wait();
          for (size_t i = 0; i < kCount; ++i) {
            int32_t want = 0;
            for (int r = 0; r < n; ++r) want += value(r, i);
            SH_CHECK_EQ(out[i], want) << "op " << k;
          }
          break;
        }
      }
    }
  });
}

// allgather(count) and allgatherv with every count equal are one call: ranks may mix the two
// (as MPI's users mix MPI_Allgather and MPI_Allgatherv), small and chunked, over each transport.
TEST(CollectivesAllgather, RanksMayMixAllgatherAndAllgathervOfEqualCounts) {
  for (const char* transport : {"shm", "tcp"}) {
    RunConfig cfg = timed_config(transport, std::chrono::seconds(30), std::chrono::seconds(90));
    run_ranks(3, cfg, [](Communicator& c) {
      const int n = c.size(), me = c.rank();
      for (size_t count : {size_t(0), size_t(1), size_t(7), size_t(100003)}) {
        for (int k = 0; k < 4; ++k) {
          auto value = [&](int rank, size_t i) { return int32_t(1000 * k + 7 * rank + int32_t(i % 1000)); };
          std::vector<int32_t> in(count), out(count * n, -1);
          for (size_t i = 0; i < count; ++i) in[i] = value(me, i);
          if ((me + k) % 2 == 0) c.allgather(in.data(), out.data(), count, DType::i32)->wait();
          else c.allgatherv(in.data(), out.data(), std::vector<size_t>(n, count), DType::i32)->wait();
          for (int r = 0; r < n; ++r)
            for (size_t i = 0; i < count; ++i)
              SH_CHECK_EQ(out[r * count + i], value(r, i)) << "count " << count << ", op " << k << ", block " << r;
        }
      }
    });
  }
}

// The reference itself: the inputs are exact and the expected values are what the file comment
// promises (so a failure above is the library's, not the generator's).
TEST(CollectivesReference, InputsAreExact) {
  for (int n : {1, 2, 3, 4, 5, 8}) {
    for (DType dt : kAllDTypes) {
      for (ReduceOp op : kAllReduceOps) {
        for (size_t i = 0; i < 200; ++i) {
          for (int r = 0; r < n; ++r) {
            int64_t v = red_input(op, dt, r, n, i, 12345);
            uint8_t b[8];
            put_value(dt, b, 0, v);
            if (op == ReduceOp::band || op == ReduceOp::bor || op == ReduceOp::bxor) continue;
            ASSERT_EQ(get_double(dt, b, 0), double(v)) << dt_name(dt) << " " << reduce_op_name(op);
          }
          int64_t e = red_expected(op, dt, n, i, 12345);
          if (op == ReduceOp::sum || op == ReduceOp::avg || op == ReduceOp::prod) {
            if (dt == DType::boolean) {
              ASSERT_TRUE(e == 0 || e == 1);
            } else {
              ASSERT_LE(std::abs(e), 127) << dt_name(dt) << " " << reduce_op_name(op) << " n=" << n;
            }
          }
          if (op == ReduceOp::avg && is_float(dt)) {
            int64_t s = 0;
            for (int r = 0; r < n; ++r) s += red_input(op, dt, r, n, i, 12345);
            ASSERT_EQ(s % n, 0);
          }
        }
      }
    }
  }
  // f16 / bf16 encodings of a few values.
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(bf16_to_f32(0xc000), -2.0f);
}

}  // namespace
