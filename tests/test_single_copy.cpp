// Single-copy transfers (src/transport/cma.h): the group's probe agrees with what the kernel
// allows, SHOAL_CMA=0 and TCP turn it off, and the ops around single copy (gather and scatter use
// it; broadcast, allgather(v) and alltoall share their buffers' shapes) give the same results with
// it as without, in place too, with ranks out of step.
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <cstddef>
#include <random>
#include <thread>
#include <vector>

#include "algo/direct_common.h"
#include "reduce/copy.h"
#include "transport/cma.h"
#include "harness.h"

using namespace shoal;
using namespace shoal_test;

namespace {

RunConfig with_cma(const std::string& transport, const char* cma) {
  RunConfig cfg = transport_config(transport);
  cfg.env.push_back({"SHOAL_CMA", cma});
  return cfg;
}

// An op's way tests: n ranks over shared memory with SHOAL_CMA=cma and `setting`=way (a
// SHOAL_DIRECT_* variable), each rank first checking that single copy is on exactly where the
// kernel permits it and cma is 1, then running `body`.
using WayParam = std::tuple<int, const char*, const char*>;  // ranks, SHOAL_CMA, way
template <class Body>
void run_way(const WayParam& param, const char* setting, Body body) {
  const auto [n, cma, way] = param;
  RunConfig cfg = with_cma("shm", cma);
  cfg.env.push_back({setting, way});
  const bool may = std::string(cma) == "1" && kernel_permits_cma();
  run_ranks(n, cfg, [may, body](Communicator& c) {
    SH_CHECK(c.single_copy() == may) << "single copy " << c.single_copy() << ", expected " << may;
    body(c);
  });
}
auto way_values() {
  return ::testing::Combine(::testing::Values(2, 3, 4), ::testing::Values("1", "0"),
                            ::testing::Values("single_copy", "scratch", "auto"));
}
std::string way_name(const ::testing::TestParamInfo<WayParam>& info) {
  return "n" + std::to_string(std::get<0>(info.param)) + (std::get<1>(info.param)[0] == '1' ? "_cma_" : "_copies_") +
         std::get<2>(info.param);
}

}  // namespace

TEST(SingleCopy, ProbeAgreesWithTheKernel) {
  const bool permitted = kernel_permits_cma();
  run_ranks(3, with_cma("shm", ""), [&](Communicator& c) {
    SH_CHECK(c.single_copy() == permitted) << "single_copy() " << c.single_copy() << ", the kernel permits CMA: " << permitted;
  });
  run_ranks(3, with_cma("shm", "0"), [](Communicator& c) { SH_CHECK(!c.single_copy()) << "SHOAL_CMA=0"; });
  run_ranks(3, with_cma("tcp", "1"), [](Communicator& c) { SH_CHECK(!c.single_copy()) << "over TCP"; });
}

// cma::read and cma::write of this process's own memory at distances in and around a page's
// first 16 bytes, through the bounce buffer of transport/cma.cpp (forced on: it is taken on AMD
// alone) and without it, at lengths around the cut and past a bounce piece, against the source,
// the bytes around the range unchanged.
struct ForceBounce {
  explicit ForceBounce(int forced) { set_bounce_for_testing(forced); }
  ~ForceBounce() { set_bounce_for_testing(-1); }
};

TEST(SingleCopy, TransfersAtEveryDistanceInAPage) {
  if (!kernel_permits_cma()) GTEST_SKIP() << "this kernel forbids process_vm_readv here";
  std::mt19937 rng(11);
  const pid_t me = getpid();
  const size_t kPad = 8192;
  for (size_t n : {size_t(1), size_t(2047), size_t(2048), size_t(4096 + 5), (size_t(256) << 10) + 3, (size_t(600) << 10) + 1}) {
    std::vector<uint8_t> src(n + 2 * kPad), dst(n + 2 * kPad);
    for (auto& b : src) b = static_cast<uint8_t>(rng());
    for (size_t d : {0, 1, 2, 8, 15, 16, 17, 64, 4095}) {
      for (auto [bounce, reading] : {std::pair{1, true}, {1, false}, {0, true}, {0, false}}) {
        ForceBounce force(bounce);
        std::fill(dst.begin(), dst.end(), uint8_t{0xA5});
        uint8_t* to = dst.data() + kPad;
        const uint8_t* base = src.data() + kPad - 4096;  // `from` lies within the page before src's middle
        const uint8_t* from = base + ((reinterpret_cast<uintptr_t>(to) - d - reinterpret_cast<uintptr_t>(base)) & 4095);
        ASSERT_EQ((reinterpret_cast<uintptr_t>(to) - reinterpret_cast<uintptr_t>(from)) & 4095, d);
        const int e = reading ? cma::read(me, from, to, n) : cma::write(me, from, to, n);
        ASSERT_EQ(e, 0) << std::strerror(e);
        ASSERT_EQ(std::memcmp(to, from, n), 0) << (reading ? "read " : "write ") << n << " bytes, distance " << d
                                               << (bounce ? ", bounced" : ", direct");
        ASSERT_TRUE(std::all_of(dst.begin(), dst.begin() + kPad, [](uint8_t b) { return b == 0xA5; })) << n << ", " << d;
        ASSERT_TRUE(std::all_of(dst.begin() + kPad + n, dst.end(), [](uint8_t b) { return b == 0xA5; })) << n << ", " << d;
      }
    }
  }
}

