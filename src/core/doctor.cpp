#include "shoal/doctor.h"

#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include "base/cpus.h"
#include "base/params.h"
#include "core/rendezvous.h"
#include "base/text.h"
#include "reduce/kernels.h"
#include "shoal/communicator.h"
#include "shoal/error.h"
#include "shoal/store.h"
#include "shoal/version.h"
#include "transport/cma.h"
#include "transport/fd_limit.h"
#include "transport/net_address.h"
#include "transport/tcp_link.h"

#ifndef SHOAL_BUILD_FLAGS
#define SHOAL_BUILD_FLAGS "unknown"
#endif

namespace shoal::doctor {
namespace {

using Items = std::vector<Item>;
using namespace reduce_impl;

std::string mib(double bytes) {
  char b[48];
  if (bytes >= double(1 << 30)) std::snprintf(b, sizeof b, "%.1f GiB", bytes / double(1 << 30));
  else std::snprintf(b, sizeof b, "%.1f MiB", bytes / double(1 << 20));
  return b;
}

std::string first_line_of(const char* path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

const char* compiler() {
#if defined(__clang__)
  return "clang " __clang_version__;
#elif defined(__GNUC__)
  return "gcc " __VERSION__;
#else
  return "unknown";
#endif
}

// Whether a child of this process may read its memory: a group's probe of each peer
// (cma::probe), asked here without a group.
bool single_copy_permitted() {
  static const uint64_t word = 0x5eed5eed5eedull;
  const pid_t parent = getpid();
  const pid_t child = fork();
  if (child < 0) return false;
  if (child == 0) _exit(cma::probe(parent, reinterpret_cast<uintptr_t>(&word), word) ? 0 : 1);
  int status = 0;
  pid_t got;
  while ((got = waitpid(child, &status, 0)) < 0 && errno == EINTR) {
  }
  return got == child && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

void shoal_section(Items& out) {
  out.push_back({"shoal", "version", SHOAL_VERSION_STRING});
  out.push_back({"shoal", "compiler", compiler()});
  out.push_back({"shoal", "build", SHOAL_BUILD_FLAGS});
}

void cpu_section(Items& out, int ranks) {
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  const int allowed = cpus_of_this_thread();  // as the rendezvous counts them
  out.push_back({"cpu", "model", cpu_model()});
  out.push_back({"cpu", "cores online", std::to_string(online)});
  out.push_back({"cpu", "cores this process may use", std::to_string(allowed)});
  // As the rendezvous decides, for ranks that all have this process's affinity.
  out.push_back({"cpu", "ranks per core",
                 ranks <= allowed ? std::to_string(ranks) + " ranks on " + std::to_string(allowed) +
                                        " cores: each rank may have a core, waiters spin briefly (SHOAL_SPIN_US)"
                                  : std::to_string(ranks) + " ranks share " + std::to_string(allowed) +
                                        " cores: waiters yield their core (SHOAL_YIELD_US), then sleep"});
  std::string compiled;
  for (auto* t : {scalar_kernels(), avx2_kernels(), avx512_kernels()})
    if (t) compiled += (compiled.empty() ? "" : ", ") + std::string(level_name(t->level));
  out.push_back({"cpu", "reduction kernels compiled", compiled});
  out.push_back({"cpu", "reduction kernels the CPU runs", std::string("up to ") + level_name(cpu_max_level())});
  out.push_back({"cpu", "reduction kernels in use", level_name(current_level())});
}

void shm_section(Items& out, int ranks) {
  const char* S = "shared memory";
  struct statvfs v {};
  if (statvfs("/dev/shm", &v) != 0) {
    out.push_back({S, "/dev/shm", std::string("cannot be read (") + std::strerror(errno) +
                                      "): ranks of this host cannot use shared memory; set SHOAL_TRANSPORT=tcp", true});
    return;
  }
  const double size = double(v.f_blocks) * v.f_frsize, avail = double(v.f_bavail) * v.f_frsize;
  out.push_back({S, "/dev/shm size", mib(size)});
  out.push_back({S, "/dev/shm free", mib(avail)});
  try {
    const ShmSizes s = shm_sizes(ranks);
    const double need = double(s.segment) * ranks;
    out.push_back({S, "segment per rank (" + std::to_string(ranks) + " ranks on this host)",
                   mib(double(s.segment)) + ": " + std::to_string(ranks - 1) + " inbound ring(s) of " + mib(double(s.ring)) +
                       ", scratch " + mib(double(s.scratch))});
    out.push_back({S, "all " + std::to_string(ranks) + " ranks", mib(need)});
    if (need > avail)
      out.push_back({S, "room",
                     "too little: " + std::to_string(ranks) + " ranks need " + mib(need) + ", " + mib(avail) +
                         " free. A group fails when it forms; give /dev/shm more room (docker --shm-size), set "
                         "SHOAL_SHM_SCRATCH or SHOAL_SHM_RING smaller, or SHOAL_TRANSPORT=tcp",
                     true});
  } catch (const Error& e) {
    out.push_back({S, "segment per rank", e.what(), true});
  }
}

void single_copy_section(Items& out) {
  const char* S = "single copy";
  const bool permitted = single_copy_permitted();
  const std::string yama = first_line_of("/proc/sys/kernel/yama/ptrace_scope");
  out.push_back({S, "kernel permits reading another process's memory", permitted ? "yes" : "no"});
  out.push_back({S, "Yama ptrace_scope", yama.empty() ? "(no Yama)" : yama});
  bool on = true;
  try {
    on = params::flag("SHOAL_CMA").value_or(true);
  } catch (const Error&) {  // reported with the settings
  }
  std::string used;
  if (!on) used = "no: SHOAL_CMA=0; every transfer takes two copies through shared memory";
  else if (!permitted)
    used = "no: the kernel refuses it here (Yama ptrace_scope above 0, a seccomp profile, or another user); "
           "every transfer takes two copies through shared memory";
  else
    used = "yes: broadcast, allgather, scatter and gather where the measured costs say, and alltoall's medium "
           "blocks when each rank has a core";
  out.push_back({S, "used", used});
}

void fd_section(Items& out, int ranks) {
  const char* S = "file descriptors";
  rlimit l{};
  getrlimit(RLIMIT_NOFILE, &l);
  auto lim = [](rlim_t v) { return v == RLIM_INFINITY ? std::string("unlimited") : std::to_string(v); };
  out.push_back({S, "ulimit -n (soft / hard)", lim(l.rlim_cur) + " / " + lim(l.rlim_max)});
  out.push_back({S, "open now", std::to_string(open_fd_count())});
  // A shared-memory peer costs a pidfd; a TCP peer on another host its streams and the control
  // connection.
  const int streams = TcpConfig{}.streams;
  const size_t shm_need = static_cast<size_t>(ranks - 1), tcp_need = static_cast<size_t>(ranks - 1) * (streams + 1);
  out.push_back({S, "a rank of " + std::to_string(ranks) + " needs",
                 std::to_string(shm_need) + " over shared memory, up to " + std::to_string(tcp_need) +
                     " over TCP to other hosts (" + std::to_string(streams) +
                     " streams and a control connection per peer)"});
  if (l.rlim_max != RLIM_INFINITY && l.rlim_max < tcp_need + 64)
    out.push_back({S, "room", "the hard limit " + lim(l.rlim_max) + " is below what a rank of " + std::to_string(ranks) +
                                  " may need over TCP: raise it (ulimit -Hn) or set SHOAL_TCP_STREAMS=1", true});
}

void network_section(Items& out) {
  const char* S = "network";
  std::vector<std::pair<std::string, std::string>> ifs;  // name, its addresses
  for (const NetInterface& i : list_interfaces()) {
    auto it = std::find_if(ifs.begin(), ifs.end(), [&](auto& x) { return x.first == i.name; });
    if (it == ifs.end()) it = ifs.insert(ifs.end(), {i.name, i.loopback ? "(loopback)" : ""});
    it->second = i.addr + (it->second.empty() ? "" : " ") + it->second;
  }
  for (auto& [name, addrs] : ifs) out.push_back({S, "interface " + name, addrs});
  for (bool elsewhere : {false, true}) {
    const std::string key = elsewhere ? "address advertised to other hosts" : "address advertised within this host";
    try {
      out.push_back({S, key, advertise_address("", elsewhere)});
    } catch (const Error& e) {
      out.push_back({S, key, e.what(), true});
    }
  }
}

void settings_section(Items& out) {
  const char* S = "settings";
  bool any = false;
  for (const params::Param& p : params::all()) {
    const auto shown = params::shown(p);
    if (!shown) continue;
    any = true;
    const std::string err = params::check(p);
    out.push_back({S, p.name, err.empty() ? *shown : err, !err.empty()});
  }
  for (const std::string& t : params::probable_typos()) {
    out.push_back({S, t.substr(0, t.find(' ')), "is not a shoal setting" + t.substr(t.find(' ')), true});
    any = true;
  }
  if (!any) out.push_back({S, "SHOAL_*", "none set: the defaults (`shoal-doctor --params` lists them)"});
}

std::string json_str(const std::string& s) { return "\"" + json_escape(s) + "\""; }

// ---- the trial group -----------------------------------------------------------------------------

double mean_us(Communicator& c, size_t count, int warmup, int iters) {
  std::vector<float> x(count, 1.0f), y(count);
  for (int i = 0; i < warmup; ++i) c.allreduce(x.data(), y.data(), count, DType::f32, ReduceOp::sum, {.blocking = true});
  c.barrier()->wait();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) c.allreduce(x.data(), y.data(), count, DType::f32, ReduceOp::sum, {.blocking = true});
  double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters, worst = 0;
  c.allreduce(&us, &worst, 1, DType::f64, ReduceOp::max, {.blocking = true});
  return worst;
}

// One rank of the trial: its lines ("key\tvalue\n", rank 0 only) go to `fd`.
void trial_rank(const std::string& dir, int rank, int ranks, double timeout_s, int fd) {
  std::string lines;
  try {
    Options o = Options::from_env({});
    o.timeout = std::chrono::milliseconds(static_cast<long long>(timeout_s * 1000));
    o.group_name = "doctor";
    Communicator c(std::make_shared<FileStore>(dir + "/store"), rank, ranks, o);
    for (int j = 1; j < ranks; ++j) lines += "rank 0 to rank " + std::to_string(j) + "\t" + c.transport_to(j) + "\n";
    lines += std::string("single copy\t") + (c.single_copy() ? "on" : "off") + "\n";
    char b[96];
    std::snprintf(b, sizeof b, "allreduce 4 KiB\t%.2f us\n", mean_us(c, 1024, 50, 2000));
    lines += b;
    const double us = mean_us(c, size_t(4) << 20, 2, 10);
    std::snprintf(b, sizeof b, "allreduce 16 MiB\t%.0f us (busbw %.2f GB/s)\n", us,
                  double(16 << 20) / us / 1e3 * 2.0 * (ranks - 1) / ranks);
    lines += b;
  } catch (const std::exception& e) {
    lines = "error\trank " + std::to_string(rank) + ": " + std::string(e.what()) + "\n";
  } catch (...) {
    lines = "error\trank " + std::to_string(rank) + ": an unknown exception\n";
  }
  if (rank == 0 || lines.rfind("error\t", 0) == 0) {
    for (size_t off = 0; off < lines.size();) {
      const ssize_t n = ::write(fd, lines.data() + off, lines.size() - off);
      if (n <= 0) break;
      off += static_cast<size_t>(n);
    }
  }
}

}  // namespace

Items machine(int ranks) {
  if (ranks < 1) throw InvalidArgument("shoal doctor: ranks must be >= 1, got " + std::to_string(ranks));
  Items out;
  shoal_section(out);
  cpu_section(out, ranks);
  shm_section(out, ranks);
  single_copy_section(out);
  fd_section(out, ranks);
  network_section(out);
  settings_section(out);
  return out;
}

Items trial(int ranks, double timeout_s) {
  if (ranks < 1) throw InvalidArgument("shoal doctor: ranks must be >= 1, got " + std::to_string(ranks));
  const std::string S = "trial group of " + std::to_string(ranks) + " ranks";
  int p[2];
  if (pipe(p) != 0) throw Error(std::string("shoal doctor: pipe: ") + std::strerror(errno));
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/shoal-doctor-XXXXXX";
  if (!mkdtemp(tmpl.data())) {
    close(p[0]);
    close(p[1]);
    throw Error("shoal doctor: cannot make a temporary directory " + tmpl + ": " + std::strerror(errno));
  }
  const std::string dir = tmpl;
  std::vector<pid_t> kids;
  for (int r = 0; r < ranks; ++r) {
    const pid_t k = fork();
    if (k == 0) {
      close(p[0]);
      trial_rank(dir, r, ranks, timeout_s, p[1]);
      _exit(0);
    }
    if (k > 0) kids.push_back(k);
  }
  close(p[1]);
  std::string got;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s + 10);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd pf{p[0], POLLIN, 0};
    if (left.count() <= 0) break;
    const int ready = ::poll(&pf, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) break;
    char buf[4096];
    const ssize_t n = ::read(p[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  close(p[0]);
  // The pipe's end comes as the ranks exit, a moment before they can be reaped; one still running
  // at the deadline is killed.
  bool killed = false;
  for (pid_t k : kids) {
    pid_t got;
    while ((got = waitpid(k, nullptr, WNOHANG)) == 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (got == 0) {
      kill(k, SIGKILL);
      killed = true;
      while (waitpid(k, nullptr, 0) < 0 && errno == EINTR) {
      }
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  Items out;
  if (static_cast<int>(kids.size()) < ranks) out.push_back({S, "error", "could not start the ranks (fork failed)", true});
  std::string errors;  // every rank's, in one item
  for (size_t a = 0; a < got.size();) {
    const size_t nl = got.find('\n', a), tab = got.find('\t', a);
    if (nl == std::string::npos || tab > nl) break;
    const std::string key = got.substr(a, tab - a), value = got.substr(tab + 1, nl - tab - 1);
    if (key == "error") errors += (errors.empty() ? "" : "; ") + value;
    else out.push_back({S, key, value});
    a = nl + 1;
  }
  if (killed) errors += (errors.empty() ? "" : "; ") + std::string("the group did not finish within ") +
                        std::to_string(int(timeout_s + 10)) + " s";
  if (!errors.empty()) out.push_back({S, "error", errors, true});
  return out;
}

std::string text(const Items& items) {
  std::string o, section;
  int warnings = 0;
  for (const Item& i : items) {
    if (i.section != section) {
      section = i.section;
      o += (o.empty() ? "" : "\n") + section + "\n";
    }
    o += (i.warning ? "! " : "  ") + i.key + ": " + i.value + "\n";
    warnings += i.warning;
  }
  o += "\n" + (warnings ? std::to_string(warnings) + " warning(s), marked with '!'" : std::string("no warnings")) + "\n";
  return o;
}

std::string json(const Items& items) {
  std::vector<std::string> order;
  for (const Item& i : items)
    if (std::find(order.begin(), order.end(), i.section) == order.end()) order.push_back(i.section);
  std::string o = "{\n  \"sections\": {";
  for (size_t s = 0; s < order.size(); ++s) {
    o += (s ? ",\n    " : "\n    ") + json_str(order[s]) + ": {";
    bool first = true;
    for (const Item& i : items) {
      if (i.section != order[s]) continue;
      o += (first ? "" : ", ") + json_str(i.key) + ": " + json_str(i.value);
      first = false;
    }
    o += "}";
  }
  o += "\n  },\n  \"warnings\": [";
  bool first = true;
  for (const Item& i : items) {
    if (!i.warning) continue;
    o += (first ? "" : ", ") + json_str(i.section + ": " + i.key + ": " + i.value);
    first = false;
  }
  return o + "]\n}\n";
}

std::string settings() { return params::markdown_table(); }

}  // namespace shoal::doctor
