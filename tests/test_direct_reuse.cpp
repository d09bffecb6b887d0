// The shared-memory (direct) algorithms reuse each rank's two scratch slots from op to op, and
// the small allreduce ends without a closing barrier (src/algo/direct_common.h, slot_of). These
// tests drive many back-to-back direct ops with ranks deliberately out of step (random delays,
// point-to-point traffic in between, small and chunked ops mixed), and check every result: a
// rank overwriting a slot that a slow peer is still reading would show up as a wrong sum.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <cstdint>
#include <iterator>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "algo/cost.h"
#include "algo/direct_common.h"
#include "base/cpus.h"
#include "harness.h"

using namespace shoal;
using namespace shoal_test;

namespace {

// RunConfig::before_construct: rank 0 reads an L2 of 1 MiB, rank 1 of 2 MiB and the others of 512
// KiB, so that a rank cutting chunks by its own L2 would differ from its peers.
void read_different_l2s(int rank) { set_l2_bytes_for_testing(rank == 0 ? 1 << 20 : rank == 1 ? 2 << 20 : 512 << 10); }

// RunConfig::before_construct: different L2s as above, and places in the slots that differ:
// rank 0 keeps every op at its slot's start, rank 1 moves every op, the others move while ops
// come fast (SHOAL_DIRECT_PLACES), so that a reader that looked where it put its own data, not
// where the writer put its, would read the wrong bytes.
void read_different_l2s_and_places(int rank) {
  read_different_l2s(rank);
  setenv("SHOAL_DIRECT_PLACES", rank == 0 ? "fixed" : rank == 1 ? "moving" : "auto", 1);
}

// Sum over ranks of (rank + 1) * (iter + 1) + i % 7, exact in f32 for these sizes.
float expected(int size, int iter, size_t i) {
  return static_cast<float>((size * (size + 1) / 2) * (iter + 1) + size * static_cast<int>(i % 7));
}

// Rank r's i64 element i in a group of p: beyond 2^53, so that a trip through floating point
// would show in a max.
int64_t big(int r, size_t i, int p) { return (int64_t(1) << 60) + int64_t(i % 97) * 1000 + (r * 7 + static_cast<int>(i)) % p; }

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
// barrier is skipped after an odd number of chunks), back to back, ranks out of step; the
// writers' copies into the scratch and the small ops' data areas with the stores
// SHOAL_DIRECT_STORES says (src/algo/cost.h);
// with `scratch_only`, broadcast, allgather, scatter and gather through the scratch at every size
// (otherwise the measured costs take single copy for some).
static void every_op_with_odd_and_even_chunk_counts(int n, const char* stores, bool scratch_only) {
  RunConfig cfg = transport_config("shm");
  // Two data slots of 128 KiB after the header and the small slots.
  cfg.env.push_back({"SHOAL_SHM_SCRATCH", std::to_string((256 << 10) + algo::direct::kHeaderBytes + algo::direct::kSmallArea)});
  cfg.env.push_back({"SHOAL_DIRECT_STORES", stores});
  if (scratch_only)
    for (const char* op : {"BROADCAST", "ALLGATHER", "SCATTER", "GATHER"})
      cfg.env.push_back({std::string("SHOAL_DIRECT_") + op, "scratch"});
  run_ranks(n, cfg, [](Communicator& c) {
    std::mt19937 rng(99 + c.rank());
    const int p = c.size(), me = c.rank();
    // f32: up to ~3 chunks per block; 300 and 1500 put a small op's data in a data area
    // (direct_small.cpp), whose copies take the stores chosen, as the chunks' do.
    const size_t counts[] = {5, 300, 20000, 1500, 50000, 90000};
    std::vector<float> in, out;
    for (int iter = 0; iter < 135; ++iter) {
      const size_t count = counts[(iter / 5) % 6];
      if (rng() % 3 == 0) usleep(rng() % 200);
      const int kind = iter % 9, root = (iter / 9 + iter) % p;  // every op meets every root
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
      } else if (kind == 4) {  // gather
        in.resize(count);
        out.assign(me == root ? count * p : 0, -1);
        for (size_t i = 0; i < count; ++i) in[i] = val(me, i);
        c.gather(in.data(), me == root ? out.data() : nullptr, count, DType::f32, root, {Algo::direct})->wait();
        if (me == root) {
          for (int r = 0; r < p; ++r)
            for (size_t i = 0; i < count; ++i)
              SH_CHECK(out[r * count + i] == val(r, i)) << "gather iter " << iter << " block " << r << " i " << i;
        }
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
      } else if (kind == 6) {  // alltoallv: rank i sends rank j ((i + 2j + iter) % 4) · count / 2 elements
        auto len = [&](int from, int to) { return ((from + 2 * to + iter) % 4) * count / 2; };
        std::vector<size_t> sc(p), rc(p);
        size_t st = 0, rt = 0;
        for (int j = 0; j < p; ++j) sc[j] = len(me, j), rc[j] = len(j, me), st += sc[j], rt += rc[j];
        in.assign(st, 0);
        for (int j = 0, o = 0; j < p; o += static_cast<int>(sc[j]), ++j)
          for (size_t i = 0; i < sc[j]; ++i) in[o + i] = val(me, j * 7 + i);
        out.assign(rt, -1);
        c.alltoallv(in.data(), sc, out.data(), rc, DType::f32, {Algo::direct})->wait();
        for (int j = 0, o = 0; j < p; o += static_cast<int>(rc[j]), ++j)
          for (size_t i = 0; i < rc[j]; ++i)
            SH_CHECK(out[o + i] == val(j, me * 7 + i)) << "alltoallv iter " << iter << " from " << j << " i " << i;
      } else if (kind == 7) {  // reduce, in place at the root every other time
        in.resize(count);
        out.assign(count, -1);
        for (size_t i = 0; i < count; ++i) in[i] = val(me, i);
        float* dst = iter % 18 == 7 ? in.data() : out.data();
        c.reduce(in.data(), dst, count, DType::f32, ReduceOp::sum, root, {Algo::direct})->wait();
        if (me == root) {
          for (size_t i = 0; i < count; ++i) {
            float want = 0;
            for (int r = 0; r < p; ++r) want += val(r, i);
            SH_CHECK(dst[i] == want) << "reduce iter " << iter << " i " << i;
          }
        }
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

TEST_P(DirectReuse, EveryOpWithOddAndEvenChunkCounts) { every_op_with_odd_and_even_chunk_counts(GetParam(), "auto", false); }
TEST_P(DirectReuse, EveryOpThroughTheScratch) { every_op_with_odd_and_even_chunk_counts(GetParam(), "cached", true); }
TEST_P(DirectReuse, EveryOpWithStreamingStores) { every_op_with_odd_and_even_chunk_counts(GetParam(), "streaming", true); }

// A broadcast's or scatter's root, and a gather's leaves, wait for no one: they run ahead of the
// slowest rank by up to the depth of their ring of slots (direct_common.h: 64 ops with up to
// kSmallLineBytes of data, 16 with more). Runs of such ops at every tier's edges (inline, line
// area, data area), with the readers stalling now and then so that the writers reach the depth,
// check every result: a writer reusing a slot before every reader is done would show as another
// op's values.
TEST_P(DirectReuse, RanksRunningAheadReuseASlotOnlyOnceItsReadersAreDone) {
  const int n = GetParam();
  run_ranks(n, transport_config("shm"), [](Communicator& c) {
    using algo::direct::kSmallBytes;
    using algo::direct::kSmallInlineBytes;
    using algo::direct::kSmallLineBytes;
    const int p = c.size(), me = c.rank();
    std::mt19937 rng(7 + me);
    // Bytes per slot: the scatter's root and the broadcast's root write `bytes`, a gather's leaf
    // writes bytes / p; the f32 counts below round down.
    const size_t tiers[] = {8, kSmallInlineBytes, kSmallInlineBytes + 4, kSmallLineBytes, kSmallLineBytes + 4, kSmallBytes};
    std::vector<float> buf, out;
    int op = 0;
    for (size_t bytes : tiers) {
      const size_t count = bytes / 4;
      for (int kind = 0; kind < 3; ++kind) {
        const int root = (kind + static_cast<int>(bytes)) % p;
        for (int k = 0; k < 150; ++k, ++op) {
          const bool reader = kind == 2 ? me == root : me != root;
          if (reader && rng() % 40 == 0) usleep(2000);  // the writers fill their ring meanwhile
          auto val = [&](int r, size_t i) { return static_cast<float>(op * 131 + r * 17 + static_cast<int>(i % 9)); };
          if (kind == 0) {
            buf.assign(count, -1);
            if (me == root)
              for (size_t i = 0; i < count; ++i) buf[i] = val(root, i);
            c.broadcast(buf.data(), count, DType::f32, root, {Algo::direct})->wait();
            for (size_t i = 0; i < count; ++i)
              SH_CHECK(buf[i] == val(root, i)) << "broadcast of " << bytes << " B, op " << op << ", element " << i;
          } else if (kind == 1) {
            const size_t each = (count + p - 1) / p;  // the root's slot holds at least `bytes`
            buf.assign(each * p, -1);
            out.assign(each, -1);
            if (me == root)
              for (size_t i = 0; i < each * p; ++i) buf[i] = val(root, i);
            c.scatter(buf.data(), out.data(), each, DType::f32, root, {Algo::direct})->wait();
            for (size_t i = 0; i < each; ++i)
              SH_CHECK(out[i] == val(root, me * each + i)) << "scatter of " << bytes << " B, op " << op << ", element " << i;
          } else {
            const size_t each = std::max<size_t>(1, count / p);
            buf.assign(each, -1);
            out.assign(each * p, -1);
            for (size_t i = 0; i < each; ++i) buf[i] = val(me, i);
            c.gather(buf.data(), out.data(), each, DType::f32, root, {Algo::direct})->wait();
            if (me == root) {
              for (int r = 0; r < p; ++r)
                for (size_t i = 0; i < each; ++i)
                  SH_CHECK(out[r * each + i] == val(r, i)) << "gather of " << bytes << " B, op " << op << ", block " << r;
            }
          }
        }
      }
    }
  });
}

// A rank says it is done with a small op only every kDoneEvery-th op, or at once after reading a
// data area (direct_common.h), so a writer may wait for a reader that has read everything but not
// said so. The depth left to a root is still kSmallSlots - kDoneEvery ops with up to
// kSmallLineBytes, kSmallDataSlots - kDoneEvery with a data area, whatever op the readers stopped
// at. Here they stop after kDoneEvery - 1 broadcasts of 8 B (so a data area read before says
// nothing of them), at every op number modulo kDoneEvery in turn (each round is an odd number of
// ops, kDoneEvery a power of 2), and wait for a message the root sends only after running that
// many broadcasts ahead. A root that waited for more would leave every rank waiting until the
// group's timeout.
TEST_P(DirectReuse, ARootRunsItsDepthAheadOfReadersWaitingElsewhere) {
  run_ranks(GetParam(), timed_config("shm", std::chrono::seconds(20), std::chrono::seconds(120)), [](Communicator& c) {
    using namespace algo::direct;
    const int p = c.size(), me = c.rank();
    std::vector<float> buf(kSmallBytes / 4), token(1);
    int op = 0;
    auto broadcast = [&](size_t count) {
      const float v = static_cast<float>(++op);
      std::fill(buf.begin(), buf.begin() + count, me == 0 ? v : -1.0f);
      c.broadcast(buf.data(), count, DType::f32, 0, {Algo::direct})->wait();
      SH_CHECK(buf[0] == v && buf[count - 1] == v) << "broadcast " << op << " of " << count << " floats";
    };
    static_assert((kDoneEvery & (kDoneEvery - 1)) == 0, "the rounds' odd length covers every residue");
    for (size_t bytes : {size_t(8), kSmallBytes}) {
      const size_t count = bytes / 4;
      const int ahead = (bytes <= kSmallLineBytes ? kSmallSlots : kSmallDataSlots) - kDoneEvery;
      SH_CHECK((kDoneEvery - 1 + ahead) % 2 == 1) << "a round of " << kDoneEvery - 1 + ahead << " ops";
      for (int round = 0; round < kDoneEvery; ++round) {
        for (int i = 0; i < kDoneEvery - 1; ++i) broadcast(2);
        if (me == 0) {
          for (int i = 0; i < ahead; ++i) broadcast(count);
          for (int r = 1; r < p; ++r) c.send(token.data(), 1, DType::f32, r)->wait();
        } else {
          c.recv(token.data(), 1, DType::f32, 0)->wait();
          for (int i = 0; i < ahead; ++i) broadcast(count);
        }
      }
    }
  });
}

// A reduce's one shot is streamed (src/algo/direct_allreduce.cpp, reduce_streamed): the root
// reads each piece once it is published, the others wrap around their slot once the root has
// reduced what they overwrite, and the root leaves last. With a 128 KiB slot, vectors of one piece,
// of a slot and a half, and of many times the slot, back to back with rotating roots, in place
// at the root every third time, mixed with allreduces and out of step, against sums and maxima
// computed here: a piece overwritten before the root read it, or read before it was written,
// shows as a wrong element.
TEST_P(DirectReuse, StreamedReducesWrapTheirSlotOutOfStep) {
  RunConfig cfg = transport_config("shm");
  cfg.env.push_back({"SHOAL_SHM_SCRATCH", std::to_string((256 << 10) + algo::direct::kHeaderBytes + algo::direct::kSmallArea)});
  cfg.env.push_back({"SHOAL_DIRECT_REDUCE", "one_shot"});
  run_ranks(GetParam(), cfg, [](Communicator& c) {
    std::mt19937 rng(5 + c.rank());
    const int p = c.size(), me = c.rank();
    const size_t counts[] = {3000, 50001, 300007, 7000};
    std::vector<float> in, out;
    std::vector<int64_t> in64, out64;
    for (int iter = 0; iter < 48; ++iter) {
      const size_t count = counts[iter % 4];
      const int root = (iter / 4 + iter) % p;
      if (rng() % 3 == 0) usleep(rng() % 300);
      auto val = [&](int r, size_t i) { return static_cast<float>((r + 1) * (iter % 11 + 1) + static_cast<int>(i % 13)); };
      in.resize(count);
      out.assign(count, -1);
      for (size_t i = 0; i < count; ++i) in[i] = val(me, i);
      if (iter % 5 == 4) {
        c.allreduce(in.data(), out.data(), count, DType::f32, ReduceOp::sum, {Algo::direct})->wait();
      } else {
        float* dst = iter % 3 == 0 ? in.data() : out.data();
        c.reduce(in.data(), dst, count, DType::f32, ReduceOp::sum, root, {Algo::direct})->wait();
        if (me != root) {
          SH_CHECK(out[0] == -1 && out[count - 1] == -1) << "reduce wrote a non-root rank's output";
        } else {
          out.assign(dst, dst + count);
        }
      }
      for (size_t i = 0; (iter % 5 == 4 || me == root) && i < count; ++i) {
        float want = 0;
        for (int r = 0; r < p; ++r) want += val(r, i);
        SH_CHECK(out[i] == want) << "iter " << iter << " (" << (iter % 5 == 4 ? "allreduce" : "reduce") << " of " << count
                                 << ", root " << root << ") element " << i << ": got " << out[i] << ", expected " << want;
      }
      if (iter % 8 == 1) {  // i64 max
        in64.resize(count);
        out64.assign(count, 0);
        for (size_t i = 0; i < count; ++i) in64[i] = big(me, i, p);
        c.reduce(in64.data(), out64.data(), count, DType::i64, ReduceOp::max, root, {Algo::direct})->wait();
        if (me == root)
          for (size_t i = 0; i < count; ++i) {
            int64_t want = INT64_MIN;
            for (int r = 0; r < p; ++r) want = std::max(want, big(r, i, p));
            SH_CHECK(out64[i] == want) << "reduce max of " << count << " i64, element " << i;
          }
      }
    }
  });
}

// Where each rank has a core, the direct reduce and allreduce may start their data further into
// the slot from op to op, through a share of one L2 (src/algo/direct_common.h, Places), each
// rank at a place of its own (read_different_l2s_and_places). Vectors of one to eight pieces or
// chunks' worth, back to back with rotating roots and new inputs each op, for more ops than a slot
// has places, with one shot (a reduce's streamed) and two shot: a reader that looked for a
// writer's data at another place than the writer's shows as a wrong sum. Places move only where
// the host has a CPU for each rank: on two CPUs, at 2 ranks.
TEST_P(DirectReuse, OpsFindEachWritersPlaceInTheSlot) {
  for (const char* way : {"one_shot", "two_shot"}) {
    RunConfig cfg = transport_config("shm");
    cfg.env.push_back({"SHOAL_DIRECT_REDUCE", way});
    cfg.before_construct = read_different_l2s_and_places;
    run_ranks(GetParam(), cfg, [way](Communicator& c) {
      const int p = c.size(), me = c.rank();
      const size_t counts[] = {8193, 16384, 40001, 65536};  // pieces of 32 KiB: 2, 2, 5 and 8
      std::vector<float> in(65536), out(65536);
      for (int iter = 0; iter < 96; ++iter) {
        const size_t count = counts[(iter / 2) % 4];  // ops alternate slots: each slot sees every count
        const int root = iter % 3 == 2 ? -1 : iter % p;  // -1: an allreduce
        auto val = [&](int r, size_t i) { return static_cast<float>((r + 1) * (iter % 13 + 1) + static_cast<int>(i % 11)); };
        for (size_t i = 0; i < count; ++i) in[i] = val(me, i);
        if (root < 0)
          c.allreduce(in.data(), out.data(), count, DType::f32, ReduceOp::sum, {Algo::direct})->wait();
        else
          c.reduce(in.data(), out.data(), count, DType::f32, ReduceOp::sum, root, {Algo::direct})->wait();
        for (size_t i = 0; (root < 0 || me == root) && i < count; ++i) {
          float want = 0;
          for (int r = 0; r < p; ++r) want += val(r, i);
          SH_CHECK(out[i] == want) << way << ", iter " << iter << " (" << (root < 0 ? "allreduce" : "reduce") << " of " << count
                                   << ", root " << root << ") element " << i << ": got " << out[i] << ", expected " << want;
        }
      }
    });
  }
}

// The other chunked direct ops take their place in the slot the same way: broadcast, allgather(v),
// scatter, gather, alltoall and reduce_scatter through the scratch (single copy off), blocks of
// 16-64 KiB, new values each op and a new root every seven, for more ops than a slot has places,
// against values computed here, each rank at a place of its own: a reader that looked at another
// place than its writer used shows.
// Places move only where the host has a CPU for each rank: on two CPUs, at 2 ranks.
TEST_P(DirectReuse, ScratchOpsFindEachWritersPlaceInTheSlot) {
  RunConfig cfg = transport_config("shm");
  cfg.env.push_back({"SHOAL_CMA", "0"});
  for (const char* way : {"SHOAL_DIRECT_BROADCAST", "SHOAL_DIRECT_ALLGATHER", "SHOAL_DIRECT_SCATTER", "SHOAL_DIRECT_GATHER",
                          "SHOAL_DIRECT_ALLTOALL"})
    cfg.env.push_back({way, "scratch"});
  cfg.before_construct = read_different_l2s_and_places;
  run_ranks(GetParam(), cfg, [](Communicator& c) {
    const int p = c.size(), me = c.rank();
    const size_t blocks[] = {4099, 8192, 16384};  // floats: 16-64 KiB a block
    std::vector<float> in, out;
    for (int iter = 0; iter < 84; ++iter) {
      const size_t n = blocks[(iter / 2) % 3], total = n * static_cast<size_t>(p);
      const int root = (iter / 7) % p, kind = iter % 7;
      auto val = [&](int r, size_t i) { return static_cast<float>((r + 1) * (iter % 13 + 1) + static_cast<int>(i % 11)); };
      in.assign(total, 0);
      out.assign(total, -1);
      for (size_t i = 0; i < total; ++i) in[i] = val(me, i);
      const CallOptions direct{Algo::direct};
      std::vector<float> want(total, -1);
      size_t check = total;
      switch (kind) {
        case 0:
          c.broadcast(in.data(), total, DType::f32, root, direct)->wait();
          for (size_t i = 0; i < total; ++i) want[i] = val(root, i);
          out = in;
          break;
        case 1:
        case 2:
          if (kind == 1) {
            c.allgather(in.data(), out.data(), n, DType::f32, direct)->wait();
          } else {
            c.allgatherv(in.data(), out.data(), std::vector<size_t>(p, n), DType::f32, direct)->wait();
          }
          for (int r = 0; r < p; ++r)
            for (size_t i = 0; i < n; ++i) want[r * n + i] = val(r, i);
          break;
        case 3:
          c.scatter(in.data(), out.data(), n, DType::f32, root, direct)->wait();
          for (size_t i = 0; i < n; ++i) want[i] = val(root, me * n + i);
          check = n;
          break;
        case 4:
          c.gather(in.data(), out.data(), n, DType::f32, root, direct)->wait();
          for (int r = 0; r < p; ++r)
            for (size_t i = 0; i < n; ++i) want[r * n + i] = val(r, i);
          if (me != root) check = 0;
          break;
        case 5:
          c.alltoall(in.data(), out.data(), n, DType::f32, direct)->wait();
          for (int r = 0; r < p; ++r)
            for (size_t i = 0; i < n; ++i) want[r * n + i] = val(r, me * n + i);
          break;
        default:
          c.reduce_scatter(in.data(), out.data(), n, DType::f32, ReduceOp::sum, direct)->wait();
          for (size_t i = 0; i < n; ++i) {
            want[i] = 0;
            for (int r = 0; r < p; ++r) want[i] += val(r, me * n + i);
          }
          check = n;
      }
      for (size_t i = 0; i < check; ++i)
        SH_CHECK(out[i] == want[i]) << "iter " << iter << " (op " << kind << ", block " << n << ", root " << root
                                    << ") element " << i << ": got " << out[i] << ", expected " << want[i];
    }
  });
}

// A streamed reduce's root reads the others' small-slot heads (to see that they are in the same
// call), and the others leave the op once their pieces are in: they must not reuse that head, 64
// small ops later, before the root has read it. Runs of small reduces to the same root after each
// streamed one let the others run up to that depth ahead while the root is still in the streamed
// op.
TEST_P(DirectReuse, SmallOpsAfterAStreamedReduceWaitForItsRoot) {
  RunConfig cfg = transport_config("shm");
  cfg.env.push_back({"SHOAL_DIRECT_REDUCE", "one_shot"});
  run_ranks(GetParam(), cfg, [](Communicator& c) {
    const int p = c.size(), me = c.rank();
    std::vector<float> in(100003), out(100003), tiny(2), tout(2);
    for (int iter = 0; iter < 30; ++iter) {
      const int root = iter % p;
      for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>((me + 1) * (iter + 1) + static_cast<int>(i % 5));
      c.reduce(in.data(), out.data(), in.size(), DType::f32, ReduceOp::sum, root, {Algo::direct})->wait();
      if (me == root) {
        for (size_t i = 0; i < in.size(); ++i)
          SH_CHECK(out[i] == static_cast<float>(p * (p + 1) / 2 * (iter + 1) + p * static_cast<int>(i % 5)))
              << "iter " << iter << " element " << i;
      }
      for (int k = 0; k < 70; ++k) {
        tiny[0] = static_cast<float>(me + k);
        tiny[1] = 1;
        c.reduce(tiny.data(), tout.data(), 2, DType::f32, ReduceOp::sum, root, {Algo::direct})->wait();
        if (me == root) {
          SH_CHECK(tout[0] == static_cast<float>(p * (p - 1) / 2 + p * k) && tout[1] == p) << "iter " << iter << " small op " << k;
        }
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(All, DirectReuse, ::testing::Values(2, 3, 4, 8),
                         [](const auto& info) { return "n" + std::to_string(info.param); });

// The ways of the direct allreduce and reduce above the small protocol (src/algo/cost.h), each
// forced on every rank (single copy: the 2-rank allreduce, where the group may; elsewhere two shot),
// at sizes of one chunk (a slice per rank, odd counts) and of several, the allreduce also in place
// on every rank (its output through the caches up to kInPlaceCachedBytes in all, and streamed
// beyond: the largest count at 8 ranks) and on the even ranks only, against sums and maxima
// computed here.
using WaysParam = std::tuple<int, std::string>;  // world size, SHOAL_DIRECT_REDUCE
class DirectReduceWays : public ::testing::TestWithParam<WaysParam> {};

TEST_P(DirectReduceWays, AllreduceAndReduceMatchTheReference) {
  const auto& [n, way] = GetParam();
  // Single copy runs only where the kernel lets the ranks read each other's memory.
  const bool single_copy = way == "single_copy" && n == 2;
  if (single_copy && !kernel_permits_cma()) GTEST_SKIP() << "this kernel forbids process_vm_readv between the ranks";
  RunConfig cfg = transport_config("shm");
  cfg.env.push_back({"SHOAL_DIRECT_REDUCE", way});
  run_ranks(n, cfg, [single_copy](Communicator& c) {
    const int p = c.size(), me = c.rank();
    if (single_copy) {
      SH_CHECK(c.single_copy()) << "the group may not copy between its ranks";
    }
    const size_t counts[] = {2049, 4097, 5003, 65537, 300001, 1000003, 2200013};
    std::vector<float> in, out;
    std::vector<int64_t> in64, out64;
    for (size_t k = 0; k < std::size(counts); ++k) {
      const size_t count = counts[k];
      const int root = static_cast<int>(k) % p;
      auto val = [&](int r, size_t i) { return static_cast<float>((r + 1) * 3 + static_cast<int>(i % 11)); };
      in.resize(count);
      for (size_t i = 0; i < count; ++i) in[i] = val(me, i);
      // allreduce, reduce, allreduce in place on every rank, then on the even ranks only
      for (int pass = 0; pass < 4; ++pass) {
        const bool rooted = pass == 1, in_place = pass == 3 ? me % 2 == 0 : pass == 2;
        out.assign(count, -1);
        if (rooted)
          c.reduce(in.data(), out.data(), count, DType::f32, ReduceOp::sum, root, {Algo::direct})->wait();
        else if (in_place) {
          out = in;
          c.allreduce(out.data(), out.data(), count, DType::f32, ReduceOp::sum, {Algo::direct})->wait();
        }
        else
          c.allreduce(in.data(), out.data(), count, DType::f32, ReduceOp::sum, {Algo::direct})->wait();
        if (rooted && me != root) {
          SH_CHECK(out[0] == -1 && out[count - 1] == -1) << "reduce wrote a non-root rank's output";
          continue;
        }
        for (size_t i = 0; i < count; ++i) {
          float want = 0;
          for (int r = 0; r < p; ++r) want += val(r, i);
          SH_CHECK(out[i] == want) << (rooted ? "reduce" : in_place ? "allreduce in place" : "allreduce") << " of " << count << " f32, element " << i
                                   << ": got " << out[i] << ", expected " << want;
        }
      }
      // i64 max.
      in64.resize(count);
      out64.assign(count, 0);
      for (size_t i = 0; i < count; ++i) in64[i] = big(me, i, p);
      c.allreduce(in64.data(), out64.data(), count, DType::i64, ReduceOp::max, {Algo::direct})->wait();
      for (size_t i = 0; i < count; ++i) {
        int64_t want = INT64_MIN;
        for (int r = 0; r < p; ++r)
          want = std::max(want, big(r, i, p));
        SH_CHECK(out64[i] == want) << "allreduce max of " << count << " i64, element " << i;
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(All, DirectReduceWays,
                         ::testing::Combine(::testing::Values(2, 3, 5, 8), ::testing::Values("one_shot", "two_shot", "single_copy")),
                         [](const auto& info) { return "n" + std::to_string(std::get<0>(info.param)) + "_" + std::get<1>(info.param); });

// Ranks that would choose ways differently (a different SHOAL_DIRECT_REDUCE, SHOAL_DIRECT_ALLTOALL,
// SHOAL_TUNING or SHOAL_TUNING_BUILTIN) fail the group's creation on every rank, naming the first that differs from
// rank 0, never a hang or a wrong result in an op.
class DirectWaysAgreement : public ::testing::TestWithParam<std::string> {};

TEST_P(DirectWaysAgreement, RanksThatWouldChooseDifferentlyFailTheGroupsCreation) {
  const std::string setting = GetParam();
  // A file of this process's own: ctest runs the other settings' tests at the same time.
  const std::string path = ::testing::TempDir() + "shoal-tuning-agreement-" + std::to_string(getpid()) + ".txt";
  {
    std::ofstream f(path);
    f << "direct allreduce 2 16384 1 2\ndirect reduce 2 16384 1 2\ndirect alltoall 2 16384 1 2\n";
  }
  RunConfig cfg = timed_config("shm", std::chrono::seconds(20), std::chrono::seconds(60));
  // SHOAL_TUNING_BUILTIN: every rank reads one file with points for every op, so that only the
  // CPU the ranks' built-in points are for differs (it decides ways too: direct_alltoall.cpp).
  std::string all_ops;
  for (const char* op : {"allreduce", "reduce", "alltoall", "alltoallv", "broadcast", "allgather", "scatter", "gather"})
    all_ops += std::string("direct ") + op + " 2 16384 1 2\n";
  const std::string all_path = path + ".all";
  if (setting == "SHOAL_TUNING_BUILTIN") std::ofstream(all_path) << all_ops;
  cfg.before_construct = [setting, path, all_path](int rank) {
    if (setting == "SHOAL_TUNING_BUILTIN") {
      setenv("SHOAL_TUNING", all_path.c_str(), 1);
      if (rank == 2) setenv("SHOAL_TUNING_BUILTIN", algo::built_in_cpu() == algo::BuiltInCpu::intel ? "amd" : "intel", 1);
      return;
    }
    if (rank != 2) return;
    if (setting == "SHOAL_TUNING") setenv("SHOAL_TUNING", path.c_str(), 1);
    else setenv(setting.c_str(), setting == "SHOAL_DIRECT_REDUCE" ? "two_shot" : "pairwise", 1);
  };
  const RunResult res = run_ranks_outcomes(3, cfg, [](Communicator&) { SH_CHECK(false) << "the group formed"; });
  ASSERT_EQ(res.ranks.size(), 3u) << res.describe();
  for (const auto& o : res.ranks) {
    EXPECT_EQ(o.setup_kind, "InvalidArgument") << res.describe();
    EXPECT_NE(o.message.find("ranks 0 and 2, on one host, read different measured costs or settings"), std::string::npos)
        << o.message;
  }
  std::remove(path.c_str());
  std::remove(all_path.c_str());
}

INSTANTIATE_TEST_SUITE_P(All, DirectWaysAgreement,
                         ::testing::Values("SHOAL_DIRECT_REDUCE", "SHOAL_DIRECT_ALLTOALL", "SHOAL_TUNING", "SHOAL_TUNING_BUILTIN"),
                         [](const auto& info) { return info.param; });

// A rank whose settings cannot be read (here SHOAL_TUNING names no file) fails with that reason,
// and its peers fail at once naming the rank and the reason, not at the rendezvous timeout; rank 0,
// which serves the store, too.
class UnreadableSetting : public ::testing::TestWithParam<int> {};

TEST_P(UnreadableSetting, FailsEveryRankAtOnce) {
  const int bad = GetParam();
  const std::string path = ::testing::TempDir() + "shoal-tuning-missing-" + std::to_string(getpid()) + ".txt";
  std::remove(path.c_str());
  RunConfig cfg = timed_config("shm", std::chrono::seconds(30), std::chrono::seconds(90));
  cfg.before_construct = [path, bad](int rank) {
    if (rank == bad) setenv("SHOAL_TUNING", path.c_str(), 1);
  };
  const auto start = std::chrono::steady_clock::now();
  const RunResult res = run_ranks_outcomes(3, cfg, [](Communicator&) { SH_CHECK(false) << "the group formed"; });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(res.ranks.size(), 3u) << res.describe();
  const std::string named = "rank " + std::to_string(bad) + " failed to set up";
  for (const auto& o : res.ranks) {
    EXPECT_EQ(o.error_kind, "setup") << res.describe();
    EXPECT_NE(o.message.find(path + "': cannot read the file"), std::string::npos) << res.describe();
    if (o.rank == bad) EXPECT_EQ(o.setup_kind, "InvalidArgument") << res.describe();
    else EXPECT_NE(o.message.find(named), std::string::npos) << res.describe();
  }
  EXPECT_LT(seconds, 15.0) << "the peers waited for the rendezvous timeout (30 s): " << res.describe();
}

INSTANTIATE_TEST_SUITE_P(All, UnreadableSetting, ::testing::Values(0, 2),
                         [](const auto& info) { return "rank" + std::to_string(info.param); });

// The switches of the automatic choice over the network drive choices among ranks of any hosts:
// a rank on another host that reads another switch fails the group's creation on every rank.
TEST(SwitchesAgreement, RanksThatReadDifferentSwitchesFailTheGroupsCreation) {
  const std::string path = ::testing::TempDir() + "shoal-tuning-switch-agreement.txt";
  {
    std::ofstream f(path);
    f << "switch allgather.rd_below 4096\n";
  }
  RunConfig cfg = timed_config("shm", std::chrono::seconds(20), std::chrono::seconds(60));
  cfg.before_construct = [path](int rank) {
    setenv("SHOAL_HOST_ID", rank == 2 ? "test-host-b" : "test-host-a", 1);
    if (rank == 2) setenv("SHOAL_TUNING", path.c_str(), 1);
  };
  const RunResult res = run_ranks_outcomes(3, cfg, [](Communicator&) { SH_CHECK(false) << "the group formed"; });
  ASSERT_EQ(res.ranks.size(), 3u) << res.describe();
  for (const auto& o : res.ranks) {
    EXPECT_EQ(o.setup_kind, "InvalidArgument") << res.describe();
    EXPECT_NE(o.message.find("ranks 0 and 2 read different switches"), std::string::npos) << o.message;
  }
  std::remove(path.c_str());
}

// A group keeps the ways it formed with: one rank changing the settings afterwards changes
// nothing for the group's ops, which each rank still runs as the others do.
TEST(DirectWaysAgreement, SettingsChangedAfterTheGroupFormedChangeNothingForIt) {
  RunConfig cfg = timed_config("shm", std::chrono::seconds(20), std::chrono::seconds(60));
  cfg.env.push_back({"SHOAL_DIRECT_ALLTOALL", "scratch"});
  cfg.env.push_back({"SHOAL_DIRECT_REDUCE", "one_shot"});
  run_ranks(3, cfg, [](Communicator& c) {
    const int p = c.size(), me = c.rank();
    if (me == 1) {
      setenv("SHOAL_DIRECT_ALLTOALL", "pairwise", 1);
      setenv("SHOAL_DIRECT_REDUCE", "two_shot", 1);
    }
    const size_t count = 100003;  // per block: above the small slots, both ways possible
    std::vector<float> in(count * p), out(count * p, -1);
    for (int j = 0; j < p; ++j)
      for (size_t i = 0; i < count; ++i) in[j * count + i] = static_cast<float>(me * 1000 + j * 10 + static_cast<int>(i % 7));
    c.alltoall(in.data(), out.data(), count, DType::f32, {Algo::direct})->wait();
    for (int j = 0; j < p; ++j)
      for (size_t i = 0; i < count; ++i)
        SH_CHECK(out[j * count + i] == static_cast<float>(j * 1000 + me * 10 + static_cast<int>(i % 7)))
            << "alltoall block from rank " << j << ", element " << i;
    c.allreduce(in.data(), out.data(), count, DType::f32, ReduceOp::sum, {Algo::direct})->wait();
    for (size_t i = 0; i < count; ++i) {
      float want = 0;
      for (int r = 0; r < p; ++r) want += static_cast<float>(r * 1000 + static_cast<int>(i % 7));
      SH_CHECK(out[i] == want) << "allreduce element " << i;
    }
  });
}

// Behind that check, the way is in the direct allreduce's token: ranks that ran it different ways
// would fail it with a mismatch (the group's creation catches every case that reaches here).

// A SHOAL_TUNING file that cannot be used is an error when the group forms, naming the file.
TEST(DirectReduceAgreement, AnUnusableTuningFileFailsTheGroupsCreation) {
  RunConfig cfg = timed_config("shm", std::chrono::seconds(20), std::chrono::seconds(60));
  cfg.env.push_back({"SHOAL_TUNING", "/nonexistent/shoal-tuning.txt"});
  const RunResult res = run_ranks_outcomes(2, cfg, [](Communicator&) {});
  ASSERT_EQ(res.ranks.size(), 2u) << res.describe();
  for (const auto& o : res.ranks) {
    EXPECT_EQ(o.error_kind, "setup") << res.describe();
    EXPECT_EQ(o.setup_kind, "InvalidArgument") << res.describe();
    EXPECT_NE(o.message.find("SHOAL_TUNING='/nonexistent/shoal-tuning.txt'"), std::string::npos) << o.message;
  }
}

// An alltoallv whose send and receive counts do not match pair by pair fails on every rank with
// a mismatch error naming both ranks and both sizes, never a hang or a wrong result.
TEST(DirectAlltoallv, CountsThatDoNotMatchPairByPairFail) {
  RunConfig cfg = timed_config("shm", std::chrono::seconds(20), std::chrono::seconds(60));
  const RunResult res = run_ranks_outcomes(3, cfg, [](Communicator& c) {
    std::vector<size_t> sc(3, 5), rc(3, 5);
    if (c.rank() == 1) sc[0] = 6;  // rank 0 expects 5 from rank 1
    std::vector<float> in(16, 1.0f), out(16);
    c.alltoallv(in.data(), sc, out.data(), rc, DType::f32, {Algo::direct})->wait();
    SH_CHECK(false) << "the alltoallv completed with counts that do not match";
  });
  ASSERT_EQ(res.ranks.size(), 3u) << res.describe();
  for (const auto& o : res.ranks) {
    EXPECT_EQ(o.error_kind, "PeerError") << res.describe();
    EXPECT_NE(o.message.find("rank 1 sends rank 0 24 bytes, and rank 0 expects 20"), std::string::npos) << o.message;
  }
}

// The direct alltoallv with the default scratch, both ways above the small slots, against blocks
// computed here: uneven blocks (zero, one element, several phases' worth), so the number of
// phases is odd in some calls and even in others, in place in every other call; and so that in
// some calls every rank's blocks go with its table, in others to its data slot, in others some
// ranks' one way and the others' the other, and in others some only before the pipeline runs.
using AlltoallvParam = std::tuple<int, std::string>;  // world size, SHOAL_DIRECT_ALLTOALL
class DirectAlltoallvSizes : public ::testing::TestWithParam<AlltoallvParam> {};

TEST_P(DirectAlltoallvSizes, UnevenBlocksInPlaceAndNot) {
  const auto& [n, way] = GetParam();
  RunConfig cfg = transport_config("shm");
  cfg.env.push_back({"SHOAL_DIRECT_ALLTOALL", way});
  run_ranks(n, cfg, [](Communicator& c) {
    const int p = c.size(), me = c.rank();
    const size_t units[] = {1, 13, 1000, 9000, 70001, 150001, 450001};
    auto val = [](int from, int to, size_t i, int t) { return static_cast<float>((from * 31 + to * 7 + t) % 101 + static_cast<int>(i % 13)); };
    std::vector<float> in, out;
    for (int t = 0; t < 14; ++t) {
      const size_t unit = units[t % 7];
      auto len = [&](int from, int to) { return static_cast<size_t>((from * 3 + to * 5 + t) % 4) * unit / 2; };
      std::vector<size_t> sc(p), rc(p);
      size_t st = 0, rt = 0;
      for (int j = 0; j < p; ++j) sc[j] = len(me, j), rc[j] = len(j, me), st += sc[j], rt += rc[j];
      const bool inplace = t % 2 == 1;
      in.assign(std::max(st, rt), -2);
      for (int j = 0, o = 0; j < p; o += static_cast<int>(sc[j]), ++j)
        for (size_t i = 0; i < sc[j]; ++i) in[o + i] = val(me, j, i, t);
      out.assign(rt, -1);
      float* dst = inplace ? in.data() : out.data();
      c.alltoallv(in.data(), sc, dst, rc, DType::f32, {Algo::direct})->wait();
      for (int j = 0, o = 0; j < p; o += static_cast<int>(rc[j]), ++j)
        for (size_t i = 0; i < rc[j]; ++i)
          SH_CHECK(dst[o + i] == val(j, me, i, t)) << "call " << t << (inplace ? " (in place)" : "") << ": block from "
                                                  << j << ", element " << i << " of " << rc[j];
    }
  });
}

INSTANTIATE_TEST_SUITE_P(All, DirectAlltoallvSizes,
                         ::testing::Combine(::testing::Values(2, 3, 5, 8), ::testing::Values("scratch", "pairwise")),
                         [](const auto& info) { return "n" + std::to_string(std::get<0>(info.param)) + "_" + std::get<1>(info.param); });

namespace {
// The page faults this process takes over `ops` blocking direct allreduces (sum) of `in`, all
// ones, into `out`, whose first and last elements it checks.
long faults_over_allreduces(Communicator& c, const std::vector<float>& in, std::vector<float>& out, int ops) {
  CallOptions o;
  o.algo = Algo::direct;
  o.blocking = true;
  rusage before{}, after{};
  getrusage(RUSAGE_SELF, &before);
  for (int i = 0; i < ops; ++i) c.allreduce(in.data(), out.data(), in.size(), DType::f32, ReduceOp::sum, o);
  getrusage(RUSAGE_SELF, &after);
  SH_CHECK(out.front() == static_cast<float>(c.size()) && out.back() == static_cast<float>(c.size())) << out.front();
  return after.ru_minflt - before.ru_minflt;
}
}  // namespace

// A group maps the small ops' slots into its processes when it is made (ShmGroupImpl::prefault):
// the first small ops, whose slots rotate through pages no op has touched yet, take no more page
// faults than the same ops once every slot has been used. Without that, each of the first 16 ops
// of 4 KiB faults on its own data slot and on its peer's (43-45 faults in the first 32 ops against
// 2 in the next; in a virtual machine a fault costs tens of microseconds: BENCHMARKS.md, "A
// group's first small ops"). Not under a sanitizer, whose shadow of the scratch takes pages of
// its own at the first ops.
TEST(DirectReuse, AGroupsFirstSmallOpsTakeNoPageFaults) {
  if (kSanitized) GTEST_SKIP() << "a sanitizer's shadow of the scratch takes its pages at the first ops";
  ASSERT_TRUE(run_ranks(2, Env{{"SHOAL_TRANSPORT", ""}, {"SHOAL_ALGO", ""}}, [](Communicator& c) {
    std::vector<float> in(1024, 1.0f), out(1024, 0.0f);
    faults_over_allreduces(c, in, out, 1);  // lazy state outside the scratch
    const int round = 2 * algo::direct::kSmallDataSlots;
    const long first = faults_over_allreduces(c, in, out, round), again = faults_over_allreduces(c, in, out, round);
    SH_CHECK(first - again < algo::direct::kSmallDataSlots / 2)
        << first << " page faults in the first " << round << " ops, " << again << " in the next";
  }));
}

// Nor do its first chunked ops, whose places in the data slots move through a share of one L2
// (direct_common.h, Places; here at every op: SHOAL_DIRECT_PLACES=moving): without the prefault,
// each of the first 2·L2/16 KiB allreduces of 16 KiB at 2 ranks with a core each (256 with an L2
// of 2 MiB) touches pages of its own slots and of its peer's that no op touched before (329 faults
// in the first 64 on an Intel Xeon, against none once every place was used: BENCHMARKS.md, "A
// group's first chunked ops"). Where the ranks share cores, or the L2 is unknown, the places do
// not move and this cannot fail.
TEST(DirectReuse, AGroupsFirstChunkedOpsTakeNoPageFaults) {
  if (kSanitized) GTEST_SKIP() << "a sanitizer's shadow of the scratch takes its pages at the first ops";
  const Env env{{"SHOAL_TRANSPORT", ""}, {"SHOAL_ALGO", ""}, {"SHOAL_DIRECT_PLACES", "moving"}};
  ASSERT_TRUE(run_ranks(2, env, [](Communicator& c) {
    std::vector<float> in(4096, 1.0f), out(4096, 0.0f);  // 16 KiB: above the small ops
    faults_over_allreduces(c, in, out, 1);  // lazy state outside the scratch
    const long first = faults_over_allreduces(c, in, out, 64);
    faults_over_allreduces(c, in, out, 512);  // every place of both slots used (with an L2 of up to 4 MiB)
    const long again = faults_over_allreduces(c, in, out, 64);
    SH_CHECK(first - again < 16) << first << " page faults in the first 64 ops of 16 KiB, " << again << " in 64 later";
  }));
}

// The allgather, reduce_scatter, allreduce and reduce cut their chunks by one core's L2
// (direct_common.h, chunk_in_l2), which the ranks of a host may read differently (cores of two
// kinds). The group agrees on the smallest (Ways::l2): here the ranks read 1 MiB, 2 MiB and 512
// KiB (3 ranks), so that each would cut other chunks on its own, and every result is checked. A
// rank cutting its own would read its peers' scratch at other places, or wait at other barriers.
TEST(DirectReuse, RanksThatReadDifferentL2sCutTheSameChunks) {
  for (int n : {2, 3}) {
    RunConfig cfg = timed_config("shm", std::chrono::seconds(20), std::chrono::seconds(120));
    cfg.env.push_back({"SHOAL_DIRECT_ALLGATHER", "scratch"});
    cfg.env.push_back({"SHOAL_DIRECT_REDUCE", "two_shot"});
    cfg.before_construct = read_different_l2s;
    EXPECT_TRUE(run_ranks(n, cfg, [](Communicator& c) {
      const int p = c.size(), me = c.rank();
      SH_CHECK(l2_bytes() == (me == 0 ? 1u << 20 : me == 1 ? 2u << 20 : 512u << 10));
      const size_t count = (size_t(3) << 20) / sizeof(float) + 48;  // 3 MiB + 192 B a rank
      auto val = [](int r, size_t i) { return static_cast<float>((r + 1) * 3 + static_cast<int>(i % 11)); };
      std::vector<float> in(count * p), out(count * p, -1);
      for (size_t i = 0; i < count; ++i) in[i] = val(me, i);
      c.allgather(in.data(), out.data(), count, DType::f32, {Algo::direct})->wait();
      for (int r = 0; r < p; ++r)
        for (size_t i = 0; i < count; ++i) SH_CHECK(out[r * count + i] == val(r, i)) << "allgather block " << r << " i " << i;
      for (size_t i = 0; i < count * p; ++i) in[i] = val(me, i);
      auto sum = [&](size_t i) {
        float s = 0;
        for (int r = 0; r < p; ++r) s += val(r, i);
        return s;
      };
      c.allreduce(in.data(), out.data(), count * p, DType::f32, ReduceOp::sum, {Algo::direct})->wait();
      for (size_t i = 0; i < count * p; ++i) SH_CHECK(out[i] == sum(i)) << "allreduce i " << i;
      c.reduce(in.data(), out.data(), count * p, DType::f32, ReduceOp::sum, p - 1, {Algo::direct})->wait();
      if (me == p - 1) {
        for (size_t i = 0; i < count * p; ++i) SH_CHECK(out[i] == sum(i)) << "reduce i " << i;
      }
      c.reduce_scatter(in.data(), out.data(), count, DType::f32, ReduceOp::sum, {Algo::direct})->wait();
      for (size_t i = 0; i < count; ++i) SH_CHECK(out[i] == sum(me * count + i)) << "reduce_scatter i " << i;
    })) << n << " ranks";
  }
}
