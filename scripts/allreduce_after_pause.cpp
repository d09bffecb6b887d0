// allreduce after a pause: p ranks (forked) each make N blocking allreduces of B bytes (f32), in
// bursts of BURST (1 where not given) back to back, each burst after a barrier and a sleep of
// PAUSE_US, and time each call alone; prints the median, the 90th
// percentile and the slowest call, each the most over the ranks, in µs. Ops that come one after
// another keep their memory in use; ops a pause apart find it as the machine left it
// (BENCHMARKS.md, "Writes after a pause").
//
//   g++ -O2 -std=c++20 -Iinclude -Ibuild/include scripts/allreduce_after_pause.cpp build/libshoal.so \
//       -Wl,-rpath,$PWD/build -o build/allreduce_after_pause
//   build/allreduce_after_pause P BYTES CALLS PAUSE_US [BURST]   (LD_LIBRARY_PATH picks another libshoal.so)
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>
#include "forked_ranks.h"
using namespace shoal;
int main(int argc, char** argv) {
  if (argc != 5 && argc != 6) {
    fprintf(stderr, "usage: %s P BYTES CALLS PAUSE_US [BURST]\n", argv[0]);
    return 2;
  }
  const int p = atoi(argv[1]), calls = atoi(argv[3]);
  const size_t bytes = strtoull(argv[2], 0, 10);
  const auto pause = std::chrono::microseconds(atol(argv[4]));
  const int burst = argc == 6 ? std::max(1, atoi(argv[5])) : 1;
  return run_forked_ranks(p, "after-pause", [&](Communicator& c, int r) {
    std::vector<float> in(bytes / 4, 1.0f), out(bytes / 4);
    CallOptions o;
    o.blocking = true;
    for (int i = 0; i < 20; ++i) c.allreduce(in.data(), out.data(), in.size(), DType::f32, ReduceOp::sum, o);
    std::vector<double> us(calls);
    for (int i = 0; i < calls; ++i) {
      if (i % burst == 0) {
        c.barrier()->wait();
        std::this_thread::sleep_for(pause);
      }
      const auto t0 = std::chrono::steady_clock::now();
      c.allreduce(in.data(), out.data(), in.size(), DType::f32, ReduceOp::sum, o);
      us[i] = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    }
    if (out[0] != static_cast<float>(p)) {
      fprintf(stderr, "rank %d: wrong result %g\n", r, out[0]);
      return 1;
    }
    std::sort(us.begin(), us.end());
    double mine[3] = {us[calls / 2], us[calls * 9 / 10], us[calls - 1]}, all[3];
    for (int k = 0; k < 3; ++k) c.allreduce(&mine[k], &all[k], 1, DType::f64, ReduceOp::max)->wait();
    if (r == 0) printf("median %.1f  p90 %.1f  slowest %.1f\n", all[0], all[1], all[2]);
    return 0;
  });
}
