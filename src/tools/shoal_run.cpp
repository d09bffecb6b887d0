// shoal-run: starts N local ranks of a program, like mpirun / torchrun (docs/launch.md).
//
//   shoal-run -n N [--store host:port] [--] PROGRAM [ARGS...]
//
// Serves a TcpStore on 127.0.0.1 (any free port) unless --store names an external one, and starts
// every rank with SHOAL_RANK, SHOAL_WORLD_SIZE, SHOAL_LOCAL_RANK, SHOAL_STORE=host:port and
// SHOAL_STORE_SERVER=0 in its environment, and SHOAL_STORE_TOKEN: the caller's, or for the store it
// serves a random one that the store requires. Children inherit stdout/stderr untouched.
// Each rank runs in its own process group, so that signals reach a rank's whole process tree (a
// shell script and the program it starts): SIGINT/SIGTERM/SIGHUP sent to shoal-run (a terminal's
// Ctrl-C included) are forwarded to every rank's group. When a rank fails (non-zero exit or killed),
// the others get SHOAL_RUN_GRACE seconds (default 10) to exit on their own (the library reports the
// failure to them), then their groups are SIGKILLed. The exit status is that of the first rank that
// failed (128+N for signal N), or 0. Ranks are not in the terminal's foreground group, so they get
// /dev/null as stdin when stdin is a terminal; otherwise rank 0 inherits stdin and the others get
// /dev/null.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "base/params.h"
#include "shoal/error.h"

extern char** environ;

namespace shoal::detail {
// Defined in src/store/tcp_store_server.cpp: a TcpStore server without a client; the handle stops it.
std::shared_ptr<void> start_store_server(const std::string& bind_host, uint16_t port, uint16_t* bound_port);
}  // namespace shoal::detail

namespace {

using Clock = std::chrono::steady_clock;

// 32 hex digits from /dev/urandom, or "" when it cannot be read.
std::string random_token() {
  unsigned char b[16];
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  ssize_t got = read(fd, b, sizeof b);
  close(fd);
  if (got != static_cast<ssize_t>(sizeof b)) return "";
  std::string s;
  char h[3];
  for (unsigned char c : b) {
    std::snprintf(h, sizeof h, "%02x", c);
    s += h;
  }
  return s;
}

const char* kUsage =
    "usage: shoal-run -n N [--store host:port] [--] PROGRAM [ARGS...]\n"
    "\n"
    "Starts N ranks of PROGRAM on this host. Each rank gets in its environment:\n"
    "  SHOAL_RANK=0..N-1  SHOAL_WORLD_SIZE=N  SHOAL_LOCAL_RANK=0..N-1\n"
    "  SHOAL_STORE=host:port  SHOAL_STORE_SERVER=0\n"
    "  SHOAL_STORE_TOKEN      the caller's; else, for the store served here, a random one\n"
    "\n"
    "options:\n"
    "  -n N                 number of ranks (required)\n"
    "  --store host:port    use an external store (e.g. shoal-store) instead of serving one on\n"
    "                       127.0.0.1; use it to run the ranks of one job on several hosts\n"
    "  --help               this text\n"
    "  --settings           every SHOAL_* variable shoal reads: meaning and default (a markdown table)\n"
    "\n"
    "SIGINT/SIGTERM/SIGHUP are forwarded to the ranks. When a rank fails, the others get\n"
    "SHOAL_RUN_GRACE seconds (default 10) to exit before they are killed. The exit status is\n"
    "the first failed rank's status (128+N for signal N), or 0. See docs/launch.md.\n";

int usage_error(const std::string& msg) {
  std::fprintf(stderr, "shoal-run: %s\n\n%s", msg.c_str(), kUsage);
  return 2;
}

bool parse_int(const char* s, long lo, long hi, long* out) {
  if (!s || !*s) return false;
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(s, &end, 10);
  if (errno || *end || v < lo || v > hi) return false;
  *out = v;
  return true;
}

bool is_ours(const char* entry) {
  static const char* names[] = {"SHOAL_RANK=", "SHOAL_WORLD_SIZE=", "SHOAL_LOCAL_RANK=", "SHOAL_STORE=",
                                "SHOAL_STORE_SERVER="};
  for (const char* n : names)
    if (std::strncmp(entry, n, std::strlen(n)) == 0) return true;
  return false;
}

std::string describe(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    const char* name = sigabbrev_np(sig);
    return "was killed by signal " + std::to_string(sig) + (name ? std::string(" (SIG") + name + ")" : "");
  }
  return "ended with wait status " + std::to_string(status);
}

