// Multi-process test harness: runs a function on every rank of a fresh shoal group, one forked
// child process per rank, and reports each rank's outcome to the (gtest) parent.
//
//   shoal_test::run_ranks(4, {{"SHOAL_TRANSPORT", "tcp"}}, [](shoal::Communicator& c) {
//     ...                      // runs in each child, after the Communicator was constructed
//     SH_CHECK(x == y) << "x=" << x;   // throws shoal_test::CheckFailure: the rank fails
//   });
//
// Inside a child, never use gtest's EXPECT_/ASSERT_ macros (their failures would stay in the
// child): use SH_CHECK* (or throw anything). Children always leave through _exit and never
// return into gtest. Each run gets a fresh temporary directory holding the store (a FileStore, or
// a TcpStore whose server is rank 0 listening on port 0 and publishing its port through a file),
// the per-rank result files and nothing else; it is removed afterwards. The parent waits with an
// overall limit, kills every child still running when it passes and says which ranks hung.
#pragma once
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <sstream>
#include <stdexcept>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "shoal/communicator.h"
#include "shoal/error.h"
#include "shoal/store.h"
#include "shoal/types.h"

namespace shoal_test {

using Env = std::vector<std::pair<std::string, std::string>>;  // empty value: unset the variable

enum class StoreKind { file, tcp };

struct RunConfig {
  Env env;                                   // applied in each child before the Communicator
  StoreKind store = StoreKind::file;
  std::chrono::milliseconds limit{std::chrono::seconds(180)};  // overall limit of the run
  shoal::Options options{};                  // base for Options::from_env (read after env is set)
  // Runs in the child before the store and the Communicator are made (e.g. to die early).
  std::function<void(int rank)> before_construct;
  // While the children run, the parent scans /dev/shm for entries named shoal* and records
  // each new one with its mode (RunResult::shm_seen).
  bool watch_dev_shm = false;
};

// A config for a transport: "shm" (the default on one host: SHOAL_TRANSPORT unset) or "tcp"
// (SHOAL_TRANSPORT=tcp).
RunConfig transport_config(const std::string& transport);
// Whether a child of this process may read its memory with process_vm_readv: the same question
// a group's probe asks of its peers (single copy), asked without the library.
bool kernel_permits_cma();
// The same, with the group's timeout `timeout` whatever SHOAL_TIMEOUT says, the automatic choice
// of algorithms whatever SHOAL_ALGO says (unless clear_algo is false), and `limit` for the run.
RunConfig timed_config(const std::string& transport, std::chrono::milliseconds timeout, std::chrono::seconds limit,
                       bool clear_algo = true);

struct RankOutcome {
  int rank = -1;
  bool exited = false;    // exited normally (exit_code valid)
  int exit_code = -1;
  int signal = 0;         // killed by this signal (SIGKILL also when the harness killed it)
  bool hung = false;      // still running at the run's limit: the harness killed it
  bool reported = false;  // the child wrote a result file
  // "" on success; else the kind of what ended fn: "InvalidArgument", "Timeout", "PeerError",
  // "Error" (other shoal::Error), "CheckFailure", "std::exception", "unknown", or "setup" (the
  // store or the Communicator could not be made; message says why, kind in setup_kind).
  std::string error_kind;
  std::string setup_kind;
  std::string message;
  double fail_seconds = -1;   // seconds from the last mark_time() (or fn's start) to the throw
  double total_seconds = -1;  // seconds fn ran (until it returned or threw)
  double fail_at = 0;         // monotonic clock (seconds, see now_seconds()) at the throw
  std::string notes;          // what the child passed to note()

