// shoal-soak: a long random run of every op of the Communicator, each result checked against a
// reference computed here, with resident memory, open file descriptors and shared-memory segments
// watched for leaks (RELIABILITY.md, "Soak").
//
//   shoal-run -n 4 build/shoal-soak [--ops N] [--seed S] [--max-bytes B] [--check-every K]
//                                   [--warmup 0|1] [--rss-limit-mib M] [--verbose] [--trace-rss]
//                                   [--corrupt-op I]
//
// Every rank draws the same sequence of ops from a PRNG seeded with --seed: the op (every
// collective, send/recv pairs, barrier), the dtype, the reduce op (every one the dtype supports),
// the size (0 .. --max-bytes, log-uniform, odd counts included, mostly small), the algorithm
// (automatic or any the op has, through CallOptions) and the communicator: one over shared
// memory, one over TCP, and one over two simulated hosts (SHOAL_HOST_ID: even ranks on one, odd on
// the other; shm inside, TCP across, the hierarchical algorithms), all alive for the whole run. Each rank's inputs are a function of
// (seed, op index, rank), so every rank computes the exact expected output locally: copies are
// compared byte for byte, integer reductions exactly (two's complement wrap, avg truncating),
// float min/max exactly, float sum/avg/prod within bounds of the rounding error of p-1 partial
// results in the dtype (f16/bf16 loosely). Outputs carry guard bytes that must stay untouched;
// outputs that must not be written (reduce/gather at non-roots) must stay untouched too.
//
// A warm-up pass first runs every (op, algorithm, transport) once at --max-bytes (rooted ops from
// every root), so the communicators' scratch buffers and the shared segments reach their full size. Then, every K ops,
// each rank records its RSS (/proc/self/statm), its open fds (/proc/self/fd) and the /dev/shm
// entries named after the group's pids. At the end: RSS may have grown by less than
// --rss-limit-mib since the first checkpoint, the fd count must equal the first checkpoint's, and
// after the communicators are destroyed no /dev/shm/shoal-<pid of this group>-* may remain.
//
// Exit status: 0 on success; 1 on a wrong result or a failed check (the op index, op, dtype, size,
// algorithm, transport and first bad element are printed); 2 when an op throws; 3 on bad usage.
#include <dirent.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "shoal/communicator.h"
#include "shoal/error.h"
#include "shoal/store.h"
#include "shoal/types.h"

using namespace shoal;

namespace {

using Clock = std::chrono::steady_clock;

uint64_t mix64(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed) {}
  uint64_t next() { return mix64(s += 0x9e3779b97f4a7c15ull); }
  uint64_t below(uint64_t n) { return n == 0 ? 0 : next() % n; }
  double uniform() { return double(next() >> 11) * 0x1p-53; }
  bool chance(double p) { return uniform() < p; }
};

// --corrupt-op I: flip one byte of op I's result on rank 0 before it is checked (a self-test of
// the checker: the run must then fail, naming op I).
int64_t g_corrupt_op = -1;
bool g_corrupt_now = false;

// ---- Ops -------------------------------------------------------------------------------------

enum class Kind : int {
  allreduce, broadcast, reduce, allgather, allgatherv, reduce_scatter, gather, scatter, alltoall, alltoallv,
  sendrecv, barrier, count
};
constexpr int kKinds = static_cast<int>(Kind::count);
// Relative weights of the kinds in the random sequence.
constexpr int kWeights[kKinds] = {6, 4, 4, 4, 3, 4, 3, 3, 3, 3, 4, 1};

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::allreduce: return "allreduce";
    case Kind::broadcast: return "broadcast";
    case Kind::reduce: return "reduce";
    case Kind::allgather: return "allgather";
    case Kind::allgatherv: return "allgatherv";
    case Kind::reduce_scatter: return "reduce_scatter";
    case Kind::gather: return "gather";
    case Kind::scatter: return "scatter";
    case Kind::alltoall: return "alltoall";
    case Kind::alltoallv: return "alltoallv";
    case Kind::sendrecv: return "sendrecv";
    case Kind::barrier: return "barrier";
    case Kind::count: break;
  }
  return "?";
}

// The communicators: every rank on one host over shm, over TCP, or on two simulated hosts.
enum class Where { shm, tcp, hosts };
const char* where_name(Where w) { return w == Where::shm ? "shm" : w == Where::tcp ? "tcp" : "hosts"; }

// The algorithms each op accepts through CallOptions, from the registry (shoal::algorithms_of):
// direct needs shm, hier several hosts.
std::vector<Algo> algos_of(Kind k, Where w) {
  const char* op = nullptr;
  switch (k) {
    case Kind::allreduce: op = "allreduce"; break;
    case Kind::broadcast: op = "broadcast"; break;
    case Kind::reduce: op = "reduce"; break;
    case Kind::allgather:
    case Kind::allgatherv: op = "allgather"; break;
    case Kind::reduce_scatter: op = "reduce_scatter"; break;
    case Kind::gather: op = "gather"; break;
    case Kind::scatter: op = "scatter"; break;
    case Kind::alltoall:
    case Kind::alltoallv: op = "alltoall"; break;
    default: return {};  // sendrecv, barrier: no algorithm option here
  }
  std::vector<Algo> v;
  for (Algo a : algorithms_of(op))
    if ((a != Algo::direct || w == Where::shm) && (a != Algo::hier || w == Where::hosts)) v.push_back(a);
  return v;
}

bool reducing(Kind k) { return k == Kind::allreduce || k == Kind::reduce || k == Kind::reduce_scatter; }
// Ops whose message is size blocks of `count` elements.
bool blocked(Kind k) {
  return k == Kind::allgather || k == Kind::reduce_scatter || k == Kind::gather || k == Kind::scatter ||
         k == Kind::alltoall;
}

