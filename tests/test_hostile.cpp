// Hostile connections while the group is working (issue 5): 4 ranks (separate processes) run
// rounds of checked collectives over TCP (SHOAL_TRANSPORT=tcp, a TcpStore served by rank 0),
// while a process forked by the test hammers every listening port it can learn:
//
//  - each rank's TCP transport port (read from the store keys "shoal/shoal/0/tcp/<r>" where the
//    ranks advertised them). A rank's listener closes once it is connected to every peer (an
//    all-to-all before the hammer starts connects every pair), so every attempt must be
//    refused (connect fails, or the connection is closed at once) — whatever it would have sent:
//    nothing, a wrong secret, garbage, a truncated hello, a frame header with a huge length, and
//    many connections at once;
//  - the store server's port (which stays up during the work, for abort publication): garbage,
//    frames that are not a HELLO, a HELLO with a bad magic, a length field over the 64 MiB limit,
//    a frame too short to be one, an unknown command and a malformed GET after a valid HELLO —
//    each must be dropped promptly and logged; silent connections, truncated frames and
//    slowloris-style partial frames (including ones that announce a 64 MiB frame, before and
//    after a HELLO) held open through the round; 200 connections opened at once.
//
// Asserted: every result equals a reference each rank computes locally from every rank's inputs,
// no op fails, the run ends in bounded time, rank 0 (which hosts the store server) does not grow
// by more than 48 MiB, every rank-port attempt was refused, every store probe that must be
// dropped was, and rank 0's log names the drops.
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"
#include "store_frames.h"

using namespace shoal;
using namespace shoal_test;
using namespace std::chrono_literals;

