// The shared-memory (direct) algorithms reuse each rank's two scratch slots from op to op, and
// the small allreduce ends without a closing barrier (src/algo/direct_common.h, slot_of). These
// tests drive many back-to-back direct ops with ranks deliberately out of step (random delays,
// point-to-point traffic in between, small and chunked ops mixed), and check every result: a
// rank overwriting a slot that a slow peer is still reading would show up as a wrong sum.
#include <unistd.h>

#include <random>
#include <vector>

#include "algo/direct_common.h"
#include "harness.h"

using namespace shoal;
using namespace shoal_test;

namespace {

// Sum over ranks of (rank + 1) * (iter + 1) + i % 7, exact in f32 for these sizes.
float expected(int size, int iter, size_t i) {
  return static_cast<float>((size * (size + 1) / 2) * (iter + 1) + size * static_cast<int>(i % 7));
}

void check_allreduce(Communicator& c, int iter, size_t count, std::vector<float>& in, std::vector<float>& out) {
  const int rank = c.rank(), size = c.size();  // once: the loops below run over a million elements
  for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>((rank + 1) * (iter + 1) + static_cast<int>(i % 7));
  c.allreduce(in.data(), out.data(), count, DType::f32, ReduceOp::sum, {Algo::direct})->wait();
  for (size_t i = 0; i < count; ++i)
    SH_CHECK(out[i] == expected(size, iter, i)) << "iteration " << iter << " count " << count << " element " << i
                                                << ": got " << out[i] << ", expected " << expected(size, iter, i);
}

}  // namespace

class DirectReuse : public ::testing::TestWithParam<int> {};

TEST_P(DirectReuse, OutOfStepRanksNeverReadAnOverwrittenSlot) {
  const int n = GetParam();
  run_ranks(n, transport_config("shm"), [](Communicator& c) {
    std::mt19937 rng(1234 + c.rank());
    const size_t counts[] = {1, 7, 1024, 1000003};  // small (one-barrier) paths and a chunked one
    std::vector<float> in(1000003), out(1000003);
    std::vector<float> token(1);
    for (int iter = 0; iter < 400; ++iter) {
      const size_t count = counts[iter % 7 == 6 ? 3 : iter % 3];
      if (rng() % 4 == 0) usleep(rng() % 300);  // put this rank out of step with the others
      check_allreduce(c, iter, count, in, out);
      if (iter % 50 == 25 && c.size() > 1) {  // point-to-point traffic between direct ops
        int right = (c.rank() + 1) % c.size(), left = (c.rank() + c.size() - 1) % c.size();
        auto s = c.send(token.data(), 1, DType::f32, right);
        c.recv(token.data(), 1, DType::f32, left)->wait();
        s->wait();
      }
    }
  });
}

// Every direct op with a small scratch area (so that 1, 2 and 3 chunks all occur: the closing
// barrier is skipped after an odd number of chunks), back to back, ranks out of step.
TEST_P(DirectReuse, EveryOpWithOddAndEvenChunkCounts) {
  const int n = GetParam();
  RunConfig cfg = transport_config("shm");
  // Two data slots of 128 KiB after the header and the small slots.
  cfg.env.push_back({"SHOAL_SHM_SCRATCH", std::to_string((256 << 10) + algo::direct::kHeaderBytes + algo::direct::kSmallArea)});
  run_ranks(n, cfg, [](Communicator& c) {
    std::mt19937 rng(99 + c.rank());
    const int p = c.size(), me = c.rank();
    const size_t counts[] = {5, 20000, 50000, 90000};  // f32: up to ~3 chunks per block
    std::vector<float> in, out;
    for (int iter = 0; iter < 120; ++iter) {
      const size_t count = counts[(iter / 5) % 4];
      if (rng() % 3 == 0) usleep(rng() % 200);
      const int kind = iter % 6, root = iter % p;
      auto val = [&](int r, size_t i) { return static_cast<float>((r + 1) * (iter % 13 + 1) + static_cast<int>(i % 5)); };
      if (kind == 0) {  // broadcast
        in.assign(count, 0);
        if (me == root)
          for (size_t i = 0; i < count; ++i) in[i] = val(root, i);
        c.broadcast(in.data(), count, DType::f32, root, {Algo::direct})->wait();
        for (size_t i = 0; i < count; ++i) SH_CHECK(in[i] == val(root, i)) << "broadcast iter " << iter << " i " << i;
      } else if (kind == 1) {  // allgather
        in.resize(count);
        out.assign(count * p, -1);
        for (size_t i = 0; i < count; ++i) in[i] = val(me, i);
        c.allgather(in.data(), out.data(), count, DType::f32, {Algo::direct})->wait();
        for (int r = 0; r < p; ++r)
          for (size_t i = 0; i < count; ++i)
            SH_CHECK(out[r * count + i] == val(r, i)) << "allgather iter " << iter << " block " << r << " i " << i;
      } else if (kind == 2) {  // reduce_scatter
        in.resize(count * p);
        out.assign(count, -1);
        for (size_t i = 0; i < count * p; ++i) in[i] = val(me, i);
        c.reduce_scatter(in.data(), out.data(), count, DType::f32, ReduceOp::sum, {Algo::direct})->wait();
        for (size_t i = 0; i < count; ++i) {
          float want = 0;
          for (int r = 0; r < p; ++r) want += val(r, me * count + i);
          SH_CHECK(out[i] == want) << "reduce_scatter iter " << iter << " i " << i;
        }
      } else if (kind == 3) {  // scatter
        in.resize(count * p);
        out.assign(count, -1);
        for (size_t i = 0; i < count * p; ++i) in[i] = val(root, i);
        c.scatter(in.data(), out.data(), count, DType::f32, root, {Algo::direct})->wait();
        for (size_t i = 0; i < count; ++i) SH_CHECK(out[i] == val(root, me * count + i)) << "scatter iter " << iter << " i " << i;
      } else if (kind == 5) {  // alltoall, in place every other time
        in.resize(count * p);
        for (int j = 0; j < p; ++j)
          for (size_t i = 0; i < count; ++i) in[j * count + i] = val(me, j * 7 + i);
        out.assign(count * p, -1);
        float* dst = iter % 12 == 5 ? in.data() : out.data();
        c.alltoall(in.data(), dst, count, DType::f32, {Algo::direct})->wait();
        for (int r = 0; r < p; ++r)
          for (size_t i = 0; i < count; ++i)
            SH_CHECK(dst[r * count + i] == val(r, me * 7 + i)) << "alltoall iter " << iter << " block " << r << " i " << i;
      } else {  // allreduce
        in.resize(count);
        out.assign(count, -1);
        for (size_t i = 0; i < count; ++i) in[i] = val(me, i);
        c.allreduce(in.data(), out.data(), count, DType::f32, ReduceOp::sum, {Algo::direct})->wait();
        for (size_t i = 0; i < count; ++i) {
          float want = 0;
          for (int r = 0; r < p; ++r) want += val(r, i);
          SH_CHECK(out[i] == want) << "allreduce iter " << iter << " i " << i;
        }
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(All, DirectReuse, ::testing::Values(2, 3, 4, 8),
                         [](const auto& info) { return "n" + std::to_string(info.param); });
