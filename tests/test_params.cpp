// The SHOAL_* settings (src/base/params.h): each reader takes what its variable may hold, turns
// anything else into an InvalidArgument that names the variable, the value and what it takes,
// and reads unset and empty alike; README.md's table is the registry's; the library reads the
// environment through the registry alone; a misspelt variable is told apart from shoal's own
// and from others; and a bad setting fails a group when it forms, on every rank.
#include <dirent.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "base/params.h"
#include "harness.h"

using namespace shoal;
using namespace shoal_test;

namespace {

// The message of the InvalidArgument f throws ("" if it throws none).
template <class F>
std::string invalid(F f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}


}  // namespace

TEST(Params, EachReaderTakesItsValuesAndNamesWhatItExpects) {
  {
    ScopedEnv e("SHOAL_TCP_STREAMS", nullptr);
    EXPECT_FALSE(params::integer("SHOAL_TCP_STREAMS"));
  }
  {
    ScopedEnv e("SHOAL_TCP_STREAMS", "");  // empty reads as unset
    EXPECT_FALSE(params::integer("SHOAL_TCP_STREAMS"));
  }
  {
    ScopedEnv e("SHOAL_TCP_STREAMS", "64");
    EXPECT_EQ(params::integer("SHOAL_TCP_STREAMS"), 64);
  }
  for (const char* v : {"0", "65", "4x", "x", "1.5", "99999999999999999999"}) {
    ScopedEnv e("SHOAL_TCP_STREAMS", v);
    EXPECT_EQ(invalid([] { params::integer("SHOAL_TCP_STREAMS"); }),
              "SHOAL_TCP_STREAMS='" + std::string(v) + "': expected an integer from 1 to 64");
  }
  struct {
    const char* v;
    uint64_t want;
  } sizes[] = {{"262144", 262144}, {"256K", 262144}, {"16M", 16u << 20}, {"1g", 1u << 30}, {"4G", uint64_t(4) << 30}};
  for (auto c : sizes) {
    ScopedEnv e("SHOAL_SHM_SCRATCH", c.v);
    EXPECT_EQ(params::bytes("SHOAL_SHM_SCRATCH"), c.want) << c.v;
  }
  for (const char* v : {"255K", "5G", "16MB", "-1", "M", "16 M", "18446744073709551616"}) {
    ScopedEnv e("SHOAL_SHM_SCRATCH", v);
    EXPECT_EQ(invalid([] { params::bytes("SHOAL_SHM_SCRATCH"); }),
              "SHOAL_SHM_SCRATCH='" + std::string(v) + "': expected bytes from 262144 to 4294967296 (suffixes K, M, G)");
  }
  {
    ScopedEnv e("SHOAL_TIMEOUT", "0.25");
    EXPECT_EQ(params::seconds("SHOAL_TIMEOUT"), 0.25);
  }
  for (const char* v : {"0", "-3", "ten", "nan", "inf", "5s"}) {
    ScopedEnv e("SHOAL_TIMEOUT", v);
    EXPECT_EQ(invalid([] { params::seconds("SHOAL_TIMEOUT"); }),
              "SHOAL_TIMEOUT='" + std::string(v) + "': expected seconds from 0.001 to 1000000000");
  }
  for (auto [v, want] : {std::pair{"1", true}, {"yes", true}, {"true", true}, {"0", false}, {"no", false}, {"false", false}}) {
    ScopedEnv e("SHOAL_CMA", v);
    EXPECT_EQ(params::flag("SHOAL_CMA"), want) << v;
  }
  {
    ScopedEnv e("SHOAL_CMA", "2");
    EXPECT_EQ(invalid([] { params::flag("SHOAL_CMA"); }), "SHOAL_CMA='2': expected 0 or 1 (or false/true, no/yes)");
  }
  {
    ScopedEnv e("SHOAL_TRANSPORT", "shm");
    EXPECT_EQ(params::choice("SHOAL_TRANSPORT"), "shm");
  }
  {
    ScopedEnv e("SHOAL_TRANSPORT", "SHM");
    EXPECT_EQ(invalid([] { params::choice("SHOAL_TRANSPORT"); }),
              "SHOAL_TRANSPORT='SHM': expected one of auto, shm, tcp");
  }
  // A name missing from the table is shoal's own bug, not the user's input.
  try {
    params::text("SHOAL_NOT_A_SETTING");
    ADD_FAILURE() << "an unregistered name was read";
  } catch (const InvalidArgument& e) {
    ADD_FAILURE() << "an unregistered name is not the user's error: " << e.what();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("SHOAL_NOT_A_SETTING is not a registered setting"), std::string::npos) << e.what();
  }
}