int exit_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  long n = 0;
  std::string store;
  int prog = -1;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      prog = i + 1;
      break;
    } else if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a == "--settings") {
      std::fputs(shoal::params::markdown_table().c_str(), stdout);
      return 0;
    } else if (a == "-n" || a == "--np") {
      if (i + 1 >= argc || !parse_int(argv[i + 1], 1, 65536, &n)) return usage_error("-n needs a number of ranks >= 1");
      ++i;
    } else if (a.rfind("-n", 0) == 0 && a.size() > 2 && a[2] != '-') {
      if (!parse_int(a.c_str() + 2, 1, 65536, &n)) return usage_error("-n needs a number of ranks >= 1");
    } else if (a == "--store") {
      if (i + 1 >= argc) return usage_error("--store needs host:port");
      store = argv[++i];
    } else if (a.rfind("--store=", 0) == 0) {
      store = a.substr(8);
    } else if (a.size() > 1 && a[0] == '-') {
      return usage_error("unknown option " + a);
    } else {
      prog = i;
      break;
    }
  }
  if (n < 1) return usage_error("missing -n N");
  if (prog < 0 || prog >= argc) return usage_error("missing PROGRAM");
  if (!store.empty()) {
    size_t colon = store.rfind(':');
    long port;
    if (colon == std::string::npos || colon == 0 || !parse_int(store.c_str() + colon + 1, 1, 65535, &port)) {
      return usage_error("--store must be host:port, got '" + store + "'");
    }
  }
  double grace_s = 10;
  try {
    grace_s = shoal::params::seconds("SHOAL_RUN_GRACE").value_or(grace_s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shoal-run: %s\n", e.what());
    return 2;
  }
  const auto grace = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(grace_s));

  // Block the signals we handle before any thread exists (the store server's thread inherits the
  // mask), and wait for them synchronously below. Children get the old mask back before exec.
  sigset_t handled, old_mask;
  sigemptyset(&handled);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigaddset(&handled, s);
  pthread_sigmask(SIG_BLOCK, &handled, &old_mask);

  std::shared_ptr<void> server;
  if (store.empty()) {
    // A token for the store served here, so that no other local user's process can use it
    // (unless the caller chose one): the server requires it, the ranks inherit it.
    if (!shoal::params::text("SHOAL_STORE_TOKEN")) {
      std::string tok = random_token();
      if (tok.empty()) {
        std::fprintf(stderr, "shoal-run: cannot read /dev/urandom for the store's token\n");
        return 1;
      }
      setenv("SHOAL_STORE_TOKEN", tok.c_str(), 1);
    }
    uint16_t port = 0;
    try {
      server = shoal::detail::start_store_server("127.0.0.1", 0, &port);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "shoal-run: cannot start the store: %s\n", e.what());
      return 1;
    }
    store = "127.0.0.1:" + std::to_string(port);
  }

  // Everything the children need is built before fork: after it, only async-signal-safe calls.
  std::vector<std::string> base_env;
  for (char** e = environ; *e; ++e)
    if (!is_ours(*e)) base_env.push_back(*e);
  std::vector<std::vector<std::string>> envs(n);
  std::vector<std::vector<char*>> envps(n);
  for (long r = 0; r < n; ++r) {
    envs[r] = base_env;
    envs[r].push_back("SHOAL_RANK=" + std::to_string(r));
    envs[r].push_back("SHOAL_WORLD_SIZE=" + std::to_string(n));
    envs[r].push_back("SHOAL_LOCAL_RANK=" + std::to_string(r));
    envs[r].push_back("SHOAL_STORE=" + store);
    envs[r].push_back("SHOAL_STORE_SERVER=0");
    for (auto& s : envs[r]) envps[r].push_back(s.data());
    envps[r].push_back(nullptr);
  }
  std::vector<char*> child_argv(argv + prog, argv + argc);
  child_argv.push_back(nullptr);
  std::string exec_fail = std::string("shoal-run: cannot execute '") + argv[prog] + "': ";

  const bool stdin_tty = isatty(0);
  int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);

  // Orphans of the ranks (a script's children) are re-parented to us and reaped below.
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  const pid_t self = getpid();
  std::vector<pid_t> pids(n, -1);
  std::vector<bool> alive(n, false);
  long running = 0;
  for (long r = 0; r < n; ++r) {
    pid_t pid = fork();
    if (pid < 0) {
      std::fprintf(stderr, "shoal-run: fork: %s\n", std::strerror(errno));
      for (long k = 0; k < r; ++k) kill(-pids[k], SIGKILL);
      while (wait(nullptr) > 0) {}
      return 1;
    }
    if (pid == 0) {
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the launcher
      if (getppid() != self) _exit(1);
      if (devnull >= 0 && (stdin_tty || r != 0)) dup2(devnull, 0);
      sigprocmask(SIG_SETMASK, &old_mask, nullptr);
      execvpe(child_argv[0], child_argv.data(), envps[r].data());
      int e = errno;
      (void)!write(2, exec_fail.data(), exec_fail.size());
      const char* msg = std::strerror(e);
      (void)!write(2, msg, std::strlen(msg));
      (void)!write(2, "\n", 1);
      _exit(127);
    }
    setpgid(pid, pid);  // as the child does: whichever runs first, the group exists before any kill
    pids[r] = pid;
    alive[r] = true;
    ++running;
  }

  int code = 0;
  long failed_rank = -1;
  bool have_deadline = false;
  Clock::time_point kill_at{};
  bool killed = false;
  auto start_grace = [&] {
    if (!have_deadline) {
      have_deadline = true;
      kill_at = Clock::now() + grace;
    }
  };

  while (running > 0) {
    // Reap whoever has ended (SIGCHLDs coalesce: always drain).
    for (;;) {
      int status = 0;
      pid_t pid = waitpid(-1, &status, WNOHANG);
      if (pid <= 0) break;
      long r = 0;
      while (r < n && pids[r] != pid) ++r;
      if (r == n || !alive[r]) continue;
      alive[r] = false;
      --running;
      int c = exit_code(status);
      if (c != 0) {
        if (!killed || failed_rank < 0) {  // not the stragglers we killed, unless nothing failed before
          std::fprintf(stderr, "shoal-run: rank %ld (pid %d) %s\n", r, (int)pid, describe(status).c_str());
        }
        if (failed_rank < 0) {
          failed_rank = r;
          code = c;
          if (running > 0 && !killed) {
            std::fprintf(stderr, "shoal-run: waiting up to %g s for the other %ld rank(s) to exit\n", grace_s, running);
          }
        }
        start_grace();
      }
    }
    if (running == 0) break;

    if (have_deadline && !killed && Clock::now() >= kill_at) {
      std::string who;
      for (long r = 0; r < n; ++r) {
        if (!alive[r]) continue;
        kill(-pids[r], SIGKILL);
        who += (who.empty() ? "" : ", ") + std::to_string(r);
      }
      std::fprintf(stderr, "shoal-run: killing rank(s) %s, still running %g s after %s\n", who.c_str(), grace_s,
                   failed_rank >= 0 ? ("rank " + std::to_string(failed_rank) + " failed").c_str()
                                    : "the launcher was signalled");
      killed = true;
    }

    siginfo_t info{};
    int sig;
    if (have_deadline && !killed) {
      auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(kill_at - Clock::now());
      if (left.count() < 0) left = std::chrono::nanoseconds(0);
      timespec ts{static_cast<time_t>(left.count() / 1000000000), static_cast<long>(left.count() % 1000000000)};
      sig = sigtimedwait(&handled, &info, &ts);
    } else {
      sig = sigwaitinfo(&handled, &info);
    }
    if (sig < 0) continue;  // timeout (EAGAIN) or EINTR: loop to reap / kill
    if (sig == SIGCHLD) continue;
    // SIGINT/SIGTERM/SIGHUP: to every running rank's process group.
    for (long r = 0; r < n; ++r)
      if (alive[r]) kill(-pids[r], sig);
    if (!have_deadline) {
      std::fprintf(stderr, "shoal-run: got SIG%s; ranks that have not exited in %g s will be killed\n",
                   sigabbrev_np(sig), grace_s);
    }
    start_grace();
  }

  if (devnull >= 0) close(devnull);
  server.reset();
  if (failed_rank >= 0 && n > 1) std::fprintf(stderr, "shoal-run: exit status %d (from rank %ld)\n", code, failed_rank);
  return code;
}