namespace {

constexpr int kRanks = 4;
constexpr int kHammerRounds = 10;     // full rounds of attacks the ranks must overlap with
constexpr int kMinOpRounds = 100;     // rounds of collectives the ranks run at least, time allowing
// ... and must have run: a sanitizer build beside other tests can be 10x slower (TSan with -j2:
// 73 rounds in 35 s), and the point is that the hammer's rounds overlapped with checked work.
constexpr int kMinOpRoundsSlow = 20;
constexpr double kMaxOpSeconds = 35;  // the ranks give up waiting for the hammer after this (TSan: ~18 s for 100 rounds)
// Growth of the store server's RSS over the whole hammering. Under ASan, freed memory sits in its
// quarantine (256 MiB by default) rather than going back, so every dropped connection's buffers
// add up to that much: `make asan` measured 315 MiB of growth. The bound there only catches gross
// growth; LeakSanitizer, at each process's exit, is what checks for leaks in that build.
constexpr long kRssLimitKb = (kSanitized ? 512 : 48) * 1024;

// Between the test process, the hammer process and the ranks: a MAP_SHARED mapping made before the
// fork, so that every process sees it.
struct Shared {
  std::atomic<int> phase;  // 0 set-up, 1 targets published (ops running), 2 hammer did its rounds, 3 ops over
  std::atomic<int> store_port;
  std::atomic<int> tcp_port[kRanks];
  std::atomic<long> rss_base_kb, rss_peak_kb;  // rank 0's
  std::atomic<int> op_rounds;
  std::atomic<int> rank0_pid;
  // Hammer counters.
  std::atomic<int> rounds;
  std::atomic<long> rank_attempts, rank_refused, rank_accepted;
  std::atomic<long> store_probes, store_dropped;
  std::atomic<long> store_held, store_many;
  char failure[512];  // the hammer's first unexpected event
};
Shared* g_sh = nullptr;

void hammer_fail(const std::string& s) {
  static std::atomic<bool> once{false};
  if (once.exchange(true)) return;
  std::snprintf(g_sh->failure, sizeof g_sh->failure, "%s", s.c_str());
}

long rss_kb() {
  std::ifstream f("/proc/self/statm");
  long size = 0, res = 0;
  f >> size >> res;
  return res * (::sysconf(_SC_PAGESIZE) / 1024);
}

// ---- The ranks' work ----------------------------------------------------------------------------

uint32_t val(int rank, int round, int op, size_t i) {
  return static_cast<uint32_t>(mix64((uint64_t(rank) << 48) ^ (uint64_t(round) << 32) ^ (uint64_t(op) << 24) ^ i));
}

std::vector<uint32_t> input(int rank, int round, int op, size_t count) {
  std::vector<uint32_t> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = val(rank, round, op, i);
  return v;
}

std::string mismatch(const char* what, int round, size_t count, const std::vector<uint32_t>& got,
                     const std::vector<uint32_t>& want) {
  for (size_t i = 0; i < want.size(); ++i)
    if (got[i] != want[i]) {
      std::ostringstream os;
      os << what << " round " << round << " count " << count << ": element " << i << " is " << got[i]
         << ", expected " << want[i];
      return os.str();
    }
  return "";
}

// One round of collectives (i32, sum wraps like uint32), every result checked.
void one_round(Communicator& c, int round) {
  const int n = c.size(), me = c.rank();
  static const size_t kCounts[] = {257, 70001, (1u << 18) + 7};  // the last is > 512 KiB: striped over the streams
  static const Algo kAlgos[] = {Algo::automatic, Algo::ring, Algo::bde, Algo::mst};
  const size_t count = kCounts[round % 3];
  const DType dt = DType::i32;

  {  // allreduce
    auto in = input(me, round, 0, count);
    std::vector<uint32_t> out(count), want(count, 0);
    c.allreduce(in.data(), out.data(), count, dt, ReduceOp::sum, {kAlgos[round % 4]})->wait();
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < count; ++i) want[i] += val(r, round, 0, i);
    std::string e = mismatch("allreduce", round, count, out, want);
    SH_CHECK(e.empty()) << e;
  }
  {  // broadcast
    int root = round % n;
    std::vector<uint32_t> buf = me == root ? input(root, round, 1, count) : std::vector<uint32_t>(count, 7);
    c.broadcast(buf.data(), count, dt, root)->wait();
    std::string e = mismatch("broadcast", round, count, buf, input(root, round, 1, count));
    SH_CHECK(e.empty()) << e;
  }
  const size_t block = count / n + 1;
  {  // allgather
    auto in = input(me, round, 2, block);
    std::vector<uint32_t> out(block * n), want;
    c.allgather(in.data(), out.data(), block, dt)->wait();
    for (int r = 0; r < n; ++r) {
      auto b = input(r, round, 2, block);
      want.insert(want.end(), b.begin(), b.end());
    }
    std::string e = mismatch("allgather", round, block, out, want);
    SH_CHECK(e.empty()) << e;
  }
  {  // reduce_scatter
    auto in = input(me, round, 3, block * n);
    std::vector<uint32_t> out(block), want(block, 0);
    c.reduce_scatter(in.data(), out.data(), block, dt, ReduceOp::sum)->wait();
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < block; ++i) want[i] += val(r, round, 3, me * block + i);
    std::string e = mismatch("reduce_scatter", round, block, out, want);
    SH_CHECK(e.empty()) << e;
  }
  {  // alltoall: block j of rank r's input goes to rank j
    auto in = input(me, round, 4, block * n);
    std::vector<uint32_t> out(block * n), want(block * n);
    c.alltoall(in.data(), out.data(), block, dt)->wait();
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < block; ++i) want[r * block + i] = val(r, round, 4, me * block + i);
    std::string e = mismatch("alltoall", round, block, out, want);
    SH_CHECK(e.empty()) << e;
  }
  {  // send/recv ring shift
    int to = (me + 1) % n, from = (me + n - 1) % n;
    auto in = input(me, round, 5, count);
    std::vector<uint32_t> out(count);
    auto s = c.send(in.data(), count, dt, to, round);
    auto r = c.recv(out.data(), count, dt, from, round);
    s->wait();
    r->wait();
    std::string e = mismatch("sendrecv", round, count, out, input(from, round, 5, count));
    SH_CHECK(e.empty()) << e;
  }
}

// Rank 0: learn the store's port and every rank's TCP address, as an outsider could.
void publish_targets(int n) {
  std::ifstream pf(run_dir() + "/port");
  unsigned port = 0;
  SH_CHECK(pf && (pf >> port) && port) << "no store port file";
  TcpStore probe("127.0.0.1", uint16_t(port), false, std::chrono::seconds(10));
  for (int r = 0; r < n; ++r) {
    std::string addr = probe.get_string("shoal/shoal/0/tcp/" + std::to_string(r), std::chrono::seconds(10));
    size_t colon = addr.rfind(':');
    SH_CHECK(colon != std::string::npos) << addr;
    g_sh->tcp_port[r].store(std::stoi(addr.substr(colon + 1)));
  }
  g_sh->store_port.store(int(port));
}

