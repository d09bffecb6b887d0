// --resources: what a rank of the group costs the machine, read from /proc after the run: the time
// the Communicator took to construct (rendezvous and connections), resident memory, the shared
// memory it reserved in /dev/shm (its own segment) and mapped (its peers' too), and its open file
// descriptors. Rank 0 prints the mean and max over ranks.
#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "bench.h"

namespace shoal::bench {
namespace {

double kib_field(const std::string& path, const std::string& key) {
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key, 0) == 0) return std::atof(line.c_str() + key.size());
  return 0;
}

int open_fds() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n - 1;  // less the directory's own
}

}  // namespace

Resources measure_resources(double init_seconds) {
  Resources r;
  r.init_s = init_seconds;
  r.rss_mib = kib_field("/proc/self/status", "VmRSS:") / 1024;
  r.hwm_mib = kib_field("/proc/self/status", "VmHWM:") / 1024;
  r.fds = open_fds();
  // Segments are named /shoal-<pid>-<group>-<rank> (and unlinked once every peer mapped them).
  const std::string own = "/dev/shm/shoal-" + std::to_string(getpid()) + "-";
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("/dev/shm/shoal-") == std::string::npos) continue;
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi) != 2) continue;
    const double mib = double(hi - lo) / (1 << 20);
    r.shm_mapped_mib += mib;
    if (line.find(own) != std::string::npos) r.shm_own_mib += mib;
  }
  return r;
}

std::string Resources::encode() const {
  std::ostringstream s;
  s.precision(9);
  s << init_s << ' ' << rss_mib << ' ' << hwm_mib << ' ' << shm_own_mib << ' ' << shm_mapped_mib << ' ' << fds;
  return s.str();
}

Resources Resources::decode(const std::string& text) {
  Resources r;
  std::istringstream s(text);
  s >> r.init_s >> r.rss_mib >> r.hwm_mib >> r.shm_own_mib >> r.shm_mapped_mib >> r.fds;
  return r;
}

std::string resources_line(const std::vector<Resources>& all) {
  auto stat = [&](auto get, const char* fmt) {
    double sum = 0, mx = 0;
    for (const auto& r : all) {
      sum += get(r);
      mx = std::max(mx, get(r));
    }
    char buf[64];
    std::snprintf(buf, sizeof buf, fmt, sum / double(all.size()), mx);
    return std::string(buf);
  };
  return "resources per rank (mean / max over " + std::to_string(all.size()) + " ranks): init " +
         stat([](const Resources& r) { return r.init_s; }, "%.3f / %.3f s") + ", RSS " +
         stat([](const Resources& r) { return r.rss_mib; }, "%.1f / %.1f MiB") + " (peak " +
         stat([](const Resources& r) { return r.hwm_mib; }, "%.1f / %.1f MiB") + "), /dev/shm reserved " +
         stat([](const Resources& r) { return r.shm_own_mib; }, "%.1f / %.1f MiB") + ", mapped " +
         stat([](const Resources& r) { return r.shm_mapped_mib; }, "%.0f / %.0f MiB") + ", fds " +
         stat([](const Resources& r) { return double(r.fds); }, "%.0f / %.0f");
}

}  // namespace shoal::bench