// check() says, for every registered variable, whether its value is one it takes: what `shoal
// doctor` reports for each variable set.
TEST(Params, CheckCoversEveryVariable) {
  for (const auto& p : params::all()) {
    {
      ScopedEnv e(p.name, nullptr);
      EXPECT_EQ(params::check(p), "") << p.name;
    }
    ScopedEnv e(p.name, "bogus!");
    const std::string err = params::check(p);
    if (p.kind == params::Kind::text) {
      EXPECT_EQ(err, "") << p.name << " takes any text";
    } else {
      EXPECT_EQ(err.rfind(std::string(p.name) + "='bogus!': expected ", 0), 0u) << p.name << ": " << err;
    }
  }
  // A reader of another kind than the table's is shoal's bug, not the user's input.
  EXPECT_THROW(params::integer("SHOAL_TRANSPORT"), Error);
}

TEST(Params, TheReadmeTableIsTheRegistry) {
  const std::string readme = slurp(SHOAL_SOURCE_DIR "/README.md");
  ASSERT_FALSE(readme.empty());
  EXPECT_NE(readme.find(params::markdown_table()), std::string::npos)
      << "README.md's configuration table is not `shoal-run --settings`; put this there:\n"
      << params::markdown_table();
  for (const auto& p : params::all()) {
    EXPECT_EQ(std::string(p.name).rfind("SHOAL_", 0), 0u) << p.name;
    EXPECT_GT(std::strlen(p.meaning), 10u) << p.name;
  }
}

// Every getenv of a SHOAL_* variable in the library and its tools is params.cpp's: a value read
// elsewhere would escape the table and its checks. (The benchmark reads its own launch variables.)
TEST(Params, TheLibraryReadsSettingsThroughTheRegistryAlone) {
  std::vector<std::string> offenders;
  for (const char* dir : {"core", "store", "transport", "algo", "reduce", "capi", "tools"}) {
    const std::string path = std::string(SHOAL_SOURCE_DIR) + "/src/" + dir;
    DIR* d = opendir(path.c_str());
    ASSERT_NE(d, nullptr) << path;
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name == "params.cpp" || name.size() < 3) continue;
      const std::string text = slurp(path + "/" + name);
      if (text.find("getenv(\"SHOAL_") != std::string::npos) offenders.push_back(std::string(dir) + "/" + name);
    }
    closedir(d);
  }
  EXPECT_TRUE(offenders.empty()) << "read SHOAL_* with std::getenv: " << join(offenders);
}

TEST(Params, AMisspeltSettingIsToldApart) {
  ScopedEnv a("SHOAL_TIMOUT", "5"), b("SHOAL_TRANSPRT", "tcp"), c("SHOAL_TIMEOUT", "5"), d("SHOAL_TEST_SOMETHING", "1");
  const auto typos = params::probable_typos();
  EXPECT_EQ(std::count(typos.begin(), typos.end(), "SHOAL_TIMOUT (did you mean SHOAL_TIMEOUT?)"), 1) << join(typos);
  EXPECT_EQ(std::count(typos.begin(), typos.end(), "SHOAL_TRANSPRT (did you mean SHOAL_TRANSPORT?)"), 1) << join(typos);
  for (const auto& t : typos) {
    EXPECT_EQ(t.rfind("SHOAL_TIMEOUT ", 0), std::string::npos) << "a setting of shoal's is no typo";
    EXPECT_EQ(t.rfind("SHOAL_TEST_SOMETHING", 0), std::string::npos) << "nothing near it is shoal's";
  }
  const auto set = params::set_in_environment();
  EXPECT_EQ(std::count(set.begin(), set.end(), "SHOAL_TIMEOUT=5"), 1) << join(set);
  ScopedEnv t("SHOAL_STORE_TOKEN", "secret-42");
  for (const auto& s : params::set_in_environment()) EXPECT_EQ(s.find("secret-42"), std::string::npos) << s;
}

// A bad setting read when a group forms fails it on every rank at once, naming the variable (the
// shared-memory sizes are read where a rank's failure reaches its peers), and a size with a
// suffix is taken.
TEST(Params, ABadSettingFailsTheGroupOnEveryRank) {
  for (auto [name, value] : {std::pair{"SHOAL_SHM_SCRATCH", "16MB"}, {"SHOAL_SPIN_US", "fast"}, {"SHOAL_ALGO", "fastest"}}) {
    RunConfig cfg = transport_config("shm");
    cfg.env.push_back({name, value});
    cfg.options.timeout = std::chrono::seconds(30);
    RunResult res = run_ranks_outcomes(3, cfg, [](Communicator&) {});
    for (const auto& r : res.ranks) {
      EXPECT_EQ(r.error_kind, "setup") << r.describe();
      EXPECT_NE(r.message.find(std::string(name) + "='" + value + "'"), std::string::npos) << r.describe();
      EXPECT_LT(r.total_seconds, 10) << "a rank waited for a peer that had failed: " << r.describe();
    }
  }
  RunConfig cfg = transport_config("shm");
  cfg.env.push_back({"SHOAL_SHM_SCRATCH", "2M"});
  cfg.env.push_back({"SHOAL_SHM_RING", "64K"});
  EXPECT_TRUE(run_ranks(3, cfg, [](Communicator& c) {
    std::vector<float> x(300000, float(c.rank() + 1)), y(x.size());
    c.allreduce(x.data(), y.data(), x.size(), DType::f32, ReduceOp::sum)->wait();
    for (float v : y) SH_CHECK(v == 6.0f) << "allreduce gave " << v;
  }));
}