struct Plan {
  uint64_t index = 0;
  bool warmup = false;
  Kind kind = Kind::barrier;
  Where where = Where::shm;
  Algo algo = Algo::automatic;
  DType dt = DType::u8;
  ReduceOp op = ReduceOp::sum;
  size_t bytes = 0;                // the op's whole message (what `size` means in the summary)
  size_t count = 0;                // per rank (or per block) elements
  std::vector<size_t> counts;      // allgatherv: per rank; alltoallv: p x p, [i * p + j] = i -> j
  int root = 0;
  bool in_place = false;
  bool null_nonroot = false;       // reduce/gather out, scatter in: null on the non-roots
  int shift = 1;                   // sendrecv: rank r sends to r + shift
  bool any_source = false;         // sendrecv: recv from kAnySource
  bool send_first = false;
  uint64_t tag = 0;
  uint64_t seed = 0;               // the op's data

  std::string describe() const {
    char b[512];
    std::snprintf(b, sizeof b, "%s #%" PRIu64 " %s dtype=%s%s%s bytes=%zu count=%zu algo=%s transport=%s root=%d%s%s",
                  warmup ? "warm-up op" : "op", index, kind_name(kind), dtype_name(dt),
                  reducing(kind) ? " op=" : "", reducing(kind) ? reduce_op_name(op) : "", bytes, count,
                  algo_name(algo), where_name(where), root, in_place ? " in-place" : "",
                  null_nonroot ? " null-at-non-roots" : "");
    std::string s = b;
    if (kind == Kind::sendrecv)
      s += " shift=" + std::to_string(shift) + (any_source ? " any-source" : "") + (send_first ? " send-first" : "");
    return s;
  }
};

// Bytes of a message: 0 now and then; mostly log-uniform in [1, 64 KiB]; one in ten log-uniform
// in [64 KiB, max]. The mean stays near max/100 so that 10,000 ops take minutes.
size_t pick_bytes(Rng& r, size_t max_bytes) {
  if (max_bytes == 0 || r.chance(1.0 / 32)) return 0;
  const double lmax = std::log2(double(max_bytes));
  const double split = std::min(16.0, lmax);
  double e = r.chance(0.1) ? split + r.uniform() * (lmax - split) : r.uniform() * split;
  return std::min(max_bytes, std::max<size_t>(1, size_t(std::exp2(e))));
}

Plan make_plan(uint64_t seed, uint64_t index, int p, size_t max_bytes) {
  Rng r(mix64(seed * 0x2545f4914f6cdd1dull + index));
  Plan pl;
  pl.index = index;
  pl.seed = r.next();
  int total = 0;
  for (int w : kWeights) total += w;
  int x = int(r.below(uint64_t(total))), k = 0;
  while (x >= kWeights[k]) x -= kWeights[k++];
  pl.kind = Kind(k);
  pl.where = Where(r.below(3));
  auto algos = algos_of(pl.kind, pl.where);
  const size_t a = r.below(algos.size() + 1);
  pl.algo = a == 0 ? Algo::automatic : algos[a - 1];
  pl.dt = kAllDTypes[r.below(std::size(kAllDTypes))];
  if (reducing(pl.kind)) {
    std::vector<ReduceOp> ops;
    for (ReduceOp o : kAllReduceOps)
      if (reduce_op_supported(pl.dt, o)) ops.push_back(o);
    pl.op = ops[r.below(ops.size())];
  }
  pl.root = int(r.below(uint64_t(p)));
  const size_t es = dtype_size(pl.dt);
  size_t bytes = pick_bytes(r, max_bytes);
  if (pl.kind == Kind::barrier) bytes = 0;
  if (blocked(pl.kind)) {
    pl.count = bytes / (es * size_t(p));
    pl.bytes = pl.count * es * size_t(p);
  } else if (pl.kind == Kind::allgatherv) {
    const size_t avg = bytes / (es * size_t(p));
    pl.counts.resize(size_t(p));
    for (auto& c : pl.counts) c = r.chance(0.2) ? 0 : r.below(2 * avg + 2);
    pl.count = avg;
    for (size_t c : pl.counts) pl.bytes += c * es;
    if (pl.bytes > max_bytes) pl.counts.assign(size_t(p), avg), pl.bytes = avg * es * size_t(p);
  } else if (pl.kind == Kind::alltoallv) {
    const size_t avg = bytes / (es * size_t(p) * size_t(p));
    pl.counts.resize(size_t(p) * size_t(p));
    for (auto& c : pl.counts) c = r.chance(0.2) ? 0 : r.below(2 * avg + 2);
    pl.count = avg;
    // Bytes: the most any rank sends or receives (at most max_bytes).
    for (int i = 0; i < p; ++i) {
      size_t s = 0, g = 0;
      for (int j = 0; j < p; ++j) s += pl.counts[size_t(i * p + j)], g += pl.counts[size_t(j * p + i)];
      pl.bytes = std::max(pl.bytes, std::max(s, g) * es);
    }
    if (pl.bytes > max_bytes) pl.counts.assign(size_t(p) * size_t(p), avg), pl.bytes = avg * es * size_t(p);
  } else {
    pl.count = bytes / es;
    pl.bytes = pl.count * es;
  }
  pl.in_place = (pl.kind == Kind::allreduce && r.chance(0.25)) || (pl.kind == Kind::reduce && r.chance(0.25)) ||
                (pl.kind == Kind::alltoall && r.chance(0.125));
  pl.null_nonroot = r.chance(0.5);
  pl.shift = 1 + int(r.below(uint64_t(std::max(1, p - 1))));
  pl.any_source = r.chance(0.25);
  pl.send_first = r.chance(0.5);
  pl.tag = r.next() >> 8;
  return pl;
}

// ---- Data ------------------------------------------------------------------------------------

// Rank r's byte stream for an op: byte b = byte b%8 of mix64(base + b/8).
uint64_t stream_base(uint64_t seed, int r) { return mix64(seed ^ (uint64_t(r + 1) * 0xd6e8feb86659fd93ull)); }

void fill_stream(uint8_t* dst, size_t n, uint64_t base, size_t off) {
  size_t b = off, end = off + n;
  while (b < end && (b & 7)) {
    *dst++ = uint8_t(mix64(base + b / 8) >> (8 * (b & 7)));
    ++b;
  }
  for (; b + 8 <= end; b += 8, dst += 8) {
    const uint64_t w = mix64(base + b / 8);
    std::memcpy(dst, &w, 8);
  }
  for (; b < end; ++b) *dst++ = uint8_t(mix64(base + b / 8) >> (8 * (b & 7)));
}

