// TCP transport: set-up and the TCP Link, over loopback between forked processes.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "base/log.h"
#include "harness.h"
#include "shoal/error.h"
#include "shoal/store.h"
#include "transport/tcp_link.h"

namespace {

using namespace std::chrono_literals;
using shoal::Bytes;
using shoal::Link;
using shoal::Millis;
using shoal_test::slurp;
using shoal::Request;
using Clock = std::chrono::steady_clock;

// A store in a directory, one file per key, written atomically (rename), polled with sleeps.
// Works across forked processes and threads.
class TestDirStore : public shoal::Store {
 public:
  TestDirStore(std::string dir, std::string prefix = "") : dir_(std::move(dir)), prefix_(std::move(prefix)) {}

  void set(const std::string& key, const Bytes& value) override {
    static std::atomic<int> counter{0};
    std::string tmp = dir_ + "/.tmp." + std::to_string(getpid()) + "." + std::to_string(counter++);
    {
      std::ofstream f(tmp, std::ios::binary);
      f.write(reinterpret_cast<const char*>(value.data()), static_cast<std::streamsize>(value.size()));
    }
    if (std::rename(tmp.c_str(), path(key).c_str()) != 0) throw shoal::Error("TestDirStore: rename failed");
  }
  Bytes get(const std::string& key, Millis timeout) override {
    auto deadline = Clock::now() + timeout;
    for (;;) {
      Bytes b;
      if (read(key, b)) return b;
      if (Clock::now() >= deadline) throw shoal::Timeout("TestDirStore: timed out waiting for " + key);
      std::this_thread::sleep_for(1ms);
    }
  }
  int64_t add(const std::string& key, int64_t delta) override {
    int lfd = ::open((dir_ + "/.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    ::flock(lfd, LOCK_EX);
    Bytes b;
    int64_t v = read(key, b) ? std::stoll(std::string(b.begin(), b.end())) : 0;
    v += delta;
    set_string(key, std::to_string(v));
    ::flock(lfd, LOCK_UN);
    ::close(lfd);
    return v;
  }
  void wait(const std::vector<std::string>& keys, Millis timeout) override {
    auto deadline = Clock::now() + timeout;
    for (auto& k : keys) get(k, std::chrono::duration_cast<Millis>(std::max(deadline - Clock::now(), Clock::duration(0))));
  }
  bool check(const std::string& key) override { return ::access(path(key).c_str(), F_OK) == 0; }

 private:
  std::string path(const std::string& key) const {
    std::string k = prefix_ + key, out = dir_ + "/k_";
    for (unsigned char c : k) {
      if (std::isalnum(c)) {
        out += static_cast<char>(c);
      } else {
        char h[4];
        std::snprintf(h, sizeof h, "%%%02x", c);
        out += h;
      }
    }
    return out;
  }
  bool read(const std::string& key, Bytes& out) const {
    std::ifstream f(path(key), std::ios::binary);
    if (!f) return false;
    out.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    return true;
  }
  std::string dir_;
  std::string prefix_;
};

std::array<uint8_t, 32> test_secret() {
  std::array<uint8_t, 32> s{};
  for (int i = 0; i < 32; ++i) s[i] = static_cast<uint8_t>(0xA5 ^ (i * 7));
  return s;
}

// The links of one rank plus the epoll fd they sleep on.
struct Net {
  int epfd = -1;
  std::vector<std::unique_ptr<Link>> links;
  Net() = default;
  Net(Net&& o) noexcept : epfd(o.epfd), links(std::move(o.links)) { o.epfd = -1; }
  Net& operator=(Net&& o) noexcept {
    reset();
    epfd = std::exchange(o.epfd, -1);
    links = std::move(o.links);
    return *this;
  }
  ~Net() { reset(); }
  void reset() {
    for (auto& l : links)
      if (l) l->close();
    links.clear();
    if (epfd >= 0) ::close(epfd);
    epfd = -1;
  }
};

// `tweak`, if given, changes the config before set-up (per-host settings, ...).
Net make_net(shoal::Store& store, int rank, int size, int streams, std::vector<bool> use = {},
             std::chrono::milliseconds timeout = 10s,
             const std::function<void(shoal::TcpConfig&)>& tweak = {}) {
  if (use.empty()) {
    use.assign(size, true);
    use[rank] = false;
  }
  Net net;
  net.epfd = ::epoll_create1(EPOLL_CLOEXEC);
  shoal::TcpConfig cfg;
  cfg.rank = rank;
  cfg.size = size;
  cfg.use_tcp = use;
  cfg.streams = streams;
  cfg.secret = test_secret();
  cfg.advertise_host = "127.0.0.1";
  cfg.deadline = Clock::now() + timeout;
  cfg.epoll_fd = net.epfd;
  if (tweak) tweak(cfg);
  // The addresses go through the store ("tcp/<rank>"), as the rendezvous sends them; this rank
  // dials the lower ranks, so it needs theirs only.
  auto conn = shoal::tcp_listen(cfg);
  store.set_string("tcp/" + std::to_string(rank), shoal::tcp_listen_address(*conn));
  std::vector<std::string> addresses(size);
  for (int j = 0; j < rank; ++j)
    if (use[j]) addresses[j] = store.get_string("tcp/" + std::to_string(j), timeout);
  net.links = shoal::connect_tcp_links(conn, addresses);
  return net;
}

// Two ranks' nets in this process (threads), `streams` data streams each.
std::pair<Net, Net> net_pair(shoal::Store& store, int streams) {
  Net n0, n1;
  std::thread t([&] { n1 = make_net(store, 1, 2, streams); });
  n0 = make_net(store, 0, 2, streams);
  t.join();
  return {std::move(n0), std::move(n1)};
}

// A tiny engine: progresses every link until all of reqs complete, sleeping on epoll (1 ms) when
// nothing moved. Throws runtime_error after `timeout`. With `strict`, it sleeps on epoll without a
// short timeout, so a link that stops before EAGAIN (a lost edge-triggered wake-up) stalls it:
// that fails the test instead of being papered over by the 1 ms poll.
void drive(Net& net, const std::vector<Request*>& reqs, std::chrono::milliseconds timeout = 10s,
           bool strict = false) {
  auto deadline = Clock::now() + timeout;
  for (;;) {
    bool moved = false;
    for (auto& l : net.links)
      if (l) moved |= l->progress();
    bool all = true;
    for (auto* r : reqs) all &= r->complete;
    if (all) return;
    if (!moved) {
      epoll_event ev[16];
      int n = ::epoll_wait(net.epfd, ev, 16, strict ? 5000 : 1);
      if (strict && n == 0) throw std::runtime_error("drive: no epoll wake-up for 5 s with requests pending");
    }
    if (Clock::now() > deadline) throw std::runtime_error("drive: timed out");
  }
}

Request make_req(Request::Dir dir, int peer, uint8_t* buf, size_t bytes, uint64_t sig, const char* what = "test") {
  Request r{};
  r.dir = dir;
  r.peer = peer;
  r.buf = buf;
  r.bytes = bytes;
  r.sig = sig;
  r.what = what;
  return r;
}

// Pseudo-random contents that depend on the sender and the message.
void fill(std::vector<uint8_t>& v, int src, size_t salt) {
  uint64_t x = 0x9E3779B97F4A7C15ull * (static_cast<uint64_t>(src) + 1) ^ (salt * 0xBF58476D1CE4E5B9ull) ^ 1;
  size_t i = 0;
  for (; i + 8 <= v.size(); i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(v.data() + i, &x, 8);
  }
  for (; i < v.size(); ++i) v[i] = static_cast<uint8_t>(x >> (8 * (i % 8))) ^ 0x5A;
}

// Runs body(index) in n forked children, stderr of child i in dir/err.i; returns exit codes
// (128+signal if killed; 124 if still running after `timeout`).
std::vector<int> run_procs(const std::string& dir, int n, const std::function<int(int)>& body,
                           std::chrono::seconds timeout = 20s) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids(n);
  for (int i = 0; i < n; ++i) {
    pid_t pid = ::fork();
    if (pid == 0) {
      std::string err = dir + "/err." + std::to_string(i);
      int fd = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      if (fd >= 0) ::dup2(fd, 2);
      shoal::set_log_rank(i);
      int code;
      try {
        code = body(i);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "child %d: uncaught exception: %s\n", i, e.what());
        code = 90;
      } catch (...) {
        code = 91;
      }
      std::fflush(stderr);
      ::_exit(code);
    }
    pids[i] = pid;
  }
  std::vector<int> codes(n, -1);
  auto deadline = Clock::now() + timeout;
  int left = n;
  while (left > 0) {
    for (int i = 0; i < n; ++i) {
      if (codes[i] != -1) continue;
      int st = 0;
      if (::waitpid(pids[i], &st, WNOHANG) == pids[i]) {
        codes[i] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        --left;
      }
    }
    if (left == 0) break;
    if (Clock::now() > deadline) {
      for (int i = 0; i < n; ++i) {
        if (codes[i] != -1) continue;
        ::kill(pids[i], SIGKILL);
        ::waitpid(pids[i], nullptr, 0);
        codes[i] = 124;
      }
      break;
    }
    std::this_thread::sleep_for(2ms);
  }
  return codes;
}

class TcpLinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/shoal_tcp_test.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string err(int i) { return slurp(dir_ + "/err." + std::to_string(i)); }
  // Expects every child to exit 0; prints the stderr of those that did not.
  void expect_all_ok(const std::vector<int>& codes) {
    for (size_t i = 0; i < codes.size(); ++i)
      EXPECT_EQ(codes[i], 0) << "child " << i << " stderr:\n" << err(static_cast<int>(i));
  }
  std::string dir_;
};