// Ranks whose shared-memory settings differ cannot lay out each other's segments alike: they
// talk over TCP (and say so), where a chunked op over shared memory would run past the end of the
// smaller scratch area.
TEST(Params, RanksWithDifferentShmSettingsTalkOverTcp) {
  for (const char* name : {"SHOAL_SHM_SCRATCH", "SHOAL_SHM_RING"}) {
    RunConfig cfg = transport_config("shm");
    cfg.before_construct = [name](int rank) { setenv(name, rank == 0 ? "1M" : "2M", 1); };
    EXPECT_TRUE(run_ranks(2, cfg, [](Communicator& c) {
      SH_CHECK(c.transport_to(1 - c.rank()) == "tcp") << c.transport_to(1 - c.rank());
      std::vector<float> x(600000, float(c.rank() + 1)), y(x.size());
      c.allreduce(x.data(), y.data(), x.size(), DType::f32, ReduceOp::sum, {.blocking = true});
      for (float v : y) SH_CHECK(v == 3.0f) << "allreduce gave " << v;
    })) << name;
  }
}

// SHOAL_ALGO names one algorithm for every op that has it, or one per op; an op it does not name,
// or where the algorithm cannot run (direct over TCP), keeps its automatic choice; a bad op or
// algorithm, or one the named op lacks, fails the group naming the variable.
TEST(Params, AlgoPerOp) {
  RunConfig cfg = transport_config("shm");
  cfg.env.push_back({"SHOAL_ALGO", "allreduce:ring,broadcast:mst,alltoall:ring"});
  EXPECT_TRUE(run_ranks(3, cfg, [](Communicator& c) {
    SH_CHECK(c.algo_for("allreduce", 1 << 20) == Algo::ring) << algo_name(c.algo_for("allreduce", 1 << 20));
    SH_CHECK(c.algo_for("broadcast", 8) == Algo::mst) << algo_name(c.algo_for("broadcast", 8));
    SH_CHECK(c.algo_for("alltoall", 1 << 20) == Algo::ring) << algo_name(c.algo_for("alltoall", 1 << 20));
    SH_CHECK(c.algo_for("reduce", 8) == Algo::direct) << "not named: the automatic choice over shm";
    std::vector<float> x(1000, float(c.rank() + 1)), y(1000);  // and they run
    c.allreduce(x.data(), y.data(), x.size(), DType::f32, ReduceOp::sum, {.blocking = true});
    for (float v : y) SH_CHECK(v == 6.0f) << v;
  }));
  RunConfig tcp = transport_config("tcp");
  tcp.env.push_back({"SHOAL_ALGO", "allreduce:direct"});
  EXPECT_TRUE(run_ranks(2, tcp, [](Communicator& c) {
    SH_CHECK(c.algo_for("allreduce", 8) != Algo::direct) << "direct needs shared memory";
  }));
  for (auto [value, says] : {std::pair{"allreduce:fastest", "unknown algorithm 'fastest'"},
                             {"allreduces:ring", "unknown op 'allreduces' (allreduce, broadcast,"},
                             {"broadcast:bde", "broadcast has no algorithm 'bde' (it has: "},
                             {"allreduce:ring,bde", "'bde' is not op:algorithm"}}) {
    RunConfig bad = transport_config("shm");
    bad.env.push_back({"SHOAL_ALGO", value});
    RunResult res = run_ranks_outcomes(2, bad, [](Communicator&) {});
    for (const auto& r : res.ranks) {
      EXPECT_EQ(r.error_kind, "setup") << r.describe();
      EXPECT_NE(r.message.find("SHOAL_ALGO='" + std::string(value) + "': "), std::string::npos) << r.describe();
      EXPECT_NE(r.message.find(says), std::string::npos) << r.describe();
    }
  }
}

// The launch contract's place in the group, as the public API gives it to front doors.
TEST(Params, PlacementFromEnvReadsRankAndSizeOrSaysWhatIsMissing) {
  {
    ScopedEnv r("SHOAL_RANK", "2"), n("SHOAL_WORLD_SIZE", "5");
    const shoal::Placement p = shoal::placement_from_env();
    EXPECT_EQ(p.rank, 2);
    EXPECT_EQ(p.size, 5);
  }
  {
    ScopedEnv r("SHOAL_RANK", "2"), n("SHOAL_WORLD_SIZE", nullptr);
    try {
      shoal::placement_from_env();
      ADD_FAILURE() << "accepted an unset SHOAL_WORLD_SIZE";
    } catch (const shoal::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("SHOAL_RANK and SHOAL_WORLD_SIZE must be set"), std::string::npos) << e.what();
    }
  }
  {
    ScopedEnv r("SHOAL_RANK", "two"), n("SHOAL_WORLD_SIZE", "5");
    try {
      shoal::placement_from_env();
      ADD_FAILURE() << "accepted SHOAL_RANK=two";
    } catch (const shoal::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("SHOAL_RANK"), std::string::npos) << e.what();
    }
  }
}