  bool ok() const { return exited && exit_code == 0 && error_kind.empty(); }
  std::string describe() const;  // one line, for messages
};

struct RunResult {
  std::vector<RankOutcome> ranks;
  std::map<std::string, unsigned> shm_seen;  // /dev/shm/shoal* name -> st_mode & 07777
  double seconds = 0;                        // wall time of the whole run
  std::vector<uint8_t> shared_copy;          // the first 64 KiB of shared_area() at the end
  std::vector<int> pids;                     // the children's process ids, by rank
  std::string describe() const;              // every rank, one line each
};

using RankFn = std::function<void(shoal::Communicator&)>;

// Runs fn on n ranks and returns every rank's outcome (for tests that expect failures).
RunResult run_ranks_outcomes(int n, const RunConfig& cfg, const RankFn& fn);
// A mismatched call: runs `call` on n ranks (the ranks' calls differ), then a barrier, and
// expects every rank to fail with PeerError within the op timeout + 3 s of the call's start,
// none hanging and none succeeding (a rank whose part of the call finished fails in the barrier).
void expect_every_rank_fails(int n, const RunConfig& cfg, std::chrono::milliseconds op_timeout, const RankFn& call);

// Runs fn on n ranks and fails the current gtest (ADD_FAILURE, with every failing rank's message
// and which ranks hung) unless every rank succeeded. Returns whether all succeeded.
bool run_ranks(int n, const RunConfig& cfg, const RankFn& fn);
bool run_ranks(int n, const Env& env, const RankFn& fn);

// Whether this build runs under a sanitizer (gcc's macros, clang's __has_feature), where
// everything is 5-20x slower: tests that loop for coverage do fewer rounds there.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

// Marks the test-side reference arithmetic (inputs, expected values, encodings, comparisons):
// not instrumented by the sanitizers, so that a sanitizer build spends its time checking the
// library rather than these per-element loops. Under ASan + UBSan they took about 80% of the
// collective matrix's time (a fake stack frame and a TLS lookup per call: perf on
// All/Collectives.Matrix/n8_shm_allreduce). They touch only the test's own vectors.
#define SHOAL_TEST_REFERENCE __attribute__((no_sanitize("address", "undefined", "thread")))

// ---- In the child ----------------------------------------------------------------------------

int my_rank();                   // this child's rank (-1 in the parent)
int my_size();
void mark_time();                // restarts the clock of RankOutcome::fail_seconds
double since_mark();             // seconds since mark_time() (or fn's start)
double now_seconds();            // CLOCK_MONOTONIC in seconds: comparable across the children
int open_sockets();              // sockets (listening or connected) this process holds now
void note(const std::string& s); // appended to RankOutcome::notes (one line each)
// 1 MiB of memory shared by the parent and every child of the current run (MAP_SHARED, zeroed
// before the fork): for flags and timestamps between ranks.
void* shared_area();
constexpr size_t kSharedAreaBytes = 1 << 20;
std::vector<int> group_pids();   // every rank's pid (complete once the Communicator is up)
std::string run_dir();           // the run's temporary directory

// ---- /dev/shm ---------------------------------------------------------------------------------

// Names of entries in /dev/shm starting with "shoal".
std::vector<std::string> list_dev_shm_shoal();
// Whether a /dev/shm entry may belong to one of `pids`: segment names of the form
// shoal-<creator pid>-... are attributed by that pid (so that tests running at the same time do
// not see each other's segments); any other name may belong to anybody, so it counts.
bool segment_may_belong_to(const std::string& name, const std::vector<int>& pids);

// ---- Typed buffers ----------------------------------------------------------------------------
// Test-side encodings, written independently of the library.

uint16_t f32_to_f16(float f);   // round to nearest even
float f16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);  // round to nearest even
float bf16_to_f32(uint16_t h);
bool is_float(shoal::DType dt);
bool is_signed(shoal::DType dt);  // floats and i8/i32/i64
size_t esize(shoal::DType dt);    // bytes per element, without the library
// buf[i] = v (v must be representable exactly in dt; integers wrap to the type's width).
void put_value(shoal::DType dt, void* buf, size_t i, int64_t v);
double get_double(shoal::DType dt, const void* buf, size_t i);  // any dtype, as a double
int64_t get_int(shoal::DType dt, const void* buf, size_t i);    // integer dtypes, sign/zero extended
std::string value_str(shoal::DType dt, const void* buf, size_t i);
// "" if the count elements are equal (floats compared by value, so -0 == +0; NaN never equal);
// else where the first mismatch is, the two values and how many elements differ.
std::string compare_buffers(shoal::DType dt, const void* got, const void* expected, size_t count);
uint64_t mix64(uint64_t x);  // splitmix64 finaliser
// A value exactly representable in dt derived from key, spread over the type's range (floats:
// integers within the exact range; bool: 0/1).
int64_t data_value(shoal::DType dt, uint64_t key);
// buf[i] = data_value(dt, mix64(seed * 0x9e3779b97f4a7c15 + i)) for i < count.
void fill_data(shoal::DType dt, void* buf, size_t count, uint64_t seed);
inline uint64_t data_key(uint64_t seed, size_t i) { return mix64(seed * 0x9e3779b97f4a7c15ull + i); }
const char* dt_name(shoal::DType dt);  // without the library

// ---- Checks that work in children ------------------------------------------------------------

class CheckFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Builds the message with <<, throws CheckFailure at the end of the full expression.
class CheckThrower {
 public:
  CheckThrower(const char* file, int line, const char* expr);
  CheckThrower(const CheckThrower&) = delete;
  ~CheckThrower() noexcept(false);
  template <class T>
  CheckThrower& operator<<(const T& v) {
    os_ << v;
    return *this;
  }

