// The in-process group of tests (loop_group.h).
#include "loop_group.h"

#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "algo/cost.h"
#include "base/scratch.h"
#include "engine/engine.h"
#include "transport/loop_link.h"

namespace shoal_test {

void run_loop(int n, const LoopOp& o, const std::function<void(shoal::Ctx&)>& fn) {
  using namespace shoal;
  const algo::Ways ways = algo::Ways::current();  // before the engines: it may throw
  std::vector<std::unique_ptr<Engine>> engines;
  std::vector<std::function<void()>> wake;
  for (int r = 0; r < n; ++r) {
    engines.push_back(std::make_unique<Engine>(r, n, "loop"));
    wake.push_back([e = engines.back().get()] { e->wake(); });
  }
  auto links = make_loop_links(n, wake);
  for (int r = 0; r < n; ++r) {
    engines[r]->set_links(std::move(links[r]));
    // A rank whose peer closed its links names why the peer failed, as through the store.
    engines[r]->peer_abort_reason = [&engines](int j) { return engines[j]->abort_reason(); };
  }
  std::vector<std::exception_ptr> errors;  // in the order the ranks failed: the first is the cause
  std::mutex errors_mu;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      Engine& e = *engines[r];
      try {
        Scratch scratch;
        e.begin_op("loop test", o.timeout);
        Ctx ctx(e, nullptr, scratch, r, n, o.dt, o.op, "loop test", 0x100b, Topo::hosts, nullptr, ways);
        fn(ctx);
      } catch (...) {
        {
          std::lock_guard<std::mutex> lock(errors_mu);
          errors.push_back(std::current_exception());
        }
        e.close_links();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : engines) e->close_links();  // each wakes its peers, all alive until every link is closed
  if (!errors.empty()) std::rethrow_exception(errors.front());
}

}  // namespace shoal_test