// f16 / bf16 bits of a float that is exactly representable in them (normal or zero).
uint16_t exact_f16(float f) {
  if (f == 0) return 0;
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u, exp = (x >> 23) & 0xFFu, man = x & 0x7FFFFFu;
  return uint16_t(sign | ((exp - 112u) << 10) | (man >> 13));
}
uint16_t exact_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  return uint16_t(x >> 16);
}
float f16_value(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
  float v;
  if (exp == 0x1F) {
    const uint32_t x = sign | 0x7F800000u | (man << 13);
    std::memcpy(&v, &x, 4);
    return v;
  }
  if (exp == 0) return (sign ? -1.0f : 1.0f) * float(man) * 0x1p-24f;
  const uint32_t x = sign | ((exp + 112u) << 23) | (man << 13);
  std::memcpy(&v, &x, 4);
  return v;
}
float bf16_value(uint16_t h) {
  const uint32_t x = uint32_t(h) << 16;
  float v;
  std::memcpy(&v, &x, 4);
  return v;
}

bool is_float(DType t) { return t == DType::f16 || t == DType::bf16 || t == DType::f32 || t == DType::f64; }

// Input value of a reduction, from the hash h: floats exactly representable in the dtype; for
// sum/avg/min/max in [-4, 4) using every bit of the dtype's significand (so that sums of p of them
// round), for prod of magnitude in [0.5, 2) with a full significand, so that p factors stay in range.
double float_input(DType dt, ReduceOp op, uint64_t h) {
  const int bits = dt == DType::f16 ? 11 : dt == DType::bf16 ? 8 : dt == DType::f32 ? 24 : 53;
  if (op == ReduceOp::prod) {
    const double mant = 1.0 + double((h >> 12) & ((uint64_t(1) << (bits - 1)) - 1)) * std::ldexp(1.0, 1 - bits);
    double v = (h & 1) ? mant : mant / 2;
    return (h & 2) ? -v : v;
  }
  // k * 2^-(bits - 3) with |k| < 2^(bits + 1) - within [-4, 4), exact in the dtype.
  const int64_t k = int64_t((h >> 11) & ((uint64_t(1) << (bits + 1)) - 1)) - (int64_t(1) << bits);
  return std::ldexp(double(k), 3 - bits - 1);
}

void store_float(DType dt, uint8_t* p, double v) {
  switch (dt) {
    case DType::f16: { uint16_t h = exact_f16(float(v)); std::memcpy(p, &h, 2); break; }
    case DType::bf16: { uint16_t h = exact_bf16(float(v)); std::memcpy(p, &h, 2); break; }
    case DType::f32: { float f = float(v); std::memcpy(p, &f, 4); break; }
    default: std::memcpy(p, &v, 8); break;
  }
}
double load_float(DType dt, const uint8_t* p) {
  switch (dt) {
    case DType::f16: { uint16_t h; std::memcpy(&h, p, 2); return f16_value(h); }
    case DType::bf16: { uint16_t h; std::memcpy(&h, p, 2); return bf16_value(h); }
    case DType::f32: { float f; std::memcpy(&f, p, 4); return f; }
    default: { double d; std::memcpy(&d, p, 8); return d; }
  }
}

// Element i of a rank's reduction input (base = stream_base(seed, rank)), as stored bytes.
void reduce_input(DType dt, ReduceOp op, uint64_t base, size_t i, uint8_t* out) {
  const uint64_t h = mix64(base + i);
  if (is_float(dt)) return store_float(dt, out, float_input(dt, op, h));
  if (dt == DType::boolean) {  // half zeros; any non-zero byte counts as true
    *out = (h >> 40) & 1 ? uint8_t((h & 0xFF) | 1) : 0;
    return;
  }
  std::memcpy(out, &h, dtype_size(dt));  // little-endian: the low bytes
}

void fill_reduce_input(DType dt, ReduceOp op, uint8_t* dst, size_t count, uint64_t base) {
  const size_t es = dtype_size(dt);
  for (size_t i = 0; i < count; ++i) reduce_input(dt, op, base, i, dst + i * es);
}

template <class T>
T int_reduce(ReduceOp op, const T* v, int p) {
  using U = std::make_unsigned_t<T>;
  U acc = U(v[0]);
  T m = v[0];
  for (int r = 1; r < p; ++r) {
    const U x = U(v[r]);
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg: acc = U(acc + x); break;
      case ReduceOp::prod: acc = U(uint64_t(acc) * uint64_t(x)); break;
      case ReduceOp::band: acc = U(acc & x); break;
      case ReduceOp::bor: acc = U(acc | x); break;
      case ReduceOp::bxor: acc = U(acc ^ x); break;
      case ReduceOp::min: m = std::min(m, v[r]); break;
      case ReduceOp::max: m = std::max(m, v[r]); break;
    }
  }
  if (op == ReduceOp::min || op == ReduceOp::max) return m;
  if (op == ReduceOp::avg) return T(T(acc) / T(p));  // truncating
  return T(acc);
}

