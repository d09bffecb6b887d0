// Every op at 32 ranks on one host (16 per core here), over shared memory and over TCP: each
// result against a reference computed from the inputs' formula. The collectives matrix covers
// dtypes, reduce ops and algorithms at up to 8 ranks; this covers the rank count, with the
// automatic choice of algorithm. scripts/many_ranks.py measures 64 and 128 ranks.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"

using namespace shoal;
using namespace shoal_test;

namespace {

constexpr int kRanks = 32;

// Rank r's element i: small integers, so that i32 sums over 32 ranks are exact.
int32_t input(int r, size_t i) { return static_cast<int32_t>((r * 7 + static_cast<int>(i % 1009) * 3) % 101) - 50; }

int32_t sum_over_ranks(int n, size_t i) {
  int32_t s = 0;
  for (int r = 0; r < n; ++r) s += input(r, i);
  return s;
}

std::vector<int32_t> inputs(int r, size_t n, size_t first = 0) {
  std::vector<int32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = input(r, first + i);
  return v;
}

void every_op(Communicator& c) {
  const int n = c.size(), me = c.rank();
  for (size_t count : {size_t(1), size_t(37), size_t(20001)}) {
    const auto x = inputs(me, count);
    std::vector<int32_t> y(count, -1);
    c.allreduce(x.data(), y.data(), count, DType::i32, ReduceOp::sum)->wait();
    for (size_t i = 0; i < count; ++i) SH_CHECK_EQ(y[i], sum_over_ranks(n, i)) << "allreduce of " << count << " at " << i;

    for (int root : {0, n - 1, 13}) {
      auto b = me == root ? inputs(root, count) : std::vector<int32_t>(count, -1);
      c.broadcast(b.data(), count, DType::i32, root)->wait();
      for (size_t i = 0; i < count; ++i) SH_CHECK_EQ(b[i], input(root, i)) << "broadcast from " << root;

      std::vector<int32_t> r(count, -1);
      c.reduce(x.data(), r.data(), count, DType::i32, ReduceOp::sum, root)->wait();
      if (me == root) {
        for (size_t i = 0; i < count; ++i) SH_CHECK_EQ(r[i], sum_over_ranks(n, i)) << "reduce to " << root;
      }

      std::vector<int32_t> g(me == root ? count * n : 0, -1);
      c.gather(x.data(), g.data(), count, DType::i32, root)->wait();
      if (me == root) {
        for (int p = 0; p < n; ++p)
          for (size_t i = 0; i < count; ++i) SH_CHECK_EQ(g[p * count + i], input(p, i)) << "gather from " << p;
      }

      // The root scatters block p = rank p's inputs at offset p * count.
      auto all = me == root ? inputs(root, count * n) : std::vector<int32_t>();
      std::vector<int32_t> s(count, -1);
      c.scatter(all.data(), s.data(), count, DType::i32, root)->wait();
      for (size_t i = 0; i < count; ++i) SH_CHECK_EQ(s[i], input(root, me * count + i)) << "scatter";
    }

    std::vector<int32_t> ag(count * n, -1);
    c.allgather(x.data(), ag.data(), count, DType::i32)->wait();
    for (int p = 0; p < n; ++p)
      for (size_t i = 0; i < count; ++i) SH_CHECK_EQ(ag[p * count + i], input(p, i)) << "allgather from " << p;

    // Rank p gives count + p % 3 elements (some ranks more than others).
    std::vector<size_t> counts(n);
    size_t total = 0;
    for (int p = 0; p < n; ++p) total += counts[p] = count + p % 3;
    const auto xv = inputs(me, counts[me]);
    std::vector<int32_t> agv(total, -1);
    c.allgatherv(xv.data(), agv.data(), counts, DType::i32)->wait();
    for (int p = 0, off = 0; p < n; off += static_cast<int>(counts[p]), ++p)
      for (size_t i = 0; i < counts[p]; ++i) SH_CHECK_EQ(agv[off + i], input(p, i)) << "allgatherv from " << p;

    // reduce_scatter: rank r's input is inputs(r, count * n); it gets block r of the sum.
    const auto rsin = inputs(me, count * n);
    std::vector<int32_t> rs(count, -1);
    c.reduce_scatter(rsin.data(), rs.data(), count, DType::i32, ReduceOp::sum)->wait();
    for (size_t i = 0; i < count; ++i) SH_CHECK_EQ(rs[i], sum_over_ranks(n, me * count + i)) << "reduce_scatter";

    // alltoall: block p of rank r's input goes to rank p; rank r's block p is inputs(r, ...) at
    // offset p * count.
    std::vector<int32_t> a2a(count * n, -1);
    c.alltoall(rsin.data(), a2a.data(), count, DType::i32)->wait();
    for (int p = 0; p < n; ++p)
      for (size_t i = 0; i < count; ++i) SH_CHECK_EQ(a2a[p * count + i], input(p, me * count + i)) << "alltoall from " << p;

    // A ring of sends: rank r sends to r+1 and receives from r-1.
    std::vector<int32_t> got(count, -1);
    auto rv = c.recv(got.data(), count, DType::i32, (me + n - 1) % n);
    c.send(x.data(), count, DType::i32, (me + 1) % n)->wait();
    rv->wait();
    for (size_t i = 0; i < count; ++i) SH_CHECK_EQ(got[i], input((me + n - 1) % n, i)) << "recv";
  }
  c.barrier()->wait();
}

class ManyRanks : public ::testing::TestWithParam<std::string> {};

TEST_P(ManyRanks, EveryOp) {
  RunConfig cfg = timed_config(GetParam(), std::chrono::seconds(120), std::chrono::seconds(280));
  run_ranks(kRanks, cfg, [transport = GetParam()](Communicator& c) {
    SH_CHECK_EQ(c.transport_to((c.rank() + 1) % c.size()), transport);
    every_op(c);
  });
}

INSTANTIATE_TEST_SUITE_P(All, ManyRanks, ::testing::Values("shm", "tcp"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return "n32_" + i.param; });

// Over TCP a pair connects when it first talks: after creation a rank holds its listener alone,
// after a ring of sends the sockets to its two neighbours (a data and a control connection each),
// and after an all-to-all every pair's, with the listener closed.
TEST(ManyRanks, TcpConnectsOnlyThePairsThatTalk) {
  RunConfig cfg = transport_config("tcp");
  cfg.limit = std::chrono::seconds(200);
  run_ranks(kRanks, cfg, [](Communicator& c) {
    const int n = c.size(), me = c.rank();
    SH_CHECK_EQ(open_sockets(), 1) << "sockets after the group's creation";
    int32_t x = me, got = -1;
    auto rv = c.recv(&got, 1, DType::i32, (me + n - 1) % n);
    c.send(&x, 1, DType::i32, (me + 1) % n)->wait();
    rv->wait();
    SH_CHECK_EQ(got, (me + n - 1) % n);
    SH_CHECK_EQ(open_sockets(), 1 + 2 * 2) << "sockets after a ring of sends";
    // Nobody dials for the all-to-all before every rank has counted (a counter in memory the
    // test's processes share: not through the group, whose barrier connects pairs too).
    auto* counted = static_cast<std::atomic<int>*>(shared_area());
    counted->fetch_add(1);
    while (counted->load() < n) std::this_thread::yield();
    const auto in = inputs(me, n);
    std::vector<int32_t> out(n, -1);
    c.alltoall(in.data(), out.data(), 1, DType::i32)->wait();
    for (int p = 0; p < n; ++p) SH_CHECK_EQ(out[p], input(p, me)) << "alltoall from " << p;
    SH_CHECK_EQ(open_sockets(), 2 * (n - 1)) << "sockets after an all-to-all";
  });
}

// A rank's first send to a lower rank waits for that rank to accept the connection, which it
// does whatever it is waiting on: here rank 0 waits on rank 1 (already connected) while rank 2's
// first send to it waits, and rank 1 waits on rank 2.
TEST(ManyRanks, TcpAcceptsWhileWaitingOnAnotherPeer) {
  RunConfig cfg = timed_config("tcp", std::chrono::seconds(20), std::chrono::seconds(60), false);
  run_ranks(3, cfg, [](Communicator& c) {
    int32_t a = 10 + c.rank(), b = -1, d = -1;
    if (c.rank() < 2) {  // connect 0 and 1 first
      auto r = c.recv(&b, 1, DType::i32, 1 - c.rank());
      c.send(&a, 1, DType::i32, 1 - c.rank())->wait();
      r->wait();
      SH_CHECK_EQ(b, 10 + (1 - c.rank()));
    }
    // Rank 2 dials rank 0 only once rank 0 waits on rank 1 (a rank accepts while a link of its
    // waits on a connection anyway).
    auto* connected = static_cast<std::atomic<int>*>(shared_area());
    if (c.rank() < 2) connected->fetch_add(1);
    const double t0 = now_seconds();
    if (c.rank() == 2) {
      while (connected->load() < 2) std::this_thread::yield();
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      c.send(&a, 1, DType::i32, 0)->wait();
      c.send(&a, 1, DType::i32, 1)->wait();
    } else if (c.rank() == 1) {
      c.recv(&d, 1, DType::i32, 2)->wait();
      SH_CHECK_EQ(d, 12);
      c.send(&a, 1, DType::i32, 0)->wait();
    } else {
      c.recv(&b, 1, DType::i32, 1)->wait();
      SH_CHECK_EQ(b, 11);
      c.recv(&d, 1, DType::i32, 2)->wait();
      SH_CHECK_EQ(d, 12);
    }
    SH_CHECK(now_seconds() - t0 < 5.2) << "a first send waited for its receiver to look";
  });
}

}  // namespace