void rank_main(Communicator& c) {
  const int me = c.rank();
  if (me == 0) publish_targets(c.size());
  {  // every pair connected, so every listener closed, before the barrier that starts the hammer
    std::vector<int32_t> in(c.size(), 1), out(c.size());
    c.alltoall(in.data(), out.data(), 1, DType::i32)->wait();
  }
  c.barrier()->wait();
  if (me == 0) {
    g_sh->rss_base_kb.store(rss_kb());
    g_sh->rss_peak_kb.store(rss_kb());
    g_sh->rank0_pid.store(int(::getpid()));
    g_sh->phase.store(1);
  }
  double t0 = now_seconds();
  for (int round = 0;; ++round) {
    one_round(c, round);
    uint8_t stop = 0;
    if (me == 0) {
      long kb = rss_kb(), cur = g_sh->rss_peak_kb.load();
      while (kb > cur && !g_sh->rss_peak_kb.compare_exchange_weak(cur, kb)) {
      }
      bool hammer_done = g_sh->phase.load() >= 2;
      stop = (round + 1 >= kMinOpRounds && hammer_done) || now_seconds() - t0 > kMaxOpSeconds;
    }
    c.broadcast(&stop, 1, DType::u8, 0)->wait();
    if (stop) {
      if (me == 0) g_sh->op_rounds.store(round + 1);
      break;
    }
  }
  c.barrier()->wait();
  if (me == 0) g_sh->phase.store(3);
}

// ---- The hammer (a process forked by the test) ------------------------------------------------

// Connects to 127.0.0.1:port. Returns the fd, or -errno.
int dial(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -errno;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int err = 0;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    err = errno;
    if (err == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, 2000) == 1) {
        socklen_t len = sizeof err;
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      } else {
        err = ETIMEDOUT;
      }
    }
  }
  if (err) {
    ::close(fd);
    return -err;
  }
  // Loopback self-connect (the kernel picked `port` itself as our source port): nobody listens.
  sockaddr_in l{};
  socklen_t llen = sizeof l;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&l), &llen) == 0 && ntohs(l.sin_port) == port) {
    ::close(fd);
    return -ECONNREFUSED;
  }
  return fd;
}

void send_all(int fd, const std::vector<uint8_t>& b) {
  size_t off = 0;
  while (off < b.size()) {
    ssize_t w = ::send(fd, b.data() + off, b.size() - off, MSG_NOSIGNAL);
    if (w < 0 && errno == EAGAIN) {
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, 1000) != 1) return;
      continue;
    }
    if (w <= 0) return;  // dropped already
    off += size_t(w);
  }
}

// Whether the peer closes fd within `ms` (whatever it sends before is read and ignored).
bool closed_within(int fd, int ms) {
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  char buf[256];
  for (;;) {
    int left = int(std::chrono::ceil<std::chrono::milliseconds>(end - std::chrono::steady_clock::now()).count());
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, left) <= 0) continue;
    ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return true;
  }
}

namespace sf = shoal_test::store_frames;
using sf::cat;
using sf::put32;
std::vector<uint8_t> junk(size_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = uint8_t(mix64(seed + i));
  return v;
}

// What an intruder could send to a rank's transport port (none reaches it: it is closed).
std::vector<std::vector<uint8_t>> transport_payloads(uint64_t seed) {
  std::vector<std::vector<uint8_t>> v;
  v.push_back({});                                   // silent
  std::vector<uint8_t> h;                            // hello with a wrong secret
  put32(h, 0x53484f4c);
  auto s = junk(32, seed);
  h.insert(h.end(), s.begin(), s.end());
  put32(h, 1);
  put32(h, 0);
  v.push_back(h);
  v.push_back(junk(4096, seed + 1));                 // garbage
  v.push_back(std::vector<uint8_t>(h.begin(), h.begin() + 20));  // truncated hello
  std::vector<uint8_t> big;                          // a frame header with a huge length
  put32(big, 0x53484652);
  put32(big, 0);
  for (int i = 0; i < 8; ++i) big.push_back(0);
  for (int i = 0; i < 8; ++i) big.push_back(0xff);
  v.push_back(big);
  return v;
}