// The first element of `got` (count elements, element i being global element off + i of the
// reduced vector) that differs from the reference; -1 if none. `what` describes it.
int64_t check_reduce(const Plan& pl, int p, const uint8_t* got, size_t count, size_t off, std::string& what) {
  const DType dt = pl.dt;
  const size_t es = dtype_size(dt);
  std::vector<uint64_t> bases(static_cast<size_t>(p));
  for (int r = 0; r < p; ++r) bases[size_t(r)] = stream_base(pl.seed, r);
  if (p > 64) throw std::runtime_error("soak: at most 64 ranks");
  const double u = dt == DType::f16 ? 0x1p-11 : dt == DType::bf16 ? 0x1p-8 : dt == DType::f32 ? 0x1p-24 : 0x1p-53;
  char b[256];
  for (size_t j = 0; j < count; ++j) {
    const size_t i = off + j;
    uint8_t ins[64][8];
    for (int r = 0; r < p; ++r) reduce_input(dt, pl.op, bases[size_t(r)], i, ins[r]);
    uint8_t flipped[8];
    const uint8_t* g = got + j * es;
    if (g_corrupt_now && j == count / 2) {
      std::memcpy(flipped, g, es);
      flipped[es - 1] ^= 0x10;
      g = flipped;
    }
    bool bad = false;
    if (is_float(dt)) {
      double ref = 0, mag = 0;
      double v0 = load_float(dt, ins[0]);
      ref = v0;
      mag = std::fabs(v0);
      for (int r = 1; r < p; ++r) {
        const double v = load_float(dt, ins[r]);
        switch (pl.op) {
          case ReduceOp::sum:
          case ReduceOp::avg: ref += v; mag += std::fabs(v); break;
          case ReduceOp::prod: ref *= v; break;
          case ReduceOp::min: ref = std::min(ref, v); break;
          case ReduceOp::max: ref = std::max(ref, v); break;
          default: break;
        }
      }
      double tol = 0;
      if (pl.op == ReduceOp::sum) tol = 2.0 * (p + 1) * u * mag;
      if (pl.op == ReduceOp::avg) ref /= p, tol = 2.0 * (p + 2) * u * mag / p;
      if (pl.op == ReduceOp::prod) tol = 2.0 * (p + 1) * u * std::fabs(ref);
      const double gv = load_float(dt, g);
      bad = !(std::fabs(gv - ref) <= tol);  // NaN is bad
      if (bad) std::snprintf(b, sizeof b, "got %.17g, expected %.17g (tolerance %.3g)", gv, ref, tol);
    } else {
      int64_t want = 0, have = 0;
      auto run = [&](auto tag) {
        using T = decltype(tag);
        T v[64] = {};
        for (int r = 0; r < p; ++r) std::memcpy(&v[r], ins[r], sizeof(T));
        want = int64_t(int_reduce<T>(pl.op, v, p));
        T h;
        std::memcpy(&h, g, sizeof(T));
        have = int64_t(h);
      };
      switch (dt) {
        case DType::i8: run(int8_t{}); break;
        case DType::u8: run(uint8_t{}); break;
        case DType::i32: run(int32_t{}); break;
        case DType::i64: run(int64_t{}); break;
        default: {  // bool: any non-zero is true; results are 0 or 1
          uint8_t v[64];
          for (int r = 0; r < p; ++r) v[r] = ins[r][0] != 0;
          const bool orr = pl.op == ReduceOp::sum || pl.op == ReduceOp::max || pl.op == ReduceOp::bor;
          const bool andd = pl.op == ReduceOp::prod || pl.op == ReduceOp::min || pl.op == ReduceOp::band;
          uint8_t acc = v[0];
          for (int r = 1; r < p; ++r) acc = orr ? (acc | v[r]) : andd ? (acc & v[r]) : (acc ^ v[r]);
          want = acc;
          have = g[0];
        }
      }
      bad = want != have;
      if (bad) std::snprintf(b, sizeof b, "got %" PRId64 ", expected %" PRId64, have, want);
    }
    if (bad) {
      what = "element " + std::to_string(j) + " (global " + std::to_string(i) + "): " + b;
      return int64_t(j);
    }
  }
  return -1;
}

// The first differing byte of got vs expected as a message ("" when equal).
std::string compare_bytes(DType dt, const uint8_t* got, const uint8_t* want, size_t n) {
  std::vector<uint8_t> flipped;
  if (g_corrupt_now && n > 0) {
    flipped.assign(got, got + n);
    flipped[n / 2] ^= 0x10;
    got = flipped.data();
  }
  if (n == 0 || std::memcmp(got, want, n) == 0) return "";
  size_t b = 0;
  while (got[b] == want[b]) ++b;
  const size_t es = dtype_size(dt), e = b / es;
  char s[256];
  uint64_t gv = 0, wv = 0;
  std::memcpy(&gv, got + e * es, std::min<size_t>(es, 8));
  std::memcpy(&wv, want + e * es, std::min<size_t>(es, 8));
  size_t bad = 0;
  for (size_t k = 0; k < n; ++k) bad += got[k] != want[k];
  std::snprintf(s, sizeof s, "element %zu (byte %zu): got 0x%0*" PRIx64 ", expected 0x%0*" PRIx64 " (%zu of %zu bytes differ)",
                e, b, int(2 * es), gv, int(2 * es), wv, bad, n);
  return s;
}

// A buffer followed by guard bytes that must stay untouched.
constexpr size_t kGuard = 64;
constexpr uint8_t kGuardByte = 0xEE, kFill = 0xA5;
struct Buf {
  std::vector<uint8_t> v;
  size_t n = 0;
  explicit Buf(size_t bytes, uint8_t fill = kFill) : v(bytes + kGuard, fill), n(bytes) {
    for (size_t k = 0; k < kGuard; ++k) v[bytes + k] = kGuardByte;
  }
  uint8_t* data() { return v.data(); }
  std::string guards() const {
    for (size_t k = 0; k < kGuard; ++k)
      if (v[n + k] != kGuardByte) return "guard byte " + std::to_string(k) + " past the end was overwritten";
    return "";
  }
  std::string untouched() const {
    for (size_t k = 0; k < n; ++k)
      if (v[k] != kFill) return "byte " + std::to_string(k) + " of a buffer that must not be written was written";
    return guards();
  }
};

// ---- Running one op ----------------------------------------------------------------------------

