// The algorithm registry (src/algo/registry.cpp) and the automatic choice (src/algo/select.cpp),
// in one process: no ranks.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "algo/algorithms.h"
#include "algo/cost.h"
#include "algo/registry.h"
#include "shoal/communicator.h"
#include "shoal/error.h"
#include "harness.h"

namespace {

using namespace shoal;

constexpr OpKind kKinds[] = {OpKind::allreduce, OpKind::broadcast, OpKind::reduce, OpKind::allgatherv, OpKind::reduce_scatter,
                             OpKind::gather, OpKind::scatter, OpKind::alltoallv, OpKind::barrier};
constexpr Algo kAlgos[] = {Algo::ring, Algo::bde, Algo::mst, Algo::direct, Algo::rd, Algo::scatter_allgather, Algo::linear,
                           Algo::hier};
constexpr Topo kTopos[] = {Topo::shm, Topo::one_host_tcp, Topo::hosts, Topo::hosts_shm};

// The built-in tuning (the tests leave SHOAL_TUNING unset).
const algo::Ways& ways() {
  static const algo::Ways w = algo::Ways::current();
  return w;
}

bool satisfied(Needs n, Topo t) {
  if (n == Needs::shm) return t == Topo::shm;
  if (n == Needs::several_hosts) return t == Topo::hosts || t == Topo::hosts_shm;
  return true;
}

// A requested algorithm runs exactly where the registry says it applies; anywhere else it is an
// InvalidArgument naming the op's algorithms. The public listing is the registry's.
TEST(Registry, RequestedAlgorithmsFollowTheTable) {
  for (OpKind k : kKinds) {
    const std::vector<Algo> listed = algos_list(k);
    EXPECT_EQ(algorithms_of(op_kind_name(k)), listed) << op_kind_name(k);
    EXPECT_FALSE(listed.empty()) << op_kind_name(k);
    for (Algo a : kAlgos) {
      const bool has = std::find(listed.begin(), listed.end(), a) != listed.end();
      EXPECT_EQ(has_algo(k, a), has) << op_kind_name(k) << " " << algo_name(a);
      for (Topo t : kTopos) {
        SCOPED_TRACE(std::string(op_kind_name(k)) + " " + algo_name(a) + " topo " + std::to_string(int(t)));
        if (has && satisfied(needs_of(k, a), t)) {
          EXPECT_EQ(choose_algo(k, a, 4096, 4, t, ways()), a);
        } else {
          try {
            choose_algo(k, a, 4096, 4, t, ways());
            ADD_FAILURE() << "accepted";
          } catch (const InvalidArgument& e) {
            if (!has) {
              EXPECT_NE(std::string(e.what()).find(algos_of(k)), std::string::npos) << e.what();
            }
          }
        }
      }
    }
  }
  EXPECT_THROW(algorithms_of("allreduce_v"), InvalidArgument);
}

// The automatic choice picks an algorithm the op has and that applies to the topology, for every
// op, topology, size and group size.
TEST(Registry, AutomaticChoiceIsAlwaysAllowed) {
  for (OpKind k : kKinds)
    for (Topo t : kTopos)
      for (int p : {2, 3, 4, 8, 16})
        for (size_t bytes : {size_t(0), size_t(8), size_t(4096), size_t(1) << 20, size_t(64) << 20}) {
          const Algo a = choose_algo(k, Algo::automatic, bytes, p, t, ways());
          EXPECT_TRUE(has_algo(k, a) && satisfied(needs_of(k, a), t))
              << op_kind_name(k) << " topo " << int(t) << " p " << p << " bytes " << bytes << ": " << algo_name(a);
        }
}

// The automatic choice, row by row, with the switches of a tuning file written here (so that the
// rows hold whatever the built-in switches are; test_cost.cpp checks that a file's switches are
// the ones in effect).
const char* const kSwitchFile =
    "switch allreduce.mst_below 32768\n"
    "switch allreduce.bde_up_to 8388608\n"
    "switch allreduce.bde_up_to_odd_p 262144\n"
    "switch broadcast.mst_below 2097152\n"
    "switch broadcast.one_host.mst_below 65536\n"
    "switch broadcast.chain_from 33554432\n"
    "switch reduce.mst_below never\n"
    "switch allgather.rd_below 8388608\n"
    "switch reduce_scatter.halving_below 65536\n"
    "switch reduce_scatter.halving_below_odd_p 0\n"
    "switch gather.mst_below 65536\n"
    "switch scatter.mst_below 131072\n";

struct Row {
  OpKind kind;
  Topo topo;
  int p;
  size_t bytes;
  Algo want;
};
constexpr size_t KiB = 1024, MiB = 1024 * 1024;
constexpr Row kRows[] = {
    {OpKind::allreduce, Topo::shm, 8, 64 * MiB, Algo::direct},
    {OpKind::allreduce, Topo::hosts_shm, 8, 8, Algo::hier},
    {OpKind::allreduce, Topo::hosts, 4, 32 * KiB - 1, Algo::mst},
    {OpKind::allreduce, Topo::hosts, 4, 32 * KiB, Algo::bde},
    {OpKind::allreduce, Topo::hosts, 4, 8 * MiB, Algo::bde},
    {OpKind::allreduce, Topo::hosts, 4, 8 * MiB + 1, Algo::ring},
    {OpKind::allreduce, Topo::hosts, 3, 256 * KiB, Algo::bde},  // p not a power of two: the fold costs
    {OpKind::allreduce, Topo::hosts, 3, 1 * MiB, Algo::ring},
    {OpKind::allreduce, Topo::one_host_tcp, 4, 64 * MiB, Algo::ring},
    {OpKind::broadcast, Topo::shm, 4, 8, Algo::direct},
    {OpKind::broadcast, Topo::hosts, 4, 1 * MiB, Algo::mst},
    {OpKind::broadcast, Topo::hosts, 4, 2 * MiB, Algo::scatter_allgather},
    {OpKind::broadcast, Topo::one_host_tcp, 4, 4 * KiB, Algo::mst},
    {OpKind::broadcast, Topo::one_host_tcp, 4, 1 * MiB, Algo::linear},  // the one-host switch, not 2 MiB
    {OpKind::broadcast, Topo::one_host_tcp, 4, 4 * MiB, Algo::linear},
    {OpKind::broadcast, Topo::one_host_tcp, 4, 64 * MiB, Algo::ring},
    {OpKind::reduce, Topo::hosts, 4, 64 * MiB, Algo::mst},
    {OpKind::allgatherv, Topo::hosts, 4, 4 * KiB, Algo::rd},
    {OpKind::allgatherv, Topo::hosts, 4, 64 * MiB, Algo::ring},
    {OpKind::reduce_scatter, Topo::hosts, 4, 8, Algo::rd},
    {OpKind::reduce_scatter, Topo::hosts, 4, 64 * KiB, Algo::ring},
    {OpKind::reduce_scatter, Topo::hosts, 3, 8, Algo::ring},  // p not a power of two: its own switch
    {OpKind::reduce_scatter, Topo::hosts_shm, 4, 1 * MiB, Algo::ring},
    {OpKind::gather, Topo::hosts, 4, 4 * KiB, Algo::mst},
    {OpKind::gather, Topo::hosts, 4, 64 * KiB, Algo::linear},
    {OpKind::scatter, Topo::hosts, 4, 64 * KiB, Algo::mst},  // its own switch, not gather's
    {OpKind::scatter, Topo::hosts, 4, 1 * MiB, Algo::linear},
    {OpKind::alltoallv, Topo::shm, 4, 8, Algo::direct},
    {OpKind::alltoallv, Topo::hosts, 4, 8, Algo::ring},
    {OpKind::barrier, Topo::hosts, 4, 0, Algo::rd},
};

TEST(Registry, AutomaticChoiceTable) {
  const std::string path = ::testing::TempDir() + "shoal-registry-switches.txt";
  {
    std::ofstream f(path);
    f << kSwitchFile;
  }
  shoal_test::ScopedEnv file("SHOAL_TUNING", path.c_str());
  const algo::Ways w = algo::Ways::current();
  for (const Row& r : kRows)
    EXPECT_EQ(choose_algo(r.kind, Algo::automatic, r.bytes, r.p, r.topo, w), r.want)
        << op_kind_name(r.kind) << " topo " << int(r.topo) << " p " << r.p << " bytes " << r.bytes << ": got "
        << algo_name(choose_algo(r.kind, Algo::automatic, r.bytes, r.p, r.topo, w)) << ", want " << algo_name(r.want);
  std::remove(path.c_str());
}

}  // namespace
