// allreduce in place and not: p ranks (forked) each make N blocking allreduces of B bytes (f32)
// from one buffer into another, then N with the output the input (as torch.distributed calls it),
// after 5 untimed of each; prints each one's mean per call, the most over the ranks, in µs.
// shoal-bench's allreduce is out of place (BENCHMARKS.md, "An allreduce in place writes its output
// through the caches").
//
//   g++ -O2 -std=c++20 -Iinclude -Ibuild/include scripts/allreduce_in_place.cpp build/libshoal.so \
//       -Wl,-rpath,$PWD/build -o build/allreduce_in_place
//   build/allreduce_in_place P BYTES CALLS          (LD_LIBRARY_PATH picks another libshoal.so)
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <vector>
#include "forked_ranks.h"
using namespace shoal;
int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s P BYTES CALLS\n", argv[0]);
    return 2;
  }
  const int p = atoi(argv[1]), calls = atoi(argv[3]);
  const size_t n = strtoull(argv[2], 0, 10) / 4;
  return run_forked_ranks(p, "in-place", [&](Communicator& c, int r) {
    std::vector<float> in(n, 1.0f), out(n);
    CallOptions o;
    o.blocking = true;
    double us[2];
    for (int in_place = 0; in_place < 2; ++in_place) {
      float* dst = in_place ? in.data() : out.data();
      for (int i = 0; i < 5; ++i) c.allreduce(in.data(), dst, n, DType::f32, ReduceOp::sum, o);
      // Out of place every element is p; in place 1 multiplied by p at each of the 5 calls.
      const float want = in_place ? static_cast<float>(p * p * p * p * p) : static_cast<float>(p);
      if (n && dst[n - 1] != want) {
        fprintf(stderr, "rank %d: %s: wrong result %g, expected %g\n", r, in_place ? "in place" : "out of place", dst[n - 1], want);
        return 1;
      }
      c.barrier()->wait();
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < calls; ++i) c.allreduce(in.data(), dst, n, DType::f32, ReduceOp::sum, o);
      us[in_place] = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / calls;
    }
    double most[2];
    c.allreduce(us, most, 2, DType::f64, ReduceOp::max)->wait();
    if (r == 0) printf("out of place %.1f  in place %.1f\n", most[0], most[1]);
    return 0;
  });
}
