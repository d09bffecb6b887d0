// Point to point: send/recv of every dtype and size 0 .. 1 Mi + 3, with tags, in both directions;
// ring exchanges among 2..8 ranks with async sends (both the safe even/odd order and the order
// where every rank posts its send first); several messages between one pair arriving in order;
// a tag, count or dtype that does not match fails with an error, never with data.
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "harness.h"

using namespace shoal;
using namespace shoal_test;

namespace {

constexpr size_t kLarge = (size_t(1) << 20) + 3;
constexpr size_t kSizes[] = {0, 1, 7, 4097, 65537, kLarge};

// Besides "shm" and "tcp": "tcp_lowat1" is TCP with SHOAL_TCP_NOTSENT_LOWAT=1, so that nearly
// every sendmsg stops short (partial writes inside headers and payloads, on every stream), and
// "tcp_nolowat" is TCP with no such limit (=0, the kernel's default).
RunConfig p2p_config(const std::string& transport) {
  RunConfig cfg = timed_config(transport.rfind("tcp", 0) == 0 ? "tcp" : transport, std::chrono::seconds(30),
                               std::chrono::seconds(120), false);
  if (transport == "tcp_lowat1") cfg.env.push_back({"SHOAL_TCP_NOTSENT_LOWAT", "1"});
  if (transport == "tcp_nolowat") cfg.env.push_back({"SHOAL_TCP_NOTSENT_LOWAT", "0"});
  return cfg;
}

class P2P : public ::testing::TestWithParam<std::string> {};

// Every dtype x size, rank 0 -> 1 then 1 -> 0, each message with its own tag.
TEST_P(P2P, EveryDtypeAndSize) {
  run_ranks(2, p2p_config(GetParam()), [](Communicator& c) {
    Suite s(c);
    const int me = c.rank(), peer = 1 - me;
    uint64_t tag = 1;
    for (int dir = 0; dir < 2; ++dir) {
      const int sender = dir;
      for (DType dt : kAllDTypes) {
        for (size_t count : kSizes) {
          const uint64_t t = tag++ * 977;  // distinct, sparse tags
          s.run(std::string("p2p ") + std::to_string(sender) + "->" + std::to_string(1 - sender) + " dt=" +
                    dt_name(dt) + " count=" + std::to_string(count) + " tag=" + std::to_string(t),
                [&]() -> std::string {
                  const uint64_t seed = s.seed();
                  if (me == sender) {
                    Buf b(dt, count), orig(dt, count);
                    fill_data(dt, b.data(), count, seed);
                    fill_data(dt, orig.data(), count, seed);
                    c.send(b.data(), count, dt, peer, t, s.opts(Algo::automatic))->wait();
                    return first_err({compare_buffers(dt, b.data(), orig.data(), count).empty()
                                          ? ""
                                          : "send modified its buffer",
                                      b.guards()});
                  }
                  Buf b(dt, count), e(dt, count);
                  fill_data(dt, e.data(), count, seed);
                  auto w = c.recv(b.data(), count, dt, peer, t, s.opts(Algo::automatic));
                  w->wait();
                  if (w->source() != peer) return "source() is " + std::to_string(w->source());
                  return first_err({compare_buffers(dt, b.data(), e.data(), count), b.guards()});
                });
        }
      }
    }
    s.finish();
  });
}

// Several messages of different sizes and tags between the same pair, all posted before any is
// waited for, arrive in order.
TEST_P(P2P, OrderingBetweenOnePair) {
  run_ranks(2, p2p_config(GetParam()), [](Communicator& c) {
    constexpr int kMsgs = 24;
    auto count_of = [](int k) -> size_t { return k % 6 == 0 ? 0 : k % 6 == 1 ? 300000 + size_t(k) : size_t(k) * 31; };
    auto tag_of = [](int k) -> uint64_t { return k % 3 == 0 ? 0 : (uint64_t(1) << 40) + uint64_t(k % 2); };
    std::vector<std::unique_ptr<Buf>> bufs;
    std::vector<WorkPtr> works;
    for (int k = 0; k < kMsgs; ++k) {
      bufs.push_back(std::make_unique<Buf>(DType::i32, count_of(k)));
      if (c.rank() == 0) {
        fill_data(DType::i32, bufs.back()->data(), count_of(k), 5000 + k);
        works.push_back(c.send(bufs.back()->data(), count_of(k), DType::i32, 1, tag_of(k)));
      } else {
        works.push_back(c.recv(bufs.back()->data(), count_of(k), DType::i32, 0, tag_of(k)));
      }
    }
    for (auto& w : works) w->wait();
    if (c.rank() == 1) {
      for (int k = 0; k < kMsgs; ++k) {
        Buf e(DType::i32, count_of(k));
        fill_data(DType::i32, e.data(), count_of(k), 5000 + k);
        std::string err = compare_buffers(DType::i32, bufs[k]->data(), e.data(), count_of(k));
        SH_CHECK(err.empty()) << "message " << k << ": " << err;
        SH_CHECK(bufs[k]->guards().empty()) << "message " << k << ": " << bufs[k]->guards();
      }
    }
    // The other direction with both ranks sending and receiving at once.
    Buf out(DType::u8, 100000), in(DType::u8, 100000), e(DType::u8, 100000);
    fill_data(DType::u8, out.data(), 100000, 77 + c.rank());
    fill_data(DType::u8, e.data(), 100000, 77 + (1 - c.rank()));
    auto ws = c.send(out.data(), 100000, DType::u8, 1 - c.rank(), 9);
    auto wr = c.recv(in.data(), 100000, DType::u8, 1 - c.rank(), 9);
    wr->wait();
    ws->wait();
    std::string err = compare_buffers(DType::u8, in.data(), e.data(), 100000);
    SH_CHECK(err.empty()) << "simultaneous exchange: " << err;
  });
}

// Thousands of small messages through a 4 KiB ring, the receives posted only after every send
// (which completes once its bytes are in the ring): the sender fills the ring, waits for room,
// and learns of it only by reading the receiver's tail again (ShmLink reads it only when a
// message does not fit in the room it last saw). Every message arrives, in order.
TEST(P2PSmallRing, ManySmallMessagesWrapTheRing) {
  RunConfig cfg = transport_config("shm");
  cfg.env.push_back({"SHOAL_SHM_RING", "4K"});
  run_ranks(2, cfg, [](Communicator& c) {
    constexpr int kMsgs = 3000;
    auto count_of = [](int k) { return size_t(k % 37); };  // 0..36 ints: 32-176 bytes with the header
    std::vector<std::vector<int32_t>> bufs(kMsgs);
    std::vector<WorkPtr> works;
    for (int k = 0; k < kMsgs; ++k) {
      bufs[k].assign(count_of(k), c.rank() == 0 ? k : -1);
      if (c.rank() == 0) works.push_back(c.send(bufs[k].data(), count_of(k), DType::i32, 1, 0));
    }
    if (c.rank() == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let the ring fill
      for (int k = 0; k < kMsgs; ++k) works.push_back(c.recv(bufs[k].data(), count_of(k), DType::i32, 0, 0));
    }
    for (auto& w : works) w->wait();
    if (c.rank() == 1) {
      for (int k = 0; k < kMsgs; ++k) {
        for (int32_t x : bufs[k]) {
          SH_CHECK(x == k) << "message " << k << " holds " << x;
        }
      }
    }
  });
}

// The copies into a ring with each stores of SHOAL_DIRECT_STORES (src/transport/stores.h): every
// length around the non-temporal kernel's edges and the timed copies', from odd places in the
// sender's buffer into odd places in the receiver's, with a 64 KiB ring that messages wrap again
// and again (a copy split at the ring's end, slices of 128 KiB). Both ways at once: each rank's
// sends while its receives drain. Every byte arrives, and nothing past a message is written.
class P2PRingStores : public ::testing::TestWithParam<std::string> {};

TEST_P(P2PRingStores, EveryByteArrivesWhicheverStores) {
  RunConfig cfg = transport_config("shm");
  cfg.env.push_back({"SHOAL_SHM_RING", "64K"});
  cfg.env.push_back({"SHOAL_DIRECT_STORES", GetParam()});
  run_ranks(2, cfg, [](Communicator& c) {
    const size_t lens[] = {0, 1, 63, 4095, 4096, 4097, 16383, 16384, 16385, 40003, 65536, 131073, 200001};
    constexpr size_t kGuard = 64;
    const int me = c.rank(), peer = 1 - me;
    auto byte = [](int from, int round, size_t k, size_t i) {
      return static_cast<uint8_t>(from * 131 + round * 31 + k * 7 + i * 13 + (i >> 8));
    };
    for (int round = 0; round < 3; ++round) {
      const size_t off = 1 + round * 16;  // the sender's and receiver's buffers start off a line
      std::vector<std::vector<uint8_t>> out(std::size(lens)), in(std::size(lens));
      std::vector<WorkPtr> works;
      for (size_t k = 0; k < std::size(lens); ++k) {
        out[k].resize(off + lens[k]);
        for (size_t i = 0; i < lens[k]; ++i) out[k][off + i] = byte(me, round, k, i);
        in[k].assign(off + lens[k] + kGuard, 0xEE);
        works.push_back(c.send(out[k].data() + off, lens[k], DType::u8, peer, k));
        works.push_back(c.recv(in[k].data() + off, lens[k], DType::u8, peer, k));
      }
      for (auto& w : works) w->wait();
      for (size_t k = 0; k < std::size(lens); ++k)
        for (size_t i = 0; i < in[k].size(); ++i) {
          const bool inside = i >= off && i < off + lens[k];
          const uint8_t want = inside ? byte(peer, round, k, i - off) : uint8_t(0xEE);
          SH_CHECK(in[k][i] == want) << "round " << round << " message " << k << " (" << lens[k] << " bytes): byte "
                                     << i << " is " << int(in[k][i]) << ", not " << int(want);
        }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Stores, P2PRingStores, ::testing::Values("cached", "streaming", "auto"));

// Messages with a tag, count or dtype the receiver did not post fail (on the receiver at least),
// never deliver data.
struct MismatchCase {
  const char* name;
  size_t send_count, recv_count;
  DType send_dt, recv_dt;
  uint64_t send_tag, recv_tag;
};
constexpr MismatchCase kMismatches[] = {
    {"tag", 100, 100, DType::f32, DType::f32, 1, 2},
    {"tag_large", kLarge, kLarge, DType::f32, DType::f32, 7, 8},
    {"count", 100, 120, DType::i32, DType::i32, 3, 3},
    {"count_shorter", 120, 100, DType::i32, DType::i32, 3, 3},
    {"dtype", 100, 100, DType::i32, DType::f32, 4, 4},
};

class P2PMismatch : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(P2PMismatch, FailsWithError) {
  const auto& [transport, which] = GetParam();
  const MismatchCase mc = kMismatches[which];
  RunConfig cfg = p2p_config(transport);
  cfg.options.timeout = std::chrono::seconds(3);
  cfg.limit = std::chrono::seconds(30);
  auto res = run_ranks_outcomes(2, cfg, [mc](Communicator& c) {
    auto* flag = static_cast<uint32_t*>(shared_area());
    if (c.rank() == 0) {
      Buf b(mc.send_dt, mc.send_count);
      fill_data(mc.send_dt, b.data(), mc.send_count, 1);
      std::string what = "ok";
      try {
        c.send(b.data(), mc.send_count, mc.send_dt, 1, mc.send_tag)->wait();
      } catch (const Error& e) {
        what = std::string("error: ") + e.what();
      }
      note("sender: " + what);
      // Stay alive until the receiver is done, so that it sees the mismatch, not our exit.
      auto until = now_seconds() + 10;
      while (__atomic_load_n(flag, __ATOMIC_SEQ_CST) == 0 && now_seconds() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return;
    }
    Buf b(mc.recv_dt, mc.recv_count);
    struct Done {
      uint32_t* f;
      ~Done() { __atomic_store_n(f, 1u, __ATOMIC_SEQ_CST); }
    } done{flag};
    mark_time();
    c.recv(b.data(), mc.recv_count, mc.recv_dt, 0, mc.recv_tag)->wait();
    SH_CHECK(false) << "recv succeeded despite a " << mc.name << " mismatch";
  });
  const auto& rx = res.ranks[1];
  EXPECT_TRUE(rx.error_kind == "PeerError" || rx.error_kind == "Timeout")
      << "receiver: " << rx.describe() << "\n" << res.describe();
  EXPECT_FALSE(rx.hung) << res.describe();
  EXPECT_LT(rx.fail_seconds, 6.0) << res.describe();
  EXPECT_FALSE(res.ranks[0].hung) << res.describe();
  EXPECT_TRUE(res.ranks[0].error_kind.empty()) << res.describe();  // sender: error inside is fine
  if (rx.error_kind == "PeerError") {
    EXPECT_TRUE(names_rank(rx.message, 0)) << "does not name the peer: " << rx.message;
  }
}

// A thread that waits for a receive progresses the engine itself (Communicator::Impl::run_claimed).
// Two things it must not hold up: another thread's receive that completes meanwhile (here that
// thread's next send is what the peer waits for before it sends the first thread's message), and
// the communicator's destruction (the waiter must let go at once, not at the timeout).
class P2PWaiters : public ::testing::TestWithParam<std::string> {};

TEST_P(P2PWaiters, AnotherThreadsReceiveCompletesMeanwhile) {
  // Rank 0 waits for `a` from rank 1 on one thread and for `b` from rank 2 on another; only once
  // that one has `b` does it send to rank 2, which then tells rank 1 to send `a`.
  run_ranks(3, p2p_config(GetParam()), [](Communicator& c) {
    const auto t0 = std::chrono::steady_clock::now();
    int32_t a = 0, b = 0, x = 0, y = 0;
    if (c.rank() == 0) {
      auto wa = c.recv(&a, 1, DType::i32, 1, 1);
      auto wb = c.recv(&b, 1, DType::i32, 2, 2);
      std::thread t1([&] { wa->wait(); });  // takes the engine, for `a`
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      wb->wait();  // must be done by now: nothing sends `a` until rank 2 hears from here
      x = b + 1;
      c.send(&x, 1, DType::i32, 2, 3)->wait();
      t1.join();
      SH_CHECK(a == 24 && b == 22) << "a=" << a << " b=" << b;
    } else if (c.rank() == 2) {
      b = 22;
      c.send(&b, 1, DType::i32, 0, 2)->wait();
      c.recv(&x, 1, DType::i32, 0, 3)->wait();
      y = x + 1;
      c.send(&y, 1, DType::i32, 1, 4)->wait();
    } else {
      c.recv(&y, 1, DType::i32, 2, 4)->wait();
      a = y;
      c.send(&a, 1, DType::i32, 0, 1)->wait();
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    SH_CHECK(secs < 10) << "took " << secs << " s (the op timeout is 30 s)";
  });
}

// A blocking receive holds the engine on its caller's thread; a send another thread queues
// meanwhile, which the peer needs before it sends what the receive waits for, must still go out
// (the receive hands its request over to the progress thread).
TEST_P(P2PWaiters, BlockingReceiveLetsAnotherThreadsSendGo) {
  run_ranks(2, p2p_config(GetParam()), [](Communicator& c) {
    const auto t0 = std::chrono::steady_clock::now();
    CallOptions blocking;
    blocking.blocking = true;
    int32_t a = 0, b = 0;
    if (c.rank() == 0) {
      std::thread sender([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the receive is waiting by now
        b = 5;
        c.send(&b, 1, DType::i32, 1, 1)->wait();
      });
      auto w = c.recv(&a, 1, DType::i32, 1, 2, blocking);
      sender.join();
      SH_CHECK(w->test() && w->source() == 1) << "test " << w->test() << " source " << w->source();
      SH_CHECK(a == 6) << "a=" << a;
    } else {
      c.recv(&b, 1, DType::i32, 0, 1)->wait();
      a = b + 1;
      c.send(&a, 1, DType::i32, 0, 2)->wait();
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    SH_CHECK(secs < 10) << "took " << secs << " s (the op timeout is 30 s)";
  });
}

TEST_P(P2PWaiters, DestroyingTheGroupReleasesAWaiter) {
  run_ranks(2, p2p_config(GetParam()), [](Communicator& c) {
    Options o = Options::from_env({});
    o.group_name = "destroyed under a waiter";
    o.timeout = std::chrono::seconds(30);
    auto g = std::make_unique<Communicator>(std::make_shared<FileStore>(run_dir() + "/waiter-store"), c.rank(),
                                            c.size(), o);
    if (c.rank() == 0) {
      float x = 0;
      auto w = g->recv(&x, 1, DType::f32, 1, 7);  // rank 1 never sends it
      std::string got = "no error";
      std::thread waiter([&] {
        try {
          w->wait();
        } catch (const Error& e) {
          got = e.what();
        }
      });
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      const auto t0 = std::chrono::steady_clock::now();
      g.reset();
      waiter.join();
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      SH_CHECK(secs < 5) << "destroying took " << secs << " s (the op timeout is 30 s)";
      SH_CHECK(got.find("destroyed") != std::string::npos) << got;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    }
    c.barrier()->wait();
  });
}

INSTANTIATE_TEST_SUITE_P(All, P2PWaiters, ::testing::Values("shm", "tcp"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

INSTANTIATE_TEST_SUITE_P(All, P2P, ::testing::Values("shm", "tcp", "tcp_lowat1", "tcp_nolowat"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

INSTANTIATE_TEST_SUITE_P(All, P2PMismatch,
                         ::testing::Combine(::testing::Values("shm", "tcp"),
                                            ::testing::Range(0, int(std::size(kMismatches)))),
                         [](const ::testing::TestParamInfo<std::tuple<std::string, int>>& i) {
                           return std::get<0>(i.param) + "_" + kMismatches[std::get<1>(i.param)].name;
                         });

// Ring exchanges among n ranks: each rank sends to its right and receives from its left (and the
// reverse), sizes 0 .. 1 Mi + 3.
class P2PRing : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

TEST_P(P2PRing, Exchanges) {
  const auto& [n, transport] = GetParam();
  run_ranks(n, p2p_config(transport), [](Communicator& c) {
    Suite s(c);
    const int n = c.size(), me = c.rank();
    const int right = (me + 1) % n, left = (me + n - 1) % n;
    const DType dts[] = {DType::f32, DType::bf16, DType::i64, DType::u8, DType::boolean};
    uint64_t round = 0;
    for (size_t count : kSizes) {
      for (DType dt : dts) {
        if (count == kLarge && dt != DType::f32 && dt != DType::i64) continue;
        const std::string base = std::string(" dt=") + dt_name(dt) + " count=" + std::to_string(count);
        // 1. Every rank posts its send first, then its receive.
        s.run("send-first ring" + base, [&]() -> std::string {
          const uint64_t seed = s.seed(), tag = ++round;
          Buf out(dt, count), in(dt, count), e(dt, count);
          fill_data(dt, out.data(), count, seed + me);
          fill_data(dt, e.data(), count, seed + left);
          auto ws = c.send(out.data(), count, dt, right, tag);
          auto wr = c.recv(in.data(), count, dt, left, tag);
          wr->wait();
          ws->wait();
          return first_err({compare_buffers(dt, in.data(), e.data(), count), in.guards()});
        });
        // 2. Even ranks send first, odd ranks receive first; waits in reverse order.
        s.run("even/odd ring" + base, [&]() -> std::string {
          const uint64_t seed = s.seed(), tag = ++round;
          Buf out(dt, count), in(dt, count), e(dt, count);
          fill_data(dt, out.data(), count, seed + me);
          fill_data(dt, e.data(), count, seed + left);
          WorkPtr ws, wr;
          if (me % 2 == 0) {
            ws = c.send(out.data(), count, dt, right, tag);
            wr = c.recv(in.data(), count, dt, left, tag);
          } else {
            wr = c.recv(in.data(), count, dt, left, tag);
            ws = c.send(out.data(), count, dt, right, tag);
          }
          ws->wait();
          wr->wait();
          return first_err({compare_buffers(dt, in.data(), e.data(), count), in.guards()});
        });
        // 3. Blocking calls (MPI_Send, MPI_Recv), in an order that cannot deadlock: even ranks
        //    send first, odd ranks receive first.
        s.run("blocking even/odd ring" + base, [&]() -> std::string {
          const uint64_t seed = s.seed(), tag = ++round;
          Buf out(dt, count), in(dt, count), e(dt, count);
          fill_data(dt, out.data(), count, seed + me);
          fill_data(dt, e.data(), count, seed + left);
          CallOptions blocking;
          blocking.blocking = true;
          WorkPtr wr;
          if (me % 2 == 0) {
            if (!c.send(out.data(), count, dt, right, tag, blocking)->test()) return "a blocking send returned pending";
            wr = c.recv(in.data(), count, dt, left, tag, blocking);
          } else {
            wr = c.recv(in.data(), count, dt, left, tag, blocking);
            if (!c.send(out.data(), count, dt, right, tag, blocking)->test()) return "a blocking send returned pending";
          }
          if (!wr->test()) return "a blocking recv returned pending";
          if (wr->source() != left) return "the blocking recv's source() is " + std::to_string(wr->source());
          return first_err({compare_buffers(dt, in.data(), e.data(), count), in.guards()});
        });
        // 4. Both directions at once: to the right with one tag, to the left with another.
        s.run("bidirectional ring" + base, [&]() -> std::string {
          const uint64_t seed = s.seed(), tag = ++round * 1000;
          Buf out_r(dt, count), out_l(dt, count), in_l(dt, count), in_r(dt, count), e_l(dt, count), e_r(dt, count);
          fill_data(dt, out_r.data(), count, seed + me * 2);
          fill_data(dt, out_l.data(), count, seed + me * 2 + 1);
          fill_data(dt, e_l.data(), count, seed + left * 2);       // what left sent to its right
          fill_data(dt, e_r.data(), count, seed + right * 2 + 1);  // what right sent to its left
          std::vector<WorkPtr> w;
          w.push_back(c.send(out_r.data(), count, dt, right, tag + 1));
          w.push_back(c.send(out_l.data(), count, dt, left, tag + 2));
          w.push_back(c.recv(in_l.data(), count, dt, left, tag + 1));
          w.push_back(c.recv(in_r.data(), count, dt, right, tag + 2));
          for (auto& x : w) x->wait();
          return first_err({compare_buffers(dt, in_l.data(), e_l.data(), count),
                            compare_buffers(dt, in_r.data(), e_r.data(), count), in_l.guards(), in_r.guards()});
        });
      }
    }
    s.finish();
  });
}

INSTANTIATE_TEST_SUITE_P(All, P2PRing,
                         ::testing::Combine(::testing::Values(2, 3, 4, 5, 8), ::testing::Values("shm", "tcp")),
                         [](const ::testing::TestParamInfo<std::tuple<int, std::string>>& i) {
                           return "n" + std::to_string(std::get<0>(i.param)) + "_" + std::get<1>(i.param);
                         });

}  // namespace
