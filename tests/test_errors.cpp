// Errors from bad use of the API.
//  - Invalid arguments (bad peer or root rank, null buffer with count > 0, unknown dtype or op,
//    an op the dtype does not support, counts vectors of the wrong length) give InvalidArgument
//    on the calling rank only, without touching the peers: the group goes on working.
//  - Mismatched calls across ranks (counts, dtypes, ops, roots, algorithms, different
//    collectives) give every rank an error (PeerError, or Timeout with a short group timeout)
//    within a few seconds: never a wrong result, never a hang.
#include <cstring>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "algo/direct_common.h"
#include "harness.h"

using namespace shoal;
using namespace shoal_test;

namespace {

// ---- Local API -------------------------------------------------------------------------------

TEST(ErrorsApi, TypesAndParsers) {
  const DType bad = static_cast<DType>(99);
  EXPECT_THROW(dtype_size(bad), InvalidArgument);
  for (DType dt : kAllDTypes) {
    EXPECT_EQ(dtype_size(dt), esize(dt)) << dt_name(dt);
    EXPECT_EQ(std::string(dtype_name(dt)), std::string(dt_name(dt)));
    EXPECT_EQ(parse_dtype(dtype_name(dt)), dt);
    EXPECT_FALSE(reduce_op_supported(dt, static_cast<ReduceOp>(99)));
  }
  EXPECT_THROW(parse_dtype("float17"), InvalidArgument);
  EXPECT_THROW(parse_dtype(""), InvalidArgument);
  for (ReduceOp op : kAllReduceOps) {
    EXPECT_EQ(parse_reduce_op(reduce_op_name(op)), op);
    EXPECT_FALSE(reduce_op_supported(bad, op));
  }
  EXPECT_THROW(parse_reduce_op("mean"), InvalidArgument);
  EXPECT_EQ(parse_algo("auto"), Algo::automatic);
  EXPECT_EQ(parse_algo("ring"), Algo::ring);
  EXPECT_EQ(parse_algo("bde"), Algo::bde);
  EXPECT_EQ(parse_algo("mst"), Algo::mst);
  EXPECT_EQ(parse_algo("direct"), Algo::direct);
  EXPECT_EQ(parse_algo("rd"), Algo::rd);
  EXPECT_THROW(parse_algo("fastest"), InvalidArgument);
  // Bitwise ops only on integers and bool; arithmetic everywhere.
  for (DType dt : {DType::f16, DType::bf16, DType::f32, DType::f64}) {
    EXPECT_FALSE(reduce_op_supported(dt, ReduceOp::band)) << dt_name(dt);
    EXPECT_FALSE(reduce_op_supported(dt, ReduceOp::bor)) << dt_name(dt);
    EXPECT_FALSE(reduce_op_supported(dt, ReduceOp::bxor)) << dt_name(dt);
    EXPECT_TRUE(reduce_op_supported(dt, ReduceOp::avg)) << dt_name(dt);
  }
  for (DType dt : kAllDTypes) {
    EXPECT_TRUE(reduce_op_supported(dt, ReduceOp::sum)) << dt_name(dt);
    EXPECT_TRUE(reduce_op_supported(dt, ReduceOp::max)) << dt_name(dt);
    EXPECT_EQ(is_integer(dt), !is_float(dt)) << dt_name(dt);
    if (is_integer(dt)) {
      EXPECT_TRUE(reduce_op_supported(dt, ReduceOp::bxor)) << dt_name(dt);
    }
  }
}

TEST(ErrorsApi, OptionsFromEnv) {
  ::setenv("SHOAL_TIMEOUT", "3", 1);
  ::setenv("SHOAL_TRANSPORT", "tcp", 1);
  Options o = Options::from_env({});
  ::unsetenv("SHOAL_TIMEOUT");
  ::unsetenv("SHOAL_TRANSPORT");
  EXPECT_EQ(o.timeout, std::chrono::milliseconds(3000));
  EXPECT_EQ(o.transport, TransportKind::tcp);
  Options base;
  base.timeout = std::chrono::milliseconds(1234);
  EXPECT_EQ(Options::from_env(base).timeout, std::chrono::milliseconds(1234));
  EXPECT_EQ(Options::from_env({}).tcp_notsent_lowat, -1);  // unset: the default
  ::setenv("SHOAL_TCP_NOTSENT_LOWAT", "0", 1);
  EXPECT_EQ(Options::from_env({}).tcp_notsent_lowat, 0);
  ::setenv("SHOAL_TCP_NOTSENT_LOWAT", "131072", 1);
  EXPECT_EQ(Options::from_env({}).tcp_notsent_lowat, 131072);
  ::setenv("SHOAL_TCP_NOTSENT_LOWAT", "16k", 1);  // bytes take K, M, G
  EXPECT_EQ(Options::from_env({}).tcp_notsent_lowat, 16384);
  for (const char* bad : {"-1", "16kb", "x", "2147483648", "2G"}) {
    ::setenv("SHOAL_TCP_NOTSENT_LOWAT", bad, 1);
    EXPECT_THROW(Options::from_env({}), InvalidArgument) << bad;
  }
  ::unsetenv("SHOAL_TCP_NOTSENT_LOWAT");
}

// Constructor arguments: checked before any rendezvous.
TEST(ErrorsApi, CommunicatorArguments) {
  RunConfig cfg;
  cfg.limit = std::chrono::seconds(60);
  run_ranks(1, cfg, [](Communicator&) {
    auto store = std::make_shared<FileStore>(run_dir() + "/store2");
    Options o;
    o.timeout = std::chrono::seconds(2);
    SH_EXPECT_KIND("InvalidArgument", Communicator(store, -1, 2, o));
    SH_EXPECT_KIND("InvalidArgument", Communicator(store, 2, 2, o));
    SH_EXPECT_KIND("InvalidArgument", Communicator(store, 0, 0, o));
    SH_EXPECT_KIND("InvalidArgument", Communicator(nullptr, 0, 1, o));
  });
}

// ---- Invalid arguments on one rank -------------------------------------------------------------

class InvalidArgs : public ::testing::TestWithParam<std::string> {};

// Ranks 0 and 2 make every kind of invalid call (each must raise InvalidArgument, from the call
// or from wait()); rank 1 makes none. Then the whole group runs correct ops: none of the invalid
// calls reached a peer or spoiled the communicator.
TEST_P(InvalidArgs, RaiseOnCallerOnly) {
  RunConfig cfg = timed_config(GetParam(), std::chrono::seconds(20), std::chrono::seconds(90), false);
  run_ranks(3, cfg, [](Communicator& c) {
    const int n = c.size(), me = c.rank();
    std::vector<float> a(64 * n, 1.0f), b(64 * n, 0.0f);
    float* A = a.data();
    float* B = b.data();
    const DType f = DType::f32, bad_dt = static_cast<DType>(99);
    const ReduceOp sum = ReduceOp::sum, bad_op = static_cast<ReduceOp>(99);
    std::vector<std::string> failures;
    auto invalid = [&](const char* what, const std::function<WorkPtr()>& call) {
      std::string e = expect_kind("InvalidArgument", [&] {
        WorkPtr w = call();
        if (w) w->wait();
      });
      if (!e.empty()) failures.push_back(std::string(what) + ": expected InvalidArgument, got " + e);
    };
    if (me != 1) {
      for (int r : {-1, -2, n, 1000}) {
        const std::string rs = std::to_string(r);
        invalid(("send peer " + rs).c_str(), [&] { return c.send(A, 4, f, r); });
        if (r != Communicator::kAnySource)  // recv from -1 is a receive from any source
          invalid(("recv peer " + rs).c_str(), [&] { return c.recv(B, 4, f, r); });
        invalid(("broadcast root " + rs).c_str(), [&] { return c.broadcast(B, 4, f, r); });
        invalid(("reduce root " + rs).c_str(), [&] { return c.reduce(A, B, 4, f, sum, r); });
        invalid(("gather root " + rs).c_str(), [&] { return c.gather(A, B, 4, f, r); });
        invalid(("scatter root " + rs).c_str(), [&] { return c.scatter(A, B, 4, f, r); });
        invalid(("transport_to " + rs).c_str(), [&] { (void)c.transport_to(r); return WorkPtr(); });
      }
      // Null buffers with a count.
      invalid("send null", [&] { return c.send(nullptr, 4, f, 1); });
      invalid("recv null", [&] { return c.recv(nullptr, 4, f, 1); });
      invalid("allreduce null in", [&] { return c.allreduce(nullptr, B, 4, f, sum); });
      invalid("allreduce null out", [&] { return c.allreduce(A, nullptr, 4, f, sum); });
      invalid("broadcast null", [&] { return c.broadcast(nullptr, 4, f, 0); });
      invalid("reduce null in", [&] { return c.reduce(nullptr, B, 4, f, sum, 1); });
      invalid("reduce null out at the root", [&] { return c.reduce(A, nullptr, 4, f, sum, me); });
      invalid("allgather null in", [&] { return c.allgather(nullptr, B, 4, f); });
      invalid("allgather null out", [&] { return c.allgather(A, nullptr, 4, f); });
      invalid("allgatherv null out", [&] { return c.allgatherv(A, nullptr, std::vector<size_t>(n, 2), f); });
      invalid("reduce_scatter null in", [&] { return c.reduce_scatter(nullptr, B, 4, f, sum); });
      invalid("reduce_scatter null out", [&] { return c.reduce_scatter(A, nullptr, 4, f, sum); });
      invalid("gather null out at the root", [&] { return c.gather(A, nullptr, 4, f, me); });
      invalid("gather null in", [&] { return c.gather(nullptr, B, 4, f, 1); });
      invalid("scatter null in at the root", [&] { return c.scatter(nullptr, B, 4, f, me); });
      invalid("scatter null out", [&] { return c.scatter(A, nullptr, 4, f, 1); });
      invalid("alltoall null in", [&] { return c.alltoall(nullptr, B, 4, f); });
      invalid("alltoall null out", [&] { return c.alltoall(A, nullptr, 4, f); });
      // Unknown dtype / op values.
      invalid("allreduce dtype 99", [&] { return c.allreduce(A, B, 4, bad_dt, sum); });
      invalid("allreduce op 99", [&] { return c.allreduce(A, B, 4, f, bad_op); });
      invalid("broadcast dtype 99", [&] { return c.broadcast(B, 4, bad_dt, 0); });
      invalid("reduce dtype 99", [&] { return c.reduce(A, B, 4, bad_dt, sum, 0); });
      invalid("reduce op 99", [&] { return c.reduce(A, B, 4, f, bad_op, 0); });
      invalid("allgather dtype 99", [&] { return c.allgather(A, B, 4, bad_dt); });
      invalid("reduce_scatter op 99", [&] { return c.reduce_scatter(A, B, 4, f, bad_op); });
      invalid("gather dtype 99", [&] { return c.gather(A, B, 4, bad_dt, 0); });
      invalid("scatter dtype 99", [&] { return c.scatter(A, B, 4, bad_dt, 0); });
      invalid("alltoall dtype 99", [&] { return c.alltoall(A, B, 4, bad_dt); });
      invalid("send dtype 99", [&] { return c.send(A, 4, bad_dt, 1); });
      invalid("recv dtype 99", [&] { return c.recv(B, 4, bad_dt, 1); });
      // Ops a dtype does not support.
      invalid("allreduce band f32", [&] { return c.allreduce(A, B, 4, f, ReduceOp::band); });
      invalid("allreduce bxor f16", [&] { return c.allreduce(A, B, 4, DType::f16, ReduceOp::bxor); });
      invalid("reduce bor f64", [&] { return c.reduce(A, B, 2, DType::f64, ReduceOp::bor, 0); });
      invalid("reduce_scatter band bf16", [&] { return c.reduce_scatter(A, B, 4, DType::bf16, ReduceOp::band); });
      invalid("allreduce avg bool", [&] {
        return reduce_op_supported(DType::boolean, ReduceOp::avg) ? WorkPtr()
                                                                   : c.allreduce(A, B, 4, DType::boolean, ReduceOp::avg);
      });
      // Counts vectors of the wrong length.
      invalid("allgatherv counts n-1", [&] { return c.allgatherv(A, B, std::vector<size_t>(n - 1, 1), f); });
      invalid("allgatherv counts n+1", [&] { return c.allgatherv(A, B, std::vector<size_t>(n + 1, 1), f); });
      invalid("allgatherv counts empty", [&] { return c.allgatherv(A, B, {}, f); });
      invalid("allgatherv counts summing past SIZE_MAX", [&] {  // a wrapped sum would look small
        std::vector<size_t> counts(n, 1);
        counts[0] = SIZE_MAX;
        return c.allgatherv(A, B, counts, f);
      });
      invalid("alltoallv send_counts n-1",
              [&] { return c.alltoallv(A, std::vector<size_t>(n - 1, 1), B, std::vector<size_t>(n, 1), f); });
      invalid("alltoallv recv_counts n+1",
              [&] { return c.alltoallv(A, std::vector<size_t>(n, 1), B, std::vector<size_t>(n + 1, 1), f); });
    }
    if (!failures.empty()) {
      std::string s;
      for (auto& x : failures) s += "\n    " + x;
      // Stop the peers too (they would otherwise run the checks below alone); the report of
      // this rank says what was wrong.
      c.abort("invalid-argument checks failed");
      SH_CHECK(false) << failures.size() << " invalid calls did not raise InvalidArgument:" << s;
    }
    SH_CHECK(!c.aborted()) << "an InvalidArgument aborted the communicator";
    // Everybody: the group is intact.
    for (int round = 0; round < 3; ++round) {
      std::vector<int32_t> v(1000, me + 1), w(1000, 0);
      c.allreduce(v.data(), w.data(), 1000, DType::i32, ReduceOp::sum)->wait();
      for (int32_t x : w) SH_CHECK_EQ(x, n * (n + 1) / 2);
      c.barrier()->wait();
      int32_t bc = me == 2 ? 4242 + round : 0;
      c.broadcast(&bc, 1, DType::i32, 2)->wait();
      SH_CHECK_EQ(bc, 4242 + round);
      int32_t x = 0;
      if (me == 0) c.send(&round, 1, DType::i32, 1, 5)->wait();
      if (me == 1) {
        c.recv(&x, 1, DType::i32, 0, 5)->wait();
        SH_CHECK_EQ(x, round);
      }
    }
    // Null buffers with a count of 0 are fine.
    c.allreduce(nullptr, nullptr, 0, DType::f32, ReduceOp::sum)->wait();
    c.broadcast(nullptr, 0, DType::f32, 0)->wait();
    c.allgather(nullptr, nullptr, 0, DType::u8)->wait();
  });
}

INSTANTIATE_TEST_SUITE_P(All, InvalidArgs, ::testing::Values("shm", "tcp"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// ---- Mismatched calls across ranks -------------------------------------------------------------

// Rank `odd` (the last one) calls something different from the others. Every rank must end with
// PeerError or Timeout: either from the mismatched op, or (for a rank whose part of the op could
// finish correctly on its own, e.g. a broadcast root) from a barrier right after it.
struct Mismatch {
  const char* name;
  bool large;      // 1 Mi elements instead of 1001
  bool shm_only;
  // Runs this rank's op (n ranks, `odd` the one that differs) and waits; returns whether the op
  // is allowed to succeed on this rank.
  bool (*run)(Communicator& c, bool odd, size_t count);
};

bool mm_allreduce_count(Communicator& c, bool odd, size_t count) {
  size_t k = odd ? count - 3 : count;
  std::vector<float> a(count, 1.0f), b(count, 0.0f);
  c.allreduce(a.data(), b.data(), k, DType::f32, ReduceOp::sum)->wait();
  return false;
}
bool mm_allreduce_count_direct(Communicator& c, bool odd, size_t count) {
  size_t k = odd ? count - 3 : count;
  std::vector<float> a(count, 1.0f), b(count, 0.0f);
  c.allreduce(a.data(), b.data(), k, DType::f32, ReduceOp::sum, {Algo::direct})->wait();
  return false;
}
bool mm_allreduce_dtype(Communicator& c, bool odd, size_t count) {
  std::vector<int32_t> a(count, 1), b(count, 0);  // same bytes either way
  c.allreduce(a.data(), b.data(), count, odd ? DType::f32 : DType::i32, ReduceOp::sum)->wait();
  return false;
}
bool mm_allreduce_op(Communicator& c, bool odd, size_t count) {
  std::vector<float> a(count, 1.0f), b(count, 0.0f);
  c.allreduce(a.data(), b.data(), count, DType::f32, odd ? ReduceOp::max : ReduceOp::sum)->wait();
  return false;
}
bool mm_allreduce_algo(Communicator& c, bool odd, size_t count) {
  std::vector<float> a(count, 1.0f), b(count, 0.0f);
  c.allreduce(a.data(), b.data(), count, DType::f32, ReduceOp::sum, {odd ? Algo::mst : Algo::ring})->wait();
  return false;
}
bool mm_broadcast_root(Communicator& c, bool odd, size_t count) {
  std::vector<float> a(count, c.rank() == 0 ? 1.0f : 0.0f);
  c.broadcast(a.data(), count, DType::f32, odd ? 1 : 0)->wait();
  // Ranks 0 and 1 agree (root 0): their part may finish, but only with root 0's data. The odd
  // rank waits for rank 1, which never sends as a root.
  if (odd) return false;
  for (float x : a)
    if (x != 1.0f) return false;
  return true;
}
bool mm_allreduce_vs_broadcast(Communicator& c, bool odd, size_t count) {
  std::vector<float> a(count, 1.0f), b(count, 0.0f);
  if (odd)
    c.broadcast(a.data(), count, DType::f32, 0)->wait();
  else
    c.allreduce(a.data(), b.data(), count, DType::f32, ReduceOp::sum)->wait();
  return false;
}
bool mm_allreduce_vs_barrier(Communicator& c, bool odd, size_t count) {
  std::vector<float> a(count, 1.0f), b(count, 0.0f);
  if (odd)
    c.barrier()->wait();
  else
    c.allreduce(a.data(), b.data(), count, DType::f32, ReduceOp::sum)->wait();
  return false;
}
bool mm_allgatherv_counts(Communicator& c, bool odd, size_t count) {
  const int n = c.size();
  std::vector<size_t> counts(n, count / 4);
  if (odd) counts[0] += 1;  // the odd rank thinks rank 0 contributes one more
  size_t total = 0;
  for (size_t x : counts) total += x;
  std::vector<float> a(counts[c.rank()], 1.0f), b(total, 0.0f);
  c.allgatherv(a.data(), b.data(), counts, DType::f32)->wait();
  return false;
}
// The odd rank's op is chunked (1 Mi elements), the others' small (direct_small.cpp).
bool mm_allreduce_small_vs_chunked(Communicator& c, bool odd, size_t count) {
  const size_t big = (size_t(1) << 20) + 3, k = odd ? big : count;
  std::vector<float> a(big, 1.0f), b(big, 0.0f);
  c.allreduce(a.data(), b.data(), k, DType::f32, ReduceOp::sum, {Algo::direct})->wait();
  return false;
}
bool mm_reduce_root(Communicator& c, bool odd, size_t count) {
  std::vector<float> a(count, 1.0f), b(count, 0.0f);
  const int root = odd ? 1 : 0;
  c.reduce(a.data(), b.data(), count, DType::f32, ReduceOp::sum, root)->wait();
  return c.rank() != root;  // a rank that only sends its part may finish
}

bool mm_alltoall_count(Communicator& c, bool odd, size_t count) {
  const size_t n = static_cast<size_t>(c.size()), k = odd ? count - 3 : count;
  std::vector<float> a(count * n, 1.0f), b(count * n, 0.0f);
  c.alltoall(a.data(), b.data(), k, DType::f32)->wait();
  return false;
}
// 15 elements per block: the small direct alltoall over shared memory.
bool mm_alltoall_count_small(Communicator& c, bool odd, size_t count) { return mm_alltoall_count(c, odd, count / 64); }

constexpr Mismatch kMismatches[] = {
    {"allreduce_count", false, false, mm_allreduce_count},
    {"allreduce_count_large", true, false, mm_allreduce_count},
    {"allreduce_count_direct", false, true, mm_allreduce_count_direct},
    {"allreduce_count_direct_large", true, true, mm_allreduce_count_direct},
    {"allreduce_dtype", false, false, mm_allreduce_dtype},
    {"allreduce_dtype_large", true, false, mm_allreduce_dtype},
    {"allreduce_op", false, false, mm_allreduce_op},
    {"allreduce_algo", false, false, mm_allreduce_algo},
    {"broadcast_root", false, false, mm_broadcast_root},
    {"broadcast_root_large", true, false, mm_broadcast_root},
    {"reduce_root", false, false, mm_reduce_root},
    {"allreduce_vs_broadcast", false, false, mm_allreduce_vs_broadcast},
    {"allreduce_vs_broadcast_large", true, false, mm_allreduce_vs_broadcast},
    {"allreduce_vs_barrier", false, false, mm_allreduce_vs_barrier},
    {"allgatherv_counts", false, false, mm_allgatherv_counts},
    {"allreduce_small_vs_chunked", false, true, mm_allreduce_small_vs_chunked},
    {"alltoall_count", false, false, mm_alltoall_count},
    {"alltoall_count_small", false, false, mm_alltoall_count_small},
    {"alltoall_count_large", true, false, mm_alltoall_count},
};

class Mismatched : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(Mismatched, EveryRankGetsAnError) {
  const auto& [transport, which] = GetParam();
  const Mismatch mm = kMismatches[which];
  constexpr int n = 3;
  constexpr double kTimeout = 3.0;
  RunConfig cfg = timed_config(transport, std::chrono::milliseconds(int(kTimeout * 1000)), std::chrono::seconds(40));
  auto res = run_ranks_outcomes(n, cfg, [mm](Communicator& c) {
    const bool odd = c.rank() == c.size() - 1;
    const size_t count = mm.large ? (size_t(1) << 20) + 3 : 1001;
    mark_time();
    bool may_succeed = mm.run(c, odd, count);
    note("op succeeded");
    std::string next = "succeeded";
    std::exception_ptr err;
    try {
      c.barrier()->wait();
    } catch (...) {
      err = std::current_exception();
      next = "failed with " + kind_of(err) + ": " + what_of(err);
    }
    SH_CHECK(may_succeed) << "the mismatched op succeeded on rank " << c.rank()
                          << " (a wrong result); a barrier right after it " << next;
    SH_CHECK(err) << "the op and a barrier after it both succeeded on rank " << c.rank();
    std::rethrow_exception(err);  // the error this rank got, from the barrier
  });
  for (const auto& o : res.ranks) {
    SCOPED_TRACE("rank " + std::to_string(o.rank));
    EXPECT_FALSE(o.hung) << res.describe();
    EXPECT_TRUE(o.error_kind == "PeerError" || o.error_kind == "Timeout") << res.describe();
    EXPECT_LT(o.fail_seconds, kTimeout + 3.0) << res.describe();
  }
}

// A reduce's streamed one shot (src/algo/direct_allreduce.cpp): the root reads the others'
// pieces as they come and they wait for it before wrapping around their slot, with no barrier
// before either. A count, a root or an op that differs on the last rank (a non-root, or the root)
// fails every rank with PeerError within the timeout, never a hang; the vectors span many slots
// (ring wrap) or less than one.
struct StreamedMismatch {
  const char* name;
  // This rank's call; `odd`: the last rank, whose call differs.
  void (*run)(Communicator& c, bool odd, size_t count);
};
constexpr StreamedMismatch kStreamedMismatches[] = {
    {"count",
     [](Communicator& c, bool odd, size_t count) {
       std::vector<float> a(count, 1.0f), b(count, 0.0f);
       c.reduce(a.data(), b.data(), odd ? count - 3 : count, DType::f32, ReduceOp::sum, 0, {Algo::direct})->wait();
     }},
    {"root",
     [](Communicator& c, bool odd, size_t count) {
       std::vector<float> a(count, 1.0f), b(count, 0.0f);
       c.reduce(a.data(), b.data(), count, DType::f32, ReduceOp::sum, odd ? 1 : 0, {Algo::direct})->wait();
     }},
    {"root_calls_allreduce",  // the last rank is the others' root
     [](Communicator& c, bool odd, size_t count) {
       std::vector<float> a(count, 1.0f), b(count, 0.0f);
       if (odd)
         c.allreduce(a.data(), b.data(), count, DType::f32, ReduceOp::sum, {Algo::direct})->wait();
       else
         c.reduce(a.data(), b.data(), count, DType::f32, ReduceOp::sum, c.size() - 1, {Algo::direct})->wait();
     }},
    {"leaf_calls_broadcast",
     [](Communicator& c, bool odd, size_t count) {
       std::vector<float> a(count, 1.0f), b(count, 0.0f);
       if (odd)
         c.broadcast(a.data(), count, DType::f32, 0, {Algo::direct})->wait();
       else
         c.reduce(a.data(), b.data(), count, DType::f32, ReduceOp::sum, 0, {Algo::direct})->wait();
     }},
};

class StreamedReduceMismatched : public ::testing::TestWithParam<std::tuple<int, size_t>> {};

TEST_P(StreamedReduceMismatched, EveryRankGetsAnError) {
  const auto& [which, count] = GetParam();
  const StreamedMismatch mm = kStreamedMismatches[which];
  const auto timeout = std::chrono::milliseconds(3000);
  RunConfig cfg = timed_config("shm", timeout, std::chrono::seconds(40));
  cfg.env.push_back({"SHOAL_SHM_SCRATCH", std::to_string((256 << 10) + algo::direct::kHeaderBytes + algo::direct::kSmallArea)});
  cfg.env.push_back({"SHOAL_DIRECT_REDUCE", "one_shot"});
  expect_every_rank_fails(3, cfg, timeout, [mm, count = count](Communicator& c) { mm.run(c, c.rank() == c.size() - 1, count); });
}

INSTANTIATE_TEST_SUITE_P(All, StreamedReduceMismatched,
                         ::testing::Combine(::testing::Range(0, int(std::size(kStreamedMismatches))),
                                            ::testing::Values(size_t(20003), size_t(300007))),
                         [](const auto& i) {
                           return std::string(kStreamedMismatches[std::get<0>(i.param)].name) + "_" +
                                  std::to_string(std::get<1>(i.param));
                         });

// The error of a mismatch quotes both ranks' calls, on every rank: op, number, count, dtype, and
// the reduce op or root. Rank 1 calls a broadcast (root 0) where rank 0 calls an allreduce; the
// op before agrees, so both are their second. Over shared memory each rank sees the other's
// token; over TCP both ranks wait to receive (allreduce by MST first gathers to rank 0), and the
// timeout's error quotes the calls the same way.
class MismatchMessage : public ::testing::TestWithParam<std::string> {};

TEST_P(MismatchMessage, QuotesBothCalls) {
  RunConfig cfg = timed_config(GetParam(), std::chrono::milliseconds(1000), std::chrono::seconds(40));
  auto res = run_ranks_outcomes(2, cfg, [](Communicator& c) {
    std::vector<float> a(1001, 1.0f), b(1001, 0.0f);
    c.allreduce(a.data(), b.data(), 7, DType::f32, ReduceOp::max)->wait();
    if (c.rank() == 0)
      c.allreduce(a.data(), b.data(), 1001, DType::f32, ReduceOp::sum)->wait();
    else
      c.broadcast(a.data(), 1001, DType::f32, 0)->wait();
    c.barrier()->wait();
  });
  for (const auto& o : res.ranks) {
    SCOPED_TRACE("rank " + std::to_string(o.rank));
    EXPECT_TRUE(o.error_kind == "PeerError" || o.error_kind == "Timeout") << res.describe();
    EXPECT_NE(o.message.find("rank 0 called: allreduce #2 (count 1001, f32, sum, algorithm "), std::string::npos)
        << o.message;
    EXPECT_NE(o.message.find("rank 1 called: broadcast #2 (count 1001, f32, root 0, algorithm "), std::string::npos)
        << o.message;
  }
}

INSTANTIATE_TEST_SUITE_P(All, MismatchMessage, ::testing::Values("shm", "tcp"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// Every case on shm; on tcp those that do not need shared memory (direct algorithms).
std::vector<std::tuple<std::string, int>> mismatch_params() {
  std::vector<std::tuple<std::string, int>> v;
  for (const char* t : {"shm", "tcp"})
    for (int i = 0; i < int(std::size(kMismatches)); ++i)
      if (!kMismatches[i].shm_only || std::string(t) == "shm") v.emplace_back(t, i);
  return v;
}

INSTANTIATE_TEST_SUITE_P(All, Mismatched, ::testing::ValuesIn(mismatch_params()),
                         [](const ::testing::TestParamInfo<std::tuple<std::string, int>>& i) {
                           return std::get<0>(i.param) + "_" + kMismatches[std::get<1>(i.param)].name;
                         });

}  // namespace
