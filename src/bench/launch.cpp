// shoal-bench: the launcher. Starts a shoal::TcpStore server on 127.0.0.1 (any free port), then
// forks and execs this binary once per rank with SHOAL_RANK, SHOAL_WORLD_SIZE,
// SHOAL_STORE=127.0.0.1:PORT, SHOAL_STORE_SERVER=0 (and SHOAL_TRANSPORT per --transport), waits for
// every rank, and when one fails kills the others (SIGTERM, then SIGKILL after 5 s). With --vs ompi
// it runs `mpirun --oversubscribe -n N` of this binary instead (the ranks take their rank from
// mpirun), and mpirun stops the others when one fails.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench.h"

extern char** environ;

namespace shoal::bench {

namespace {

volatile sig_atomic_t g_interrupted = 0;
void on_signal(int) { g_interrupted = 1; }

bool dropped_env(const char* kv, bool drop_transport) {
  static const char* const kNames[] = {"SHOAL_RANK=", "SHOAL_WORLD_SIZE=", "SHOAL_STORE=", "SHOAL_STORE_SERVER=",
                                       "SHOAL_LOCAL_RANK=", "SHOAL_LOCAL_WORLD_SIZE=",
                                       "SHOAL_BENCH_FLOORS="};
  for (const char* n : kNames)
    if (std::strncmp(kv, n, std::strlen(n)) == 0) return true;
  return drop_transport && std::strncmp(kv, "SHOAL_TRANSPORT=", 16) == 0;
}

std::string describe_status(int st) {
  if (WIFEXITED(st)) return "exited with status " + std::to_string(WEXITSTATUS(st));
  if (WIFSIGNALED(st)) return std::string("was killed by signal ") + std::to_string(WTERMSIG(st)) + " (" +
                              strsignal(WTERMSIG(st)) + ")";
  return "ended with wait status " + std::to_string(st);
}

}  // namespace

int launch(const Config& cfg, const char* self) {
  (void)self;  // exec'd through /proc/self/exe, whatever argv[0] says
  const int n = cfg.ranks;
  TcpStore server("127.0.0.1", 0, /*is_server=*/true, Millis(30000));
  const uint16_t port = server.port();

  // Environment and arguments of the ranks, built before fork (only execve after it).
  std::vector<std::string> env_keep;
  for (char** e = environ; e && *e; ++e)
    if (!dropped_env(*e, cfg.transport_given)) env_keep.emplace_back(*e);
  env_keep.push_back("SHOAL_WORLD_SIZE=" + std::to_string(n));
  env_keep.push_back("SHOAL_STORE=127.0.0.1:" + std::to_string(port));
  env_keep.push_back("SHOAL_STORE_SERVER=0");
  if (cfg.transport_given && cfg.transport != "auto") env_keep.push_back("SHOAL_TRANSPORT=" + cfg.transport);
  if (cfg.floors) env_keep.push_back(floors_env(measure_floors()));  // before any rank runs
  std::vector<std::string> rank_env(n);
  for (int r = 0; r < n; ++r) rank_env[r] = "SHOAL_RANK=" + std::to_string(r);

  // The real path (so that the ranks' process name is shoal-bench, not "exe").
  std::string exe = "/proc/self/exe";
  {
    char buf[4096];
    ssize_t len = readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (len > 0) exe.assign(buf, static_cast<size_t>(len));
  }
  std::vector<std::string> argv_s;
  const bool via_mpirun = cfg.vs_ompi && have_ompi();
  if (via_mpirun) {
    // One mpirun starts every rank, as an MPI user starts a job; it passes these variables on.
    const std::string self_path = exe;
    exe = mpirun_path();
    argv_s = {"mpirun", "--oversubscribe", "-n", std::to_string(n)};
    if (geteuid() == 0) argv_s.push_back("--allow-run-as-root");
    for (const char* name : {"SHOAL_WORLD_SIZE", "SHOAL_STORE", "SHOAL_STORE_SERVER", "SHOAL_TRANSPORT"})
      for (const auto& e : env_keep)
        if (e.rfind(std::string(name) + "=", 0) == 0) argv_s.insert(argv_s.end(), {"-x", e});
    std::string word;
    for (char ch : cfg.mpirun_args + " ") {
      if (ch != ' ') {
        word += ch;
      } else if (!word.empty()) {
        argv_s.push_back(word);
        word.clear();
      }
    }
    argv_s.push_back(self_path);
  } else {
    argv_s.push_back("shoal-bench");
  }
  for (const auto& a : cfg.argv) argv_s.push_back(a);
  std::vector<char*> argv_p;
  for (auto& a : argv_s) argv_p.push_back(a.data());
  argv_p.push_back(nullptr);

  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t parent = getpid();
  const int nproc = via_mpirun ? 1 : n;  // the processes this launcher starts and waits for
  std::vector<pid_t> pids(nproc, -1);
  for (int r = 0; r < nproc; ++r) {
    std::vector<char*> envp;
    for (auto& e : env_keep) envp.push_back(e.data());
    if (!via_mpirun) envp.push_back(rank_env[r].data());
    envp.push_back(nullptr);
    pid_t pid = fork();
    if (pid < 0) {
      std::fprintf(stderr, "shoal-bench: fork: %s\n", std::strerror(errno));
      for (int q = 0; q < r; ++q) kill(pids[q], SIGKILL);
      for (int q = 0; q < r; ++q) waitpid(pids[q], nullptr, 0);
      return 1;
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // a rank never outlives the launcher
      if (getppid() != parent) _exit(126);
      execve(exe.c_str(), argv_p.data(), envp.data());
      std::fprintf(stderr, "shoal-bench: cannot run %s: %s\n", exe.c_str(), std::strerror(errno));
      _exit(127);
    }
    pids[r] = pid;
  }

  int remaining = nproc;
  bool failed = false, failed_soft = false, reported = false;
  auto rank_of = [&](pid_t pid) {
    for (int r = 0; r < nproc; ++r)
      if (pids[r] == pid) return r;
    return -1;
  };
  auto kill_rest = [&](int sig) {
    for (int r = 0; r < nproc; ++r)
      if (pids[r] > 0) kill(pids[r], sig);
  };
  while (remaining > 0) {
    int st = 0;
    pid_t pid = waitpid(-1, &st, 0);
    if (pid < 0) {
      if (errno == EINTR) {
        if (g_interrupted && !failed) {
          failed = true;
          std::fprintf(stderr, "shoal-bench: interrupted, stopping the ranks\n");
          kill_rest(SIGTERM);
        }
        continue;
      }
      break;  // ECHILD: nothing left
    }
    int r = rank_of(pid);
    if (r < 0) continue;
    pids[r] = -1;
    --remaining;
    bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
    if (WIFEXITED(st) && WEXITSTATUS(st) == 3) {
      // The rank finished the sweep but shoal failed an op or a check (the table says which):
      // every rank knows and ends by itself.
      if (!reported) std::fprintf(stderr, "shoal-bench: shoal reported failed ops or checks\n");
      reported = true;
      failed_soft = true;
      continue;
    }
    if (!ok && !failed) {
      failed = true;
      if (via_mpirun)
        std::fprintf(stderr, "shoal-bench: mpirun %s\n", describe_status(st).c_str());
      else
        std::fprintf(stderr, "shoal-bench: rank %d %s; stopping the other ranks\n", r, describe_status(st).c_str());
      kill_rest(SIGTERM);
      // Give them 5 s to go, then SIGKILL.
      auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (remaining > 0 && std::chrono::steady_clock::now() < deadline) {
        pid_t q = waitpid(-1, &st, WNOHANG);
        if (q > 0) {
          int rq = rank_of(q);
          if (rq >= 0) pids[rq] = -1, --remaining;
        } else if (q < 0 && errno != EINTR) {
          remaining = 0;
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
      }
      kill_rest(SIGKILL);
    }
  }
  return failed ? 1 : (failed_soft ? 3 : 0);
}

}  // namespace shoal::bench