// ---------------------------------------------------------------------------------------------
// Ring exchange: each rank sends to its right while receiving from its left, one size at a time
// and then all sizes posted at once; streams = 1 and 4.

int ring_body(const std::string& dir, int rank, int n, std::vector<bool> use = {}, bool quick = false) {
  std::vector<size_t> sizes = {0, 1, 1000, (1u << 20) + 3};
  if (!quick) sizes.push_back(16u << 20);
  const int right = (rank + 1) % n, left = (rank + n - 1) % n;
  for (int streams : {1, 4}) {
    if (quick && streams == 1) continue;
    TestDirStore store(dir, "s" + std::to_string(streams) + "/");
    Net net = make_net(store, rank, n, streams, use);
    for (int j = 0; j < n; ++j) {
      bool want = use.empty() ? j != rank : static_cast<bool>(use[j]);
      if (static_cast<bool>(net.links[j]) != want) return 10;
      if (net.links[j] && std::strcmp(net.links[j]->kind(), "tcp") != 0) return 11;
    }
    Link* lr = net.links[right].get();
    Link* ll = net.links[left].get();
    // One at a time.
    for (size_t k = 0; k < sizes.size(); ++k) {
      size_t sz = sizes[k];
      std::vector<uint8_t> sbuf(sz), rbuf(sz, 0xEE), want(sz);
      fill(sbuf, rank, sz);
      fill(want, left, sz);
      Request s = make_req(Request::Dir::send, right, sbuf.data(), sz, 100 + k);
      Request r = make_req(Request::Dir::recv, left, rbuf.data(), sz, 100 + k);
      lr->post(&s);
      ll->post(&r);
      drive(net, {&s, &r}, 10s, /*strict=*/true);
      if (rbuf != want) {
        std::fprintf(stderr, "rank %d streams %d: wrong data for size %zu\n", rank, streams, sz);
        return 20;
      }
      if (s.done != sz || r.done != sz) return 21;
      if (lr->busy() || ll->busy()) return 22;
    }
    // All posted at once: requests of one direction complete in post order.
    std::vector<std::vector<uint8_t>> sb, rb;
    std::vector<Request> reqs;
    reqs.reserve(2 * sizes.size());
    for (size_t k = 0; k < sizes.size(); ++k) {
      sb.emplace_back(sizes[k]);
      fill(sb.back(), rank, sizes[k] + 1);
      rb.emplace_back(sizes[k], 0xEE);
    }
    std::vector<Request*> ptrs;
    for (size_t k = 0; k < sizes.size(); ++k) {
      reqs.push_back(make_req(Request::Dir::send, right, sb[k].data(), sizes[k], 200 + k));
      lr->post(&reqs.back());
      ptrs.push_back(&reqs.back());
      reqs.push_back(make_req(Request::Dir::recv, left, rb[k].data(), sizes[k], 200 + k));
      ll->post(&reqs.back());
      ptrs.push_back(&reqs.back());
    }
    drive(net, ptrs, 10s, /*strict=*/true);
    for (size_t k = 0; k < sizes.size(); ++k) {
      std::vector<uint8_t> want(sizes[k]);
      fill(want, left, sizes[k] + 1);
      if (rb[k] != want) {
        std::fprintf(stderr, "rank %d streams %d: wrong data for pipelined size %zu\n", rank, streams, sizes[k]);
        return 30;
      }
    }
    if (lr->busy() || ll->busy()) return 31;
  }
  return 0;
}