void attack_rank_ports(int round) {
  std::vector<int> fds;
  for (int r = 0; r < kRanks; ++r) {
    int port = g_sh->tcp_port[r].load();
    for (auto& payload : transport_payloads(uint64_t(round) * 100 + r)) {
      g_sh->rank_attempts.fetch_add(1);
      int fd = dial(port);
      if (fd < 0) {
        g_sh->rank_refused.fetch_add(1);
        continue;
      }
      // Accepted: something listens there. It must at least drop us at once.
      g_sh->rank_accepted.fetch_add(1);
      send_all(fd, payload);
      if (!closed_within(fd, 2000))
        hammer_fail("rank " + std::to_string(r) + "'s transport port " + std::to_string(port) +
                    " accepted a connection and kept it open");
      ::close(fd);
    }
    // Many at once.
    for (int k = 0; k < 32; ++k) {
      g_sh->rank_attempts.fetch_add(1);
      int fd = dial(port);
      if (fd < 0) {
        g_sh->rank_refused.fetch_add(1);
      } else {
        g_sh->rank_accepted.fetch_add(1);
        fds.push_back(fd);
      }
    }
  }
  for (int fd : fds) {
    if (!closed_within(fd, 2000)) hammer_fail("a rank's transport port accepted a connection and kept it open");
    ::close(fd);
  }
}

void sample_rank0_rss() {
  std::ifstream f("/proc/" + std::to_string(g_sh->rank0_pid.load()) + "/statm");
  long size = 0, res = 0;
  if (!(f >> size >> res)) return;
  long kb = res * (::sysconf(_SC_PAGESIZE) / 1024);
  long cur = g_sh->rss_peak_kb.load();
  while (kb > cur && !g_sh->rss_peak_kb.compare_exchange_weak(cur, kb)) {
  }
}