// Runs pl on c; returns "" or what was wrong.
std::string run_op(Communicator& c, const Plan& pl) {
  const int p = c.size(), me = c.rank();
  const size_t es = dtype_size(pl.dt);
  const CallOptions co{pl.algo};
  const uint64_t my_base = stream_base(pl.seed, me);
  std::string err;
  auto first = [&](std::string e) {
    if (err.empty() && !e.empty()) err = std::move(e);
  };
  switch (pl.kind) {
    case Kind::allreduce: {
      Buf in(pl.count * es);
      fill_reduce_input(pl.dt, pl.op, in.data(), pl.count, my_base);
      if (pl.in_place) {
        c.allreduce(in.data(), in.data(), pl.count, pl.dt, pl.op, co)->wait();
        check_reduce(pl, p, in.data(), pl.count, 0, err);
        first(in.guards());
      } else {
        Buf out(pl.count * es);
        c.allreduce(in.data(), out.data(), pl.count, pl.dt, pl.op, co)->wait();
        check_reduce(pl, p, out.data(), pl.count, 0, err);
        first(out.guards());
      }
      break;
    }
    case Kind::reduce: {
      Buf in(pl.count * es), out(pl.count * es);
      fill_reduce_input(pl.dt, pl.op, in.data(), pl.count, my_base);
      const bool root = me == pl.root;
      uint8_t* o = root ? (pl.in_place ? in.data() : out.data()) : (pl.null_nonroot ? nullptr : out.data());
      c.reduce(in.data(), o, pl.count, pl.dt, pl.op, pl.root, co)->wait();
      if (root) {
        check_reduce(pl, p, o, pl.count, 0, err);
        first(pl.in_place ? in.guards() : out.guards());
      } else {
        first(out.untouched());
      }
      break;
    }
    case Kind::reduce_scatter: {
      Buf in(pl.count * es * size_t(p)), out(pl.count * es);
      fill_reduce_input(pl.dt, pl.op, in.data(), pl.count * size_t(p), my_base);
      c.reduce_scatter(in.data(), out.data(), pl.count, pl.dt, pl.op, co)->wait();
      check_reduce(pl, p, out.data(), pl.count, size_t(me) * pl.count, err);
      first(out.guards());
      break;
    }
    case Kind::broadcast: {
      const size_t n = pl.count * es;
      Buf buf(n), want(n);
      fill_stream(want.data(), n, stream_base(pl.seed, pl.root), 0);
      if (me == pl.root) std::memcpy(buf.data(), want.data(), n);
      c.broadcast(buf.data(), pl.count, pl.dt, pl.root, co)->wait();
      first(compare_bytes(pl.dt, buf.data(), want.data(), n));
      first(buf.guards());
      break;
    }
    case Kind::allgather: {
      const size_t n = pl.count * es;
      Buf in(n), out(n * size_t(p)), want(n * size_t(p));
      fill_stream(in.data(), n, my_base, 0);
      for (int r = 0; r < p; ++r) fill_stream(want.data() + size_t(r) * n, n, stream_base(pl.seed, r), 0);
      c.allgather(in.data(), out.data(), pl.count, pl.dt, co)->wait();
      first(compare_bytes(pl.dt, out.data(), want.data(), n * size_t(p)));
      first(out.guards());
      break;
    }
    case Kind::allgatherv: {
      size_t total = 0;
      for (size_t k : pl.counts) total += k;
      Buf in(pl.counts[size_t(me)] * es), out(total * es), want(total * es);
      fill_stream(in.data(), pl.counts[size_t(me)] * es, my_base, 0);
      size_t off = 0;
      for (int r = 0; r < p; ++r) {
        fill_stream(want.data() + off, pl.counts[size_t(r)] * es, stream_base(pl.seed, r), 0);
        off += pl.counts[size_t(r)] * es;
      }
      c.allgatherv(in.data(), out.data(), pl.counts, pl.dt, co)->wait();
      first(compare_bytes(pl.dt, out.data(), want.data(), total * es));
      first(out.guards());
      break;
    }
    case Kind::gather: {
      const size_t n = pl.count * es;
      Buf in(n), out(n * size_t(p));
      fill_stream(in.data(), n, my_base, 0);
      const bool root = me == pl.root;
      c.gather(in.data(), root || !pl.null_nonroot ? out.data() : nullptr, pl.count, pl.dt, pl.root, co)->wait();
      if (root) {
        Buf want(n * size_t(p));
        for (int r = 0; r < p; ++r) fill_stream(want.data() + size_t(r) * n, n, stream_base(pl.seed, r), 0);
        first(compare_bytes(pl.dt, out.data(), want.data(), n * size_t(p)));
        first(out.guards());
      } else {
        first(out.untouched());
      }
      break;
    }
    case Kind::scatter: {
      const size_t n = pl.count * es;
      Buf in(n * size_t(p)), out(n), want(n);
      const bool root = me == pl.root;
      if (root) fill_stream(in.data(), n * size_t(p), my_base, 0);
      fill_stream(want.data(), n, stream_base(pl.seed, pl.root), size_t(me) * n);
      c.scatter(root || !pl.null_nonroot ? in.data() : nullptr, out.data(), pl.count, pl.dt, pl.root, co)->wait();
      first(compare_bytes(pl.dt, out.data(), want.data(), n));
      first(out.guards());
      if (!root) first(in.untouched());
      break;
    }
    case Kind::alltoall: {
      const size_t n = pl.count * es;
      Buf in(n * size_t(p)), want(n * size_t(p));
      fill_stream(in.data(), n * size_t(p), my_base, 0);
      for (int r = 0; r < p; ++r) fill_stream(want.data() + size_t(r) * n, n, stream_base(pl.seed, r), size_t(me) * n);
      if (pl.in_place) {
        c.alltoall(in.data(), in.data(), pl.count, pl.dt, co)->wait();
        first(compare_bytes(pl.dt, in.data(), want.data(), n * size_t(p)));
        first(in.guards());
      } else {
        Buf out(n * size_t(p));
        c.alltoall(in.data(), out.data(), pl.count, pl.dt, co)->wait();
        first(compare_bytes(pl.dt, out.data(), want.data(), n * size_t(p)));
        first(out.guards());
      }
      break;
    }
    case Kind::alltoallv: {
      std::vector<size_t> sc(static_cast<size_t>(p)), rc(static_cast<size_t>(p));
      size_t st = 0, rt = 0;
      for (int j = 0; j < p; ++j) {
        sc[size_t(j)] = pl.counts[size_t(me * p + j)];
        rc[size_t(j)] = pl.counts[size_t(j * p + me)];
        st += sc[size_t(j)], rt += rc[size_t(j)];
      }
      Buf in(st * es), out(rt * es), want(rt * es);
      fill_stream(in.data(), st * es, my_base, 0);
      size_t off = 0;
      for (int i = 0; i < p; ++i) {  // block from rank i: at i's send offset for me
        size_t src_off = 0;
        for (int j = 0; j < me; ++j) src_off += pl.counts[size_t(i * p + j)];
        fill_stream(want.data() + off, rc[size_t(i)] * es, stream_base(pl.seed, i), src_off * es);
        off += rc[size_t(i)] * es;
      }
      c.alltoallv(in.data(), sc, out.data(), rc, pl.dt, co)->wait();
      first(compare_bytes(pl.dt, out.data(), want.data(), rt * es));
      first(out.guards());
      break;
    }
    case Kind::sendrecv: {
      const int to = (me + pl.shift) % p, from = (me - pl.shift % p + p) % p;
      const size_t n = pl.count * es;
      Buf out(n), in(n), want(n);
      fill_stream(out.data(), n, my_base, 0);
      fill_stream(want.data(), n, stream_base(pl.seed, from), 0);
      WorkPtr ws, wr;
      const int src = pl.any_source ? Communicator::kAnySource : from;
      if (pl.send_first) {
        ws = c.send(out.data(), pl.count, pl.dt, to, pl.tag);
        wr = c.recv(in.data(), pl.count, pl.dt, src, pl.tag);
      } else {
        wr = c.recv(in.data(), pl.count, pl.dt, src, pl.tag);
        ws = c.send(out.data(), pl.count, pl.dt, to, pl.tag);
      }
      wr->wait();
      ws->wait();
      first(compare_bytes(pl.dt, in.data(), want.data(), n));
      first(in.guards());
      if (pl.any_source && wr->source() != from)
        first("any-source recv reports source " + std::to_string(wr->source()) + ", expected " + std::to_string(from));
      break;
    }
    case Kind::barrier: c.barrier()->wait(); break;
    case Kind::count: break;
  }
  return err;
}

