// Every algorithm that runs over point-to-point links (the registry's Needs::any: all but the
// direct and hierarchical ones), called through the algorithm layer's entry points
// (src/algo/algorithms.h) on ranks that are threads of this process over the in-process transport
// (loop_group.h): group sizes 1 to 9, 12, 13 and 16, counts 0, 1, odd and some pipeline chunks'
// worth, first, last and middle roots, in place where the op allows, against results computed
// here. No fork, store or socket, so the whole matrix runs in seconds, and under the sanitizers
// every rank is in view.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "algo/algorithms.h"
#include "algo/registry.h"
#include "base/call.h"
#include "loop_group.h"
#include "shoal/error.h"

namespace {

using namespace shoal;
using shoal_test::LoopOp;
using shoal_test::run_loop;

const int kSizes[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 16};
const size_t kCounts[] = {0, 1, 7, 1000, 65537};

// The algorithms of `k` that need neither shared memory nor several hosts.
std::vector<Algo> p2p_algos(OpKind k) {
  std::vector<Algo> out;
  for (Algo a : algos_list(k))
    if (needs_of(k, a) == Needs::any) out.push_back(a);
  return out;
}

std::string where(OpKind k, Algo a, int n) {
  return std::string(op_kind_name(k)) + " " + algo_name(a) + ", " + std::to_string(n) + " ranks";
}

// fn(a, ctx) on a group of each of kSizes ranks, for every algorithm a of `k` here.
void on_every_group(OpKind k, const LoopOp& o, const std::function<void(Algo, Ctx&)>& fn) {
  for (Algo a : p2p_algos(k))
    for (int n : kSizes) {
      SCOPED_TRACE(where(k, a, n));
      run_loop(n, o, [&](Ctx& c) { fn(a, c); });
    }
}

// Small integers: every sum below is exact in f32, whatever the order of the additions.
float val(int r, size_t i) { return static_cast<float>((r * 7 + static_cast<int>(i % 101)) % 23 + 1); }

std::vector<int> roots(int n) {
  std::vector<int> r = {0, n - 1, n / 2};
  std::sort(r.begin(), r.end());
  r.erase(std::unique(r.begin(), r.end()), r.end());
  return r;
}

TEST(LoopAlgorithms, AllreduceSumsInPlaceAndNot) {
  on_every_group(OpKind::allreduce, {}, [&](Algo a, Ctx& c) {
    const int n = c.size;
    for (size_t count : kCounts)
      for (bool in_place : {false, true}) {
        std::vector<float> in(count), out(count, -1);
        for (size_t i = 0; i < count; ++i) in[i] = val(c.rank, i);
        float* o = in_place ? in.data() : out.data();
        allreduce(c, a, in.data(), o, count);
        for (size_t i = 0; i < count; ++i) {
          float want = 0;
          for (int r = 0; r < n; ++r) want += val(r, i);
          if (o[i] != want) {
            ADD_FAILURE() << "rank " << c.rank << ", count " << count << (in_place ? " in place" : "") << ", element "
                          << i << ": " << o[i] << ", expected " << want;
            return;
          }
        }
      }
  });
}

// Another type and reduction: i64 max, values beyond 2^53 so that a trip through floating point
// would show.
TEST(LoopAlgorithms, AllreduceMaxOfI64) {
  on_every_group(OpKind::allreduce, {DType::i64, ReduceOp::max}, [&](Algo a, Ctx& c) {
    const int n = c.size;
    auto v = [](int r, size_t i) { return (int64_t(1) << 60) + int64_t(i % 97) * 1000 + (r * 5 + static_cast<int>(i)) % 11; };
    const size_t count = 4099;
    std::vector<int64_t> in(count), out(count);
    for (size_t i = 0; i < count; ++i) in[i] = v(c.rank, i);
    allreduce(c, a, in.data(), out.data(), count);
    for (size_t i = 0; i < count; ++i) {
      int64_t want = INT64_MIN;
      for (int r = 0; r < n; ++r) want = std::max(want, v(r, i));
      if (out[i] != want) {
        ADD_FAILURE() << "rank " << c.rank << ", element " << i << ": " << out[i] << ", expected " << want;
        return;
      }
    }
  });
}

TEST(LoopAlgorithms, BroadcastFromEveryKindOfRoot) {
  on_every_group(OpKind::broadcast, {}, [&](Algo a, Ctx& c) {
    const int n = c.size;
    for (int root : roots(n))
      for (size_t count : kCounts) {
        std::vector<float> buf(count);
        for (size_t i = 0; i < count; ++i) buf[i] = c.rank == root ? val(root, i) : -1;
        broadcast(c, a, buf.data(), count, root);
        for (size_t i = 0; i < count; ++i)
          if (buf[i] != val(root, i)) {
            ADD_FAILURE() << "rank " << c.rank << ", root " << root << ", count " << count << ", element " << i;
            return;
          }
      }
  });
}

TEST(LoopAlgorithms, ReduceSumsAtTheRoot) {
  on_every_group(OpKind::reduce, {}, [&](Algo a, Ctx& c) {
    const int n = c.size;
    for (int root : roots(n))
      for (size_t count : kCounts) {
        std::vector<float> in(count), out(count, -1);
        for (size_t i = 0; i < count; ++i) in[i] = val(c.rank, i);
        reduce(c, a, in.data(), out.data(), count, root);
        if (c.rank != root) continue;
        for (size_t i = 0; i < count; ++i) {
          float want = 0;
          for (int r = 0; r < n; ++r) want += val(r, i);
          if (out[i] != want) {
            ADD_FAILURE() << "root " << root << ", count " << count << ", element " << i << ": " << out[i]
                          << ", expected " << want;
            return;
          }
        }
      }
  });
}

TEST(LoopAlgorithms, GatherAndScatterMoveEveryBlock) {
  for (OpKind k : {OpKind::gather, OpKind::scatter})
    on_every_group(k, {}, [&](Algo a, Ctx& c) {
      const int n = c.size;
      for (int root : roots(n))
        for (size_t count : kCounts) {
          const size_t all = count * n;
          if (k == OpKind::gather) {
            std::vector<float> in(count), out(c.rank == root ? all : 0, -1);
            for (size_t i = 0; i < count; ++i) in[i] = val(c.rank, i);
            gather(c, a, in.data(), out.data(), count, root);
            if (c.rank != root) continue;
            for (size_t i = 0; i < all; ++i)
              if (out[i] != val(static_cast<int>(i / count), i % count)) {
                ADD_FAILURE() << "root " << root << ", count " << count << ", element " << i;
                return;
              }
          } else {
            std::vector<float> in(c.rank == root ? all : 0), out(count, -1);
            for (size_t i = 0; i < in.size(); ++i) in[i] = val(static_cast<int>(i / count), i % count);
            scatter(c, a, in.data(), out.data(), count, root);
            for (size_t i = 0; i < count; ++i)
              if (out[i] != val(c.rank, i)) {
                ADD_FAILURE() << "rank " << c.rank << ", root " << root << ", count " << count << ", element " << i;
                return;
              }
          }
        }
    });
}

// Blocks of different sizes per rank, zero among them.
TEST(LoopAlgorithms, AllgathervOfUnevenBlocks) {
  on_every_group(OpKind::allgatherv, {}, [&](Algo a, Ctx& c) {
    const int n = c.size;
    for (size_t unit : {size_t(1), size_t(333), size_t(20001)}) {
      std::vector<size_t> counts(n), off(n);
      size_t total = 0;
      for (int r = 0; r < n; ++r) counts[r] = static_cast<size_t>((r * 3 + 1) % 4) * unit, off[r] = total, total += counts[r];
      std::vector<float> in(counts[c.rank]), out(total, -1);
      for (size_t i = 0; i < in.size(); ++i) in[i] = val(c.rank, i);
      allgatherv(c, a, in.data(), out.data(), counts);
      for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < counts[r]; ++i)
          if (out[off[r] + i] != val(r, i)) {
            ADD_FAILURE() << "rank " << c.rank << ", unit " << unit << ", block of rank " << r << ", element " << i;
            return;
          }
    }
  });
}

