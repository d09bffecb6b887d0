// Receives from any source (Communicator::kAnySource): the first message with the tag and dtype
// wins, Work::source() names its sender, and messages with another tag are left for their own
// receives; on shared memory and on TCP.
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "harness.h"

using namespace shoal;
using namespace shoal_test;

class AnySource : public ::testing::TestWithParam<std::string> {};

TEST_P(AnySource, RootReceivesEveryRanksMessageOnce) {
  for (int n : {2, 3, 5}) {
    run_ranks(n, transport_config(GetParam()), [](Communicator& c) {
      const size_t count = 1000;  // several messages in flight: the ring/socket holds them all
      if (c.rank() != 0) {
        std::vector<int32_t> v(count, c.rank() * 100);
        c.send(v.data(), count, DType::i32, 0, /*tag=*/7)->wait();
        c.barrier()->wait();
        return;
      }
      std::vector<int> seen;
      for (int k = 1; k < c.size(); ++k) {
        std::vector<int32_t> v(count, -1);
        auto w = c.recv(v.data(), count, DType::i32, Communicator::kAnySource, 7);
        w->wait();
        const int src = w->source();
        SH_CHECK(src >= 1 && src < c.size()) << "source " << src;
        for (size_t i = 0; i < count; ++i) SH_CHECK(v[i] == src * 100) << "element " << i << " from " << src;
        seen.push_back(src);
      }
      std::sort(seen.begin(), seen.end());
      for (int k = 1; k < c.size(); ++k) SH_CHECK(seen[k - 1] == k) << "rank " << k << " matched " << "not once";
      c.barrier()->wait();
    });
  }
}

TEST_P(AnySource, OtherTagsAreLeftForTheirOwnReceives) {
  run_ranks(3, transport_config(GetParam()), [](Communicator& c) {
    int32_t x = c.rank(), go = 0;
    if (c.rank() == 1) c.send(&x, 1, DType::i32, 0, /*tag=*/1)->wait();  // another tag, sent first
    if (c.rank() == 2) {
      c.recv(&go, 1, DType::i32, 0, /*tag=*/9)->wait();  // only once rank 0 listens for tag 2
      c.send(&x, 1, DType::i32, 0, /*tag=*/2)->wait();
    }
    if (c.rank() == 0) {
      usleep(100000);  // rank 1's tag-1 message has arrived and waits, unmatched
      int32_t a = -1, b = -1;
      auto w = c.recv(&a, 1, DType::i32, Communicator::kAnySource, 2);
      c.send(&go, 1, DType::i32, 2, 9)->wait();
      w->wait();
      SH_CHECK(w->source() == 2 && a == 2) << "any-source tag 2 got " << a << " from " << w->source();
      auto w1 = c.recv(&b, 1, DType::i32, 1, 1);
      w1->wait();
      SH_CHECK(b == 1 && w1->source() == 1) << "tag 1 got " << b;
    }
    c.barrier()->wait();
  });
}

INSTANTIATE_TEST_SUITE_P(All, AnySource, ::testing::Values("shm", "tcp"));
