// shoal-run, the local launcher: the environment contract it sets, exit status when a rank fails
// or dies, and a real shoal program (shoal-bench, which acts as a rank when SHOAL_RANK is set)
// forming a group through the store shoal-run serves.
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <set>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

namespace {

struct Result {
  int status = -1;  // exit status of the shell running the command
  std::string out;
  double seconds = 0;
};

Result run(const std::string& cmd) {
  auto t0 = std::chrono::steady_clock::now();
  Result r;
  FILE* f = popen((cmd + " 2>&1").c_str(), "r");
  if (!f) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) r.out.append(buf, n);
  int st = pclose(f);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

const std::string kRun = SHOAL_RUN_PATH;
const std::string kBench = SHOAL_BENCH_PATH;

}  // namespace

TEST(Launcher, SetsTheEnvironmentContractForEveryRank) {
  Result r = run(kRun + " -n 3 /bin/sh -c 'echo rank=$SHOAL_RANK size=$SHOAL_WORLD_SIZE store=$SHOAL_STORE'");
  ASSERT_EQ(r.status, 0) << r.out;
  std::set<std::string> ranks;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("rank=", 0) != 0) continue;
    ranks.insert(line.substr(0, line.find(' ')));
    EXPECT_NE(line.find("size=3"), std::string::npos) << line;
    EXPECT_NE(line.find("store=127.0.0.1:"), std::string::npos) << line;
  }
  EXPECT_EQ(ranks, (std::set<std::string>{"rank=0", "rank=1", "rank=2"})) << r.out;
}

TEST(Launcher, ExitStatusIsTheFailingRanks) {
  Result r = run(kRun + " -n 3 /bin/sh -c 'if [ $SHOAL_RANK = 1 ]; then exit 7; fi'");
  EXPECT_EQ(r.status, 7) << r.out;
}

TEST(Launcher, KilledRankEndsTheRunAfterTheGracePeriod) {
  Result r = run("SHOAL_RUN_GRACE=1 " + kRun +
                 " -n 3 /bin/sh -c 'if [ $SHOAL_RANK = 2 ]; then kill -9 $$; fi; sleep 60'");
  EXPECT_EQ(r.status, 128 + 9) << r.out;
  EXPECT_LT(r.seconds, 20) << "the surviving ranks were not stopped: " << r.out;
}

TEST(Launcher, RanksFormAGroupThroughItsStore) {
  Result r = run(kRun + " -n 3 " + kBench + " allreduce -n 3 -b 4K -e 64K -f 4 --check");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("65536"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("FAIL"), std::string::npos) << r.out;
}

// The store shoal-run serves requires a token it makes up (32 hex digits) and hands to the ranks:
// they form their group with it, a process with another token is refused with a message naming
// SHOAL_STORE_TOKEN, and a token the caller set is used as it is.
TEST(Launcher, StoreItServesRequiresItsToken) {
  Result r = run("env -u SHOAL_STORE_TOKEN " + kRun + " -n 2 /bin/sh -c 'echo token=$SHOAL_STORE_TOKEN'");
  ASSERT_EQ(r.status, 0) << r.out;
  std::set<std::string> tokens;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("token=", 0) == 0) tokens.insert(line.substr(6));
  ASSERT_EQ(tokens.size(), 1u) << "both ranks should get the same token: " << r.out;
  const std::string tok = *tokens.begin();
  EXPECT_EQ(tok.size(), 32u) << tok;
  EXPECT_EQ(tok.find_first_not_of("0123456789abcdef"), std::string::npos) << tok;

  r = run("env -u SHOAL_STORE_TOKEN " + kRun + " -n 1 /bin/sh -c 'SHOAL_STORE_TOKEN=wrong exec " + kBench +
          " allreduce -n 1 -b 4 -e 4'");
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("SHOAL_STORE_TOKEN"), std::string::npos) << r.out;

  r = run("SHOAL_STORE_TOKEN=callers-own " + kRun + " -n 2 /bin/sh -c 'echo token=$SHOAL_STORE_TOKEN'");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("token=callers-own"), std::string::npos) << r.out;
}
