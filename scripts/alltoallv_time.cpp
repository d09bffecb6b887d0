// alltoallv with equal counts, timed: p ranks (forked) each send a block of B bytes (f32) to
// every rank, N blocking calls after 20 untimed ones; prints the max over ranks of the mean per
// call, in µs. shoal-bench's alltoall calls alltoall; torch's all_to_all_single calls alltoallv,
// which this times without torch's own cost per call (BENCHMARKS.md, "alltoall: the scratch
// slots or the rings").
//
//   g++ -O2 -std=c++20 -Iinclude -Ibuild/include scripts/alltoallv_time.cpp build/libshoal.so \
//       -Wl,-rpath,$PWD/build -o build/alltoallv_time
//   build/alltoallv_time P BYTES_PER_BLOCK CALLS         (LD_LIBRARY_PATH picks another libshoal.so)
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <vector>
#include "forked_ranks.h"
using namespace shoal;
int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s P BYTES_PER_BLOCK CALLS\n", argv[0]);
    return 2;
  }
  const int p = atoi(argv[1]), iters = atoi(argv[3]);
  const size_t n = strtoull(argv[2], 0, 10) / 4;
  return run_forked_ranks(p, "a2av", [&](Communicator& c, int r) {
    std::vector<size_t> counts(p, n);
    std::vector<float> in(n * p, 1.0f), out(n * p);
    CallOptions o;
    o.blocking = true;
    for (int i = 0; i < 20; ++i) c.alltoallv(in.data(), counts, out.data(), counts, DType::f32, o);
    c.barrier()->wait();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) c.alltoallv(in.data(), counts, out.data(), counts, DType::f32, o);
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
    std::vector<double> all(p);
    c.allgather(&us, all.data(), 1, DType::f64)->wait();
    if (r == 0) printf("%.1f\n", *std::max_element(all.begin(), all.end()));
    return 0;
  });
}