// ---- Resources ---------------------------------------------------------------------------------

size_t rss_bytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  unsigned long size = 0, res = 0;
  if (std::fscanf(f, "%lu %lu", &size, &res) != 2) res = 0;
  std::fclose(f);
  return size_t(res) * size_t(sysconf(_SC_PAGESIZE));
}

// RssAnon and RssShmem from /proc/self/status, in bytes: heap vs shared segments' pages.
std::pair<size_t, size_t> rss_split() {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return {0, 0};
  char line[256];
  size_t anon = 0, shmem = 0;
  while (std::fgets(line, sizeof line, f)) {
    unsigned long kb = 0;
    if (std::sscanf(line, "RssAnon: %lu kB", &kb) == 1) anon = size_t(kb) << 10;
    if (std::sscanf(line, "RssShmem: %lu kB", &kb) == 1) shmem = size_t(kb) << 10;
  }
  std::fclose(f);
  return {anon, shmem};
}

int count_fds() {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  int n = 0;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n - 1;  // the directory's own fd
}

// /dev/shm entries named shoal-<pid>-... for one of pids.
int count_segments(const std::vector<int>& pids) {
  DIR* d = opendir("/dev/shm");
  if (!d) return 0;
  int n = 0;
  while (dirent* e = readdir(d)) {
    int pid = 0;
    if (std::sscanf(e->d_name, "shoal-%d-", &pid) == 1 && std::find(pids.begin(), pids.end(), pid) != pids.end()) ++n;
  }
  closedir(d);
  return n;
}

struct Checkpoint {
  uint64_t op;
  size_t rss;
  size_t anon, shmem;
  int fds;
  int segs;
  double seconds;
};

// ---- Main --------------------------------------------------------------------------------------

struct Args {
  uint64_t ops = 10000;
  uint64_t seed = 1;
  size_t max_bytes = size_t(16) << 20;
  uint64_t check_every = 500;
  bool warmup = true;
  size_t rss_limit = size_t(32) << 20;
  bool verbose = false;
  bool trace_rss = false;  // print every op after which RssAnon or RssShmem reached a new high
};

size_t parse_size(const char* s) {
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  size_t mult = 1;
  if (end && *end) {
    switch (*end) {
      case 'k': case 'K': mult = size_t(1) << 10; break;
      case 'm': case 'M': mult = size_t(1) << 20; break;
      case 'g': case 'G': mult = size_t(1) << 30; break;
      default: throw std::runtime_error(std::string("bad size '") + s + "'");
    }
  }
  if (!(v >= 0)) throw std::runtime_error(std::string("bad size '") + s + "'");
  return size_t(v * double(mult));
}

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "shoal-soak: %s\nusage: shoal-run -n N shoal-soak [--ops N] [--seed S] [--max-bytes B] "
               "[--check-every K] [--warmup 0|1] [--rss-limit-mib M] [--verbose] [--trace-rss] [--corrupt-op I]\n",
               why);
  std::exit(3);
}

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--verbose") { a.verbose = true; continue; }
    if (k == "--trace-rss") { a.trace_rss = true; continue; }
    if (k == "--help" || k == "-h") usage("help");
    if (i + 1 >= argc) usage(("missing value for " + k).c_str());
    const char* v = argv[++i];
    try {
      if (k == "--ops") a.ops = std::stoull(v);
      else if (k == "--seed") a.seed = std::stoull(v);
      else if (k == "--max-bytes") a.max_bytes = parse_size(v);
      else if (k == "--check-every") a.check_every = std::max<uint64_t>(1, std::stoull(v));
      else if (k == "--warmup") a.warmup = std::stoi(v) != 0;
      else if (k == "--rss-limit-mib") a.rss_limit = size_t(std::stoull(v)) << 20;
      else if (k == "--corrupt-op") g_corrupt_op = std::stoll(v);
      else usage(("unknown option " + k).c_str());
    } catch (const std::exception&) {
      usage(("bad value for " + k + ": " + v).c_str());
    }
  }
  return a;
}

int env_int(const char* name) {
  const char* s = std::getenv(name);
  if (!s || !*s) {
    std::fprintf(stderr, "shoal-soak: %s is not set (start it with shoal-run -n N)\n", name);
    std::exit(3);
  }
  return std::atoi(s);
}