TEST_F(TcpLinkTest, RingExchange2) {
  expect_all_ok(run_procs(dir_, 2, [&](int r) { return ring_body(dir_, r, 2); }));
}
TEST_F(TcpLinkTest, RingExchange3) {
  expect_all_ok(run_procs(dir_, 3, [&](int r) { return ring_body(dir_, r, 3); }));
}
TEST_F(TcpLinkTest, RingExchange4) {
  expect_all_ok(run_procs(dir_, 4, [&](int r) { return ring_body(dir_, r, 4); }));
}
// Only ring neighbours talk TCP: the other links are null and no set-up waits for them (streams=4,
// up to 1 MiB: the data path is covered above).
TEST_F(TcpLinkTest, RingNeighboursOnly) {
  expect_all_ok(run_procs(dir_, 4, [&](int r) {
    std::vector<bool> use(4, false);
    use[(r + 1) % 4] = use[(r + 3) % 4] = true;
    return ring_body(dir_, r, 4, use, /*quick=*/true);
  }));
}

// Peers on this host and on others get their own stream counts and unsent watermarks
// (TcpConfig::same_host): ranks 0 and 1 share a host, rank 2 is elsewhere. Each rank counts its
// sockets by TCP_NOTSENT_LOWAT (one value per kind of peer) and exchanges messages, split ones
// among them, with both peers.
TEST_F(TcpLinkTest, StreamsAndWatermarkPerPeerHost) {
  constexpr int kRemoteStreams = 3, kLocalStreams = 1, kRemoteLowat = 4096;
  expect_all_ok(run_procs(dir_, 3, [&](int rank) {
    auto sockets_by_lowat = [] {
      std::map<int, int> n;
      for (auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
        int fd = std::stoi(e.path().filename().string());
        struct stat st;
        if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
        int v = -1;
        socklen_t len = sizeof v;
        if (::getsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &v, &len) == 0) ++n[v];
      }
      return n;
    };
    auto before = sockets_by_lowat();
    TestDirStore store(dir_);
    Net net = make_net(store, rank, 3, kRemoteStreams, {}, 10s, [&](shoal::TcpConfig& cfg) {
      cfg.same_host = {rank == 1, rank == 0, false};
      cfg.notsent_lowat = kRemoteLowat;
      cfg.local_streams = kLocalStreams;
      cfg.local_notsent_lowat = 0;
    });
    auto after = sockets_by_lowat();
    const int remote = rank == 2 ? 2 : 1, local = rank == 2 ? 0 : 1;  // peers of each kind
    if (after[kRemoteLowat] - before[kRemoteLowat] != remote * (kRemoteStreams + 1)) return 10;
    if (after[0] - before[0] != local * (kLocalStreams + 1)) return 11;
    for (int peer = 0; peer < 3; ++peer) {
      if (peer == rank) continue;
      for (size_t sz : {size_t{1000}, size_t{(1u << 20) + 3}}) {
        std::vector<uint8_t> sbuf(sz), rbuf(sz), want(sz);
        fill(sbuf, rank, sz + peer);
        fill(want, peer, sz + rank);
        Request s = make_req(Request::Dir::send, peer, sbuf.data(), sz, 5);
        Request r = make_req(Request::Dir::recv, peer, rbuf.data(), sz, 5);
        net.links[peer]->post(&s);
        net.links[peer]->post(&r);
        drive(net, {&s, &r});
        if (rbuf != want) return 20 + peer;
      }
    }
    return 0;
  }));
}

