// shoal-doctor: what shoal will do on this machine (docs/doctor.md).
//
//   shoal-doctor [-n N] [--json] [--params]
//
// Without -n it sizes what it reports for one rank per core and forms no group; with -n N it also
// forms a group of N ranks here and reports each pair's transport and two allreduce times.
// --params prints every SHOAL_* variable instead. Exit status 0, or 1 when a warning was found.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unistd.h>

#include "shoal/doctor.h"

namespace {
const char kUsage[] =
    "usage: shoal-doctor [-n N] [--json] [--params]\n"
    "  -n N       size the report for N ranks on this host and run a group of N ranks here\n"
    "             (default: one rank per core, no group)\n"
    "  --json     the report as JSON: {\"sections\": {section: {key: value}}, \"warnings\": [...]}\n"
    "  --params   every SHOAL_* variable: meaning and default (a markdown table)\n"
    "Exit status: 0, or 1 when the report has warnings (marked '!'), 2 for bad arguments.\n";
}

int main(int argc, char** argv) {
  int ranks = 0;
  bool as_json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a == "--params") {
      std::fputs(shoal::doctor::settings().c_str(), stdout);
      return 0;
    } else if (a == "--json") {
      as_json = true;
    } else if (a == "-n" && i + 1 < argc) {
      char* end = nullptr;
      const long n = std::strtol(argv[++i], &end, 10);
      if (*end || n < 1 || n > 4096) {
        std::fprintf(stderr, "shoal-doctor: -n needs a number of ranks from 1 to 4096, got '%s'\n%s", argv[i], kUsage);
        return 2;
      }
      ranks = static_cast<int>(n);
    } else {
      std::fprintf(stderr, "shoal-doctor: unknown argument '%s'\n%s", a.c_str(), kUsage);
      return 2;
    }
  }
  try {
    auto items = shoal::doctor::machine(ranks ? ranks : static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
    if (ranks) {
      auto t = shoal::doctor::trial(ranks);
      items.insert(items.end(), t.begin(), t.end());
    }
    std::fputs((as_json ? shoal::doctor::json(items) : shoal::doctor::text(items)).c_str(), stdout);
    for (const auto& i : items)
      if (i.warning) return 1;
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shoal-doctor: %s\n", e.what());
    return 2;
  }
}