void attack_store(int round) {
  const int port = g_sh->store_port.load();
  const auto hello = sf::hello();
  std::vector<uint8_t> huge{0xff, 0xff, 0xff, 0xff, 0, 1, 0, 0, 0};
  std::vector<uint8_t> get_body;  // malformed GET: timeout but no key
  put32(get_body, 1000);
  put32(get_body, 0);
  std::vector<uint8_t> set_body;  // a SET "hostile" = "x" without a HELLO first
  put32(set_body, 7);
  for (char ch : std::string("hostile")) set_body.push_back(uint8_t(ch));
  put32(set_body, 1);
  set_body.push_back('x');
  std::vector<uint8_t> not_hello = junk(200, uint64_t(round) * 7919);
  not_hello[0] = 196;  // a complete frame of junk: length 196, then a junk command byte
  not_hello[1] = not_hello[2] = not_hello[3] = 0;
  not_hello[4] = 0xee;
  std::vector<uint8_t> big_junk = junk(65536 + 4, uint64_t(round) * 31);
  big_junk[0] = 0, big_junk[1] = 0, big_junk[2] = 1, big_junk[3] = 0, big_junk[4] = 0xee;  // length 65536

  // Probes the server must drop promptly.
  const std::vector<std::vector<uint8_t>> drop_probes = {
      not_hello,                                 // a frame that is not a HELLO
      sf::frame(sf::kSet, set_body),             // a SET before any HELLO
      sf::hello(0xdeadbeef),                     // a HELLO with a bad magic
      huge,                                      // a length over the 64 MiB limit
      {2, 0, 0, 0, 0, 0},                        // a frame too short to be one
      cat(hello, sf::frame(99, {1, 2, 3})),      // HELLO, then an unknown command
      cat(hello, sf::frame(sf::kGet, get_body)), // HELLO, then a malformed GET
      cat(hello, huge),                          // HELLO, then a length over the limit
      big_junk,                                  // 64 KiB of garbage in one frame
  };
  // Held open through the round: silent, truncated, slowloris, 64 MiB announced but not sent.
  std::vector<uint8_t> claim{0x00, 0x00, 0x00, 0x04, 2, 1, 0, 0, 0};  // length 0x04000000: 64 MiB, the limit
  const std::vector<std::vector<uint8_t>> held_probes = {
      {},                                                             // silent
      {0x0d, 0x00},                                                   // half a length field
      std::vector<uint8_t>(hello.begin(), hello.begin() + 9),         // a truncated HELLO
      cat(hello, {0x20, 0, 0, 0, 1}),                                 // HELLO, then a truncated SET
      claim, claim, claim, claim,                                     // 64 MiB announced before any HELLO
      cat(hello, claim), cat(hello, claim), cat(hello, claim), cat(hello, claim),  // ... and after one
  };

  std::vector<int> held;
  for (auto& p : held_probes) {
    int fd = dial(port);
    if (fd < 0) {
      if (g_sh->phase.load() >= 3) break;  // the ranks are over: the store may be gone
      hammer_fail("the store refused a connection: " + std::string(std::strerror(-fd)));
      continue;
    }
    send_all(fd, p);
    held.push_back(fd);
    g_sh->store_held.fetch_add(1);
  }
  // Rank 0 (the store server) while they are open: they must not cost it memory.
  std::this_thread::sleep_for(20ms);
  sample_rank0_rss();
  for (auto& p : drop_probes) {
    int fd = dial(port);
    if (fd < 0) {
      if (g_sh->phase.load() >= 3) break;  // as above
      hammer_fail("the store refused a connection: " + std::string(std::strerror(-fd)));
      continue;
    }
    g_sh->store_probes.fetch_add(1);
    send_all(fd, p);
    if (closed_within(fd, 3000))
      g_sh->store_dropped.fetch_add(1);
    else
      hammer_fail("the store server kept a connection open after a bad frame of " + std::to_string(p.size()) +
                  " bytes (first byte " + std::to_string(p.empty() ? -1 : p[0]) + ")");
    ::close(fd);
  }
  // Slowloris: trickle a frame a byte at a time on one of the held connections.
  const auto trickle = cat(hello, sf::frame(sf::kCheck, {3, 0, 0, 0, 'k', 'e', 'y'}));
  int slow = dial(port);
  if (slow >= 0) {
    for (size_t i = 0; i + 1 < trickle.size() && g_sh->phase.load() < 3; ++i) {
      send_all(slow, {trickle[i]});
      std::this_thread::sleep_for(5ms);
    }
    held.push_back(slow);
  }
  // Many at once: 200 connections, then garbage on each; all must be dropped.
  std::vector<int> many;
  for (int k = 0; k < 200; ++k) {
    int fd = dial(port);
    if (fd >= 0) many.push_back(fd);
  }
  for (size_t k = 0; k < many.size(); ++k) {
    auto g = junk(16, k + uint64_t(round) * 1000);  // a whole junk frame, or a length over the limit
    g[0] = k % 2 ? 12 : 0xff, g[1] = k % 2 ? 0 : 0xff, g[2] = k % 2 ? 0 : 0xff, g[3] = k % 2 ? 0 : 0xff;
    g[4] = 0xee;
    send_all(many[k], g);
  }
  for (int fd : many) {
    g_sh->store_many.fetch_add(1);
    g_sh->store_probes.fetch_add(1);
    if (closed_within(fd, 3000))
      g_sh->store_dropped.fetch_add(1);
    else
      hammer_fail("the store server kept one of 200 garbage connections open");
    ::close(fd);
  }
  sample_rank0_rss();
  for (int fd : held) ::close(fd);
}

void hammer() {
  while (g_sh->phase.load() == 0) std::this_thread::sleep_for(1ms);  // no allocation before the forks are done
  for (int round = 0; g_sh->phase.load() < 3; ++round) {
    attack_rank_ports(round);
    attack_store(round);
    if (g_sh->rounds.fetch_add(1) + 1 >= kHammerRounds && g_sh->phase.load() == 1) g_sh->phase.store(2);
  }
}