// ---------------------------------------------------------------------------------------------
// Mismatched calls: rank 0 sends (bytes, sig), rank 1 expects (bytes, sig); rank 1 must get a
// PeerError whose message contains `expect`.

struct MismatchCase {
  int streams;
  size_t send_bytes;
  uint64_t send_sig;
  size_t recv_bytes;
  uint64_t recv_sig;
  const char* expect;
};

const MismatchCase kMismatch[] = {
    {1, 4096, 7, 8192, 7, "allreduce: rank 0 sent 4096 bytes but this rank expects 8192 (mismatched call across ranks)"},
    {4, 4096, 7, 8192, 7, "allreduce: rank 0 sent 4096 bytes but this rank expects 8192"},
    {1, 0, 7, 8, 7, "allreduce: rank 0 sent 0 bytes but this rank expects 8"},
    {4, 1u << 20, 7, 2u << 20, 7, "part 0 of a 2097152-byte message"},
    {4, 1u << 20, 7, 4096, 7, "allreduce: rank 0 sent 262144 bytes but this rank expects 4096"},
    {1, 1000, 0x1234, 1000, 0x5678, "expects 0x0000000000005678"},
    {4, 3u << 20, 0x1234, 3u << 20, 0x5678, "op signature 0x0000000000001234"},
};

TEST_F(TcpLinkTest, MismatchIsPeerError) {
  auto codes = run_procs(dir_, 2, [&](int rank) {
    for (size_t c = 0; c < std::size(kMismatch); ++c) {
      const MismatchCase& m = kMismatch[c];
      TestDirStore store(dir_, "m" + std::to_string(c) + "/");
      Net net = make_net(store, rank, 2, m.streams);
      if (rank == 0) {
        std::vector<uint8_t> buf(m.send_bytes, 1);
        Request s = make_req(Request::Dir::send, 1, buf.data(), buf.size(), m.send_sig, "allreduce");
        net.links[1]->post(&s);
        try {
          drive(net, {&s});
        } catch (const shoal::PeerError&) {
          // The receiver may close before all of it went out: fine.
        }
        store.get("verdict", 10s);  // keep the connection until rank 1 has judged
      } else {
        std::vector<uint8_t> buf(m.recv_bytes);
        Request r = make_req(Request::Dir::recv, 0, buf.data(), buf.size(), m.recv_sig, "allreduce");
        net.links[0]->post(&r);
        std::string what;
        try {
          drive(net, {&r});
        } catch (const shoal::PeerError& e) {
          what = e.what();
        }
        store.set_string("verdict", "x");
        std::fprintf(stderr, "case %zu: %s\n", c, what.c_str());
        if (what.empty()) return 1;
        if (what.find(m.expect) == std::string::npos) return 2;
        // The failure sticks.
        try {
          net.links[0]->progress();
          return 3;
        } catch (const shoal::PeerError&) {
        }
      }
    }
    return 0;
  });
  expect_all_ok(codes);
}

// ---------------------------------------------------------------------------------------------
// A peer that dies mid-transfer: the survivor's progress() throws PeerError promptly, whether it
// was receiving from it or sending to it.

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

void death_test(const std::string& dir, bool sender_dies, std::vector<int>& codes) {
  constexpr size_t kBytes = 64u << 20;
  const int dying = sender_dies ? 0 : 1;
  codes = run_procs(dir, 2, [&](int rank) {
    TestDirStore store(dir);
    Net net = make_net(store, rank, 2, 1);
    std::vector<uint8_t> buf(kBytes, 3);
    int peer = 1 - rank;
    Request r = make_req(rank == 0 ? Request::Dir::send : Request::Dir::recv, peer, buf.data(), kBytes, 9, "broadcast");
    net.links[peer]->post(&r);
    // Moves data until `until` holds (10 s at most).
    auto progress_until = [&](auto until) {
      auto deadline = Clock::now() + 10s;
      while (!until() && Clock::now() < deadline) {
        if (!net.links[peer]->progress()) {
          epoll_event ev[4];
          ::epoll_wait(net.epfd, ev, 4, 1);
        }
      }
    };
    if (rank == dying) {
      if (sender_dies) {
        // Dies once the receiver has paused: with the receiver not reading, the socket buffers
        // (a few MiB) cannot take the rest of the message, so the sender dies mid-transfer.
        progress_until([&] { return r.complete || store.check("paused"); });
      } else {
        progress_until([&] { return r.done >= (1u << 20); });
      }
      if (r.complete) return 5;
      store.set_string("died", std::to_string(now_ns()));
      ::_exit(0);  // no close(), no destructors: like a crash
    }
    if (sender_dies) {
      // Receive some of it, then stop reading until the sender has died. (Reading on, a fast
      // receiver let the sender finish the whole message before it could die.)
      progress_until([&] { return r.done >= (1u << 20); });
      store.set_string("paused", "1");
      store.get("died", 10s);
    }
    std::string what;
    try {
      drive(net, {&r});
    } catch (const shoal::PeerError& e) {
      what = e.what();
    }
    int64_t caught = now_ns();
    std::fprintf(stderr, "survivor: %s\n", what.c_str());
    if (what.empty()) return 1;
    std::string expect = "rank " + std::to_string(dying) + " closed the connection during broadcast";
    if (what.find(expect) == std::string::npos) return 2;
    int64_t died = std::stoll(store.get_string("died", 1s));
    double late = (caught - died) / 1e9;
    std::fprintf(stderr, "survivor noticed after %.3f s\n", late);
    if (late > 1.0) return 3;
    return 0;
  });
}

