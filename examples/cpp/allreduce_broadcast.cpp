// An allreduce and a broadcast, checked: run it under `shoal-run -n N`, which starts N ranks and
// gives each the environment store_from_env reads (docs/launch.md).
#include <shoal/communicator.h>
#include <shoal/error.h>
#include <shoal/version.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main() {
  const char* r = std::getenv("SHOAL_RANK");
  const char* n = std::getenv("SHOAL_WORLD_SIZE");
  if (!r || !n) {
    std::fprintf(stderr, "run me under shoal-run -n N (SHOAL_RANK and SHOAL_WORLD_SIZE are unset)\n");
    return 2;
  }
  const int rank = std::atoi(r), size = std::atoi(n);
  try {
    shoal::Communicator comm(shoal::store_from_env(rank, std::chrono::seconds(60)), rank, size);

    // Every rank gives rank + 1 in each element; each gets the sum, size * (size + 1) / 2.
    std::vector<float> x(1000, float(rank + 1)), sum(1000);
    comm.allreduce(x.data(), sum.data(), x.size(), shoal::DType::f32, shoal::ReduceOp::sum)->wait();
    const float want = size * (size + 1) / 2.0f;
    for (float v : sum)
      if (v != want) {
        std::fprintf(stderr, "rank %d: allreduce gave %g, not %g\n", rank, v, want);
        return 1;
      }

    // The last rank's numbers reach every rank.
    std::vector<int> b(16, rank == size - 1 ? 42 : -1);
    comm.broadcast(b.data(), b.size(), shoal::DType::i32, size - 1)->wait();
    for (int v : b)
      if (v != 42) {
        std::fprintf(stderr, "rank %d: broadcast gave %d, not 42\n", rank, v);
        return 1;
      }
    std::printf("rank %d of %d: allreduce %g, broadcast %d, over %s (shoal %s)\n", rank, size, sum[0], b[0],
                comm.transport_to((rank + 1) % size).c_str(), SHOAL_VERSION_STRING);
  } catch (const shoal::Error& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    return 1;
  }
  return 0;
}