struct TempDir {
  std::string path;
  TempDir() {
    char t[] = "/tmp/shoal-hostile-XXXXXX";
    if (::mkdtemp(t)) path = t;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

TEST(Hostile, ConnectionsDuringWorkAreDroppedAndTheGroupIsUnharmed) {
  TempDir logs;
  ASSERT_FALSE(logs.path.empty());
  void* m = ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  g_sh = new (m) Shared{};

  RunConfig cfg;
  cfg.store = StoreKind::tcp;
  cfg.env = {{"SHOAL_TRANSPORT", "tcp"}, {"SHOAL_TIMEOUT", "20"}, {"SHOAL_LOG", "warn"}};
  cfg.limit = std::chrono::seconds(60);
  const std::string dir = logs.path;
  cfg.before_construct = [dir](int rank) {  // each rank's log (stderr) to a file
    int fd = ::open((dir + "/rank" + std::to_string(rank) + ".log").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) {
      ::dup2(fd, 2);
      ::close(fd);
    }
  };

  auto t0 = std::chrono::steady_clock::now();
  // The hammer is a process of its own (it shares g_sh), not a thread: the ranks are forked from
  // this process, and a fork while another thread runs is what TSan refuses (and what gcc's
  // libasan can hang in, RELIABILITY.md).
  const pid_t hammer_pid = ::fork();
  ASSERT_GE(hammer_pid, 0);
  if (hammer_pid == 0) {
    hammer();
    ::_exit(0);
  }
  bool ok = run_ranks(kRanks, cfg, rank_main);
  g_sh->phase.store(3);  // stops the hammer even when the ranks failed
  int hammer_status = 0;
  ::waitpid(hammer_pid, &hammer_status, 0);
  EXPECT_TRUE(WIFEXITED(hammer_status) && WEXITSTATUS(hammer_status) == 0) << "the hammer process failed";
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::ifstream lf(dir + "/rank0.log");
  std::string log0((std::istreambuf_iterator<char>(lf)), std::istreambuf_iterator<char>());
  Shared& s = *g_sh;
  std::printf("hostile: %.1f s; %d op rounds (6 checked collectives each); %d hammer rounds; rank ports: "
              "%ld attempts, %ld refused, %ld accepted; store: %ld bad probes, %ld dropped (%ld of them in bursts "
              "of 200), %ld held open; rank 0 RSS %ld -> peak %ld KiB\n",
              secs, s.op_rounds.load(), s.rounds.load(), s.rank_attempts.load(), s.rank_refused.load(),
              s.rank_accepted.load(), s.store_probes.load(), s.store_dropped.load(), s.store_many.load(),
              s.store_held.load(), s.rss_base_kb.load(), s.rss_peak_kb.load());
  if (!ok) std::printf("rank 0's log:\n%s\n", log0.c_str());

  EXPECT_TRUE(ok);
  EXPECT_EQ(s.failure[0], '\0') << s.failure;
  EXPECT_GE(s.rounds.load(), kHammerRounds) << "the ranks stopped before the hammer finished its rounds";
  EXPECT_GE(s.op_rounds.load(), kMinOpRoundsSlow);
  EXPECT_LT(secs, 45.0);
  // The transport listeners are closed once set-up is over: nothing gets through.
  EXPECT_GT(s.rank_attempts.load(), 0);
  EXPECT_EQ(s.rank_refused.load(), s.rank_attempts.load());
  EXPECT_EQ(s.rank_accepted.load(), 0);
  // The store drops every bad connection and stays small.
  EXPECT_GT(s.store_probes.load(), 0);
  EXPECT_EQ(s.store_dropped.load(), s.store_probes.load());
  EXPECT_LT(s.rss_peak_kb.load() - s.rss_base_kb.load(), kRssLimitKb)
      << "rank 0 (the store server) grew by " << (s.rss_peak_kb.load() - s.rss_base_kb.load()) << " KiB";
  for (const char* want : {"store server: dropping connection from 127.0.0.1:", "is not a shoal store HELLO",
                           "bad HELLO", "exceeds the 64 MiB limit", "frame too short", "unknown command",
                           "malformed GET"})
    EXPECT_NE(log0.find(want), std::string::npos) << "rank 0's log lacks '" << want << "':\n" << log0.substr(0, 4000);

  g_sh->~Shared();
  ::munmap(m, sizeof(Shared));
  g_sh = nullptr;
}

}  // namespace