std::string mib(size_t b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.1f MiB", double(b) / (1 << 20));
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse_args(argc, argv);
  // Large buffers from mmap and back to the kernel when freed (no dynamic threshold): RSS then
  // follows what is live, not the allocator's high-water mark.
  mallopt(M_MMAP_THRESHOLD, 256 << 10);
  mallopt(M_TRIM_THRESHOLD, 1 << 20);

  const int rank = env_int("SHOAL_RANK"), size = env_int("SHOAL_WORLD_SIZE");
  if (size < 2) usage("needs at least 2 ranks");
  const auto t0 = Clock::now();
  auto since = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };

  std::vector<int> pids;
  std::vector<Checkpoint> cps;
  uint64_t n_kind[kKinds] = {}, bytes_kind[kKinds] = {}, n_where[3] = {}, n_warm = 0;
  double sec_kind[kKinds] = {};
  double slowest = 0;
  std::string slowest_op;
  int rc = 0;
  const Plan* current = nullptr;
  size_t hi_anon = 0, hi_shmem = 0;
  try {
    auto store = store_from_env(rank, std::chrono::seconds(300));
    Options base = Options::from_env({});
    Options so = base, to = base;
    so.group_name = "soak-shm";
    so.transport = TransportKind::shm;
    to.group_name = "soak-tcp";
    to.transport = TransportKind::tcp;
    Options ho = base;
    ho.group_name = "soak-hosts";
    auto shm = std::make_unique<Communicator>(store, rank, size, so);
    auto tcp = std::make_unique<Communicator>(store, rank, size, to);
    setenv("SHOAL_HOST_ID", rank % 2 ? "soak-odd" : "soak-even", 1);
    auto hosts = std::make_unique<Communicator>(store, rank, size, ho);
    unsetenv("SHOAL_HOST_ID");
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      const std::string across = r % 2 == rank % 2 ? "shm" : "tcp";
      if (shm->transport_to(r) != "shm" || tcp->transport_to(r) != "tcp" || hosts->transport_to(r) != across) {
        std::fprintf(stderr, "shoal-soak: rank %d: transports to rank %d are %s / %s / %s, expected shm / tcp / %s\n",
                     rank, r, shm->transport_to(r).c_str(), tcp->transport_to(r).c_str(),
                     hosts->transport_to(r).c_str(), across.c_str());
        return 1;
      }
    }
    {  // every rank's pid, for the /dev/shm check
      pids.assign(size_t(size), 0);
      const int32_t mine = int32_t(getpid());
      std::vector<int32_t> all(static_cast<size_t>(size));
      tcp->allgather(&mine, all.data(), 1, DType::i32)->wait();
      pids.assign(all.begin(), all.end());
    }
    if (rank == 0)
      std::printf("soak: %d ranks, %" PRIu64 " ops, seed %" PRIu64 ", max %zu bytes, checkpoint every %" PRIu64 " ops\n",
                  size, args.ops, args.seed, args.max_bytes, args.check_every);

    auto run_checked = [&](const Plan& pl) {
      current = &pl;
      Communicator& c = pl.where == Where::tcp ? *tcp : pl.where == Where::hosts ? *hosts : *shm;
      const auto s = Clock::now();
      g_corrupt_now = !pl.warmup && rank == 0 && int64_t(pl.index) == g_corrupt_op;
      std::string err = run_op(c, pl);
      g_corrupt_now = false;
      const double dt = std::chrono::duration<double>(Clock::now() - s).count();
      if (!err.empty()) {
        std::fprintf(stderr, "shoal-soak: rank %d: WRONG RESULT in %s: %s\n", rank, pl.describe().c_str(), err.c_str());
        std::fflush(stderr);
        std::_Exit(1);
      }
      if (args.verbose && rank == 0) std::printf("  %.3fs %s\n", dt, pl.describe().c_str());
      if (args.trace_rss) {
        const auto [anon, shmem] = rss_split();
        if (anon > hi_anon + (256 << 10) || shmem > hi_shmem + (256 << 10))
          std::printf("  rank %d: anon %s shmem %s after %s\n", rank, mib(anon).c_str(), mib(shmem).c_str(),
                      pl.describe().c_str());
        hi_anon = std::max(hi_anon, anon), hi_shmem = std::max(hi_shmem, shmem);
      }
      current = nullptr;
      return dt;
    };

    if (args.warmup) {
      // Every (op, algorithm, transport) at the largest size, the rooted ones from every root: the
      // communicators' scratch buffers (kept across ops, sized by the largest op so far) and the
      // pages of the shared segments that ops touch reach their high-water marks here, so that RSS
      // growth past the first checkpoint means a leak. (With one root only, ranks grew by up to
      // 24 MiB later in the run, in steps, as other roots came up.)
      uint64_t w = 0;
      for (Where where : {Where::shm, Where::tcp, Where::hosts})
        for (int k = 0; k < kKinds; ++k) {
          const Kind kind = Kind(k);
          auto algos = algos_of(kind, where);
          algos.insert(algos.begin(), Algo::automatic);
          if (kind == Kind::sendrecv || kind == Kind::barrier) algos = {Algo::automatic};
          const bool rooted = kind == Kind::broadcast || kind == Kind::reduce || kind == Kind::gather || kind == Kind::scatter;
          for (Algo a : algos)
            for (DType dt : {DType::f32})
              for (int root = 0; root < (rooted ? size : 1); ++root) {
                Plan pl = make_plan(args.seed ^ 0x5eed, w, size, args.max_bytes);  // for the per-op choices
                pl.index = w++;
                pl.warmup = true;
                pl.kind = kind;
                pl.where = where;
                pl.algo = a;
                pl.dt = dt;
                pl.op = ReduceOp::sum;
                pl.root = root;
                pl.in_place = false;
                const size_t es = dtype_size(dt), p = size_t(size);
                pl.counts.clear();
                if (blocked(kind)) pl.count = args.max_bytes / (es * p);
                else if (kind == Kind::allgatherv) pl.counts.assign(p, pl.count = args.max_bytes / (es * p));
                else if (kind == Kind::alltoallv) pl.counts.assign(p * p, pl.count = args.max_bytes / (es * p * p));
                else if (kind == Kind::barrier) pl.count = 0;
                else pl.count = args.max_bytes / es;
                pl.bytes = args.max_bytes;
                run_checked(pl);
                ++n_warm;
              }
        }
      if (rank == 0) std::printf("soak: warm-up: %" PRIu64 " ops at %zu bytes in %.1f s\n", n_warm, args.max_bytes, since());
    }

    auto checkpoint = [&](uint64_t op) {
      const auto [anon, shmem] = rss_split();
      Checkpoint cp{op, rss_bytes(), anon, shmem, count_fds(), count_segments(pids), since()};
      cps.push_back(cp);
      if (rank == 0) {
        std::printf("soak: op %6" PRIu64 "  %7.1f s  rss %s  fds %d  segments %d\n", op, cp.seconds, mib(cp.rss).c_str(),
                    cp.fds, cp.segs);
        std::fflush(stdout);
      }
    };
    const auto run_start = Clock::now();
    checkpoint(0);
    for (uint64_t i = 0; i < args.ops; ++i) {
      const Plan pl = make_plan(args.seed, i, size, args.max_bytes);
      const double dt = run_checked(pl);
      const int k = static_cast<int>(pl.kind);
      ++n_kind[k];
      bytes_kind[k] += pl.bytes;
      sec_kind[k] += dt;
      n_where[int(pl.where)]++;
      if (dt > slowest) slowest = dt, slowest_op = pl.describe();
      if ((i + 1) % args.check_every == 0 || i + 1 == args.ops) checkpoint(i + 1);
    }
    const double run_seconds = std::chrono::duration<double>(Clock::now() - run_start).count();

    // Every rank's figures to rank 0: rss first/last/max, fds first/last, segments max.
    const Checkpoint& f = cps.front();
    const Checkpoint& l = cps.back();
    size_t rss_max = 0;
    int segs_max = 0;
    for (const auto& cp : cps) rss_max = std::max(rss_max, cp.rss), segs_max = std::max(segs_max, cp.segs);
    int64_t mine[6] = {int64_t(f.rss), int64_t(l.rss), int64_t(rss_max), f.fds, l.fds, segs_max};
    std::vector<int64_t> all(size_t(6 * size));
    tcp->allgather(mine, all.data(), 6, DType::i64)->wait();
    // RSS, RssAnon, RssShmem at each checkpoint.
    const size_t nc = cps.size();
    std::vector<int64_t> series(3 * nc), all_series(3 * nc * size_t(size));
    for (size_t k = 0; k < nc; ++k)
      series[k] = int64_t(cps[k].rss), series[nc + k] = int64_t(cps[k].anon), series[2 * nc + k] = int64_t(cps[k].shmem);
    tcp->allgather(series.data(), all_series.data(), series.size(), DType::i64)->wait();
    tcp->barrier()->wait();

    std::string problems;
    if (l.rss > f.rss + args.rss_limit)
      problems += "RSS grew from " + mib(f.rss) + " to " + mib(l.rss) + " (limit +" + mib(args.rss_limit) + "); ";
    if (l.fds != f.fds)
      problems += "open fds went from " + std::to_string(f.fds) + " to " + std::to_string(l.fds) + "; ";

    shm.reset();
    tcp.reset();
    hosts.reset();
    const int segs_after = count_segments(pids);
    if (segs_after != 0) problems += std::to_string(segs_after) + " /dev/shm/shoal-<pid>-* segments left; ";

    if (rank == 0) {
      uint64_t total_ops = 0, total_bytes = 0;
      for (int k = 0; k < kKinds; ++k) total_ops += n_kind[k], total_bytes += bytes_kind[k];
      std::printf("soak: per kind (ops, payload, seconds):\n");
      for (int k = 0; k < kKinds; ++k)
        std::printf("  %-15s %6" PRIu64 "  %12s  %7.1f s\n", kind_name(Kind(k)), n_kind[k], mib(bytes_kind[k]).c_str(),
                    sec_kind[k]);
      std::printf("soak: slowest op %.2f s: %s\n", slowest, slowest_op.c_str());
      for (int r = 0; r < size; ++r) {
        const int64_t* a = &all[size_t(6 * r)];
        std::printf("soak: rank %d: rss first %s last %s max %s, fds first %" PRId64 " last %" PRId64
                    ", segments seen %" PRId64 "\n",
                    r, mib(size_t(a[0])).c_str(), mib(size_t(a[1])).c_str(), mib(size_t(a[2])).c_str(), a[3], a[4], a[5]);
      }
      if (args.verbose || nc <= 41)
        for (int r = 0; r < size; ++r)
          for (int w = 0; w < 3; ++w) {
            std::printf("soak: rank %d %s (MiB) at each checkpoint:", r, w == 0 ? "rss" : w == 1 ? "anon" : "shmem");
            for (size_t k = 0; k < nc; ++k)
              std::printf(" %.1f", double(all_series[size_t(r) * 3 * nc + size_t(w) * nc + k]) / (1 << 20));
            std::printf("\n");
          }
      std::printf("SOAK %s: %d ranks, %" PRIu64 " ops (%" PRIu64 " shm, %" PRIu64 " tcp, %" PRIu64 " hosts; + %" PRIu64
                  " warm-up), %s payload in %.1f s (%.0f ops/s), seed %" PRIu64 ", max %zu bytes; rss rank 0 first %s last %s; "
                  "fds first %d last %d; segments left %d\n",
                  problems.empty() ? "OK" : "FAILED", size, total_ops, n_where[0], n_where[1], n_where[2], n_warm, mib(total_bytes).c_str(),
                  run_seconds, double(total_ops) / std::max(run_seconds, 1e-9), args.seed, args.max_bytes,
                  mib(f.rss).c_str(), mib(l.rss).c_str(), f.fds, l.fds, segs_after);
      std::fflush(stdout);
    }
    if (!problems.empty()) {
      std::fprintf(stderr, "shoal-soak: rank %d: LEAK: %s\n", rank, problems.c_str());
      rc = 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shoal-soak: rank %d: %s%s: %s\n", rank, current ? "error in " : "error",
                 current ? current->describe().c_str() : "", e.what());
    std::fflush(stderr);
    std::_Exit(2);
  }
  return rc;
}