 private:
  std::ostringstream os_;
};

// Name of an exception's kind as in RankOutcome::error_kind.
std::string kind_of(std::exception_ptr e);
std::string what_of(std::exception_ptr e);

// Runs f; returns "" if it threw an exception of kind `kind` (e.g. "InvalidArgument"), else a
// description of what happened instead.
std::string expect_kind(const std::string& kind, const std::function<void()>& f);

// Whether `msg` names rank `r` ("rank 2", "peer 2", "rank=2", "peer #2", case-insensitive).
bool names_rank(const std::string& msg, int r);

// ---- Text ------------------------------------------------------------------------------------

std::string join(const std::vector<std::string>& v);  // "a, b, c"
std::string slurp(const std::string& path);           // a file's contents ("" if it cannot be read)

// ---- The environment ---------------------------------------------------------------------------

// Sets (or, with null, unsets) an environment variable of this process for its lifetime, then
// puts back what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_) setenv(name_.c_str(), old_.c_str(), 1);
    else unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_, old_;
  bool had_ = false;
};

// ---- Buffers with guard zones ------------------------------------------------------------------

// count elements of dt filled with kFill, between two guard zones that must stay untouched.
// data() is never null (a count of 0 still has room for one element).
class Buf {
 public:
  static constexpr size_t kGuard = 64;
  static constexpr uint8_t kFill = 0xA5, kGuardByte = 0xEE;
  Buf(shoal::DType dt, size_t count, uint8_t fill = kFill);
  uint8_t* data() { return v_.data() + kGuard; }
  const uint8_t* data() const { return v_.data() + kGuard; }
  size_t count() const { return count_; }
  std::string guards() const;           // "" if neither guard zone was written
  bool all_fill(size_t elems) const;    // the first elems elements still hold kFill

 private:
  size_t es_, count_;
  std::vector<uint8_t> v_;
};

// The first non-empty string of errs, or "".
std::string first_err(std::initializer_list<std::string> errs);

// ---- Many cases in one group -------------------------------------------------------------------

// Runs the cases of one forked group: a case that returns an error string (or throws
// InvalidArgument / CheckFailure, which leave the communicator usable) is recorded and the loop
// goes on; any other exception ends the group at once (the communicator is aborted by then),
// rethrown with the case's description. finish() throws CheckFailure listing the failed cases.
class Suite {
 public:
  explicit Suite(shoal::Communicator& c) : c(c), n(c.size()), rank(c.rank()) {}

  template <class F>
  void run(const std::string& desc, F&& f) {
    ++cases_;
    try {
      std::string e = f();
      if (!e.empty()) fail(desc + ": " + e);
    } catch (const shoal::InvalidArgument& e) {
      fail(desc + ": InvalidArgument: " + e.what());
    } catch (const CheckFailure& e) {
      fail(desc + ": " + e.what());
    } catch (...) {
      auto e = std::current_exception();
      throw std::runtime_error(desc + ": " + kind_of(e) + ": " + what_of(e) + summary());
    }
  }
  void finish();
  uint64_t seed() const { return uint64_t(cases_) * 101 + 17; }  // differs from case to case
  // The options of a case's op: algorithm `a`, as a blocking call on half the ranks of every
  // other case (the ranks of one op need not agree on it).
  shoal::CallOptions opts(shoal::Algo a) const {
    shoal::CallOptions o;
    o.algo = a;
    o.blocking = (cases_ + rank) % 2 == 1;
    return o;
  }
  int cases() const { return cases_; }

  shoal::Communicator& c;
  const int n;
  const int rank;

 private:
  void fail(const std::string& s);
  std::string summary() const;
  int cases_ = 0;
  size_t failed_ = 0;
  std::vector<std::string> failures_;
};

}  // namespace shoal_test

#define SH_CHECK(cond) \
  if (cond) {          \
  } else               \
    ::shoal_test::CheckThrower(__FILE__, __LINE__, #cond)

#define SH_CHECK_EQ(a, b) SH_CHECK((a) == (b)) << #a " = " << (a) << ", " #b " = " << (b) << ". "

// Evaluates stmt, which must throw an exception of kind `kind` (see kind_of).
#define SH_EXPECT_KIND(kind, stmt)                                                     \
  do {                                                                                 \
    std::string sh_err_ = ::shoal_test::expect_kind(kind, [&] { stmt; });              \
    SH_CHECK(sh_err_.empty()) << #stmt << ": expected " << kind << ", got " << sh_err_; \
  } while (0)