TEST(LoopAlgorithms, ReduceScatterSumsEachRanksBlock) {
  on_every_group(OpKind::reduce_scatter, {}, [&](Algo a, Ctx& c) {
    const int n = c.size;
    for (size_t count : kCounts) {
      std::vector<float> in(count * n), out(count, -1);
      for (size_t i = 0; i < in.size(); ++i) in[i] = val(c.rank, i);
      reduce_scatter(c, a, in.data(), out.data(), count);
      for (size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int r = 0; r < n; ++r) want += val(r, c.rank * count + i);
        if (out[i] != want) {
          ADD_FAILURE() << "rank " << c.rank << ", count " << count << ", element " << i << ": " << out[i]
                        << ", expected " << want;
          return;
        }
      }
    }
  });
}

// Uneven blocks between each pair, zero among them, in place in every other call.
TEST(LoopAlgorithms, AlltoallvOfUnevenBlocks) {
  on_every_group(OpKind::alltoallv, {}, [&](Algo a, Ctx& c) {
    const int n = c.size;
    auto v = [](int from, int to, size_t i) { return static_cast<float>((from * 31 + to * 7) % 101 + static_cast<int>(i % 13)); };
    for (int t = 0; t < 6; ++t) {
      const size_t unit = t < 2 ? 1 : t < 4 ? 777 : 30001;
      auto len = [&](int from, int to) { return static_cast<size_t>((from * 3 + to * 5 + t) % 4) * unit / 2; };
      std::vector<size_t> sc(n), rc(n);
      size_t st = 0, rt = 0;
      for (int j = 0; j < n; ++j) sc[j] = len(c.rank, j), rc[j] = len(j, c.rank), st += sc[j], rt += rc[j];
      const bool in_place = t % 2 == 1;
      std::vector<float> in(std::max(st, rt), -2), out(rt, -1);
      for (int j = 0, o = 0; j < n; o += static_cast<int>(sc[j]), ++j)
        for (size_t i = 0; i < sc[j]; ++i) in[o + i] = v(c.rank, j, i);
      float* dst = in_place ? in.data() : out.data();
      alltoallv(c, a, in.data(), sc, dst, rc);
      for (int j = 0, o = 0; j < n; o += static_cast<int>(rc[j]), ++j)
        for (size_t i = 0; i < rc[j]; ++i)
          if (dst[o + i] != v(j, c.rank, i)) {
            ADD_FAILURE() << "rank " << c.rank << ", call " << t << ", block from rank " << j << ", element " << i;
            return;
          }
    }
  });
}