TEST(SingleCopy, BadValueIsAnError) {
  RunResult res = run_ranks_outcomes(2, with_cma("shm", "2"), [](Communicator&) {});
  for (auto& r : res.ranks) {
    EXPECT_EQ(r.error_kind, "setup") << r.describe();
    EXPECT_NE(r.message.find("SHOAL_CMA='2': expected 0 or 1"), std::string::npos) << r.describe();
  }
}

// The ops with large blocks, below and above the single-copy threshold, with ranks out of step,
// in place where the op allows it; compared against values computed here. Run with SHOAL_CMA=1 and =0: the
// two forms must agree with the reference, so with each other.
class SingleCopyOps : public ::testing::TestWithParam<std::tuple<int, const char*>> {};

TEST_P(SingleCopyOps, MatchTheReference) {
  const int n = std::get<0>(GetParam());
  run_ranks(n, with_cma("shm", std::get<1>(GetParam())), [](Communicator& c) {
    std::mt19937 rng(7 + c.rank());
    const int p = c.size(), me = c.rank();
    // Blocks around 2 MiB, where most of these ops change way, odd counts included.
    const size_t big = (size_t(2) << 20) / sizeof(float);
    const size_t counts[] = {big / static_cast<size_t>(p) + 3, big + 1, 2 * big + 5};
    std::vector<float> in, out;
    for (int iter = 0; iter < (kSanitized ? 12 : 36); ++iter) {
      const size_t count = counts[iter % 3];
      const int kind = (iter / 3) % 6, root = iter % p;
      const bool in_place = iter % 2 == 1;
      if (rng() % 3 == 0) usleep(rng() % 500);
      auto val = [&](int r, size_t i) SHOAL_TEST_REFERENCE { return static_cast<float>((r + 1) * (iter + 1) + static_cast<int>(i % 11)); };
      auto expect_blocks = [&](const float* got, const char* what, auto want) SHOAL_TEST_REFERENCE {
        for (int r = 0; r < p; ++r)
          for (size_t i = 0; i < count; ++i)
            SH_CHECK(got[r * count + i] == want(r, i)) << what << " iter " << iter << " block " << r << " i " << i;
      };
      if (kind == 0) {  // broadcast
        in.assign(count, -1);
        if (me == root)
          for (size_t i = 0; i < count; ++i) in[i] = val(root, i);
        c.broadcast(in.data(), count, DType::f32, root)->wait();
        for (size_t i = 0; i < count; ++i) SH_CHECK(in[i] == val(root, i)) << "broadcast iter " << iter << " i " << i;
      } else if (kind == 1) {  // scatter; in place at the root: its out is its own block of in
        in.assign(count * p, -1);
        if (me == root)
          for (size_t i = 0; i < count * p; ++i) in[i] = val(root, i);
        out.assign(count, -1);
        float* dst = in_place && me == root ? in.data() + me * count : out.data();
        c.scatter(in.data(), dst, count, DType::f32, root)->wait();
        for (size_t i = 0; i < count; ++i) SH_CHECK(dst[i] == val(root, me * count + i)) << "scatter iter " << iter << " i " << i;
      } else if (kind == 2 || kind == 3) {  // allgather / gather; in place: in is the own block of out
        out.assign(count * p, -1);
        in.assign(count, 0);
        float* src = in_place ? out.data() + me * count : in.data();
        for (size_t i = 0; i < count; ++i) src[i] = val(me, i);
        if (kind == 2) {
          c.allgather(src, out.data(), count, DType::f32)->wait();
          expect_blocks(out.data(), "allgather", val);
        } else {
          c.gather(src, out.data(), count, DType::f32, root)->wait();
          if (me == root) expect_blocks(out.data(), "gather", val);
        }
      } else if (kind == 4) {  // allgatherv: rank r gives count + r elements
        std::vector<size_t> cs(p);
        size_t total = 0;
        for (int r = 0; r < p; ++r) total += cs[r] = count + r;
        in.resize(cs[me]);
        for (size_t i = 0; i < cs[me]; ++i) in[i] = val(me, i);
        out.assign(total, -1);
        c.allgatherv(in.data(), out.data(), cs, DType::f32)->wait();
        size_t off = 0;
        for (int r = 0; r < p; off += cs[r], ++r)
          for (size_t i = 0; i < cs[r]; ++i) SH_CHECK(out[off + i] == val(r, i)) << "allgatherv iter " << iter << " block " << r << " i " << i;
      } else {  // alltoall; block j of rank r's input is val(r, j * 13 + i)
        in.resize(count * p);
        for (int j = 0; j < p; ++j)
          for (size_t i = 0; i < count; ++i) in[j * count + i] = val(me, j * 13 + i);
        out.assign(count * p, -1);
        float* dst = in_place ? in.data() : out.data();
        c.alltoall(in.data(), dst, count, DType::f32)->wait();
        expect_blocks(dst, "alltoall", [&](int r, size_t i) SHOAL_TEST_REFERENCE { return val(r, me * 13 + i); });
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(All, SingleCopyOps,
                         ::testing::Combine(::testing::Values(2, 3, 4, 8), ::testing::Values("1", "0")),
                         [](const auto& info) {
                           return "n" + std::to_string(std::get<0>(info.param)) + (std::get<1>(info.param)[0] == '1' ? "_cma" : "_copies");
                         });

// A gather's writers write into the root's output in pieces, each after a look at the root's
// state. When the root fails the op mid-way (here it aborts from another thread), the pieces in
// flight must land before its call returns: after that the buffer is the caller's again (it may
// free it), and a write landing then would corrupt whatever lives there. The root counts the
// pieces whose last element has landed (the kernel copies a piece front to back) when its call
// returns and again 200 ms later: the two counts must be equal.
TEST(SingleCopy, NoWriteLandsInTheRootAfterItsFailedGatherReturns) {
  if (!kernel_permits_cma()) GTEST_SKIP() << "the kernel does not permit single copy here";
  constexpr int n = 4, root = 0;
  constexpr size_t piece = size_t(1) << 20;  // ShmGroupImpl's transfer piece (kTransferPiece)
  const size_t count = (size_t(128) << 20) / sizeof(float);  // 128 MiB per writer: ~0.1 s of writing
  RunConfig cfg = with_cma("shm", "1");
  cfg.env.push_back({"SHOAL_DIRECT_GATHER", "single_copy"});
  cfg.options.timeout = std::chrono::seconds(60);
  cfg.limit = std::chrono::seconds(120);
  RunResult res = run_ranks_outcomes(n, cfg, [&](Communicator& c) {
    std::vector<float> in(count, float(c.rank() + 1));
    std::vector<float> out(c.rank() == root ? count * n : 0, 0.0f);
    auto landed = [&] {
      size_t k = 0;
      for (int j = 0; j < n; ++j)
        if (j != root)
          for (size_t end = piece; end <= count * sizeof(float); end += piece)
            k += std::atomic_ref<float>(out[j * count + end / sizeof(float) - 1]).load() != 0.0f;
      return k;
    };
    c.barrier()->wait();
    std::jthread aborter;
    if (c.rank() == root)
      aborter = std::jthread([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(15));
        c.abort("the test's root gives up mid-gather");
      });
    try {
      c.gather(in.data(), out.data(), count, DType::f32, root)->wait();
      note("completed=1");
    } catch (const Error&) {
      if (c.rank() != root) throw;
      const size_t at_return = landed();
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      const size_t later = landed();
      note("pieces=" + std::to_string(at_return) + "/" + std::to_string((n - 1) * count * sizeof(float) / piece));
      SH_CHECK(later == at_return) << later - at_return << " piece(s) landed in the root's output after its gather failed";
      throw;
    }
  });
  const auto& r0 = res.ranks[root];
  if (r0.notes.find("completed=1") != std::string::npos) GTEST_SKIP() << "the gather finished before the root aborted";
  EXPECT_EQ(r0.error_kind, "PeerError") << res.describe();
}

// alltoall through the scratch (SHOAL_DIRECT_ALLTOALL=scratch: the measured costs may take the
// rings at these sizes) writes each block straight into its peer's output (direct_alltoall.cpp):
// with the AMD points for blocks of 64 KiB - 1 MiB where every rank has a core of its own; with
// the Intel ones for blocks from 4 KiB where it does, from 32 KiB where ranks share cores. Block
// sizes at and around the bounds, odd ones, a large one, in place, ranks out of step, with single
// copy on and off, with each CPU's points; compared against values computed here.
class SingleCopyAlltoall : public ::testing::TestWithParam<std::tuple<int, const char*, const char*>> {};

TEST_P(SingleCopyAlltoall, MatchesTheReference) {
  const int n = std::get<0>(GetParam());
  RunConfig cfg = with_cma("shm", std::get<1>(GetParam()));
  cfg.env.push_back({"SHOAL_DIRECT_ALLTOALL", "scratch"});
  cfg.env.push_back({"SHOAL_TUNING_BUILTIN", std::get<2>(GetParam())});
  run_ranks(n, cfg, [](Communicator& c) {
    std::mt19937 rng(11 + c.rank());
    const int p = c.size(), me = c.rank();
    const size_t kib = 1024 / sizeof(float);
    const size_t counts[] = {4 * kib - 1, 4 * kib + 3, 32 * kib - 1, 32 * kib, 64 * kib - 1, 64 * kib, 200 * kib + 3,
                             1024 * kib, 1024 * kib + 1, 3 * 1024 * kib + 5};
    std::vector<float> in, out;
    for (int iter = 0; iter < 20; ++iter) {
      const size_t count = counts[iter % 10];
      const bool in_place = iter >= 10;
      if (rng() % 3 == 0) usleep(rng() % 500);
      auto val = [&](int r, size_t i) SHOAL_TEST_REFERENCE { return static_cast<float>((r + 1) * 1000 + (iter + 1) * 7 + static_cast<int>(i % 13)); };
      in.resize(count * p);
      for (int j = 0; j < p; ++j)
        for (size_t i = 0; i < count; ++i) in[j * count + i] = val(me, j * count + i);
      out.assign(count * p, -1);
      float* dst = in_place ? in.data() : out.data();
      c.alltoall(in.data(), dst, count, DType::f32)->wait();
      for (int j = 0; j < p; ++j)  // block j came from rank j, its block me
        for (size_t i = 0; i < count; ++i)
          SH_CHECK(dst[j * count + i] == val(j, me * count + i)) << "alltoall iter " << iter << " count " << count << " block " << j << " i " << i;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(All, SingleCopyAlltoall,
                         ::testing::Combine(::testing::Values(2, 3, 4), ::testing::Values("1", "0"),
                                            ::testing::Values("amd", "intel")),
                         [](const auto& info) {
                           return "n" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param)[0] == '1' ? "_cma_" : "_copies_") + std::get<2>(info.param);
                         });

// broadcast above the small protocol, each way forced (SHOAL_DIRECT_BROADCAST) and chosen by the
// measured costs, with single copy on and off (off, or at 3 ranks or more, a forced single copy
// takes the scratch): sizes
// from just above the small protocol to past 4 MiB, odd ones, every root, ranks out of step;
// compared against values computed here.
class SingleCopyBroadcast : public ::testing::TestWithParam<WayParam> {};

TEST_P(SingleCopyBroadcast, MatchesTheReference) {
  run_way(GetParam(), "SHOAL_DIRECT_BROADCAST", [](Communicator& c) {
    std::mt19937 rng(13 + c.rank());
    const int p = c.size(), me = c.rank();
    const size_t kib = 1024 / sizeof(float);
    // The last: 64 bytes past the 2-rank scratch's 4 MiB chunk, cut into chunks of one length.
    const size_t counts[] = {8 * kib + 1, 64 * kib - 1, 256 * kib + 3, 1024 * kib, 3 * 1024 * kib + 7, 4096 * kib + 16};
    std::vector<float> buf;
    for (int iter = 0; iter < 12; ++iter) {
      const size_t count = counts[iter % 6];
      const int root = iter % p;
      if (rng() % 3 == 0) usleep(rng() % 500);
      auto val = [&](size_t i) SHOAL_TEST_REFERENCE { return static_cast<float>((root + 1) * 100 + iter + static_cast<int>(i % 17)); };
      buf.assign(count, -1);
      if (me == root)
        for (size_t i = 0; i < count; ++i) buf[i] = val(i);
      c.broadcast(buf.data(), count, DType::f32, root)->wait();
      for (size_t i = 0; i < count; ++i)
        SH_CHECK(buf[i] == val(i)) << "broadcast iter " << iter << " count " << count << " root " << root << " i " << i;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(All, SingleCopyBroadcast, way_values(), way_name);

// allgather and allgatherv at 2 ranks above the small protocol, each way forced
// (SHOAL_DIRECT_ALLGATHER) and chosen by the measured costs, with single copy on and off: equal
// and unequal blocks, odd sizes (up to past 16 MiB a block, where single copy writes the own block
// by non-temporal stores on every CPU: from 8 MiB, or 16 MiB on Intel), in place (the input as
// the rank's own block of the output, and the input at the output's start on both ranks), ranks
// out of step; compared against values computed here.
class SingleCopyAllgather : public ::testing::TestWithParam<std::tuple<const char*, const char*>> {};

TEST_P(SingleCopyAllgather, MatchesTheReference) {
  const auto [cma, way] = GetParam();
  RunConfig cfg = with_cma("shm", cma);
  cfg.env.push_back({"SHOAL_DIRECT_ALLGATHER", way});
  const bool may = std::string(cma) == "1" && kernel_permits_cma();
  run_ranks(2, cfg, [may](Communicator& c) {
    SH_CHECK(c.single_copy() == may) << "single copy " << c.single_copy() << ", expected " << may;
    std::mt19937 rng(17 + c.rank());
    const int p = c.size(), me = c.rank();
    const size_t kib = 1024 / sizeof(float);
    const size_t sizes[] = {4 * kib + 1, 32 * kib - 1, 128 * kib + 3, 512 * kib, 2048 * kib + 7, 8192 * kib + 5, 16384 * kib + 3};
    constexpr int kSizes = static_cast<int>(std::size(sizes));
    std::vector<float> in, out;
    for (int iter = 0; iter < 6 * kSizes; ++iter) {
      const size_t base = sizes[iter % kSizes];
      // Every size with every `where` and both `uneven`: 6·kSizes iterations, each pair once.
      const int where = iter / kSizes % 3;  // the input: its own buffer, the own block of out, out's start
      const bool uneven = iter / (3 * kSizes) % 2 == 1;
      std::vector<size_t> counts(p, base);
      if (uneven) counts[1] = base / 3 + 1;  // rank 1's block a third of rank 0's
      std::vector<size_t> off(p, 0);
      for (int j = 1; j < p; ++j) off[j] = off[j - 1] + counts[j - 1];
      const size_t total = off[p - 1] + counts[p - 1];
      if (rng() % 3 == 0) usleep(rng() % 500);
      auto val = [&](int r, size_t i) SHOAL_TEST_REFERENCE { return static_cast<float>((r + 1) * 1000 + iter + static_cast<int>(i % 19)); };
      out.assign(total, -1);
      in.assign(counts[me], 0);
      float* src = where == 0 ? in.data() : where == 1 ? out.data() + off[me] : out.data();
      for (size_t i = 0; i < counts[me]; ++i) src[i] = val(me, i);
      if (uneven) c.allgatherv(src, out.data(), counts, DType::f32)->wait();
      else c.allgather(src, out.data(), base, DType::f32)->wait();
      for (int j = 0; j < p; ++j)
        for (size_t i = 0; i < counts[j]; ++i)
          SH_CHECK(out[off[j] + i] == val(j, i)) << "allgather iter " << iter << " block " << j << " i " << i;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(All, SingleCopyAllgather,
                         ::testing::Combine(::testing::Values("1", "0"), ::testing::Values("single_copy", "scratch", "auto")),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param)[0] == '1' ? "cma_" : "copies_") + std::get<1>(info.param);
                         });

// scatter above the small protocol, each way forced (SHOAL_DIRECT_SCATTER) and chosen by the
// measured costs, with single copy on and off (off, a forced single copy takes the scratch):
// blocks from just above the small protocol to several MiB, odd ones, every root, in place at the
// root (its output is its own block of the input), the root's output half over its own block and
// half over a neighbour's, ranks out of step; compared against values computed here.
class SingleCopyScatter : public ::testing::TestWithParam<WayParam> {};

TEST_P(SingleCopyScatter, MatchesTheReference) {
  run_way(GetParam(), "SHOAL_DIRECT_SCATTER", [](Communicator& c) {
    std::mt19937 rng(19 + c.rank());
    const int p = c.size(), me = c.rank();
    const size_t kib = 1024 / sizeof(float);
    const size_t counts[] = {8 * kib + 1, 64 * kib - 1, 128 * kib + 3, 512 * kib, 2048 * kib + 7};
    std::vector<float> in, out;
    for (int iter = 0; iter < 10; ++iter) {
      const size_t count = counts[iter % 5];
      const int root = iter % p;
      const bool in_place = iter % 4 >= 2, straddles = iter % 4 == 1;
      if (rng() % 3 == 0) usleep(rng() % 500);
      auto val = [&](size_t i) SHOAL_TEST_REFERENCE { return static_cast<float>((root + 1) * 100 + iter + static_cast<int>(i % 23)); };
      in.assign(count * p, -1);
      if (me == root)
        for (size_t i = 0; i < count * p; ++i) in[i] = val(i);
      out.assign(count, -1);
      float* dst = out.data();
      if (me == root && in_place) dst = in.data() + me * count;
      const auto half = static_cast<std::ptrdiff_t>(count / 2);
      if (me == root && straddles) dst = in.data() + me * count + (me + 1 < p ? half : -half);
      c.scatter(in.data(), dst, count, DType::f32, root)->wait();
      for (size_t i = 0; i < count; ++i)
        SH_CHECK(dst[i] == val(me * count + i)) << "scatter iter " << iter << " count " << count << " root " << root << " i " << i;
      if (me == root && !straddles) {  // the root's input is not written (in place, its own block holds its own values)
        for (size_t i = 0; i < count * p; ++i) SH_CHECK(in[i] == val(i)) << "scatter's input changed at " << i;
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(All, SingleCopyScatter, way_values(), way_name);

// gather above the small protocol, each way forced (SHOAL_DIRECT_GATHER) and chosen by the
// measured costs, with single copy on and off (off, a forced single copy takes the scratch):
// blocks from just above the small protocol to several MiB, odd ones, every root, in place at the
// root (its input is its own block of the output), ranks out of step; compared against values
// computed here.
class SingleCopyGather : public ::testing::TestWithParam<WayParam> {};

TEST_P(SingleCopyGather, MatchesTheReference) {
  run_way(GetParam(), "SHOAL_DIRECT_GATHER", [](Communicator& c) {
    std::mt19937 rng(23 + c.rank());
    const int p = c.size(), me = c.rank();
    const size_t kib = 1024 / sizeof(float);
    const size_t counts[] = {8 * kib + 1, 64 * kib - 1, 128 * kib + 3, 512 * kib, 2048 * kib + 7};
    std::vector<float> in, out;
    for (int iter = 0; iter < 10; ++iter) {
      const size_t count = counts[iter % 5];
      const int root = iter % p;
      const bool in_place = iter % 4 >= 2;
      if (rng() % 3 == 0) usleep(rng() % 500);
      auto val = [&](int r, size_t i) SHOAL_TEST_REFERENCE { return static_cast<float>((r + 1) * 100 + iter + static_cast<int>(i % 29)); };
      out.assign(me == root ? count * p : 0, -1);
      in.assign(count, 0);
      float* src = in_place && me == root ? out.data() + me * count : in.data();
      for (size_t i = 0; i < count; ++i) src[i] = val(me, i);
      c.gather(src, me == root ? out.data() : nullptr, count, DType::f32, root)->wait();
      if (me == root) {
        for (int j = 0; j < p; ++j)
          for (size_t i = 0; i < count; ++i)
            SH_CHECK(out[j * count + i] == val(j, i)) << "gather iter " << iter << " count " << count << " root " << root << " block " << j << " i " << i;
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(All, SingleCopyGather, way_values(), way_name);

namespace {

// A scatter's or gather's single copy waits one way (begin_rooted_single): the others wait for
// the root's head alone, the root for their copies, with no barrier. A rank whose call differs
// (its root, its count, its op) still fails every rank with PeerError within the timeout, never
// a hang or a wrong result: the others check the root's head, the root every other's.
struct RootedMismatch {
  const char* name;
  // This rank's call; `odd`: the last rank, whose call differs.
  void (*run)(Communicator& c, bool odd, size_t count);
};
void scatter_from(Communicator& c, int root, size_t count) {
  std::vector<float> in(c.rank() == root ? count * c.size() : 0, 1.0f), out(count, 0.0f);
  c.scatter(in.data(), out.data(), count, DType::f32, root)->wait();
}
void gather_to(Communicator& c, int root, size_t count) {
  std::vector<float> in(count, 1.0f), out(c.rank() == root ? count * c.size() : 0, 0.0f);
  c.gather(in.data(), out.data(), count, DType::f32, root)->wait();
}
constexpr RootedMismatch kRootedMismatches[] = {
    {"scatter_root", [](Communicator& c, bool odd, size_t count) { scatter_from(c, odd ? 1 : 0, count); }},
    {"scatter_count", [](Communicator& c, bool odd, size_t count) { scatter_from(c, 0, odd ? count + 16 : count); }},
    {"gather_root", [](Communicator& c, bool odd, size_t count) { gather_to(c, odd ? 1 : 0, count); }},
    {"root_gathers_where_the_others_scatter",  // the last rank is the root of both
     [](Communicator& c, bool odd, size_t count) {
       if (odd) gather_to(c, c.size() - 1, count);
       else scatter_from(c, c.size() - 1, count);
     }},
    {"leaf_calls_allreduce",
     [](Communicator& c, bool odd, size_t count) {
       if (!odd) return gather_to(c, 0, count);
       std::vector<float> a(count, 1.0f), b(count, 0.0f);
       c.allreduce(a.data(), b.data(), count, DType::f32, ReduceOp::sum)->wait();
     }},
    {"leaf_runs_ahead_through_a_small_op",
     // The last rank is a small reduce's leaf (it leaves at once) where the others scatter from
     // rank 0, then all scatter from rank 1. With rank 2 late to the first scatter, the last rank
     // has copied in the second before rank 0 looks at it in the first: its copy of a later op
     // must not pass for one of this op.
     [](Communicator& c, bool odd, size_t count) {
       if (odd) {
         float x = 1, y = 0;
         c.reduce(&x, &y, 1, DType::f32, ReduceOp::sum, 1)->wait();
       } else {
         if (c.rank() == 2) usleep(200000);
         scatter_from(c, 0, count);
       }
       scatter_from(c, 1, count);
     }},
    {"root_calls_broadcast",  // chunked, with barriers, where the others scatter
     [](Communicator& c, bool odd, size_t count) {
       if (!odd) return scatter_from(c, c.size() - 1, count);
       std::vector<float> a(count, 1.0f);
       c.broadcast(a.data(), count, DType::f32, c.size() - 1)->wait();
     }},
};

class RootedSingleCopyMismatched : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(RootedSingleCopyMismatched, EveryRankGetsAnError) {
  if (!kernel_permits_cma()) GTEST_SKIP() << "the kernel does not permit single copy here";
  const auto& [which, n] = GetParam();
  const RootedMismatch mm = kRootedMismatches[which];
  const auto timeout = std::chrono::milliseconds(3000);
  RunConfig cfg = timed_config("shm", timeout, std::chrono::seconds(40));
  cfg.env.push_back({"SHOAL_CMA", "1"});
  cfg.env.push_back({"SHOAL_DIRECT_SCATTER", "single_copy"});
  cfg.env.push_back({"SHOAL_DIRECT_GATHER", "single_copy"});
  expect_every_rank_fails(n, cfg, timeout, [mm](Communicator& c) {
    mm.run(c, c.rank() == c.size() - 1, (size_t(256) << 10) / sizeof(float));
  });
}

INSTANTIATE_TEST_SUITE_P(All, RootedSingleCopyMismatched,
                         ::testing::Combine(::testing::Range(0, int(std::size(kRootedMismatches))), ::testing::Values(3, 5)),
                         [](const auto& i) {
                           return std::string(kRootedMismatches[std::get<0>(i.param)].name) + "_n" +
                                  std::to_string(std::get<1>(i.param));
                         });

// Single-copy scatters and gathers, which wait one way and take no chunked number, between
// chunked ops that end without a closing barrier (an odd number of chunks: the next chunked op's
// first barrier covers their last slot) and small ops, ranks out of step: the chunked op after
// the single copy must not write a slot a slow peer still reads from the one before (slot_of,
// end). Every result against values computed here, at 3, 4 and 8 ranks.
class RootedSingleCopyBetweenChunkedOps : public ::testing::TestWithParam<int> {};

TEST_P(RootedSingleCopyBetweenChunkedOps, MatchTheReference) {
  if (!kernel_permits_cma()) GTEST_SKIP() << "the kernel does not permit single copy here";
  RunConfig cfg = with_cma("shm", "1");
  cfg.env.push_back({"SHOAL_DIRECT_SCATTER", "single_copy"});
  cfg.env.push_back({"SHOAL_DIRECT_GATHER", "single_copy"});
  cfg.env.push_back({"SHOAL_DIRECT_BROADCAST", "scratch"});
  cfg.env.push_back({"SHOAL_DIRECT_ALLGATHER", "scratch"});
  // Small slots: a 300 KiB op takes several chunks, odd and even counts of them.
  cfg.env.push_back({"SHOAL_SHM_SCRATCH", std::to_string((256 << 10) + algo::direct::kHeaderBytes + algo::direct::kSmallArea)});
  run_ranks(GetParam(), cfg, [](Communicator& c) {
    SH_CHECK(c.single_copy()) << "single copy is off: the test would not reach it";
    std::mt19937 rng(31 + c.rank());
    const int p = c.size(), me = c.rank();
    std::vector<float> in, out;
    for (int iter = 0; iter < (kSanitized ? 16 : 48); ++iter) {
      const int root = (iter / 4) % p;
      const size_t count = (size_t(100) << 10) / sizeof(float) * (1 + iter % 3) + iter;  // 100-300 KiB, odd
      auto val = [&](int r, size_t i) SHOAL_TEST_REFERENCE { return static_cast<float>((r + 1) * 1000 + iter + static_cast<int>(i % 37)); };
      if (rng() % 2 == 0) usleep(rng() % 300);
      switch (iter % 4) {
        case 0: {  // chunked allgather: every rank reads every slot
          in.resize(count);
          for (size_t i = 0; i < count; ++i) in[i] = val(me, i);
          out.assign(count * p, -1);
          c.allgather(in.data(), out.data(), count, DType::f32)->wait();
          for (int r = 0; r < p; ++r)
            for (size_t i = 0; i < count; ++i) SH_CHECK(out[r * count + i] == val(r, i)) << "allgather iter " << iter << " block " << r << " i " << i;
          break;
        }
        case 1: {  // scatter by single copy
          in.assign(me == root ? count * p : 0, -1);
          for (size_t i = 0; i < in.size(); ++i) in[i] = val(root, i);
          out.assign(count, -1);
          c.scatter(in.data(), out.data(), count, DType::f32, root)->wait();
          for (size_t i = 0; i < count; ++i) SH_CHECK(out[i] == val(root, me * count + i)) << "scatter iter " << iter << " i " << i;
          break;
        }
        case 2: {  // chunked broadcast, then a gather by single copy at once
          out.assign(count, -1);
          if (me == root)
            for (size_t i = 0; i < count; ++i) out[i] = val(root, i);
          c.broadcast(out.data(), count, DType::f32, root)->wait();
          for (size_t i = 0; i < count; ++i) SH_CHECK(out[i] == val(root, i)) << "broadcast iter " << iter << " i " << i;
          in.resize(count);
          for (size_t i = 0; i < count; ++i) in[i] = val(me, i);
          out.assign(me == root ? count * p : 0, -1);
          c.gather(in.data(), out.data(), count, DType::f32, root)->wait();
          for (size_t i = 0; i < out.size(); ++i) SH_CHECK(out[i] == val(static_cast<int>(i / count), i % count)) << "gather iter " << iter << " i " << i;
          break;
        }
        default: {  // a small allreduce
          float x = static_cast<float>(me + iter), sum = 0;
          c.allreduce(&x, &sum, 1, DType::f32, ReduceOp::sum)->wait();
          SH_CHECK(sum == static_cast<float>(p * iter + p * (p - 1) / 2)) << "allreduce iter " << iter;
        }
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(All, RootedSingleCopyBetweenChunkedOps, ::testing::Values(3, 4, 8));

}  // namespace
