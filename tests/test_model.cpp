// The α-β-γ model (src/algo/model.h): every algorithm of the registry has a cost function, the
// costs grow as the algorithms' designs say (latency terms against bandwidth terms, powers of two
// against the others), and the fit finds the parameters that made a set of times.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "algo/direct_common.h"
#include "algo/model.h"
#include "base/cpus.h"
#include "algo/registry.h"
#include "shoal/error.h"

namespace shoal::algo {
namespace {

constexpr OpKind kKinds[] = {OpKind::allreduce,      OpKind::broadcast, OpKind::reduce,
                             OpKind::allgatherv,     OpKind::reduce_scatter, OpKind::gather,
                             OpKind::scatter,        OpKind::alltoallv, OpKind::barrier};

double alpha_of(OpKind k, Algo a, int p, double n = 8) { return seconds(cost_of(k, a, {p, 1}, n), Model{1, 0, 0, 0, 0}); }
double beta_of(OpKind k, Algo a, int p, double n) { return seconds(cost_of(k, a, {p, 1}, n), Model{0, 1, 0, 0, 0}); }

// Which protocol a direct op (or a hierarchical op's steps inside a host) takes for n: the small
// one or the chunked one. Their costs grow with n each, not across the switch: the small protocol
// has every rank read every peer's slot, which at many ranks moves more than the chunked one.
bool small_protocol(OpKind k, Algo a, int p, double n) {
  if (a != Algo::direct && a != Algo::hier) return false;
  const bool per_block = k == OpKind::allgatherv || k == OpKind::gather;  // their small test is per block
  return direct_small(per_block ? n / p : n);
}

TEST(Model, EveryAlgorithmHasACostThatGrowsWithTheMessage) {
  for (OpKind k : kKinds)
    for (Algo a : algos_list(k))
      for (int hosts : {1, 2, 3})
        for (int p : {1, 2, 3, 4, 5, 8, 16, 64, 128}) {
          if (a == Algo::hier && hosts > p) continue;
          double last = -1;
          bool last_small = true;
          for (double n : {0.0, 1.0, 4096.0, 65536.0, 1048576.0, 67108864.0}) {
            const Terms t = cost_of(k, a, {p, hosts}, n);
            const Model m{1e-6, 1e-9, 5e-10, 2e-7, 1e-10};
            const double s = seconds(t, m);
            SCOPED_TRACE(std::string(op_kind_name(k)) + " " + algo_name(a) + " p=" + std::to_string(p) +
                         " hosts=" + std::to_string(hosts) + " n=" + std::to_string(n));
            for (double x : {t.messages, t.bytes, t.reduced, t.local_messages, t.local_bytes})
              EXPECT_TRUE(std::isfinite(x) && x >= 0) << x;
            const bool small = small_protocol(k, a, p, n);
            if (small == last_small) {
              EXPECT_GE(s, last);  // a larger message never costs less
            }
            if (k != OpKind::barrier && p > 1 && n > 0) {
              EXPECT_GT(t.bytes + t.local_bytes, 0);
            }
            last = s, last_small = small;
          }
        }
}

TEST(Model, AnOpWithoutTheAlgorithmIsAnError) {
  EXPECT_THROW(cost_of(OpKind::barrier, Algo::ring, {4, 1}, 0), InvalidArgument);
  EXPECT_THROW(cost_of(OpKind::alltoallv, Algo::mst, {4, 1}, 1024), InvalidArgument);
}

// Latency: the trees and recursive doubling take lg p steps where rings and chains take p - 1.
TEST(Model, TreesTakeFewerMessagesThanRings) {
  for (int p : {8, 16, 64}) {
    EXPECT_LT(alpha_of(OpKind::allreduce, Algo::bde, p), alpha_of(OpKind::allreduce, Algo::ring, p));
    EXPECT_LT(alpha_of(OpKind::allreduce, Algo::mst, p), alpha_of(OpKind::allreduce, Algo::ring, p));
    EXPECT_LT(alpha_of(OpKind::broadcast, Algo::mst, p), alpha_of(OpKind::broadcast, Algo::linear, p));
    EXPECT_LT(alpha_of(OpKind::broadcast, Algo::mst, p), alpha_of(OpKind::broadcast, Algo::scatter_allgather, p));
    EXPECT_LT(alpha_of(OpKind::allgatherv, Algo::rd, p), alpha_of(OpKind::allgatherv, Algo::ring, p));
    EXPECT_LT(alpha_of(OpKind::reduce_scatter, Algo::rd, p), alpha_of(OpKind::reduce_scatter, Algo::ring, p));
    EXPECT_LT(alpha_of(OpKind::gather, Algo::mst, p), alpha_of(OpKind::gather, Algo::linear, p));
    EXPECT_EQ(alpha_of(OpKind::barrier, Algo::rd, p), std::log2(p));
  }
  // The direct ops' small protocol: one round, no barrier, whatever p.
  EXPECT_EQ(alpha_of(OpKind::allreduce, Algo::direct, 64, 4096), 1);
  EXPECT_EQ(alpha_of(OpKind::barrier, Algo::direct, 64), 1);
}

// Bandwidth: the ring and Rabenseifner's algorithm move 2(p-1)/p·n, a tree lg p times n.
TEST(Model, RingsMoveFewerBytesThanTreesOnLargeMessages) {
  const double n = 64 << 20;
  for (int p : {4, 8, 16}) {
    EXPECT_DOUBLE_EQ(beta_of(OpKind::allreduce, Algo::ring, p, n), 2.0 * (p - 1) / p * n);
    EXPECT_DOUBLE_EQ(beta_of(OpKind::allreduce, Algo::bde, p, n), 2.0 * (p - 1) / p * n);
    EXPECT_LT(beta_of(OpKind::allreduce, Algo::ring, p, n), beta_of(OpKind::allreduce, Algo::mst, p, n));
    EXPECT_LT(beta_of(OpKind::broadcast, Algo::scatter_allgather, p, n), beta_of(OpKind::broadcast, Algo::mst, p, n));
    EXPECT_LT(beta_of(OpKind::broadcast, Algo::ring, p, n), beta_of(OpKind::broadcast, Algo::mst, p, n));
  }
}

// A group that is not a power of two folds ranks in and out: BDE and recursive halving cost more
// at 6 ranks than at 4 or 8; the ring does not care.
TEST(Model, FoldingCostsWhereTheGroupIsNotAPowerOfTwo) {
  const double n = 1 << 20;
  for (OpKind k : {OpKind::allreduce, OpKind::reduce_scatter}) {
    const Algo a = k == OpKind::allreduce ? Algo::bde : Algo::rd;
    EXPECT_GT(beta_of(k, a, 6, n), beta_of(k, a, 8, n));
    EXPECT_GT(alpha_of(k, a, 6), alpha_of(k, a, 4));
  }
  EXPECT_LT(beta_of(OpKind::allreduce, Algo::ring, 6, n), beta_of(OpKind::allreduce, Algo::ring, 8, n));
}

// The hierarchical allreduce crosses the network between the hosts' leaders only: its network
// terms do not grow with the ranks per host, and stay under the flat ring's.
TEST(Model, HierarchicalOpsCountTheNetworkAndTheHostsApart) {
  const double n = 1 << 20;
  const Terms t8 = cost_of(OpKind::allreduce, Algo::hier, {8, 2}, n);
  const Terms t32 = cost_of(OpKind::allreduce, Algo::hier, {32, 2}, n);
  EXPECT_EQ(t8.bytes, t32.bytes);
  EXPECT_EQ(t8.messages, t32.messages);
  EXPECT_LT(t8.local_messages, t32.local_messages);
  for (int p : {8, 32}) {
    EXPECT_LT(cost_of(OpKind::allreduce, Algo::hier, {p, 2}, n).bytes, cost_of(OpKind::allreduce, Algo::ring, {p, 1}, n).bytes);
    EXPECT_LT(cost_of(OpKind::broadcast, Algo::hier, {p, 4}, n).messages, cost_of(OpKind::broadcast, Algo::mst, {p, 1}, n).messages);
  }
}

// The direct ops' barriers: one per chunk and one more (allreduce and reduce: two more), chunks cut
// as each op's file cuts them with the default 16 MiB scratch. The counts below are worked out by
// hand from those files for 4 ranks (chunk_target: 16 MiB / 8 = 2 MiB), with an L2 that cuts
// nothing (0: unknown) and with a 1 MiB one (chunk_in_l2).
TEST(Model, DirectOpsCountTheirChunksAsTheirFilesCutThem) {
  auto barriers = [](OpKind k, double n, int p = 4) { return cost_of(k, Algo::direct, {p, 1}, n).messages; };
  const double K = 1024, M = K * K;
  struct L2 {
    explicit L2(long b) { set_l2_bytes_for_testing(b); }
    ~L2() { set_l2_bytes_for_testing(-1); }
  };
  {
    L2 unknown(0);
    EXPECT_EQ(barriers(OpKind::allreduce, 256 * K), 1 + 2);    // one chunk
    EXPECT_EQ(barriers(OpKind::allreduce, 16 * M), 8 + 2);     // chunk 2 MiB
    EXPECT_EQ(barriers(OpKind::allgatherv, 16 * M), 2 + 1);    // blocks of 4 MiB in 2 MiB chunks
    EXPECT_EQ(barriers(OpKind::reduce_scatter, 16 * M), 8 + 1);  // pieces of 2 MiB / 4 of each block
  }
  {
    L2 one_mib(1 << 20);
    EXPECT_EQ(barriers(OpKind::allreduce, 256 * K), 1 + 2);
    EXPECT_EQ(barriers(OpKind::allreduce, 16 * M), 16 + 2);
    EXPECT_EQ(barriers(OpKind::reduce, 16 * M), 16 + 2);
    EXPECT_EQ(barriers(OpKind::allgatherv, 16 * M), 4 + 1);
    EXPECT_EQ(barriers(OpKind::reduce_scatter, 16 * M), 16 + 1);  // pieces of 256 KiB
    // 3 ranks: chunks of whole lines for each slice, 1 MiB - 64 B (a multiple of 3·64), so one
    // more than 16; reduce_scatter's pieces 1/3 MiB to a line, 3 a chunk: the same.
    EXPECT_EQ(barriers(OpKind::allreduce, 16 * M, 3), 17 + 2);
    EXPECT_EQ(barriers(OpKind::reduce_scatter, 16 * M, 3), 17 + 1);
    // Broadcast, gather, scatter and alltoall keep chunk_target.
    EXPECT_EQ(barriers(OpKind::broadcast, 1 * M), 1 + 1);      // chunk 2 MiB, no 4-chunk minimum
    EXPECT_EQ(barriers(OpKind::broadcast, 5 * M), 3 + 1);
    EXPECT_EQ(barriers(OpKind::gather, 16 * M), 2 + 1);
    EXPECT_EQ(barriers(OpKind::scatter, 16 * M), 3 + 1);  // pieces of min(slot / 4, 2 MiB): the slot is
                                                            // just under 8 MiB (the small area takes 164 KiB)
    EXPECT_EQ(barriers(OpKind::alltoallv, 16 * M), 8 + 1);     // blocks of 4 MiB in pieces of 512 KiB
    EXPECT_EQ(barriers(OpKind::alltoallv, 1 * M), 4 + 1);      // pieces of max(64 KiB, 256 KiB / 4)
  }
  // The small protocol: up to 8 KiB in a slot (allgather and gather: a block; scatter: all).
  EXPECT_EQ(barriers(OpKind::allgatherv, 32 * K), 1);
  EXPECT_GT(barriers(OpKind::scatter, 32 * K), 1);
  EXPECT_EQ(barriers(OpKind::scatter, 8 * K), 1);
}

// chunk_in_l2 is chunk_target cut to one core's L2, a whole number of cache lines; an L2 that is
// unknown (0) or implausibly small leaves chunk_target.
TEST(Model, ChunksInL2AreAtMostOneL2) {
  using direct::chunk_in_l2;
  using direct::chunk_target;
  const size_t K = 1024, M = K * K, slot = direct_slot();
  EXPECT_EQ(chunk_target(slot, 2), 4 * M);
  EXPECT_EQ(chunk_in_l2(slot, 2, 1 * M), 1 * M);
  EXPECT_EQ(chunk_in_l2(slot, 2, 2 * M), 2 * M);
  EXPECT_EQ(chunk_in_l2(slot, 2, 8 * M), 4 * M);
  EXPECT_EQ(chunk_in_l2(slot, 8, 2 * M), 1 * M);  // chunk_target is the smaller
  EXPECT_EQ(chunk_in_l2(slot, 2, 1280 * K + 3), 1280 * K);
  EXPECT_EQ(chunk_in_l2(slot, 2, 0), 4 * M);
  EXPECT_EQ(chunk_in_l2(slot, 2, 32 * K), 4 * M);
  // The two-shot chunk: whole lines for each of p slices, and it fits a slot with one slice more.
  // Where ranks share cores, at least kMinChunks chunks; with a core each, the chunk itself.
  EXPECT_EQ(direct::two_shot_chunk(slot, 3, 16 * M, 1 * M, true), 1 * M - 64);
  EXPECT_EQ(direct::two_shot_chunk(slot, 3, 16 * M, 1 * M, false), 1 * M - 64);
  EXPECT_EQ(direct::two_shot_chunk(slot, 2, 1 * M, 1 * M, true), 256 * K);  // n / 4
  EXPECT_EQ(direct::two_shot_chunk(slot, 2, 1 * M, 1 * M, false), 1 * M);
  EXPECT_EQ(direct::two_shot_chunk(slot, 2, 2 * M, 2 * M, false), 2 * M);  // the vector is one chunk
  EXPECT_EQ(direct::two_shot_chunk(slot, 2, 2 * M, 0, false), 512 * K);    // an unknown L2: four chunks
  EXPECT_EQ(direct::two_shot_chunk(64 * K * 3, 2, 16 * M, 0, true), 128 * K);  // 2/3 of the slot
  EXPECT_EQ(direct::reduce_scatter_piece(slot, 3, 1 * M), (1 * M / 3) / 64 * 64);
}

// even_pieces: as few pieces as `most` allows (or least_parts once one will not do), all of one
// length to a cache line (to an element where `most` is under a line), never over `most`.
TEST(DirectPieces, OfOneLengthAndNoMoreThanNeeded) {
  using direct::even_pieces;
  const size_t K = 1024, M = K * K;
  EXPECT_EQ(even_pieces(4 * M, 4 * M, 4), 4 * M);                  // one piece
  EXPECT_EQ(even_pieces(4 * M + 64, 4 * M, 4), 2 * M + 64);        // two, not 4 MiB and 64 B
  EXPECT_EQ(even_pieces(4 * M, 4055 * K, 4), 2 * M);               // the 2-rank scatter's blocks
  EXPECT_EQ(even_pieces(4 * M + 64, 4 * M, 4, 4), M + 64);         // the broadcast: four once one will not do
  EXPECT_EQ(even_pieces(4 * M, 4 * M, 4, 4), 4 * M);               // ... and one where one will
  EXPECT_EQ(even_pieces(1000, 64, 4), 64);                         // 16 pieces, the last 40 B
  EXPECT_EQ(even_pieces(100, 48, 4), 36);                          // under a line: whole elements, 3 pieces
  EXPECT_EQ(even_pieces(0, 64, 4), 64);
  for (size_t bytes : {size_t(1), size_t(63), 3 * M + 5, 9 * M + 4 * K}) {
    for (size_t most : {size_t(64) * K, 1 * M, 4055 * K}) {
      const size_t piece = even_pieces(bytes, most, 4);
      const size_t parts = (bytes + piece - 1) / piece;
      EXPECT_LE(piece, most);
      EXPECT_EQ(piece % 64, 0u);
      EXPECT_EQ(parts, std::max<size_t>(1, (bytes + most - 1) / most)) << bytes << " in " << most;
      const size_t last = bytes - (parts - 1) * piece;
      EXPECT_LE(last, piece);
      if (parts > 1) {
        EXPECT_GE(last + 64 * parts, piece) << "a short last piece: " << bytes << " in " << most;
      }
    }
  }
}

// output_copy: non-temporal stores for an output of 8 MiB or more, and, where three or more writers
// of this host write one at once, for one of the op's `shared` bytes or more, or for outputs of
// its `host` bytes or more together.
TEST(OutputStores, StreamWhereTheHostsWritersWriteMuchTogether) {
  const size_t M = size_t(1) << 20;
  for (StreamFrom from : {kStreamReduceAlltoall, kStreamAllgather, kStreamBroadcast}) {
    EXPECT_EQ(output_copy(8 * M, 1, from), copy_streaming);      // one writer, as before
    EXPECT_EQ(output_copy(8 * M - 64, 1, from), copy_bytes);
    EXPECT_EQ(output_copy(8 * M - 64, 2, from), copy_bytes);      // two: from 8 MiB each, as before
    EXPECT_EQ(output_copy(8 * M, 2, from), copy_streaming);
    EXPECT_EQ(output_copy(0, 64, from), copy_bytes);
    for (size_t writers : {3, 4, 5, 8, 16, 64}) {
      // The least output that streams: `shared`, or less where it makes `host` in all.
      const size_t least = std::min({from.shared, (from.host + writers - 1) / writers, 8 * M});
      EXPECT_EQ(output_copy(least, writers, from), copy_streaming) << writers << " writers, " << from.host;
      EXPECT_EQ(output_copy(least - 1, writers, from), copy_bytes) << writers << " writers, " << from.host;
    }
  }
  // Points measured on either side (BENCHMARKS.md, "Outputs streamed by what the host's ranks
  // write together").
  EXPECT_EQ(output_copy(1280 * 1024, 8, kStreamReduceAlltoall), copy_streaming);  // 8 ranks of 1.25 MiB
  EXPECT_EQ(output_copy(1280 * 1024 - 64, 8, kStreamReduceAlltoall), copy_bytes);
  EXPECT_EQ(output_copy(7 * M / 2, 4, kStreamAllgather), copy_streaming);         // 4 ranks of 3.5 MiB
  EXPECT_EQ(output_copy(3 * M, 5, kStreamAllgather), copy_bytes);                 // 5 of 3 MiB: 15 in all
  EXPECT_EQ(output_copy(3996 * 1024, 3, kStreamAllgather), copy_streaming);       // 3 of 3.9 MiB
  EXPECT_EQ(output_copy(3 * M - 64, 8, kStreamAllgather), copy_bytes);            // 8 of 3 MiB: 24 in all
  EXPECT_EQ(output_copy(3 * M, 8, kStreamAllgather), copy_streaming);
  EXPECT_EQ(output_copy(3 * M / 2 - 64, 16, kStreamAllgather), copy_bytes);       // 16 of 1.5 MiB
  EXPECT_EQ(output_copy(3 * M / 2, 16, kStreamAllgather), copy_streaming);
  EXPECT_EQ(output_copy(5 * M, 4, kStreamBroadcast), copy_bytes);                 // a broadcast: 24 in all
  EXPECT_EQ(output_copy(6 * M, 4, kStreamBroadcast), copy_streaming);
  EXPECT_EQ(output_copy(3 * M - 64, 8, kStreamBroadcast), copy_bytes);
}

// Times made by a known model, from two ops whose terms tell α, β and γ apart, give that model back.
TEST(Model, TheFitFindsTheParametersThatMadeTheTimes) {
  const Model truth{2.5e-6, 0.4e-9, 0.15e-9, 0, 0};
  std::vector<Terms> terms;
  std::vector<double> secs;
  for (double n : {8.0, 4096.0, 262144.0, 16777216.0}) {
    for (auto [k, a] : {std::pair{OpKind::allreduce, Algo::ring}, std::pair{OpKind::allgatherv, Algo::ring}}) {
      terms.push_back(cost_of(k, a, {4, 1}, n));
      secs.push_back(seconds(terms.back(), truth));
    }
  }
  const Fit f = fit_model(terms, secs);
  EXPECT_NEAR(f.model.alpha / truth.alpha, 1, 1e-6);
  EXPECT_NEAR(f.model.beta / truth.beta, 1, 1e-6);
  EXPECT_NEAR(f.model.gamma / truth.gamma, 1, 1e-6);
  EXPECT_LT(f.rms_relative_error, 1e-9);
}

// One op alone cannot tell β from γ (its bytes moved and reduced keep one ratio): the fit keeps
// one of them, never a negative value, and still explains the times.
TEST(Model, TermsThatMoveTogetherFitAsOne) {
  const Model truth{1e-6, 0.5e-9, 0.2e-9, 0, 0};
  std::vector<Terms> terms;
  std::vector<double> secs;
  for (double n : {64.0, 65536.0, 4194304.0}) {
    terms.push_back(cost_of(OpKind::allreduce, Algo::ring, {4, 1}, n));
    secs.push_back(seconds(terms.back(), truth) * (n == 65536.0 ? 1.1 : 1.0));  // one noisy size
  }
  const Fit f = fit_model(terms, secs);
  EXPECT_GE(f.model.alpha, 0);
  EXPECT_GE(f.model.beta, 0);
  EXPECT_GE(f.model.gamma, 0);
  EXPECT_TRUE(f.model.beta == 0 || f.model.gamma == 0);
  EXPECT_LT(f.rms_relative_error, 0.1);
  EXPECT_NEAR(seconds(terms.back(), f.model) / secs.back(), 1, 0.1);
}

TEST(Model, TheFitLeavesOutTimesThatAreNotTimesAndRefusesUnequalRows) {
  const Model truth{2e-6, 1e-9, 0, 0, 0};
  std::vector<Terms> terms;
  std::vector<double> secs;
  for (double n : {8.0, 65536.0, 4194304.0}) {
    terms.push_back(cost_of(OpKind::allgatherv, Algo::ring, {4, 1}, n));
    secs.push_back(seconds(terms.back(), truth));
  }
  terms.push_back(terms[0]), secs.push_back(INFINITY);
  terms.push_back(terms[1]), secs.push_back(0);
  const Fit f = fit_model(terms, secs);
  EXPECT_EQ(f.rows, 3u);
  EXPECT_NEAR(f.model.alpha / truth.alpha, 1, 1e-6);
  EXPECT_NEAR(f.model.beta / truth.beta, 1, 1e-6);
  EXPECT_TRUE(std::isnan(fit_model({}, {}).rms_relative_error));
  secs.pop_back();
  EXPECT_THROW(fit_model(terms, secs), InvalidArgument);
}

}  // namespace
}  // namespace shoal::algo
