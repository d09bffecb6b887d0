// shoal-bench: entry point. Without SHOAL_RANK (or mpirun's OMPI_COMM_WORLD_RANK) in the
// environment it is the launcher (launch.cpp); with it, one rank of the benchmark (worker.cpp).
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "bench/bench.h"

int main(int argc, char** argv) {
  using namespace shoal::bench;
  std::vector<std::string> args(argv + 1, argv + argc);
  Config cfg;
  try {
    cfg = parse_args(args);
  } catch (const std::exception& e) {
    std::string msg = e.what();
    if (msg.empty()) {  // -h
      std::fputs(usage().c_str(), stdout);
      return 0;
    }
    std::fprintf(stderr, "shoal-bench: %s\n\n%s", msg.c_str(), usage().c_str());
    return 2;
  }
  try {
    if (std::getenv("SHOAL_RANK") || std::getenv("OMPI_COMM_WORLD_RANK")) return worker_main(cfg);
    return launch(cfg, argv[0]);
  } catch (const std::exception& e) {
    const char* r = std::getenv("SHOAL_RANK");
    std::fprintf(stderr, "shoal-bench%s%s: %s\n", r ? " rank " : "", r ? r : "", e.what());
    return 1;
  }
}
