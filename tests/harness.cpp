#include "harness.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <memory>
#include <regex>
#include <set>
#include <thread>

namespace shoal_test {
namespace {

int g_rank = -1;
int g_size = 0;
double g_mark = 0;
std::string g_notes;
void* g_shared = nullptr;
std::string g_run_dir;

struct ChildResult {
  std::string kind, setup_kind, message, notes;
  double fail_seconds = -1, total_seconds = -1, fail_at = 0;
};

// The harness's own part of the shared mapping (its last 4 KiB): the children's pids.
constexpr size_t kPidTableOffset = kSharedAreaBytes - 4096;
int* pid_table() { return reinterpret_cast<int*>(static_cast<uint8_t*>(g_shared) + kPidTableOffset); }

void put_field(std::string& out, const char* key, const std::string& v) {
  out += key;
  out += ' ';
  out += std::to_string(v.size());
  out += '\n';
  out += v;
  out += '\n';
}

std::string num(double d) {
  char b[64];
  std::snprintf(b, sizeof b, "%.6f", d);
  return b;
}

// Writes the result file atomically (write + rename), with plain syscalls.
void write_result(int rank, const ChildResult& r) {
  std::string s;
  put_field(s, "kind", r.kind);
  put_field(s, "setup_kind", r.setup_kind);
  put_field(s, "message", r.message);
  put_field(s, "notes", r.notes);
  put_field(s, "fail_seconds", num(r.fail_seconds));
  put_field(s, "total_seconds", num(r.total_seconds));
  put_field(s, "fail_at", num(r.fail_at));
  std::string tmp = g_run_dir + "/rank" + std::to_string(rank) + ".tmp";
  std::string fin = g_run_dir + "/rank" + std::to_string(rank) + ".res";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return;
  size_t off = 0;
  while (off < s.size()) {
    ssize_t w = ::write(fd, s.data() + off, s.size() - off);
    if (w <= 0) {
      if (w < 0 && errno == EINTR) continue;
      break;
    }
    off += size_t(w);
  }
  ::close(fd);
  ::rename(tmp.c_str(), fin.c_str());
}

bool read_result(const std::string& dir, int rank, ChildResult& r) {
  std::ifstream in(dir + "/rank" + std::to_string(rank) + ".res", std::ios::binary);
  if (!in) return false;
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t pos = 0;
  std::map<std::string, std::string> f;
  while (pos < all.size()) {
    size_t sp = all.find(' ', pos);
    size_t nl = all.find('\n', pos);
    if (sp == std::string::npos || nl == std::string::npos || sp > nl) break;
    std::string key = all.substr(pos, sp - pos);
    size_t len = std::strtoull(all.c_str() + sp + 1, nullptr, 10);
    if (nl + 1 + len > all.size()) break;
    f[key] = all.substr(nl + 1, len);
    pos = nl + 1 + len + 1;
  }
  r.kind = f["kind"];
  r.setup_kind = f["setup_kind"];
  r.message = f["message"];
  r.notes = f["notes"];
  r.fail_seconds = std::atof(f["fail_seconds"].c_str());
  r.total_seconds = std::atof(f["total_seconds"].c_str());
  r.fail_at = std::atof(f["fail_at"].c_str());
  return true;
}

std::shared_ptr<shoal::Store> make_store(int rank, const RunConfig& cfg) {
  if (cfg.store == StoreKind::file) return std::make_shared<shoal::FileStore>(g_run_dir + "/store");
  std::string port_file = g_run_dir + "/port";
  if (rank == 0) {
    auto s = std::make_shared<shoal::TcpStore>("127.0.0.1", 0, true, cfg.limit);
    std::string tmp = port_file + ".tmp";
    {
      std::ofstream out(tmp);
      out << s->port() << "\n";
    }
    ::rename(tmp.c_str(), port_file.c_str());
    return s;
  }
  auto deadline = std::chrono::steady_clock::now() + cfg.limit;
  for (;;) {
    std::ifstream in(port_file);
    unsigned port = 0;
    if (in && (in >> port) && port != 0)
      return std::make_shared<shoal::TcpStore>("127.0.0.1", uint16_t(port), false, cfg.limit);
    if (std::chrono::steady_clock::now() > deadline)
      throw std::runtime_error("rank 0 never published the TcpStore port in " + port_file);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

[[noreturn]] void child_main(int rank, int n, pid_t parent, const RunConfig& cfg, const RankFn& fn) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(99);
  pid_table()[rank] = ::getpid();
  g_rank = rank;
  g_size = n;
  g_notes.clear();
  ChildResult res;
  int code = 0;
  try {
    for (const auto& [k, v] : cfg.env) {
      if (v.empty())
        ::unsetenv(k.c_str());
      else
        ::setenv(k.c_str(), v.c_str(), 1);
    }
    if (cfg.before_construct) cfg.before_construct(rank);
    std::shared_ptr<shoal::Store> store = make_store(rank, cfg);
    shoal::Options opts = shoal::Options::from_env(cfg.options);
    auto comm = std::make_unique<shoal::Communicator>(store, rank, n, opts);
    double start = now_seconds();
    g_mark = start;
    try {
      fn(*comm);
      res.total_seconds = now_seconds() - start;
    } catch (...) {
      double t = now_seconds();
      auto e = std::current_exception();
      res.kind = kind_of(e);
      res.message = what_of(e);
      res.fail_seconds = t - g_mark;
      res.total_seconds = t - start;
      res.fail_at = t;
      code = 1;
    }
    res.notes = g_notes;
    // Report before the Communicator goes away, so that a destructor that hangs still leaves
    // the outcome of fn behind.
    write_result(rank, res);
    comm.reset();
  } catch (...) {
    auto e = std::current_exception();
    double t = now_seconds();
    res.kind = "setup";
    res.setup_kind = kind_of(e);
    res.message = "setting up the rank failed: " + what_of(e);
    res.fail_at = t;
    res.notes = g_notes;
    code = 3;
  }
  write_result(rank, res);
  ::_exit(code);
}

std::string describe_status(const RankOutcome& o) {
  if (o.hung) return "HUNG (killed by the harness at the run's limit)";
  if (o.signal) return std::string("killed by signal ") + std::to_string(o.signal) + " (" + strsignal(o.signal) + ")";
  if (o.exited) return "exit " + std::to_string(o.exit_code);
  return "?";
}

}  // namespace

std::string RankOutcome::describe() const {
  std::ostringstream os;
  os << "rank " << rank << ": " << describe_status(*this);
  if (!reported) {
    os << ", no report";
  } else if (error_kind.empty()) {
    os << ", ok (" << num(total_seconds) << " s)";
  } else {
    os << ", " << error_kind;
    if (!setup_kind.empty()) os << "/" << setup_kind;
    os << " after " << num(fail_seconds) << " s: " << message;
  }
  return os.str();
}

std::string RunResult::describe() const {
  std::string s;
  for (const auto& r : ranks) s += "  " + r.describe() + "\n";
  return s;
}

bool kernel_permits_cma() {
  static volatile uint64_t word = 0x5eed5eed5eedull;
  const pid_t parent = getpid();
  const pid_t child = fork();
  if (child == 0) {
    uint64_t got = 0;
    iovec l{&got, sizeof got}, r{const_cast<uint64_t*>(&word), sizeof got};
    _exit(process_vm_readv(parent, &l, 1, &r, 1, 0) == sizeof got && got == word ? 0 : 1);
  }
  int status = 0;
  waitpid(child, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

RunConfig transport_config(const std::string& transport) {
  RunConfig cfg;
  if (transport == "tcp")
    cfg.env.push_back({"SHOAL_TRANSPORT", "tcp"});
  else
    cfg.env.push_back({"SHOAL_TRANSPORT", ""});
  return cfg;
}

RunConfig timed_config(const std::string& transport, std::chrono::milliseconds timeout, std::chrono::seconds limit,
                       bool clear_algo) {
  RunConfig cfg = transport_config(transport);
  cfg.options.timeout = timeout;
  cfg.env.push_back({"SHOAL_TIMEOUT", ""});
  if (clear_algo) cfg.env.push_back({"SHOAL_ALGO", ""});
  cfg.limit = limit;
  return cfg;
}

std::vector<std::string> list_dev_shm_shoal() {
  std::vector<std::string> out;
  DIR* d = ::opendir("/dev/shm");
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    if (std::strncmp(e->d_name, "shoal", 5) == 0) out.push_back(e->d_name);
  }
  ::closedir(d);
  return out;
}

RunResult run_ranks_outcomes(int n, const RunConfig& cfg, const RankFn& fn) {
  RunResult result;
  result.ranks.resize(size_t(n));
  char tmpl[] = "/tmp/shoal-test-XXXXXX";
  if (!::mkdtemp(tmpl)) throw std::runtime_error(std::string("mkdtemp: ") + std::strerror(errno));
  g_run_dir = tmpl;
  g_shared = ::mmap(nullptr, kSharedAreaBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (g_shared == MAP_FAILED) throw std::runtime_error(std::string("mmap: ") + std::strerror(errno));

  std::set<std::string> shm_before;
  if (cfg.watch_dev_shm)
    for (auto& s : list_dev_shm_shoal()) shm_before.insert(s);

  std::fflush(stdout);
  std::fflush(stderr);
  pid_t parent = ::getpid();
  std::vector<pid_t> pids(size_t(n), -1);
  auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < n; ++r) {
    pid_t p = ::fork();
    if (p == 0) child_main(r, n, parent, cfg, fn);
    if (p < 0) {
      for (int q = 0; q < r; ++q) ::kill(pids[q], SIGKILL);
      for (int q = 0; q < r; ++q) ::waitpid(pids[q], nullptr, 0);
      throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
    }
    pids[r] = p;
  }
  result.pids.assign(pids.begin(), pids.end());

  auto deadline = t0 + cfg.limit;
  int left = n;
  std::vector<bool> done(size_t(n), false);
  while (left > 0) {
    for (int r = 0; r < n; ++r) {
      if (done[r]) continue;
      int st = 0;
      pid_t w = ::waitpid(pids[r], &st, WNOHANG);
      if (w == pids[r]) {
        done[r] = true;
        --left;
        auto& o = result.ranks[r];
        if (WIFEXITED(st)) {
          o.exited = true;
          o.exit_code = WEXITSTATUS(st);
        } else if (WIFSIGNALED(st)) {
          o.signal = WTERMSIG(st);
        }
      }
    }
    if (left == 0) break;
    if (cfg.watch_dev_shm) {
      for (auto& name : list_dev_shm_shoal()) {
        if (shm_before.count(name) || result.shm_seen.count(name)) continue;
        struct stat sb;
        if (::stat(("/dev/shm/" + name).c_str(), &sb) == 0) result.shm_seen[name] = sb.st_mode & 07777;
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < n; ++r) {
        if (done[r]) continue;
        ::kill(pids[r], SIGKILL);
        int st = 0;
        ::waitpid(pids[r], &st, 0);
        auto& o = result.ranks[r];
        o.hung = true;
        o.signal = SIGKILL;
        done[r] = true;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(cfg.watch_dev_shm ? 200 : 2000));
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  for (int r = 0; r < n; ++r) {
    auto& o = result.ranks[r];
    o.rank = r;
    ChildResult cr;
    if (read_result(g_run_dir, r, cr)) {
      o.reported = true;
      o.error_kind = cr.kind;
      o.setup_kind = cr.setup_kind;
      o.message = cr.message;
      o.notes = cr.notes;
      o.fail_seconds = cr.fail_seconds;
      o.total_seconds = cr.total_seconds;
      o.fail_at = cr.fail_at;
    }
  }
  result.shared_copy.assign(static_cast<uint8_t*>(g_shared), static_cast<uint8_t*>(g_shared) + 65536);
  ::munmap(g_shared, kSharedAreaBytes);
  g_shared = nullptr;
  std::error_code ec;
  std::filesystem::remove_all(g_run_dir, ec);
  g_run_dir.clear();
  return result;
}

bool run_ranks(int n, const RunConfig& cfg, const RankFn& fn) {
  RunResult res = run_ranks_outcomes(n, cfg, fn);
  bool all_ok = true;
  std::string hung;
  for (const auto& o : res.ranks) {
    if (!o.ok()) all_ok = false;
    if (o.hung) hung += (hung.empty() ? "" : ", ") + std::to_string(o.rank);
  }
  if (!all_ok) {
    std::string failing;
    for (const auto& o : res.ranks)
      if (!o.ok()) failing += "  " + o.describe() + "\n";
    ADD_FAILURE() << "run of " << n << " ranks failed after " << num(res.seconds) << " s"
                  << (hung.empty() ? std::string() : "; ranks that hung: " + hung) << "\n"
                  << failing;
  }
  return all_ok;
}

void expect_every_rank_fails(int n, const RunConfig& cfg, std::chrono::milliseconds op_timeout, const RankFn& call) {
  RunResult res = run_ranks_outcomes(n, cfg, [&](shoal::Communicator& c) {
    mark_time();
    call(c);
    c.barrier()->wait();
    SH_CHECK(false) << "the mismatched call and a barrier after it both succeeded on rank " << c.rank();
  });
  for (const auto& o : res.ranks) {
    SCOPED_TRACE("rank " + std::to_string(o.rank));
    EXPECT_FALSE(o.hung) << res.describe();
    EXPECT_EQ(o.error_kind, "PeerError") << res.describe();
    EXPECT_LT(o.fail_seconds, std::chrono::duration<double>(op_timeout).count() + 3.0) << res.describe();
  }
}

bool run_ranks(int n, const Env& env, const RankFn& fn) {
  RunConfig cfg;
  cfg.env = env;
  return run_ranks(n, cfg, fn);
}

int my_rank() { return g_rank; }
int my_size() { return g_size; }

double now_seconds() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

int open_sockets() {
  int n = 0;
  for (auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    struct stat st;
    if (::stat(e.path().c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) ++n;
  }
  return n;
}

void mark_time() { g_mark = now_seconds(); }
double since_mark() { return now_seconds() - g_mark; }

void note(const std::string& s) {
  g_notes += s;
  g_notes += '\n';
}

void* shared_area() { return g_shared; }

std::vector<int> group_pids() {
  std::vector<int> v;
  for (int r = 0; r < g_size; ++r) v.push_back(pid_table()[r]);
  return v;
}

bool segment_may_belong_to(const std::string& name, const std::vector<int>& pids) {
  static const std::regex re("^shoal[-_.]([0-9]+)[-_.].*");
  std::smatch m;
  if (!std::regex_match(name, m, re)) return true;
  int pid = std::atoi(m[1].str().c_str());
  return std::find(pids.begin(), pids.end(), pid) != pids.end();
}
std::string run_dir() { return g_run_dir; }

CheckThrower::CheckThrower(const char* file, int line, const char* expr) {
  const char* base = std::strrchr(file, '/');
  os_ << (base ? base + 1 : file) << ":" << line << ": check failed: " << expr << ". ";
}

CheckThrower::~CheckThrower() noexcept(false) { throw CheckFailure(os_.str()); }

std::string kind_of(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const shoal::InvalidArgument&) {
    return "InvalidArgument";
  } catch (const shoal::Timeout&) {
    return "Timeout";
  } catch (const shoal::PeerError&) {
    return "PeerError";
  } catch (const shoal::Error&) {
    return "Error";
  } catch (const CheckFailure&) {
    return "CheckFailure";
  } catch (const std::exception&) {
    return "std::exception";
  } catch (...) {
    return "unknown";
  }
}

std::string what_of(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "(not a std::exception)";
  }
}

std::string expect_kind(const std::string& kind, const std::function<void()>& f) {
  try {
    f();
  } catch (...) {
    auto e = std::current_exception();
    std::string k = kind_of(e);
    if (k == kind) return "";
    return k + ": " + what_of(e);
  }
  return "no exception";
}

bool names_rank(const std::string& msg, int r) {
  std::regex re("(rank|peer)\\s*[#=:]?\\s*" + std::to_string(r) + "(?![0-9])", std::regex::icase);
  return std::regex_search(msg, re);
}

}  // namespace shoal_test

// ---- Typed buffers --------------------------------------------------------------------------

namespace shoal_test {
using shoal::DType;

SHOAL_TEST_REFERENCE uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
  if (absx == 0x7f800000u) return uint16_t(sign | 0x7c00u);
  int32_t exp = int32_t((absx >> 23) & 0xff) - 127 + 15;
  uint32_t mant = absx & 0x7fffffu;
  if (exp >= 31) return uint16_t(sign | 0x7c00u);
  if (exp <= 0) {
    if (exp < -10) return uint16_t(sign);
    mant |= 0x800000u;
    uint32_t shift = uint32_t(14 - exp);
    uint32_t h = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) ++h;
    return uint16_t(sign | h);
  }
  uint32_t h = (uint32_t(exp) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) ++h;
  return uint16_t(sign | h);
}

SHOAL_TEST_REFERENCE float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  uint32_t x;
  if (exp == 0) {
    float v = std::ldexp(float(mant), -24);
    return sign ? -v : v;
  } else if (exp == 31) {
    x = sign | 0x7f800000u | (mant << 13);
  } else {
    x = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

SHOAL_TEST_REFERENCE uint16_t f32_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t(((x >> 16) & 0x8000u) | 0x7fc0u);
  x += 0x7fffu + ((x >> 16) & 1);
  return uint16_t(x >> 16);
}

SHOAL_TEST_REFERENCE float bf16_to_f32(uint16_t h) {
  uint32_t x = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

SHOAL_TEST_REFERENCE bool is_float(DType dt) {
  return dt == DType::f16 || dt == DType::bf16 || dt == DType::f32 || dt == DType::f64;
}
SHOAL_TEST_REFERENCE bool is_signed(DType dt) { return is_float(dt) || dt == DType::i8 || dt == DType::i32 || dt == DType::i64; }

SHOAL_TEST_REFERENCE size_t esize(DType dt) {
  switch (dt) {
    case DType::f16:
    case DType::bf16:
      return 2;
    case DType::f32:
    case DType::i32:
      return 4;
    case DType::f64:
    case DType::i64:
      return 8;
    case DType::i8:
    case DType::u8:
    case DType::boolean:
      return 1;
  }
  return 0;
}

const char* dt_name(DType dt) {
  switch (dt) {
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::i8: return "i8";
    case DType::u8: return "u8";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::boolean: return "bool";
  }
  return "?";
}

SHOAL_TEST_REFERENCE void put_value(DType dt, void* buf, size_t i, int64_t v) {
  auto* p = static_cast<uint8_t*>(buf);
  switch (dt) {
    case DType::f16: {
      uint16_t h = f32_to_f16(float(v));
      std::memcpy(p + 2 * i, &h, 2);
      break;
    }
    case DType::bf16: {
      uint16_t h = f32_to_bf16(float(v));
      std::memcpy(p + 2 * i, &h, 2);
      break;
    }
    case DType::f32: {
      float f = float(v);
      std::memcpy(p + 4 * i, &f, 4);
      break;
    }
    case DType::f64: {
      double d = double(v);
      std::memcpy(p + 8 * i, &d, 8);
      break;
    }
    case DType::i8:
    case DType::u8:
      p[i] = uint8_t(v);
      break;
    case DType::boolean:
      p[i] = v != 0 ? 1 : 0;
      break;
    case DType::i32: {
      int32_t x = int32_t(uint32_t(v));
      std::memcpy(p + 4 * i, &x, 4);
      break;
    }
    case DType::i64:
      std::memcpy(p + 8 * i, &v, 8);
      break;
  }
}

SHOAL_TEST_REFERENCE int64_t get_int(DType dt, const void* buf, size_t i) {
  const auto* p = static_cast<const uint8_t*>(buf);
  switch (dt) {
    case DType::i8:
      return int8_t(p[i]);
    case DType::u8:
    case DType::boolean:
      return p[i];
    case DType::i32: {
      int32_t x;
      std::memcpy(&x, p + 4 * i, 4);
      return x;
    }
    case DType::i64: {
      int64_t x;
      std::memcpy(&x, p + 8 * i, 8);
      return x;
    }
    default:
      return int64_t(get_double(dt, buf, i));
  }
}

SHOAL_TEST_REFERENCE double get_double(DType dt, const void* buf, size_t i) {
  const auto* p = static_cast<const uint8_t*>(buf);
  switch (dt) {
    case DType::f16: {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      return f16_to_f32(h);
    }
    case DType::bf16: {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      return bf16_to_f32(h);
    }
    case DType::f32: {
      float f;
      std::memcpy(&f, p + 4 * i, 4);
      return f;
    }
    case DType::f64: {
      double d;
      std::memcpy(&d, p + 8 * i, 8);
      return d;
    }
    default:
      return double(get_int(dt, buf, i));
  }
}

std::string value_str(DType dt, const void* buf, size_t i) {
  std::ostringstream os;
  if (is_float(dt)) {
    os << get_double(dt, buf, i);
  } else {
    os << get_int(dt, buf, i);
  }
  const auto* p = static_cast<const uint8_t*>(buf) + esize(dt) * i;
  os << " (0x";
  char b[4];
  for (size_t k = esize(dt); k-- > 0;) {
    std::snprintf(b, sizeof b, "%02x", p[k]);
    os << b;
  }
  os << ")";
  return os.str();
}

SHOAL_TEST_REFERENCE std::string compare_buffers(DType dt, const void* got, const void* expected, size_t count) {
  size_t bad = 0, first = 0;
  const size_t es = esize(dt);
  const auto* g = static_cast<const uint8_t*>(got);
  const auto* e = static_cast<const uint8_t*>(expected);
  if (count == 0) return "";
  if (std::memcmp(g, e, count * es) == 0) return "";
  for (size_t i = 0; i < count; ++i) {
    bool eq;
    if (is_float(dt)) {
      eq = get_double(dt, got, i) == get_double(dt, expected, i);
    } else {
      eq = std::memcmp(g + i * es, e + i * es, es) == 0;
    }
    if (!eq) {
      if (bad == 0) first = i;
      ++bad;
    }
  }
  if (bad == 0) return "";
  std::ostringstream os;
  os << bad << " of " << count << " elements differ; first at index " << first << ": got "
     << value_str(dt, got, first) << ", expected " << value_str(dt, expected, first);
  return os.str();
}

SHOAL_TEST_REFERENCE uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

SHOAL_TEST_REFERENCE int64_t data_value(DType dt, uint64_t key) {
  switch (dt) {
    case DType::f16:
      return int64_t(key % 4095) - 2047;
    case DType::bf16:
      return int64_t(key % 511) - 255;
    case DType::f32:
      return int64_t(key % (1ull << 25)) - (1ll << 24);
    case DType::f64:
      return int64_t(key % (1ull << 54)) - (1ll << 53);
    case DType::boolean:
      return int64_t(key >> 63);
    default:
      return int64_t(key);  // wraps to the width in put_value
  }
}

SHOAL_TEST_REFERENCE void fill_data(DType dt, void* buf, size_t count, uint64_t seed) {
  for (size_t i = 0; i < count; ++i) put_value(dt, buf, i, data_value(dt, data_key(seed, i)));
}

}  // namespace shoal_test

namespace shoal_test {

Buf::Buf(shoal::DType dt, size_t count, uint8_t fill) : es_(esize(dt)), count_(count) {
  v_.assign(kGuard + std::max<size_t>(count, 1) * es_ + kGuard, fill);
  std::memset(v_.data(), kGuardByte, kGuard);
  std::memset(v_.data() + v_.size() - kGuard, kGuardByte, kGuard);
}

std::string Buf::guards() const {
  for (size_t i = 0; i < kGuard; ++i)
    if (v_[i] != kGuardByte) return "wrote before the start of a buffer";
  for (size_t i = v_.size() - kGuard; i < v_.size(); ++i)
    if (v_[i] != kGuardByte) return "wrote past the end of a buffer";
  if (count_ == 0)
    for (size_t i = 0; i < es_; ++i)
      if (data()[i] != kFill) return "wrote into a buffer of 0 elements";
  return "";
}

bool Buf::all_fill(size_t elems) const {
  for (size_t i = 0; i < elems * es_; ++i)
    if (data()[i] != kFill) return false;
  return true;
}

std::string first_err(std::initializer_list<std::string> errs) {
  for (auto& e : errs)
    if (!e.empty()) return e;
  return "";
}

void Suite::finish() {
  note("cases: " + std::to_string(cases_));
  if (!failures_.empty()) throw CheckFailure(summary());
}

void Suite::fail(const std::string& s) {
  if (failures_.size() < 40) failures_.push_back(s);
  ++failed_;
}

std::string Suite::summary() const {
  if (failures_.empty()) return "";
  std::string s = "\n" + std::to_string(failed_) + " of " + std::to_string(cases_) + " cases failed on rank " +
                  std::to_string(rank) + ":";
  for (auto& f : failures_) s += "\n    " + f;
  if (failed_ > failures_.size()) s += "\n    ...";
  return s;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace shoal_test