// No rank leaves a barrier before every rank has entered it.
TEST(LoopAlgorithms, BarrierHoldsEveryRankUntilAllArrive) {
  for (Algo a : p2p_algos(OpKind::barrier))
    for (int n : kSizes) {
      SCOPED_TRACE(where(OpKind::barrier, a, n));
      std::atomic<int> arrived{0};
      run_loop(n, {}, [&](Ctx& c) {
        for (int k = 1; k <= 5; ++k) {
          arrived.fetch_add(1);
          barrier(c, a);
          const int seen = arrived.load();
          if (seen < k * n) {
            ADD_FAILURE() << "rank " << c.rank << " left barrier " << k << " when " << seen << " of " << k * n
                          << " arrivals had happened";
            return;
          }
        }
      });
    }
}

// Ranks that call mismatched ops fail with an error naming the mismatch, never a wrong result:
// over this transport as over the others.
TEST(LoopAlgorithms, MismatchedCountsFailNamingTheCall) {
  try {
    run_loop(3, {}, [](Ctx& c) {
      const size_t count = c.rank == 1 ? 1001 : 1000;
      std::vector<float> in(count, 1), out(count);
      allreduce(c, Algo::ring, in.data(), out.data(), count);
    });
    FAIL() << "mismatched counts completed";
  } catch (const PeerError& e) {
    EXPECT_NE(std::string(e.what()).find("mismatched ops"), std::string::npos) << e.what();
  }
}

}  // namespace