// The dying rank returns 5 when the whole message went through before it could die (one
// progress() call moves data until the socket would block, and a fast peer - or a slow dying rank,
// as under TSan - may never let it block); the survivor then sees no error. That run tells nothing,
// so it is repeated.
std::vector<int> death_test_mid_transfer(const std::string& dir, bool sender_dies) {
  std::vector<int> codes;
  for (int attempt = 0; attempt < 5; ++attempt) {
    const std::string sub = dir + "/attempt" + std::to_string(attempt);  // a fresh store each time
    ::mkdir(sub.c_str(), 0700);
    death_test(sub, sender_dies, codes);
    if (codes.size() == 2 && codes[sender_dies ? 0 : 1] != 5) break;
  }
  return codes;
}
TEST_F(TcpLinkTest, SenderDiesMidTransfer) { expect_all_ok(death_test_mid_transfer(dir_, true)); }
TEST_F(TcpLinkTest, ReceiverDiesMidTransfer) { expect_all_ok(death_test_mid_transfer(dir_, false)); }

// ---------------------------------------------------------------------------------------------
// Intruders during set-up: a silent connection, a wrong secret, garbage, a forged rank. Each is
// dropped (the silent one without stalling anything), logged with its address, and set-up succeeds.

int connect_to(const std::string& hostport) {
  size_t colon = hostport.rfind(':');
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(std::stoi(hostport.substr(colon + 1))));
  ::inet_pton(AF_INET, hostport.substr(0, colon).c_str(), &a.sin_addr);
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

std::vector<uint8_t> hello(uint32_t magic, const std::array<uint8_t, 32>& secret, int32_t rank, int32_t stream) {
  std::vector<uint8_t> h(44);
  for (int i = 0; i < 4; ++i) h[i] = static_cast<uint8_t>(magic >> (8 * i));
  std::memcpy(h.data() + 4, secret.data(), 32);
  for (int i = 0; i < 4; ++i) h[36 + i] = static_cast<uint8_t>(static_cast<uint32_t>(rank) >> (8 * i));
  for (int i = 0; i < 4; ++i) h[40 + i] = static_cast<uint8_t>(static_cast<uint32_t>(stream) >> (8 * i));
  return h;
}

// True if the server closes fd within `within`.
bool dropped_within(int fd, std::chrono::milliseconds within) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(within.count())) <= 0) return false;
  char c;
  ssize_t n = ::recv(fd, &c, 1, 0);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

TEST_F(TcpLinkTest, IntrudersAreDroppedAndSetupSucceeds) {
  auto codes = run_procs(dir_, 3, [&](int who) {
    TestDirStore store(dir_);
    if (who == 2) {  // the intruder
      std::string addr = store.get_string("tcp/0", 10s);
      int silent = connect_to(addr);
      if (silent < 0) return 40;
      auto bad_secret = test_secret();
      bad_secret[5] ^= 1;
      std::vector<std::vector<uint8_t>> probes = {
          hello(0x53484f4c, bad_secret, 1, 0),                        // wrong secret
          std::vector<uint8_t>(44, 'G'),                              // garbage
          hello(0x53484f4c, test_secret(), 0, 0),                     // forged rank (not higher than 0)
          hello(0x53484f4c, test_secret(), 1, 9),                     // stream out of range
      };
      for (size_t i = 0; i < probes.size(); ++i) {
        int fd = connect_to(addr);
        if (fd < 0) return 41;
        if (::send(fd, probes[i].data(), probes[i].size(), MSG_NOSIGNAL) != 44) return 42;
        // Dropped promptly even though the silent connection is still pending.
        if (!dropped_within(fd, 1500ms)) {
          std::fprintf(stderr, "probe %zu was not dropped\n", i);
          return 43 + static_cast<int>(i);
        }
        ::close(fd);
      }
      store.set_string("intruder/done", "1");
      store.get("setup/0", 10s);
      ::close(silent);
      return 0;
    }
    if (who == 1) store.get("intruder/done", 10s);
    Net net = make_net(store, who, 2, 2);
    if (who == 0) store.set_string("setup/0", "1");
    // The links work.
    int peer = 1 - who;
    for (size_t sz : {size_t{1000}, size_t{(1u << 20) + 3}}) {
      std::vector<uint8_t> sbuf(sz), rbuf(sz), want(sz);
      fill(sbuf, who, sz);
      fill(want, peer, sz);
      Request s = make_req(Request::Dir::send, peer, sbuf.data(), sz, 5);
      Request r = make_req(Request::Dir::recv, peer, rbuf.data(), sz, 5);
      net.links[peer]->post(&s);
      net.links[peer]->post(&r);
      drive(net, {&s, &r});
      if (rbuf != want) return 20;
    }
    return 0;
  });
  expect_all_ok(codes);
  std::string log0 = err(0);
  EXPECT_NE(log0.find("dropped connection from 127.0.0.1:"), std::string::npos) << log0;
  EXPECT_NE(log0.find("wrong group secret"), std::string::npos) << log0;
  EXPECT_NE(log0.find("bad hello magic"), std::string::npos) << log0;
  EXPECT_NE(log0.find("unexpected rank 0 / stream 0"), std::string::npos) << log0;
  EXPECT_NE(log0.find("unexpected rank 1 / stream 9"), std::string::npos) << log0;
}

// ---------------------------------------------------------------------------------------------
// In one process.

TEST_F(TcpLinkTest, TimeoutNamesMissingPeers) {
  TestDirStore store(dir_);
  auto t0 = Clock::now();
  try {
    std::vector<bool> use = {false, true, false, true};
    make_net(store, 0, 4, 2, use, 300ms);
    FAIL() << "expected Timeout";
  } catch (const shoal::Timeout& e) {
    std::string w = e.what();
    EXPECT_NE(w.find("rank 1 (0/3 connections)"), std::string::npos) << w;
    EXPECT_NE(w.find("rank 3 (0/3 connections)"), std::string::npos) << w;
    EXPECT_EQ(w.find("rank 2"), std::string::npos) << w;
  }
  EXPECT_LT(Clock::now() - t0, 2s);
  EXPECT_TRUE(store.check("tcp/0"));
}

TEST_F(TcpLinkTest, ConnectSideTimeout) {
  // Rank 1 of 2 waits for rank 0's address, which never comes.
  TestDirStore store(dir_);
  EXPECT_THROW(make_net(store, 1, 2, 1, {}, 200ms), shoal::Timeout);
}

TEST_F(TcpLinkTest, NoTcpPeersPublishesAndReturnsNulls) {
  TestDirStore store(dir_);
  Net net = make_net(store, 1, 3, 4, {false, false, false});
  ASSERT_EQ(net.links.size(), 3u);
  for (auto& l : net.links) EXPECT_EQ(l, nullptr);
  std::string addr = store.get_string("tcp/1", 1s);
  EXPECT_EQ(addr.rfind("127.0.0.1:", 0), 0u) << addr;
}

TEST_F(TcpLinkTest, InvalidConfig) {
  TestDirStore store(dir_);
  EXPECT_THROW(make_net(store, 0, 2, 0), shoal::InvalidArgument);
  EXPECT_THROW(make_net(store, 0, 2, 1, {true}), shoal::InvalidArgument);
  EXPECT_THROW(make_net(store, 2, 2, 1, {false, false}), shoal::InvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// Flow control (tcp_link.h): a sender gets at most kTcpWindow messages ahead of what its receiver
// has consumed, is released as the receiver's reports arrive (an epoll wake-up, not a poll), and
// fails promptly if the receiver leaves while it is held.

// Progresses `net` for `d`, whatever completes.
void spin_for(Net& net, std::chrono::milliseconds d) {
  auto until = Clock::now() + d;
  while (Clock::now() < until) {
    bool moved = false;
    for (auto& l : net.links)
      if (l) moved |= l->progress();
    if (!moved) std::this_thread::sleep_for(1ms);
  }
}

TEST_F(TcpLinkTest, SenderIsHeldAtTheWindowAndReleasedByReports) {
  TestDirStore store(dir_);
  auto [n0, n1] = net_pair(store, 2);
  constexpr size_t kMsgs = 3 * shoal::kTcpWindow + 5;
  std::vector<std::vector<uint8_t>> out(kMsgs), in(kMsgs);
  std::vector<Request> sends(kMsgs), recvs(kMsgs);
  for (size_t i = 0; i < kMsgs; ++i) {
    out[i].resize(100 + i);
    fill(out[i], 0, i);
    in[i].assign(out[i].size(), 0);
    sends[i] = make_req(Request::Dir::send, 1, out[i].data(), out[i].size(), 7);
    recvs[i] = make_req(Request::Dir::recv, 0, in[i].data(), in[i].size(), 7);
    n0.links[1]->post(&sends[i]);
  }
  // Nothing posted on the receiving side: the sender stops at the window, in order.
  spin_for(n0, 100ms);
  size_t done = 0;
  while (done < kMsgs && sends[done].complete) ++done;
  EXPECT_EQ(done, shoal::kTcpWindow);
  for (size_t i = done; i < kMsgs; ++i) EXPECT_FALSE(sends[i].complete) << i;

  // The receiver consumes; its reports wake the sender's epoll (strict: no 1 ms polling).
  for (auto& r : recvs) n1.links[0]->post(&r);
  std::vector<Request*> rp, sp;
  for (size_t i = 0; i < kMsgs; ++i) {
    rp.push_back(&recvs[i]);
    sp.push_back(&sends[i]);
  }
  std::string recv_error;
  std::thread rt([&] {
    try {
      drive(n1, rp, 10s, true);
    } catch (const std::exception& e) {
      recv_error = e.what();
    }
  });
  drive(n0, sp, 10s, true);
  rt.join();
  ASSERT_EQ(recv_error, "");
  for (size_t i = 0; i < kMsgs; ++i) ASSERT_EQ(in[i], out[i]) << "message " << i;

  // Both ways at once, many more messages than the window, small and split (> 512 KiB) mixed.
  constexpr size_t kMixed = 4 * shoal::kTcpWindow;
  std::vector<std::vector<uint8_t>> bufs[2][2];  // [rank][0 out, 1 in]
  std::vector<Request> reqs[2][2];
  for (int r = 0; r < 2; ++r) {
    for (int k = 0; k < 2; ++k) {
      bufs[r][k].resize(kMixed);
      reqs[r][k].resize(kMixed);
    }
    for (size_t i = 0; i < kMixed; ++i) {
      size_t bytes = i % 9 == 4 ? (600u << 10) + i : (i * 37) % 3000;
      bufs[r][0][i].resize(bytes);
      fill(bufs[r][0][i], r, 1000 + i);
      bufs[r][1][i].assign(bytes, 0);
    }
  }
  Net* nets[2] = {&n0, &n1};
  for (int r = 0; r < 2; ++r) {
    for (size_t i = 0; i < kMixed; ++i) {
      reqs[r][0][i] = make_req(Request::Dir::send, 1 - r, bufs[r][0][i].data(), bufs[r][0][i].size(), 8);
      reqs[r][1][i] = make_req(Request::Dir::recv, 1 - r, bufs[r][1][i].data(), bufs[r][1][i].size(), 8);
    }
  }
  std::string errs[2];
  auto run = [&](int r) {
    std::vector<Request*> all;
    for (size_t i = 0; i < kMixed; ++i) {  // interleaved: sends can run ahead of receives
      nets[r]->links[1 - r]->post(&reqs[r][0][i]);
      all.push_back(&reqs[r][0][i]);
      if (i % 2 == 1) {
        for (size_t j = i - 1; j <= i; ++j) {
          nets[r]->links[1 - r]->post(&reqs[r][1][j]);
          all.push_back(&reqs[r][1][j]);
        }
      }
    }
    try {
      drive(*nets[r], all, 20s, true);
    } catch (const std::exception& e) {
      errs[r] = e.what();
    }
  };
  std::thread t1(run, 1);
  run(0);
  t1.join();
  ASSERT_EQ(errs[0], "");
  ASSERT_EQ(errs[1], "");
  for (int r = 0; r < 2; ++r)
    for (size_t i = 0; i < kMixed; ++i) ASSERT_EQ(bufs[r][1][i], bufs[1 - r][0][i]) << "rank " << r << " message " << i;
}

TEST_F(TcpLinkTest, SenderHeldAtTheWindowFailsWhenTheReceiverLeaves) {
  TestDirStore store(dir_);
  auto [n0, n1] = net_pair(store, 1);
  std::vector<uint8_t> buf(64, 1);
  std::vector<Request> sends(shoal::kTcpWindow + 1);
  for (auto& s : sends) {
    s = make_req(Request::Dir::send, 1, buf.data(), buf.size(), 3, "gather");
    n0.links[1]->post(&s);
  }
  spin_for(n0, 50ms);
  ASSERT_TRUE(sends[shoal::kTcpWindow - 1].complete);
  ASSERT_FALSE(sends.back().complete);
  n1.links[0]->close();  // as when the process dies: its sockets close
  auto t0 = Clock::now();
  std::string what;
  try {
    drive(n0, {&sends.back()}, 5s, true);
  } catch (const shoal::PeerError& e) {
    what = e.what();
  }
  EXPECT_LT(Clock::now() - t0, 1s);
  EXPECT_NE(what.find("gather: rank 1 closed the connection"), std::string::npos) << what;
}

// Two ranks as threads: close() is idempotent, a closed link fails its posted requests, and the
// peer learns that the rank is gone.
TEST_F(TcpLinkTest, CloseTellsThePeer) {
  TestDirStore store(dir_);
  auto [n0, n1] = net_pair(store, 2);
  Link* a = n0.links[1].get();
  Link* b = n1.links[0].get();
  ASSERT_TRUE(a && b);
  EXPECT_STREQ(a->kind(), "tcp");
  EXPECT_FALSE(a->busy());
  EXPECT_FALSE(a->progress());

  // A zero-byte message still completes (header only).
  Request s0 = make_req(Request::Dir::send, 1, nullptr, 0, 1);
  Request r0 = make_req(Request::Dir::recv, 0, nullptr, 0, 1);
  a->post(&s0);
  b->post(&r0);
  EXPECT_TRUE(a->busy());
  auto deadline = Clock::now() + 5s;
  while (!(s0.complete && r0.complete) && Clock::now() < deadline) {
    a->progress();
    b->progress();
  }
  ASSERT_TRUE(s0.complete && r0.complete);

  std::vector<uint8_t> buf(100);
  Request r = make_req(Request::Dir::recv, 0, buf.data(), buf.size(), 2, "barrier");
  b->post(&r);
  Request s = make_req(Request::Dir::send, 1, buf.data(), buf.size(), 2);
  a->post(&s);
  a->close();
  a->close();  // idempotent
  EXPECT_THROW(a->progress(), shoal::PeerError);
  deadline = Clock::now() + 2s;
  std::string what;
  while (what.empty() && Clock::now() < deadline) {
    try {
      if (!b->progress()) std::this_thread::sleep_for(1ms);
    } catch (const shoal::PeerError& e) {
      what = e.what();
    }
  }
  EXPECT_NE(what.find("rank 0 closed the connection during barrier"), std::string::npos) << what;
}

// ---------------------------------------------------------------------------------------------
// Connections made when a pair first talks (tcp_listen + make_tcp_links, what a group uses).

// Listens, publishes "tcp/<rank>", reads every rank's address, and makes the lazy links.
Net make_lazy_net(shoal::Store& store, int rank, int size, int streams) {
  Net net;
  net.epfd = ::epoll_create1(EPOLL_CLOEXEC);
  shoal::TcpConfig cfg;
  cfg.rank = rank;
  cfg.size = size;
  cfg.use_tcp.assign(size, true);
  cfg.use_tcp[rank] = false;
  cfg.streams = cfg.local_streams = streams;
  cfg.secret = test_secret();
  cfg.advertise_host = "127.0.0.1";
  cfg.epoll_fd = net.epfd;
  auto conn = shoal::tcp_listen(cfg);
  store.set_string("tcp/" + std::to_string(rank), shoal::tcp_listen_address(*conn));
  std::vector<std::string> addrs(size);
  for (int j = 0; j < size; ++j) addrs[j] = store.get_string("tcp/" + std::to_string(j), 10s);
  net.links = shoal::make_tcp_links(conn, addrs);
  return net;
}

// Exchanges one message with each of `peers` and checks it.
int exchange(Net& net, int rank, const std::vector<int>& peers, uint64_t sig) {
  const size_t sz = 3000;
  std::vector<std::vector<uint8_t>> sb, rb;
  std::vector<Request> reqs;
  reqs.reserve(2 * peers.size());
  std::vector<Request*> ptrs;
  for (int p : peers) {
    sb.emplace_back(sz);
    fill(sb.back(), rank, sig + p);
    rb.emplace_back(sz, 0xEE);
  }
  for (size_t k = 0; k < peers.size(); ++k) {
    reqs.push_back(make_req(Request::Dir::send, peers[k], sb[k].data(), sz, sig));
    net.links[peers[k]]->post(&reqs.back());
    ptrs.push_back(&reqs.back());
    reqs.push_back(make_req(Request::Dir::recv, peers[k], rb[k].data(), sz, sig));
    net.links[peers[k]]->post(&reqs.back());
    ptrs.push_back(&reqs.back());
  }
  // Strict: every step of the connections (accept, connect, hello, acknowledgement) wakes epoll.
  drive(net, ptrs, 10s, /*strict=*/true);
  for (size_t k = 0; k < peers.size(); ++k) {
    std::vector<uint8_t> want(sz);
    fill(want, peers[k], sig + rank);
    if (rb[k] != want) return 1;
  }
  return 0;
}

// Five ranks, two streams per pair: after set-up a rank holds only its listener; talking to its
// ring neighbours connects those two pairs and no other; talking to everyone connects the rest
// and closes the listener.
TEST_F(TcpLinkTest, PairsConnectWhenTheyFirstTalk) {
  constexpr int n = 5, streams = 2;
  expect_all_ok(run_procs(dir_, n, [&](int rank) {
    const int base = shoal_test::open_sockets();
    TestDirStore store(dir_);
    Net net = make_lazy_net(store, rank, n, streams);
    if (shoal_test::open_sockets() - base != 1) return 10;  // the listener
    if (exchange(net, rank, {(rank + 1) % n, (rank + n - 1) % n}, 7)) return 20;
    const int ring = shoal_test::open_sockets() - base;
    if (ring != 1 + 2 * (streams + 1)) {
      std::fprintf(stderr, "rank %d: %d sockets after the ring exchange\n", rank, ring);
      return 30;
    }
    // Nobody dials for the next exchange before every rank has counted.
    store.set_string("counted/" + std::to_string(rank), "1");
    for (int j = 0; j < n; ++j) store.get("counted/" + std::to_string(j), 10s);
    std::vector<int> all;
    for (int j = 0; j < n; ++j)
      if (j != rank) all.push_back(j);
    if (exchange(net, rank, all, 8)) return 40;
    const int full = shoal_test::open_sockets() - base;
    if (full != (n - 1) * (streams + 1)) {
      std::fprintf(stderr, "rank %d: %d sockets after talking to everyone\n", rank, full);
      return 50;
    }
    return 0;
  }));
}

// A rank that leaves before its pair ever talked: the peer that would dial it is refused at once,
// and the peer it would have dialed finds it gone at its next look (once a second), not at the
// op's timeout.
TEST_F(TcpLinkTest, APeerThatLeftBeforeTalkingIsAnErrorAtOnce) {
  for (int leaver : {0, 1}) {
    SCOPED_TRACE(leaver);
    const std::string sub = dir_ + "/leaver" + std::to_string(leaver);
    ASSERT_EQ(::mkdir(sub.c_str(), 0700), 0);
    auto codes = run_procs(sub, 2, [&](int rank) {
      TestDirStore store(sub);
      Net net = make_lazy_net(store, rank, 2, 1);
      if (rank == leaver) {
        store.set_string("leaving", "1");
        ::_exit(0);  // no close(): like a crash
      }
      store.get("leaving", 10s);
      std::this_thread::sleep_for(100ms);  // its descriptors close as it exits
      std::vector<uint8_t> buf(64);
      Request r = make_req(Request::Dir::recv, leaver, buf.data(), buf.size(), 3, "allgather");
      net.links[leaver]->post(&r);
      const auto t0 = Clock::now();
      std::string what;
      try {
        drive(net, {&r});
      } catch (const shoal::PeerError& e) {
        what = e.what();
      }
      const double took = std::chrono::duration<double>(Clock::now() - t0).count();
      std::fprintf(stderr, "after %.3f s: %s\n", took, what.c_str());
      if (what.find("rank " + std::to_string(leaver) + " refused a connection at 127.0.0.1:") == std::string::npos ||
          what.find("it has exited or left the group") == std::string::npos)
        return 1;
      if (took > (rank > leaver ? 0.5 : 2.5)) return 2;
      return 0;
    });
    for (int i = 0; i < 2; ++i) EXPECT_EQ(codes[i], 0) << slurp(sub + "/err." + std::to_string(i));
  }
}

}  // namespace
