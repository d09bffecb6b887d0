// Failures of peers and of the group, on shared memory and on TCP:
//  - a rank killed (SIGKILL) in the middle of a large allreduce, or while the others wait in a
//    barrier: every other rank's op fails within a few seconds (the group timeout is 60 s) with
//    a PeerError naming the dead rank, and every later op fails at once;
//  - a peer that never calls the op: the op fails at the group's timeout (2 s) with a Timeout
//    naming the op;
//  - abort() from another thread unblocks a pending op, and the peers learn about it;
//  - a rank killed during each kind of op (broadcast .. sendrecv), on shm and tcp: the survivors
//    fail fast naming it, then form a new group among themselves that works;
//  - a peer that stalls (SIGSTOP): the others fail at the group's timeout;
//  - shared-memory segments are private (mode 0600) and none is left in /dev/shm afterwards,
//    even when ranks crash (before, during or after the rendezvous).
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <iostream>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "harness.h"

using namespace shoal;
using namespace shoal_test;

namespace {

constexpr double kDetectBound = 5.0;   // seconds from a peer's death to the error (spec: ~2 s)
constexpr double kAfterBound = 2.5;    // seconds for an op after the failure to fail (at once, with
                                       // slack for a loaded machine: well under kDetectBound)

// Shared between the ranks of one run (and copied back to the parent).
struct Shared {
  double kill_time;   // now_seconds() just before the victim killed itself
  double abort_time;  // when abort() was called
  uint32_t done;      // set when a rank is finished with what the others wait for
  uint32_t failed;    // survivors that have seen their op fail
};
Shared* shared() { return static_cast<Shared*>(shared_area()); }
Shared shared_of(const RunResult& r) {
  Shared s;
  std::memcpy(&s, r.shared_copy.data(), sizeof s);
  return s;
}

void store_time(double* p, double v) { std::atomic_ref<double>(*p).store(v); }
double load_time(double* p) { return std::atomic_ref<double>(*p).load(); }

[[noreturn]] void die_now() {
  store_time(&shared()->kill_time, now_seconds());
  ::raise(SIGKILL);
  ::_exit(111);  // not reached
}

struct SetDoneOnExit {
  ~SetDoneOnExit() { __atomic_store_n(&shared()->done, 1u, __ATOMIC_SEQ_CST); }
};

void wait_done(double max_seconds) {
  double until = now_seconds() + max_seconds;
  while (__atomic_load_n(&shared()->done, __ATOMIC_SEQ_CST) == 0 && now_seconds() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

std::string note_value(const std::string& notes, const std::string& key) {
  size_t p = 0;
  while (p < notes.size()) {
    size_t nl = notes.find('\n', p);
    if (nl == std::string::npos) nl = notes.size();
    std::string line = notes.substr(p, nl - p);
    if (line.rfind(key + "=", 0) == 0) return line.substr(key.size() + 1);
    p = nl + 1;
  }
  return "";
}

// Survivors keep their communicators until all of them have seen the failure, so that what each
// one reports is how it learnt of the dead rank, not that another survivor exited.
void wait_all_failed(int survivors) {
  __atomic_fetch_add(&shared()->failed, 1u, __ATOMIC_SEQ_CST);
  double until = now_seconds() + 8;
  while (__atomic_load_n(&shared()->failed, __ATOMIC_SEQ_CST) < uint32_t(survivors) && now_seconds() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// After an op failed: a later op of each kind must fail at once. Notes "after_<op>=<kind> <s>".
void check_later_ops_fail(Communicator& c) {
  std::vector<float> a(1000, 1.0f), b(1000, 0.0f);
  auto probe = [&](const char* what, const std::function<void()>& f) {
    double t = now_seconds();
    std::string kind = "none";
    try {
      f();
    } catch (...) {
      kind = kind_of(std::current_exception());
    }
    char buf[128];
    std::snprintf(buf, sizeof buf, "after_%s=%s %.3f", what, kind.c_str(), now_seconds() - t);
    note(buf);
  };
  probe("allreduce", [&] { c.allreduce(a.data(), b.data(), 1000, DType::f32, ReduceOp::sum)->wait(); });
  probe("barrier", [&] { c.barrier()->wait(); });
  probe("broadcast", [&] { c.broadcast(a.data(), 1000, DType::f32, 0)->wait(); });
  note(std::string("aborted=") + (c.aborted() ? "1" : "0"));
}

void expect_later_ops_failed(const RankOutcome& o) {
  for (const char* what : {"allreduce", "barrier", "broadcast"}) {
    std::string v = note_value(o.notes, std::string("after_") + what);
    SCOPED_TRACE(std::string("rank ") + std::to_string(o.rank) + " op after the failure: " + what + " -> " + v);
    ASSERT_FALSE(v.empty()) << o.describe();
    std::string kind = v.substr(0, v.find(' '));
    double secs = std::atof(v.substr(v.find(' ') + 1).c_str());
    EXPECT_EQ(kind, "PeerError");
    EXPECT_LT(secs, kAfterBound);
  }
  EXPECT_EQ(note_value(o.notes, "aborted"), "1") << "rank " << o.rank << ": aborted() is false after a PeerError";
}

// /dev/shm/shoal* entries of the run's processes (see segment_may_belong_to) that were not there
// before it, once it is over (waiting up to 2 s for unattributable ones that may belong to another
// test running at the same time). Removes what it reports, so that a leak does not spill into
// other tests.
std::vector<std::string> leftover_segments(const std::set<std::string>& before, const RunResult& res) {
  std::vector<std::string> left;
  for (int tries = 0; tries < 200; ++tries) {
    left.clear();
    for (auto& s : list_dev_shm_shoal())
      if (!before.count(s) && segment_may_belong_to(s, res.pids)) left.push_back(s);
    if (left.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (auto& s : left) ::shm_unlink(("/" + s).c_str());
  return left;
}

std::set<std::string> dev_shm_now() {
  auto v = list_dev_shm_shoal();
  return std::set<std::string>(v.begin(), v.end());
}

void expect_private_modes(const RunResult& res) {
  for (const auto& [name, mode] : res.shm_seen)
    EXPECT_EQ(mode, 0600u) << "/dev/shm/" << name << " has mode 0" << std::oct << mode << std::dec;
}

RunConfig failure_config(const std::string& transport, int timeout_s) {
  RunConfig cfg = timed_config(transport, std::chrono::seconds(timeout_s), std::chrono::seconds(45));
  cfg.watch_dev_shm = transport == "shm";
  return cfg;
}

std::string latencies(const RunResult& res, double kill_time) {
  std::string s = "  seconds from the kill to each rank's error:";
  for (const auto& o : res.ranks) {
    std::string f = note_value(o.notes, "fail_at");
    if (f.empty()) continue;
    char b[64];
    std::snprintf(b, sizeof b, " rank %d: %.3f", o.rank, std::atof(f.c_str()) - kill_time);
    s += b;
  }
  return s;
}

// Checks every survivor of a run where `victim` killed itself.
void expect_survivors_failed(const RunResult& res, int victim) {
  const Shared sh = shared_of(res);
  const auto& v = res.ranks[victim];
  EXPECT_EQ(v.signal, SIGKILL) << "the victim did not die as planned: " << v.describe();
  ASSERT_GT(sh.kill_time, 0.0) << "the victim never got to the kill";
  for (const auto& o : res.ranks) {
    if (o.rank == victim) continue;
    SCOPED_TRACE("rank " + std::to_string(o.rank));
    ASSERT_FALSE(o.hung) << res.describe();
    EXPECT_EQ(o.error_kind, "PeerError") << res.describe();
    const double fail_at = std::atof(note_value(o.notes, "fail_at").c_str());
    const double latency = fail_at - sh.kill_time;
    EXPECT_GE(latency, 0.0) << "failed before the victim died\n" << res.describe();
    EXPECT_LT(latency, kDetectBound) << "took " << latency << " s to notice the dead peer\n"
                                     << res.describe() << latencies(res, sh.kill_time);
    EXPECT_TRUE(names_rank(o.message, victim)) << "the error does not name rank " << victim << ": " << o.message;
    expect_later_ops_failed(o);
  }
}

// ---- A rank killed during a large allreduce ----------------------------------------------------

class KillDuringAllreduce : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(KillDuringAllreduce, SurvivorsFailFast) {
  const auto& [transport, algo_name] = GetParam();
  const Algo algo = parse_algo(algo_name);
  constexpr int n = 4, victim = 2;
  auto before = dev_shm_now();
  RunConfig cfg = failure_config(transport, 60);
  auto res = run_ranks_outcomes(n, cfg, [algo](Communicator& c) {
    const size_t count = size_t(8) << 20;  // 32 MiB of f32 per rank
    std::vector<float> a(count, 1.0f), b(count, 0.0f);
    if (c.rank() == victim) {
      auto w = c.allreduce(a.data(), b.data(), count, DType::f32, ReduceOp::sum, {algo});
      std::this_thread::sleep_for(std::chrono::milliseconds(40));
      die_now();
    }
    try {
      for (int it = 0; it < 2000; ++it) c.allreduce(a.data(), b.data(), count, DType::f32, ReduceOp::sum, {algo})->wait();
    } catch (const Error&) {
      const double t = now_seconds();
      check_later_ops_fail(c);
      wait_all_failed(n - 1);
      note("fail_at=" + std::to_string(t));
      throw;
    }
    SH_CHECK(false) << "2000 allreduces succeeded with a dead peer";
  });
  expect_survivors_failed(res, victim);
  expect_private_modes(res);
  auto left = leftover_segments(before, res);
  EXPECT_TRUE(left.empty()) << "left in /dev/shm: " << join(left);
}

INSTANTIATE_TEST_SUITE_P(All, KillDuringAllreduce,
                         ::testing::Values(std::make_tuple("shm", "auto"), std::make_tuple("shm", "ring"),
                                           std::make_tuple("shm", "direct"), std::make_tuple("tcp", "auto"),
                                           std::make_tuple("tcp", "ring"), std::make_tuple("tcp", "bde")),
                         [](const ::testing::TestParamInfo<std::tuple<std::string, std::string>>& i) {
                           return std::get<0>(i.param) + "_" + std::get<1>(i.param);
                         });

// ---- A rank killed while the others wait in a barrier -----------------------------------------

class KillDuringBarrier : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(KillDuringBarrier, SurvivorsFailFast) {
  const auto& [transport, victim] = GetParam();
  constexpr int n = 4;
  auto before = dev_shm_now();
  auto res = run_ranks_outcomes(n, failure_config(transport, 60), [victim = victim](Communicator& c) {
    c.barrier()->wait();  // everybody is up
    if (c.rank() == victim) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      die_now();
    }
    try {
      c.barrier()->wait();
    } catch (const Error&) {
      const double t = now_seconds();
      check_later_ops_fail(c);
      wait_all_failed(n - 1);
      note("fail_at=" + std::to_string(t));
      throw;
    }
    SH_CHECK(false) << "the barrier succeeded without the dead rank";
  });
  expect_survivors_failed(res, victim);
  expect_private_modes(res);
  auto left = leftover_segments(before, res);
  EXPECT_TRUE(left.empty()) << "left in /dev/shm: " << join(left);
}

INSTANTIATE_TEST_SUITE_P(All, KillDuringBarrier,
                         ::testing::Combine(::testing::Values("shm", "tcp"), ::testing::Values(0, 3)),
                         [](const ::testing::TestParamInfo<std::tuple<std::string, int>>& i) {
                           return std::get<0>(i.param) + "_victim" + std::to_string(std::get<1>(i.param));
                         });

// ---- A peer that never calls the op ----------------------------------------------------------

class PeerNeverCalls : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

// Rank 0 calls the op, rank 1 never does (it stays alive and idle): rank 0 fails at the group's
// timeout (2 s) with a Timeout naming the op. Rank 1's next op then fails promptly too.
// "blocking": the allreduce as a blocking call, which runs on the caller's thread and throws.
TEST_P(PeerNeverCalls, TimesOut) {
  const auto& [transport, op] = GetParam();
  auto before = dev_shm_now();
  auto res = run_ranks_outcomes(2, failure_config(transport, 2), [op = op](Communicator& c) {
    std::vector<float> a(4096, 1.0f), b(4096, 0.0f);
    CallOptions o;
    o.blocking = op == "blocking" || op == "recv_blocking";
    if (c.rank() == 0) {
      SetDoneOnExit done;
      mark_time();
      if (op == "allreduce" || op == "blocking") c.allreduce(a.data(), b.data(), 4096, DType::f32, ReduceOp::sum, o)->wait();
      if (op == "barrier") c.barrier()->wait();
      if (op == "recv") c.recv(b.data(), 4096, DType::f32, 1, 3)->wait();
      if (op == "recv_blocking") c.recv(b.data(), 4096, DType::f32, 1, 3, o);
      SH_CHECK(false) << op << " succeeded without the peer";
    }
    wait_done(15);
    mark_time();
    c.allreduce(a.data(), b.data(), 4096, DType::f32, ReduceOp::sum, o)->wait();
    SH_CHECK(false) << "allreduce succeeded on rank 1 after rank 0 timed out";
  });
  const auto& r0 = res.ranks[0];
  const auto& r1 = res.ranks[1];
  const std::string named = op == "blocking" ? "allreduce" : op == "recv_blocking" ? "recv" : op;
  EXPECT_EQ(r0.error_kind, "Timeout") << res.describe();
  EXPECT_NE(r0.message.find(named), std::string::npos) << "the Timeout does not name the op: " << r0.message;
  EXPECT_GE(r0.fail_seconds, 1.5) << res.describe();
  EXPECT_LT(r0.fail_seconds, 5.0) << res.describe();
  EXPECT_FALSE(r1.hung) << res.describe();
  EXPECT_TRUE(r1.error_kind == "PeerError" || r1.error_kind == "Timeout") << res.describe();
  EXPECT_LT(r1.fail_seconds, 3.0) << res.describe();
  auto left = leftover_segments(before, res);
  EXPECT_TRUE(left.empty()) << "left in /dev/shm: " << join(left);
}

INSTANTIATE_TEST_SUITE_P(All, PeerNeverCalls,
                         ::testing::Combine(::testing::Values("shm", "tcp"),
                                            ::testing::Values("allreduce", "blocking", "barrier", "recv", "recv_blocking")),
                         [](const ::testing::TestParamInfo<std::tuple<std::string, std::string>>& i) {
                           return std::get<0>(i.param) + "_" + std::get<1>(i.param);
                         });

// Three ranks, the last never calls: both callers fail by about the timeout, at least one of them
// with Timeout (the other may learn of it as a PeerError first).
TEST(PeerNeverCallsGroup, ThreeRanks) {
  for (const char* transport : {"shm", "tcp"}) {
    SCOPED_TRACE(transport);
    auto res = run_ranks_outcomes(3, failure_config(transport, 2), [](Communicator& c) {
      std::vector<float> a(100000, 1.0f), b(100000, 0.0f);
      if (c.rank() == 2) {
        wait_done(15);
        return;
      }
      SetDoneOnExit done;
      mark_time();
      c.allreduce(a.data(), b.data(), 100000, DType::f32, ReduceOp::sum)->wait();
      SH_CHECK(false) << "allreduce succeeded without rank 2";
    });
    int timeouts = 0;
    for (int r = 0; r < 2; ++r) {
      const auto& o = res.ranks[r];
      EXPECT_TRUE(o.error_kind == "Timeout" || o.error_kind == "PeerError") << res.describe();
      timeouts += o.error_kind == "Timeout";
      EXPECT_GE(o.fail_seconds, 1.5) << res.describe();
      EXPECT_LT(o.fail_seconds, 5.0) << res.describe();
    }
    EXPECT_GE(timeouts, 1) << res.describe();
    EXPECT_FALSE(res.ranks[2].hung) << res.describe();
  }
}

// ---- abort() from another thread ----------------------------------------------------------------

class AbortFromThread : public ::testing::TestWithParam<std::string> {};

TEST_P(AbortFromThread, UnblocksPendingOp) {
  auto before = dev_shm_now();
  auto res = run_ranks_outcomes(2, failure_config(GetParam(), 60), [](Communicator& c) {
    std::vector<float> a(1 << 16, 1.0f), b(1 << 16, 0.0f);
    if (c.rank() == 1) {
      // Late for the allreduce: by then rank 0 has aborted, and this rank must learn of it.
      SetDoneOnExit done;
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      mark_time();
      c.allreduce(a.data(), b.data(), 1 << 16, DType::f32, ReduceOp::sum)->wait();
      SH_CHECK(false) << "allreduce succeeded with an aborted peer";
    }
    // The thread starts first, so that abort() comes while the op is pending however the op
    // runs (queued to the progress thread, or on this thread inside the call).
    std::jthread aborter([&c] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      store_time(&shared()->abort_time, now_seconds());
      c.abort("aborted by the test thread");
    });
    try {
      c.allreduce(a.data(), b.data(), 1 << 16, DType::f32, ReduceOp::sum)->wait();
    } catch (const Error& e) {
      aborter.join();
      const double dt = now_seconds() - load_time(&shared()->abort_time);
      note("unblocked_after=" + std::to_string(dt));
      SH_CHECK(dt < kAfterBound) << "the pending op failed " << dt << " s after abort()";
      SH_CHECK(c.aborted()) << "aborted() is false after abort()";
      check_later_ops_fail(c);
      // Stay up until rank 1 is done: it must learn of the abort from the abort itself, not
      // from this process going away.
      wait_done(8);
      throw;
    }
    SH_CHECK(false) << "the allreduce completed although the peer never called it";
  });
  const auto& r0 = res.ranks[0];
  const auto& r1 = res.ranks[1];
  EXPECT_EQ(r0.error_kind, "PeerError") << res.describe();
  expect_later_ops_failed(r0);
  EXPECT_FALSE(r1.hung) << res.describe();
  EXPECT_EQ(r1.error_kind, "PeerError") << res.describe();
  EXPECT_LT(r1.fail_seconds, kAfterBound) << res.describe();
  EXPECT_TRUE(names_rank(r1.message, 0)) << "the peer's error does not name rank 0: " << r1.message;
  auto left = leftover_segments(before, res);
  EXPECT_TRUE(left.empty()) << "left in /dev/shm: " << join(left);
}

INSTANTIATE_TEST_SUITE_P(All, AbortFromThread, ::testing::Values("shm", "tcp"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// abort() while the whole group streams allreduces: every rank stops with PeerError.
TEST(AbortFromThreadGroup, DuringTraffic) {
  for (const char* transport : {"shm", "tcp"}) {
    SCOPED_TRACE(transport);
    auto res = run_ranks_outcomes(3, failure_config(transport, 60), [](Communicator& c) {
      const size_t count = size_t(1) << 20;
      std::vector<float> a(count, 1.0f), b(count, 0.0f);
      std::jthread aborter;
      if (c.rank() == 1)
        aborter = std::jthread([&c] {
          std::this_thread::sleep_for(std::chrono::milliseconds(400));
          c.abort("aborted during traffic");
        });
      for (int it = 0; it < 100000; ++it) c.allreduce(a.data(), b.data(), count, DType::f32, ReduceOp::sum)->wait();
      SH_CHECK(false) << "never stopped";
    });
    for (const auto& o : res.ranks) {
      EXPECT_FALSE(o.hung) << res.describe();
      EXPECT_EQ(o.error_kind, "PeerError") << res.describe();
    }
  }
}

// ---- Shared-memory segments ---------------------------------------------------------------------

// While the group is up, its segments are private (0600) and unlinked as soon as every peer has
// mapped them: after a barrier none of them is visible; after exit nothing is left.
TEST(DevShm, SegmentsPrivateAndUnlinked) {
  auto before = dev_shm_now();
  RunConfig cfg = failure_config("shm", 30);
  cfg.watch_dev_shm = true;
  // The last rank comes late, so the others' segments exist for a while before all are mapped.
  cfg.before_construct = [](int rank) {
    if (rank == 3) std::this_thread::sleep_for(std::chrono::milliseconds(500));
  };
  auto res = run_ranks_outcomes(4, cfg, [before](Communicator& c) {
    c.barrier()->wait();
    std::vector<std::string> visible;
    for (int tries = 0; tries < 100; ++tries) {
      visible.clear();
      for (auto& s : list_dev_shm_shoal())
        if (!before.count(s) && segment_may_belong_to(s, group_pids())) visible.push_back(s);
      if (visible.empty()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    SH_CHECK(visible.empty()) << "still in /dev/shm after every rank mapped the segments: " << join(visible);
    std::vector<double> x(1000, 1.0), y(1000, 0.0);
    c.allreduce(x.data(), y.data(), 1000, DType::f64, ReduceOp::sum)->wait();
    SH_CHECK_EQ(y[0], 4.0);
  });
  for (const auto& o : res.ranks) EXPECT_TRUE(o.ok()) << res.describe();
  std::string seen;
  for (const auto& [name, mode] : res.shm_seen) seen += " " + name;
  std::cout << "[ info ] segments seen in /dev/shm during construction:" << (seen.empty() ? " none" : seen) << "\n";
  expect_private_modes(res);
  auto left = leftover_segments(before, res);
  EXPECT_TRUE(left.empty()) << "left in /dev/shm: " << join(left);
}

// A rank that dies before constructing: the others' construction fails by the timeout, and
// their segments (never mapped by the dead rank) are not left behind.
TEST(DevShm, RankDiesBeforeConstruction) {
  auto before = dev_shm_now();
  RunConfig cfg = failure_config("shm", 3);
  cfg.before_construct = [](int rank) {
    if (rank == 2) die_now();
  };
  auto res = run_ranks_outcomes(3, cfg, [](Communicator&) { SH_CHECK(false) << "construction succeeded"; });
  EXPECT_EQ(res.ranks[2].signal, SIGKILL);
  for (int r = 0; r < 2; ++r) {
    const auto& o = res.ranks[r];
    EXPECT_FALSE(o.hung) << res.describe();
    EXPECT_EQ(o.error_kind, "setup") << res.describe();
    EXPECT_TRUE(o.setup_kind == "Timeout" || o.setup_kind == "PeerError") << res.describe();
    EXPECT_LT(o.fail_at - shared_of(res).kill_time, 3.0 + 3.0) << res.describe();
  }
  expect_private_modes(res);
  auto left = leftover_segments(before, res);
  EXPECT_TRUE(left.empty()) << "left in /dev/shm: " << join(left);
}

// A rank killed in the middle of the rendezvous (its segment made, not yet mapped by a late
// peer): nothing may be left behind either.
TEST(DevShm, RankDiesDuringConstruction) {
  auto before = dev_shm_now();
  RunConfig cfg = failure_config("shm", 4);
  cfg.before_construct = [](int rank) {
    if (rank == 3) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    if (rank == 2) {
      std::thread([] {
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        die_now();
      }).detach();
    }
  };
  auto res = run_ranks_outcomes(4, cfg, [](Communicator& c) {
    c.barrier()->wait();
    SH_CHECK(false) << "a barrier succeeded with a dead rank";
  });
  EXPECT_EQ(res.ranks[2].signal, SIGKILL) << res.describe();
  for (int r : {0, 1, 3}) {
    const auto& o = res.ranks[r];
    EXPECT_FALSE(o.hung) << res.describe();
    EXPECT_FALSE(o.ok()) << res.describe();
  }
  expect_private_modes(res);
  auto left = leftover_segments(before, res);
  EXPECT_TRUE(left.empty()) << "left in /dev/shm: " << join(left);
}

// Every rank killed at once in the middle of traffic: no survivor cleans up, and still nothing is
// left in /dev/shm.
TEST(DevShm, WholeGroupKilled) {
  auto before = dev_shm_now();
  auto res = run_ranks_outcomes(4, failure_config("shm", 30), [](Communicator& c) {
    const size_t count = size_t(1) << 20;
    std::vector<float> a(count, 1.0f), b(count, 0.0f);
    for (int it = 0; it < 3; ++it) c.allreduce(a.data(), b.data(), count, DType::f32, ReduceOp::sum)->wait();
    auto w = c.allreduce(a.data(), b.data(), count, DType::f32, ReduceOp::sum);
    ::raise(SIGKILL);
  });
  for (const auto& o : res.ranks) EXPECT_EQ(o.signal, SIGKILL) << res.describe();
  auto left = leftover_segments(before, res);
  EXPECT_TRUE(left.empty()) << "left in /dev/shm: " << join(left);
}

// A /dev/shm without room for the group's segments (a container's): every rank fails at
// construction at once, with an error that says how much is needed and how much is free, whether
// every rank ran out or only the later ones; nothing is left there; the group runs over TCP.
TEST(DevShm, TooSmallIsAnErrorAtCreation) {
  // A private mount namespace with a small tmpfs on /dev/shm (needs CAP_SYS_ADMIN, which root
  // has in a container or sandbox).
  if (unshare(CLONE_NEWNS) != 0) GTEST_SKIP() << "unshare(CLONE_NEWNS): " << std::strerror(errno);
  ASSERT_EQ(mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr), 0) << std::strerror(errno);
  // 8 MiB: no rank's segment fits (each reserves about 24 MiB); 40 MiB: the first fits.
  for (const char* size : {"size=8m", "size=40m"}) {
    SCOPED_TRACE(size);
    ASSERT_EQ(mount("tmpfs", "/dev/shm", "tmpfs", 0, size), 0) << std::strerror(errno);
    const double t0 = now_seconds();
    auto res = run_ranks_outcomes(4, failure_config("shm", 60), [](Communicator&) { SH_CHECK(false) << "construction succeeded"; });
    EXPECT_LT(now_seconds() - t0, 20.0) << "the ranks waited for one that could not make its segment\n" << res.describe();
    for (const auto& o : res.ranks) {
      EXPECT_FALSE(o.hung) << res.describe();
      EXPECT_EQ(o.error_kind, "setup") << res.describe();
      EXPECT_NE(o.message.find("not enough shared memory"), std::string::npos) << o.message;
      EXPECT_NE(o.message.find("of /dev/shm"), std::string::npos) << o.message;
      EXPECT_NE(o.message.find("is free"), std::string::npos) << o.message;
    }
    EXPECT_TRUE(list_dev_shm_shoal().empty()) << "left in the small /dev/shm: " << join(list_dev_shm_shoal());
    ASSERT_EQ(umount("/dev/shm"), 0) << std::strerror(errno);
  }
  ASSERT_EQ(mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=8m"), 0) << std::strerror(errno);
  // The store served by rank 0 and gone the moment rank 0 fails (torch's and Ray's TCPStore do
  // not linger as shoal's does): the others still get the cause, not a lost store.
  for (int round = 0; round < 5; ++round) {
    RunConfig cfg = failure_config("shm", 60);
    cfg.store = StoreKind::tcp;
    cfg.env.push_back({"SHOAL_STORE_LINGER", "0"});
    auto res = run_ranks_outcomes(8, cfg, [](Communicator&) { SH_CHECK(false) << "construction succeeded"; });
    for (const auto& o : res.ranks) {
      EXPECT_EQ(o.error_kind, "setup") << res.describe();
      EXPECT_NE(o.message.find("not enough shared memory"), std::string::npos) << res.describe();
    }
  }
  auto res = run_ranks_outcomes(4, failure_config("tcp", 60), [](Communicator& c) {
    std::vector<double> x(1000, 1.0), y(1000, 0.0);
    c.allreduce(x.data(), y.data(), 1000, DType::f64, ReduceOp::sum)->wait();
    SH_CHECK_EQ(y[999], 4.0);
  });
  for (const auto& o : res.ranks) EXPECT_TRUE(o.ok()) << res.describe();
  umount("/dev/shm");
}

// A rank that never joins the group's creation: the others fail with a Timeout at the group's
// timeout that names it (rank 0, which gathers the ranks' keys, and the others, which wait for
// rank 0's combined key, alike).
TEST(Rendezvous, TimeoutNamesTheRankThatNeverCame) {
  for (const std::string transport : {"shm", "tcp"}) {
    SCOPED_TRACE(transport);
    RunConfig cfg = failure_config(transport, 2);
    cfg.before_construct = [](int rank) {
      if (rank == 2) _exit(0);
    };
    auto res = run_ranks_outcomes(4, cfg, [](Communicator&) { SH_CHECK(false) << "construction succeeded"; });
    for (int r : {0, 1, 3}) {
      const auto& o = res.ranks[r];
      EXPECT_FALSE(o.hung) << res.describe();
      EXPECT_EQ(o.error_kind, "setup") << res.describe();
      EXPECT_NE(o.message.find("timed out waiting for rank(s) 2 (hostid)"), std::string::npos) << o.message;
    }
  }
}

// Over TCP a pair connects when it first talks, so an address that does not reach a rank (a wrong
// SHOAL_HOST, a firewall) shows at the first op between the two. Where the network refuses the
// connection (as here) both ranks fail at once naming the address; where it drops it, at the op's
// timeout, saying the pair never connected and the dialer's last error.
TEST(Rendezvous, AddressThatDoesNotReachTheRankFailsTheFirstOp) {
  RunConfig cfg = failure_config("tcp", 3);
  cfg.before_construct = [](int rank) {
    if (rank == 0) ::setenv("SHOAL_HOST", "192.0.2.1", 1);  // TEST-NET-1: no host of ours
  };
  auto res = run_ranks_outcomes(2, cfg, [](Communicator& c) {
    std::vector<float> x(16, 1.0f), y(16);
    c.allreduce(x.data(), y.data(), 16, DType::f32, ReduceOp::sum)->wait();
  });
  for (const auto& o : res.ranks) {
    EXPECT_FALSE(o.hung) << res.describe();
    EXPECT_TRUE(o.error_kind == "Timeout" || o.error_kind == "PeerError") << res.describe();
  }
  const auto& dialer = res.ranks[1];
  if (dialer.error_kind == "PeerError") {
    EXPECT_NE(dialer.message.find("rank 0 refused a connection at 192.0.2.1:"), std::string::npos) << dialer.message;
    EXPECT_NE(dialer.message.find("SHOAL_HOST"), std::string::npos) << dialer.message;
  } else {
    EXPECT_NE(dialer.message.find("not connected to rank 0 (0/2 connections, last error: "), std::string::npos)
        << dialer.message;
  }
}

// A peer that is there but has not yet come to its first op with this rank: the op times out
// saying the pair never connected.
TEST(Rendezvous, PeerLateForTheFirstOpTimesOutNamingTheConnection) {
  RunConfig cfg = failure_config("tcp", 2);
  auto res = run_ranks_outcomes(2, cfg, [](Communicator& c) {
    if (c.rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(4));
    std::vector<float> x(16, 1.0f), y(16);
    c.allreduce(x.data(), y.data(), 16, DType::f32, ReduceOp::sum)->wait();
  });
  const auto& o = res.ranks[0];
  EXPECT_EQ(o.error_kind, "Timeout") << res.describe();
  EXPECT_NE(o.message.find("timed out waiting for rank(s) 1; not connected to rank 1 (0/2 connections)"),
            std::string::npos)
      << o.message;
}

// Containers on one host share its name and boot id but not /dev/shm (each has its own IPC and
// mount namespaces): the probe finds no segment of a peer in another one, and the pair talks TCP.
// Ranks 0 and 1 stay in the test's namespaces; ranks 2 and 3 each enter new ones with a /dev/shm of
// their own, as separate containers would.
TEST(Containers, RanksInOtherIpcAndMountNamespacesUseTcp) {
  auto enter_container = [] {
    return unshare(CLONE_NEWNS | CLONE_NEWIPC) == 0 && mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0 &&
           mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=64m") == 0;
  };
  if (pid_t probe = fork(); probe == 0) {
    _exit(enter_container() ? 0 : 1);
  } else {
    int st = 0;
    waitpid(probe, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) GTEST_SKIP() << "no new IPC and mount namespaces here (needs CAP_SYS_ADMIN)";
  }
  RunConfig cfg = failure_config("shm", 60);
  cfg.env.push_back({"SHOAL_TRANSPORT", ""});
  cfg.watch_dev_shm = false;
  cfg.before_construct = [enter_container](int rank) {
    if (rank >= 2 && !enter_container()) _exit(4);
  };
  auto res = run_ranks_outcomes(4, cfg, [](Communicator& c) {
    const char* want[4][4] = {{"self", "shm", "tcp", "tcp"},
                              {"shm", "self", "tcp", "tcp"},
                              {"tcp", "tcp", "self", "tcp"},
                              {"tcp", "tcp", "tcp", "self"}};
    for (int p = 0; p < 4; ++p) SH_CHECK_EQ(c.transport_to(p), want[c.rank()][p]) << "peer " << p;
    for (size_t n : {size_t(1), size_t(1000), size_t(300001)}) {
      std::vector<float> x(n, float(c.rank() + 1)), y(n, 0.0f);
      c.allreduce(x.data(), y.data(), n, DType::f32, ReduceOp::sum)->wait();
      SH_CHECK_EQ(y[n - 1], 10.0f) << n;
      std::vector<float> all(4 * n, -1.0f);
      c.allgather(x.data(), all.data(), n, DType::f32)->wait();
      for (int r = 0; r < 4; ++r) SH_CHECK_EQ(all[r * n + n - 1], float(r + 1)) << n;
    }
  });
  for (const auto& o : res.ranks) EXPECT_TRUE(o.ok()) << res.describe();

  // SHOAL_TRANSPORT=shm there: every rank fails at creation naming a pair, at once (ranks 0 and 1,
  // which could talk shm to each other, do not wait for the others' TCP addresses).
  cfg.env.push_back({"SHOAL_TRANSPORT", "shm"});
  const double t0 = now_seconds();
  res = run_ranks_outcomes(4, cfg, [](Communicator&) { SH_CHECK(false) << "construction succeeded"; });
  EXPECT_LT(now_seconds() - t0, 20.0) << res.describe();
  for (const auto& o : res.ranks) {
    EXPECT_EQ(o.error_kind, "setup") << res.describe();
    EXPECT_NE(o.message.find("SHOAL_TRANSPORT=shm but rank"), std::string::npos) << res.describe();
  }
}

// A rank makes room for the descriptors its links may take (2 per TCP peer on its host, 1 pidfd per
// shared-memory peer, counted as TCP while the probe may still fall back to it): a low soft
// RLIMIT_NOFILE is raised (with a margin, at most to the hard limit); a hard limit below the need is
// an error at construction on every rank, naming the limit and the fix, not EMFILE half-way through
// connecting nor a wait for the timeout.
class FdLimit : public ::testing::TestWithParam<std::string> {};

TEST_P(FdLimit, SoftLimitIsRaisedHardLimitIsAnError) {
  struct Case {
    rlim_t soft, hard;
    bool fits;
  } cases[] = {{32, 4096, true}, {20, 40, true}, {20, 20, false}};  // 8 ranks need 15 besides what is open
  for (const auto& k : cases) {
    SCOPED_TRACE("soft " + std::to_string(k.soft) + ", hard " + std::to_string(k.hard));
    RunConfig cfg = failure_config(GetParam(), 60);
    cfg.watch_dev_shm = false;
    cfg.before_construct = [k](int) {
      rlimit lim{k.soft, k.hard};
      if (setrlimit(RLIMIT_NOFILE, &lim) != 0) _exit(3);
    };
    const double t0 = now_seconds();
    auto res = run_ranks_outcomes(8, cfg, [k](Communicator& c) {
      rlimit lim{};
      getrlimit(RLIMIT_NOFILE, &lim);
      SH_CHECK(lim.rlim_cur > k.soft && lim.rlim_cur <= k.hard) << "soft limit " << lim.rlim_cur;
      std::vector<float> x(100, 1.0f), y(100, 0.0f);
      c.allreduce(x.data(), y.data(), 100, DType::f32, ReduceOp::sum)->wait();
      SH_CHECK_EQ(y[99], 8.0f);
    });
    for (const auto& o : res.ranks) {
      if (k.fits) {
        EXPECT_TRUE(o.ok()) << res.describe();
        continue;
      }
      EXPECT_FALSE(o.hung) << res.describe();
      EXPECT_EQ(o.error_kind, "setup") << res.describe();
      EXPECT_NE(o.message.find("links to its peers (sockets and pidfds) needs 15 file descriptors"), std::string::npos)
          << o.message;
      EXPECT_NE(o.message.find("RLIMIT_NOFILE allows 20 (hard limit 20)"), std::string::npos) << o.message;
      EXPECT_NE(o.message.find("ulimit -n"), std::string::npos) << o.message;
    }
    EXPECT_LT(now_seconds() - t0, 20.0) << res.describe();
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, FdLimit, ::testing::Values("shm", "tcp"));

}  // namespace

// ---- A rank killed during each kind of op, then the survivors regroup -------------------------
//
// For every op and transport: rank 2 of 4 starts the op and dies (SIGKILL) 40 ms in; the others
// loop on the same op and must fail with a PeerError naming rank 2 within kDetectBound, leave no
// segment in /dev/shm, and then form a new group of 3 (a fresh store namespace, ranks renumbered)
// in which an allreduce gives the right sum.

namespace {

// One call of `op` on every rank of `c` (count elements per block), waited for.
void run_op(Communicator& c, const std::string& op, std::vector<float>& a, std::vector<float>& b, size_t count) {
  const int n = c.size(), r = c.rank();
  if (op == "broadcast") c.broadcast(a.data(), count, DType::f32, 0)->wait();
  if (op == "reduce") c.reduce(a.data(), b.data(), count, DType::f32, ReduceOp::sum, 0)->wait();
  if (op == "allgather") c.allgather(a.data(), b.data(), count, DType::f32)->wait();
  if (op == "reduce_scatter") c.reduce_scatter(a.data(), b.data(), count, DType::f32, ReduceOp::sum)->wait();
  if (op == "gather") c.gather(a.data(), b.data(), count, DType::f32, 0)->wait();
  if (op == "scatter") c.scatter(a.data(), b.data(), count, DType::f32, 0)->wait();
  if (op == "alltoall") c.alltoall(a.data(), b.data(), count, DType::f32)->wait();
  if (op == "sendrecv") {  // ring shift: everyone sends right and receives from the left
    auto s = c.send(a.data(), count, DType::f32, (r + 1) % n, 5);
    auto v = c.recv(b.data(), count, DType::f32, (r + n - 1) % n, 5);
    s->wait();
    v->wait();
  }
}

// After the failure: the survivors (all ranks but `victim`) form a new group and allreduce.
void regroup_and_check(int old_rank, int old_size, int victim) {
  const int rank = old_rank < victim ? old_rank : old_rank - 1, size = old_size - 1;
  Options o = Options::from_env({});
  o.group_name = "regroup";
  o.timeout = std::chrono::seconds(20);
  Communicator c2(std::make_shared<FileStore>(run_dir() + "/regroup-store"), rank, size, o);
  std::vector<float> x(4099, float(rank + 1)), y(4099, 0.0f);
  c2.allreduce(x.data(), y.data(), x.size(), DType::f32, ReduceOp::sum)->wait();
  const float want = float(size * (size + 1) / 2);
  for (float v : y) SH_CHECK(v == want) << "allreduce in the new group gave " << v << ", not " << want;
  note("regrouped=1");
}

}  // namespace

class KillDuringOp : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(KillDuringOp, SurvivorsFailFastAndRegroup) {
  const auto& [transport, op] = GetParam();
  constexpr int n = 4, victim = 2;
  auto before = dev_shm_now();
  auto res = run_ranks_outcomes(n, failure_config(transport, 60), [op = op](Communicator& c) {
    const size_t count = size_t(1) << 20;  // 4 MiB of f32 per block
    std::vector<float> a(count * n, 1.0f), b(count * n, 0.0f);
    if (c.rank() == victim) {
      std::jthread t([&] {
        try {
          run_op(c, op, a, b, count);
        } catch (...) {
        }
      });
      std::this_thread::sleep_for(std::chrono::milliseconds(40));
      die_now();
    }
    try {
      for (int it = 0; it < 5000; ++it) run_op(c, op, a, b, count);
    } catch (const Error&) {
      const double t = now_seconds();
      check_later_ops_fail(c);
      wait_all_failed(n - 1);
      note("fail_at=" + std::to_string(t));
      regroup_and_check(c.rank(), n, victim);
      throw;
    }
    SH_CHECK(false) << "5000 " << op << "s succeeded with a dead peer";
  });
  expect_survivors_failed(res, victim);
  for (const auto& o : res.ranks) {
    if (o.rank == victim) continue;
    EXPECT_EQ(note_value(o.notes, "regrouped"), "1") << res.describe();
  }
  expect_private_modes(res);
  auto left = leftover_segments(before, res);
  EXPECT_TRUE(left.empty()) << "left in /dev/shm: " << join(left);
}

INSTANTIATE_TEST_SUITE_P(All, KillDuringOp,
                         ::testing::Combine(::testing::Values("shm", "tcp"),
                                            ::testing::Values("broadcast", "reduce", "allgather", "reduce_scatter",
                                                              "gather", "scatter", "alltoall", "sendrecv")),
                         [](const ::testing::TestParamInfo<std::tuple<std::string, std::string>>& i) {
                           return std::get<0>(i.param) + "_" + std::get<1>(i.param);
                         });

// ---- A peer that leaves as soon as its op is done ---------------------------------------------
//
// A rank whose op has completed may destroy its communicator at once, while its peers are still
// finishing the same op (they have yet to see its last message, or to look at the barrier word
// it set): they must complete the op, not fail with "rank r aborted: the communicator was
// destroyed". 8 ranks (more than this machine's cores, so ranks are preempted anywhere) form many
// short-lived groups, each running one op and destroyed at once, over every kind of op.
class LeaveRightAfterOp : public ::testing::TestWithParam<std::string> {};

TEST_P(LeaveRightAfterOp, PeersStillComplete) {
  const std::string transport = GetParam();
  constexpr int n = 8, rounds = kSanitized ? 24 : 128;  // TSan: 128 rounds take 86 s alone
  RunConfig cfg = failure_config(transport, 20);
  cfg.limit = std::chrono::seconds(120);
  // Small segments: each of the 1,024 segments is reserved in full when its group is made
  // (24 MiB by default at 8 ranks), and these ops move 32 KiB at most.
  cfg.env.push_back({"SHOAL_SHM_RING", "65536"});
  cfg.env.push_back({"SHOAL_SHM_SCRATCH", "1048576"});
  EXPECT_TRUE(run_ranks(n, cfg, [](Communicator& c) {
    const char* ops[] = {"barrier", "allreduce", "allreduce_ring", "broadcast", "reduce", "allgather", "sendrecv"};
    const size_t count = 1024;
    for (int round = 0; round < rounds; ++round) {
      const std::string op = ops[round % std::size(ops)];
      Options o = Options::from_env({});
      o.group_name = "leave" + std::to_string(round);
      o.timeout = std::chrono::seconds(20);
      Communicator g(std::make_shared<FileStore>(run_dir() + "/leave-store"), c.rank(), c.size(), o);
      std::vector<float> a(count * n, float(g.rank() + 1)), b(count * n, 0.0f);
      if (op == "barrier") {
        g.barrier()->wait();
      } else if (op == "allreduce" || op == "allreduce_ring") {
        CallOptions co;
        if (op == "allreduce_ring") co.algo = Algo::ring;
        g.allreduce(a.data(), b.data(), count, DType::f32, ReduceOp::sum, co)->wait();
        for (size_t i = 0; i < count; ++i)
          SH_CHECK(b[i] == float(n * (n + 1) / 2)) << op << " round " << round << " gave " << b[i];
      } else {
        run_op(g, op, a, b, count);
      }
    }  // each group is destroyed right after its op
  }));
}

INSTANTIATE_TEST_SUITE_P(All, LeaveRightAfterOp, ::testing::Values("shm", "tcp"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// ---- A peer that stalls (SIGSTOP) --------------------------------------------------------------
//
// Rank 1 of 3 stops itself in the middle of a stream of allreduces: it is alive (its pid and
// sockets stay) but makes no progress, so no peer death is seen; the others must fail at the
// group's timeout (3 s) with a Timeout naming the op. Rank 0 then kills the stopped rank.
class StalledPeer : public ::testing::TestWithParam<std::string> {};

TEST_P(StalledPeer, TripsTheTimeout) {
  const std::string transport = GetParam();
  constexpr int n = 3, stalled = 1;
  auto before = dev_shm_now();
  RunConfig cfg = failure_config(transport, 3);
  auto res = run_ranks_outcomes(n, cfg, [](Communicator& c) {
    std::vector<float> a(1 << 18, 1.0f), b(1 << 18, 0.0f);
    c.barrier()->wait();
    if (c.rank() == stalled) {
      store_time(&shared()->kill_time, now_seconds());
      ::raise(SIGSTOP);
      ::_exit(112);  // reached only if continued: the test kills it instead
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    mark_time();
    try {
      for (int it = 0; it < 100000; ++it) c.allreduce(a.data(), b.data(), a.size(), DType::f32, ReduceOp::sum)->wait();
    } catch (const Error&) {
      if (c.rank() == 0) ::kill(group_pids()[stalled], SIGKILL);
      throw;
    }
    SH_CHECK(false) << "allreduces went on with a stopped peer";
  });
  bool some_timeout = false;
  for (const auto& o : res.ranks) {
    if (o.rank == stalled) continue;
    SCOPED_TRACE("rank " + std::to_string(o.rank));
    ASSERT_FALSE(o.hung) << res.describe();
    // One survivor times out; the other may hear of it first as a PeerError (the timed-out rank
    // aborts its communicator and tells the group).
    EXPECT_TRUE(o.error_kind == "Timeout" || o.error_kind == "PeerError") << res.describe();
    some_timeout |= o.error_kind == "Timeout";
    EXPECT_LT(o.fail_seconds, 3.0 + kDetectBound) << res.describe();
    if (o.error_kind == "Timeout") {
      EXPECT_NE(o.message.find("allreduce"), std::string::npos) << "the Timeout does not name the op: " << o.message;
    }
  }
  EXPECT_TRUE(some_timeout) << res.describe();
  auto left = leftover_segments(before, res);
  EXPECT_TRUE(left.empty()) << "left in /dev/shm: " << join(left);
}

INSTANTIATE_TEST_SUITE_P(All, StalledPeer, ::testing::Values("shm", "tcp"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });
