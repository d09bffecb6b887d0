// Rendezvous stores: TcpStore (server + clients), FileStore, PrefixStore, store_from_env.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "harness.h"
#include "shoal/error.h"
#include "shoal/store.h"
#include "store_frames.h"

using namespace std::chrono_literals;
using shoal_test::ScopedEnv;
using shoal::Bytes;
using shoal::Millis;
using Clock = std::chrono::steady_clock;

namespace {

long ms_since(Clock::time_point t0) {
  return static_cast<long>(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count());
}

Bytes random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  Bytes b(n);
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  return b;
}

// A port that nothing listens on right now (bound to 0, then closed).
uint16_t free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// Runs fn(i) in n forked children; returns how many of them failed (threw or did not exit 0).
int run_children(int n, const std::function<void(int)>& fn) {
  std::vector<pid_t> pids;
  for (int i = 0; i < n; ++i) {
    pid_t pid = fork();
    if (pid == 0) {
      int rc = 0;
      try {
        fn(i);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "child %d: %s\n", i, e.what());
        rc = 1;
      }
      _exit(rc);
    }
    pids.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  return failed;
}

// ---------------------------------------------------------------------------------------------
// The same behaviour from every store kind.

enum class Kind { tcp, file };

class StoreTest : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    if (GetParam() == Kind::tcp) {
      auto tcp = std::make_shared<shoal::TcpStore>("127.0.0.1", 0, true, 5000ms);
      port_ = tcp->port();
      server_ = tcp;
      ASSERT_NE(port_, 0);
    } else {
      char tmpl[] = "/tmp/shoal-store-test-XXXXXX";
      ASSERT_NE(mkdtemp(tmpl), nullptr);
      dir_ = tmpl;
      path_ = dir_ + "/store";
      server_ = std::make_shared<shoal::FileStore>(path_);
    }
  }
  void TearDown() override {
    server_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  // Another handle on the same store (a new connection, or the file opened again). Safe to call
  // in a forked child.
  std::shared_ptr<shoal::Store> client() {
    if (GetParam() == Kind::tcp) return std::make_shared<shoal::TcpStore>("127.0.0.1", port_, false, 5000ms);
    return std::make_shared<shoal::FileStore>(path_);
  }
  shoal::Store& store() { return *server_; }

  std::shared_ptr<shoal::Store> server_;
  uint16_t port_ = 0;
  std::string dir_, path_;
};

TEST_P(StoreTest, SetGetAddCheckWait) {
  auto& s = store();
  EXPECT_FALSE(s.check("a"));
  s.set_string("a", "hello");
  EXPECT_TRUE(s.check("a"));
  EXPECT_EQ(s.get_string("a", 1000ms), "hello");
  s.set_string("a", "again");  // overwrite
  EXPECT_EQ(s.get_string("a", 1000ms), "again");
  s.set("empty", {});
  EXPECT_TRUE(s.get("empty", 1000ms).empty());

  EXPECT_EQ(s.add("n", 5), 5);
  EXPECT_EQ(s.add("n", -2), 3);
  EXPECT_EQ(s.add("n", 0), 3);
  EXPECT_EQ(s.get_string("n", 1000ms), "3");  // counters read back as decimal text
  EXPECT_THROW(s.add("a", 1), shoal::Error);  // not an integer

  s.wait({"a", "n", "empty"}, 1000ms);
  s.wait({}, 0ms);

  auto other = client();  // another connection sees the same data
  EXPECT_EQ(other->get_string("a", 1000ms), "again");
  EXPECT_EQ(other->add("n", 10), 13);
  EXPECT_EQ(s.add("n", 0), 13);
}

TEST_P(StoreTest, GetBlocksUntilAnotherThreadSets) {
  auto other = client();
  auto t0 = Clock::now();
  std::thread setter([&] {
    std::this_thread::sleep_for(100ms);
    other->set_string("late", "value");
  });
  EXPECT_EQ(store().get_string("late", 5000ms), "value");
  long ms = ms_since(t0);
  setter.join();
  EXPECT_GE(ms, 90);
  EXPECT_LT(ms, 1000);
}

TEST_P(StoreTest, WaitBlocksUntilAllKeysAreSet) {
  std::thread setter([&] {
    auto other = client();
    for (const char* k : {"w1", "w2", "w3"}) {
      std::this_thread::sleep_for(30ms);
      other->set_string(k, "x");
    }
  });
  auto t0 = Clock::now();
  store().wait({"w1", "w2", "w3"}, 5000ms);
  EXPECT_GE(ms_since(t0), 80);
  setter.join();
}

TEST_P(StoreTest, GetBlocksUntilAnotherProcessSets) {
  auto t0 = Clock::now();
  int failed = run_children(1, [&](int) {
    auto c = client();
    std::this_thread::sleep_for(100ms);
    c->set_string("from-child", "42");
  });
  // The child has exited; its value must be there (and it was not there before).
  EXPECT_EQ(failed, 0);
  EXPECT_EQ(store().get_string("from-child", 5000ms), "42");
  EXPECT_GE(ms_since(t0), 90);

  // Now block first, then let a process set it.
  pid_t pid = fork();
  if (pid == 0) {
    int rc = 0;
    try {
      auto c = client();
      std::this_thread::sleep_for(100ms);
      c->set_string("from-child-2", "43");
    } catch (...) {
      rc = 1;
    }
    _exit(rc);
  }
  EXPECT_EQ(store().get_string("from-child-2", 5000ms), "43");
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

TEST_P(StoreTest, GetTimesOutNamingTheKey) {
  auto t0 = Clock::now();
  try {
    store().get("missing-key", 200ms);
    FAIL() << "no Timeout";
  } catch (const shoal::Timeout& e) {
    EXPECT_NE(std::string(e.what()).find("missing-key"), std::string::npos) << e.what();
  }
  long ms = ms_since(t0);
  EXPECT_GE(ms, 190);
  EXPECT_LT(ms, 2000);  // the 200 ms deadline is kept, not the store's default (slack for a loaded machine)

  EXPECT_THROW(store().get("missing-key", 0ms), shoal::Timeout);
}

TEST_P(StoreTest, WaitTimesOutNamingTheMissingKeys) {
  store().set_string("present", "1");
  auto t0 = Clock::now();
  try {
    store().wait({"present", "absent-1", "absent-2"}, 200ms);
    FAIL() << "no Timeout";
  } catch (const shoal::Timeout& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("absent-1"), std::string::npos) << m;
    EXPECT_NE(m.find("absent-2"), std::string::npos) << m;
    EXPECT_EQ(m.find("'present'"), std::string::npos) << m;
  }
  long ms = ms_since(t0);
  EXPECT_GE(ms, 190);
  EXPECT_LT(ms, 2000);  // the 200 ms deadline is kept, not the store's default (slack for a loaded machine)
}

TEST_P(StoreTest, AddFromSeveralProcesses) {
  constexpr int kProcs = 6, kAdds = 50;
  int failed = run_children(kProcs, [&](int i) {
    auto c = client();
    for (int j = 0; j < kAdds; ++j) c->add("counter", i + 1);
    c->add("done", 1);
  });
  EXPECT_EQ(failed, 0);
  EXPECT_EQ(store().add("counter", 0), kAdds * (kProcs * (kProcs + 1) / 2));
  EXPECT_EQ(store().add("done", 0), kProcs);
}

TEST_P(StoreTest, AddFromSeveralThreadsAndConnections) {
  constexpr int kThreads = 8, kAdds = 50;
  auto shared = client();
  std::vector<std::thread> ts;
  for (int i = 0; i < kThreads; ++i) {
    ts.emplace_back([&, i] {
      auto own = client();
      for (int j = 0; j < kAdds; ++j) (i % 2 ? *shared : *own).add("c", 1);
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(store().add("c", 0), kThreads * kAdds);
}

TEST_P(StoreTest, LargeAndBinaryValues) {
  Bytes big = random_bytes(8u << 20, 1);
  store().set("big", big);
  auto other = client();
  EXPECT_EQ(other->get("big", 5000ms), big);

  Bytes bin;
  for (int i = 0; i < 256; ++i) bin.push_back(static_cast<uint8_t>(i));
  bin.insert(bin.end(), {0, 0, 0, '\n', 0});
  other->set("bin", bin);
  EXPECT_EQ(store().get("bin", 1000ms), bin);

  std::string key_with_zero("k\0ey", 4);
  store().set_string(key_with_zero, "z");
  EXPECT_TRUE(other->check(key_with_zero));
  EXPECT_FALSE(other->check("k"));
  EXPECT_EQ(other->get_string(key_with_zero, 1000ms), "z");
}

TEST_P(StoreTest, PrefixStoreIsolation) {
  auto inner = client();
  shoal::PrefixStore a("groupA", inner), b("groupB", server_);
  a.set_string("k", "from A");
  b.set_string("k", "from B");
  EXPECT_EQ(a.get_string("k", 1000ms), "from A");
  EXPECT_EQ(b.get_string("k", 1000ms), "from B");
  EXPECT_EQ(store().get_string("groupA/k", 1000ms), "from A");
  EXPECT_FALSE(store().check("k"));
  EXPECT_EQ(a.add("n", 2), 2);
  EXPECT_EQ(b.add("n", 5), 5);
  EXPECT_TRUE(a.check("n"));
  EXPECT_FALSE(a.check("only-b"));
  b.set_string("only-b", "x");
  EXPECT_FALSE(a.check("only-b"));
  a.wait({"k", "n"}, 1000ms);
  try {
    a.wait({"k", "only-b"}, 50ms);
    FAIL() << "no Timeout";
  } catch (const shoal::Timeout& e) {
    EXPECT_NE(std::string(e.what()).find("groupA/only-b"), std::string::npos) << e.what();
  }
  shoal::PrefixStore nested("outer", std::make_shared<shoal::PrefixStore>("inner", server_));
  nested.set_string("x", "1");
  EXPECT_TRUE(store().check("inner/outer/x"));
}

INSTANTIATE_TEST_SUITE_P(Stores, StoreTest, ::testing::Values(Kind::tcp, Kind::file),
                         [](const auto& info) { return info.param == Kind::tcp ? "Tcp" : "File"; });

// ---------------------------------------------------------------------------------------------
// TcpStore specifics.

TEST(TcpStore, PortAndLocalAddress) {
  shoal::TcpStore server("127.0.0.1", 0, true, 2000ms);
  EXPECT_NE(server.port(), 0);
  EXPECT_EQ(server.local_address(), "127.0.0.1");
  shoal::TcpStore c("localhost", server.port(), false, 2000ms);
  EXPECT_EQ(c.port(), server.port());
  EXPECT_EQ(c.local_address(), "127.0.0.1");
}

TEST(TcpStore, OneClientSharedByThreads) {
  // A GET blocked in one thread must not hold up a SET from another thread on the same client.
  shoal::TcpStore s("127.0.0.1", 0, true, 2000ms);
  auto t0 = Clock::now();
  std::thread getter([&] { EXPECT_EQ(s.get_string("k", 5000ms), "v"); });
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(s.check("k"));
  s.set_string("k", "v");
  getter.join();
  EXPECT_LT(ms_since(t0), 1000);

  // Many threads, interleaved blocking and immediate requests.
  std::vector<std::thread> ts;
  for (int i = 0; i < 8; ++i) {
    ts.emplace_back([&, i] {
      std::string mine = "t" + std::to_string(i), next = "t" + std::to_string((i + 1) % 8);
      s.set_string(mine, mine);
      EXPECT_EQ(s.get_string(next, 5000ms), next);
      s.add("sum", i);
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(s.add("sum", 0), 28);
}

TEST(TcpStore, BlockedGetDoesNotSpin) {
  shoal::TcpStore s("127.0.0.1", 0, true, 2000ms);
  rusage before{}, after{};
  getrusage(RUSAGE_SELF, &before);
  EXPECT_THROW(s.get("never", 300ms), shoal::Timeout);
  getrusage(RUSAGE_SELF, &after);
  auto cpu_us = [](const rusage& r) {
    return (r.ru_utime.tv_sec + r.ru_stime.tv_sec) * 1000000L + r.ru_utime.tv_usec + r.ru_stime.tv_usec;
  };
  EXPECT_LT(cpu_us(after) - cpu_us(before), 50000) << "a waiting get should sleep, not poll";
}

TEST(TcpStore, ClientRetriesUntilTheServerStarts) {
  uint16_t port = free_port();
  std::shared_ptr<shoal::TcpStore> server;
  std::thread starter([&] {
    std::this_thread::sleep_for(200ms);
    server = std::make_shared<shoal::TcpStore>("127.0.0.1", port, true, 2000ms);
  });
  auto t0 = Clock::now();
  shoal::TcpStore c("127.0.0.1", port, false, 5000ms);
  EXPECT_GE(ms_since(t0), 150);
  starter.join();
  c.set_string("k", "v");
  EXPECT_EQ(server->get_string("k", 1000ms), "v");
}

TEST(TcpStore, ConnectFailsAfterTheConnectTimeout) {
  uint16_t port = free_port();
  auto t0 = Clock::now();
  try {
    shoal::TcpStore c("127.0.0.1", port, false, 300ms);
    FAIL() << "connected to nothing";
  } catch (const shoal::Timeout&) {
    FAIL() << "a connection failure is an Error, not a Timeout";
  } catch (const shoal::Error& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(port)), std::string::npos) << e.what();
  }
  long ms = ms_since(t0);
  EXPECT_GE(ms, 280);
  EXPECT_LT(ms, 1500);
}

TEST(TcpStore, ServerDyingFailsWaitingClients) {
  // The serving process dies (no destructor runs): a client blocked in get fails at once.
  uint16_t port = free_port();
  pid_t pid = fork();
  if (pid == 0) {
    try {
      shoal::TcpStore server("127.0.0.1", port, true, 2000ms);
      std::this_thread::sleep_for(300ms);
      _exit(0);  // dies serving: no destructor
    } catch (...) {
    }
    _exit(0);
  }
  shoal::TcpStore c("127.0.0.1", port, false, 5000ms);
  auto t0 = Clock::now();
  EXPECT_THROW(c.get("never", 10000ms), shoal::Error);
  EXPECT_LT(ms_since(t0), 2000);
  EXPECT_THROW(c.set_string("k", "v"), shoal::Error);  // the connection stays failed
  waitpid(pid, nullptr, 0);
}

TEST(TcpStore, ServingStoreWaitsForClientsBeforeStopping) {
  // The rank serving the store finishes first: its destructor keeps serving the others until
  // they disconnect (up to a few seconds).
  ScopedEnv linger("SHOAL_STORE_LINGER", nullptr);  // the default, 5 s
  auto server = std::make_shared<shoal::TcpStore>("127.0.0.1", 0, true, 2000ms);
  auto c = std::make_unique<shoal::TcpStore>("127.0.0.1", server->port(), false, 2000ms);
  std::atomic<bool> destroyed{false};
  auto t0 = Clock::now();
  std::thread closer([&] {
    server.reset();
    destroyed = true;
  });
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE(destroyed.load());
  EXPECT_NO_THROW({
    c->set_string("late", "still served");
    EXPECT_EQ(c->get_string("late", 1000ms), "still served");
  });
  c.reset();
  closer.join();
  long ms = ms_since(t0);
  EXPECT_GE(ms, 190);
  EXPECT_LT(ms, 1500);
}

TEST(TcpStore, ValueOverTheFrameLimitIsRejected) {
  shoal::TcpStore s("127.0.0.1", 0, true, 2000ms);
  EXPECT_THROW(s.set("huge", Bytes((64u << 20) + 1)), shoal::InvalidArgument);
  s.set_string("still", "fine");
  EXPECT_EQ(s.get_string("still", 1000ms), "fine");
}

int raw_connect(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  return fd;
}
// Whether the server closes `fd` within `ms` (reads and discards anything it sends first).
bool closed_by_peer(int fd, int ms) {
  auto deadline = Clock::now() + std::chrono::milliseconds(ms);
  char buf[4096];
  while (Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) == 1) {
      ssize_t r = recv(fd, buf, sizeof buf, 0);
      if (r <= 0) return true;
    }
  }
  return false;
}

TEST(TcpStore, ServerSurvivesGarbage) {
  shoal::TcpStore s("127.0.0.1", 0, true, 2000ms);
  s.set_string("before", "1");

  // Random bytes.
  int g1 = raw_connect(s.port());
  Bytes junk = random_bytes(100000, 7);
  (void)!send(g1, junk.data(), junk.size(), MSG_NOSIGNAL);

  // An absurd frame length: dropped at once.
  int g2 = raw_connect(s.port());
  uint8_t huge[] = {0xf0, 0xff, 0xff, 0xff, 1, 2, 3};
  ASSERT_EQ(send(g2, huge, sizeof huge, MSG_NOSIGNAL), (ssize_t)sizeof huge);
  EXPECT_TRUE(closed_by_peer(g2, 2000)) << "a 4 GiB frame should drop the connection";

  // A plausible small frame that is not a HELLO: dropped.
  int g3 = raw_connect(s.port());
  uint8_t set_frame[] = {9, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0};
  ASSERT_EQ(send(g3, set_frame, sizeof set_frame, MSG_NOSIGNAL), (ssize_t)sizeof set_frame);
  EXPECT_TRUE(closed_by_peer(g3, 2000));

  // Half a frame, then hang up.
  int g4 = raw_connect(s.port());
  uint8_t partial[] = {100, 0, 0, 0, 0};
  (void)!send(g4, partial, sizeof partial, MSG_NOSIGNAL);
  close(g4);

  // Normal clients, old and new, still work.
  shoal::TcpStore c("127.0.0.1", s.port(), false, 2000ms);
  EXPECT_EQ(c.get_string("before", 1000ms), "1");
  c.set_string("after", "2");
  EXPECT_EQ(s.get_string("after", 1000ms), "2");
  EXPECT_EQ(s.add("n", 1), 1);
  close(g1);
  close(g2);
  close(g3);
  EXPECT_EQ(c.add("n", 1), 2);
}

// A connection that stalls before completing its HELLO, or in the middle of a frame, is dropped
// after SHOAL_STORE_STALL_TIMEOUT (here 0.5 s); one idle between frames is kept.
TEST(TcpStore, StalledConnectionsAreDropped) {
  ::setenv("SHOAL_STORE_STALL_TIMEOUT", "0.5", 1);
  shoal::TcpStore s("127.0.0.1", 0, true, 2000ms);  // the server reads it when it starts
  ::unsetenv("SHOAL_STORE_STALL_TIMEOUT");
  shoal::TcpStore idle_client("127.0.0.1", s.port(), false, 2000ms);
  idle_client.set_string("k", "v");

  const std::vector<uint8_t> hello = shoal_test::store_frames::hello();
  auto send_bytes = [](int fd, const std::vector<uint8_t>& b) {
    ASSERT_EQ(send(fd, b.data(), b.size(), MSG_NOSIGNAL), (ssize_t)b.size());
  };
  const auto t0 = Clock::now();
  int silent = raw_connect(s.port());
  int half_hello = raw_connect(s.port());
  send_bytes(half_hello, std::vector<uint8_t>(hello.begin(), hello.begin() + 5));  // its length and command
  int half_frame = raw_connect(s.port());
  send_bytes(half_frame, shoal_test::store_frames::cat(hello, {20, 0, 0, 0, 1}));  // HELLO, then 5 bytes of a 24-byte SET
  int hello_only = raw_connect(s.port());
  send_bytes(hello_only, hello);

  EXPECT_TRUE(closed_by_peer(silent, 5000)) << "a connection that never sends its HELLO";
  EXPECT_TRUE(closed_by_peer(half_hello, 5000)) << "a truncated HELLO";
  EXPECT_TRUE(closed_by_peer(half_frame, 5000)) << "a frame begun after the HELLO and never finished";
  EXPECT_GE(Clock::now() - t0, 400ms) << "dropped before the stall timeout";

  // Slowloris: after the HELLO, the first 12 bytes of a 24-byte frame, one byte every 100 ms
  // (1.2 s > 0.5 s; the frame is never completed, so only the stall can drop it).
  int slow = raw_connect(s.port());
  send_bytes(slow, hello);
  const std::vector<uint8_t> check = {20, 0, 0, 0, 4, 2, 0, 0, 0, 1, 0, 0};  // CHECK ... (cut short)
  bool dropped = false;
  for (uint8_t b : check) {
    if (send(slow, &b, 1, MSG_NOSIGNAL) != 1) {
      dropped = true;
      break;
    }
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_TRUE(dropped || closed_by_peer(slow, 3000)) << "a frame trickled a byte at a time";

  // Idle between frames for longer than the timeout: kept, and still served.
  EXPECT_FALSE(closed_by_peer(hello_only, 300)) << "a connection idle after its HELLO was dropped";
  EXPECT_EQ(idle_client.get_string("k", 1000ms), "v");
  for (int fd : {silent, half_hello, half_frame, hello_only, slow}) close(fd);
}

// SHOAL_STORE_TOKEN: a server with a token refuses clients without it or with another one, with a
// message that names the variable, and serves clients that present it; a server without one
// serves everyone (the token is opt-in, as for torch's TCPStore, which has none).
TEST(TcpStore, TokenIsRequiredWhereTheServerHasOne) {
  ::setenv("SHOAL_STORE_TOKEN", "s3cret-token", 1);
  shoal::TcpStore s("127.0.0.1", 0, true, 2000ms);  // server and its own client: both have it
  s.set_string("k", "v");
  shoal::TcpStore good("127.0.0.1", s.port(), false, 2000ms);
  EXPECT_EQ(good.get_string("k", 1000ms), "v");
  for (const char* bad : {"", "s3cret-tokeN", "s3cret-token-and-more"}) {
    ::setenv("SHOAL_STORE_TOKEN", bad, 1);
    try {
      shoal::TcpStore c("127.0.0.1", s.port(), false, 2000ms);
      ADD_FAILURE() << "a client with token '" << bad << "' was served";
    } catch (const shoal::Error& e) {
      EXPECT_NE(std::string(e.what()).find("SHOAL_STORE_TOKEN"), std::string::npos) << e.what();
    }
  }
  ::unsetenv("SHOAL_STORE_TOKEN");
  EXPECT_THROW(shoal::TcpStore("127.0.0.1", s.port(), false, 2000ms), shoal::Error);
  EXPECT_EQ(good.get_string("k", 1000ms), "v");  // the refusals did not disturb the others

  shoal::TcpStore open_server("127.0.0.1", 0, true, 2000ms);  // no token: anyone
  ::setenv("SHOAL_STORE_TOKEN", "whatever", 1);
  shoal::TcpStore c("127.0.0.1", open_server.port(), false, 2000ms);
  ::unsetenv("SHOAL_STORE_TOKEN");
  c.set_string("x", "1");
  EXPECT_EQ(open_server.get_string("x", 1000ms), "1");
}

// ---------------------------------------------------------------------------------------------
// store_from_env.

TEST(StoreFromEnv, UnsetExplainsTheContract) {
  ScopedEnv e("SHOAL_STORE", nullptr);
  try {
    shoal::store_from_env(0, 1000ms);
    FAIL() << "no error";
  } catch (const shoal::InvalidArgument& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("SHOAL_STORE"), std::string::npos) << m;
    EXPECT_NE(m.find("host:port"), std::string::npos) << m;
  }
}

TEST(StoreFromEnv, MalformedValues) {
  for (const char* v : {"localhost", "localhost:", ":1234", "host:abc", "host:0", "host:70000", "[::1]1234"}) {
    ScopedEnv e("SHOAL_STORE", v);
    EXPECT_THROW(shoal::store_from_env(1, 100ms), shoal::InvalidArgument) << v;
  }
  ScopedEnv e("SHOAL_STORE", "127.0.0.1:1234");
  ScopedEnv s("SHOAL_STORE_SERVER", "maybe");
  EXPECT_THROW(shoal::store_from_env(0, 100ms), shoal::InvalidArgument);
}

TEST(StoreFromEnv, TcpRankZeroServes) {
  std::string addr = "127.0.0.1:" + std::to_string(free_port());
  ScopedEnv e("SHOAL_STORE", addr.c_str());
  ScopedEnv s("SHOAL_STORE_SERVER", nullptr);
  auto r0 = shoal::store_from_env(0, 2000ms);
  auto r1 = shoal::store_from_env(1, 2000ms);
  ASSERT_NE(dynamic_cast<shoal::TcpStore*>(r0.get()), nullptr);
  r1->set_string("hi", "from 1");
  EXPECT_EQ(r0->get_string("hi", 1000ms), "from 1");
}

TEST(StoreFromEnv, TcpExternalServer) {
  shoal::TcpStore server("127.0.0.1", 0, true, 2000ms);
  std::string addr = "127.0.0.1:" + std::to_string(server.port());
  ScopedEnv e("SHOAL_STORE", addr.c_str());
  ScopedEnv s("SHOAL_STORE_SERVER", "0");
  auto r0 = shoal::store_from_env(0, 2000ms);  // a client: the port is taken by `server` anyway
  r0->set_string("k", "v");
  EXPECT_EQ(server.get_string("k", 1000ms), "v");
}

TEST(StoreFromEnv, ErrorWhenNothingServes) {
  std::string addr = "127.0.0.1:" + std::to_string(free_port());
  ScopedEnv e("SHOAL_STORE", addr.c_str());
  ScopedEnv s("SHOAL_STORE_SERVER", "0");
  EXPECT_THROW(shoal::store_from_env(0, 200ms), shoal::Error);
}

TEST(StoreFromEnv, FilePath) {
  char tmpl[] = "/tmp/shoal-store-env-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  std::string path = std::string(tmpl) + "/store";
  {
    ScopedEnv e("SHOAL_STORE", path.c_str());
    auto a = shoal::store_from_env(0, 1000ms);
    auto b = shoal::store_from_env(1, 1000ms);
    ASSERT_NE(dynamic_cast<shoal::FileStore*>(a.get()), nullptr);
    a->set_string("k", "v");
    EXPECT_EQ(b->get_string("k", 1000ms), "v");
  }
  {
    ScopedEnv e("SHOAL_STORE", "/nonexistent-dir-for-shoal/store");
    EXPECT_THROW(shoal::store_from_env(0, 100ms), shoal::Error);
  }
  std::filesystem::remove_all(tmpl);
}

}  // namespace
