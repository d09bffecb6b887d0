#include "base/params.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "shoal/error.h"

extern char** environ;

namespace shoal::params {
namespace {

const std::vector<Param> kParams = {
    {"SHOAL_RANK", Kind::integer, 0, 1 << 24, nullptr, "this process's rank in the group: the launch contract (`docs/launch.md`)", ""},
    {"SHOAL_WORLD_SIZE", Kind::integer, 1, 1 << 24, nullptr, "the number of ranks in the group (`docs/launch.md`)", ""},
    {"SHOAL_STORE", Kind::text, 0, 0, nullptr, "where the ranks meet: `host:port` of a TCP store, or a path of a file store (`docs/launch.md`)", ""},
    {"SHOAL_STORE_SERVER", Kind::flag, 0, 0, nullptr,
     "`0`: rank 0 does not serve the TCP store at `SHOAL_STORE` but connects to it, as every other rank does "
     "(another process serves it: `shoal-store`, `shoal-run`; `docs/launch.md`)",
     "`1`: rank 0 serves it"},
    {"SHOAL_STORE_TOKEN", Kind::text, 0, 0, nullptr,
     "a token the TCP store requires of every client (set the same for the server and every rank; `docs/launch.md`)",
     "none; `shoal-run` makes one up for the store it serves"},
    {"SHOAL_STORE_LINGER", Kind::seconds, 0, 3600, nullptr,
     "seconds the rank serving the TCP store keeps serving after its own communicator is gone, while other "
     "clients are still connected (0: stop at once)",
     "5"},
    {"SHOAL_STORE_STALL_TIMEOUT", Kind::seconds, 0, 3600, nullptr,
     "seconds the TCP store waits for the rest of a request a client has started before it drops the connection",
     "30"},
    {"SHOAL_TRANSPORT", Kind::choice, 0, 0, "auto,shm,tcp",
     "`auto`, `shm` (fail if a peer is not on this host) or `tcp` (TCP even between local peers)", "`auto`"},
    {"SHOAL_ALGO", Kind::text, 0, 0, nullptr,
     "force an algorithm where the op has it (`ring`, `bde`, `mst`, `direct`, `rd`, `scatter_allgather`, `linear`, "
     "`hier`), or one per op: `allreduce:bde,broadcast:ring` (ops: `allreduce`, `broadcast`, `reduce`, "
     "`allgather`, `reduce_scatter`, `gather`, `scatter`, `alltoall`, `barrier`; the others choose their own)",
     "automatic"},
    {"SHOAL_TUNING", Kind::text, 0, 0, nullptr,
     "a file of costs measured on this machine, which the automatic choice of algorithm uses instead of the "
     "built-in ones (`scripts/tune_algos.py` writes it; `docs/algorithms.md`, \"Measured cost curves\" and "
     "\"Where the choice changes\"); it may hold points for some ops only, and some switches only. Read when a "
     "group forms, as are the eight below; set them the same for every rank of a host, and its `switch` lines the "
     "same for every rank of a group (the group's creation checks)",
     "the built-in costs of this CPU's kind (`SHOAL_TUNING_BUILTIN`)"},
    {"SHOAL_TUNING_BUILTIN", Kind::choice, 0, 0, "auto,amd,intel",
     "which built-in costs the automatic choice reads for the ops `SHOAL_TUNING` has no points of: `amd` (measured "
     "on a 2-core AMD EPYC, `src/algo/cost_points.inc`), `intel` (on a 2-core Intel Xeon, "
     "`src/algo/cost_points_intel.inc`, for the ops it has points of; AMD's for the others) or `auto` (those of "
     "this CPU's maker; AMD's for another maker)",
     "`auto`"},
    {"SHOAL_DIRECT_REDUCE", Kind::choice, 0, 0, "auto,one_shot,two_shot,single_copy",
     "for tuning and tests: how the shared-memory allreduce and reduce above 8 KiB run: `one_shot` (every rank, "
     "or a reduce's root, reads every input; an allreduce only when it fits the scratch area; a reduce's root "
     "as the others copy in, at any size), `two_shot` (each rank reduces a slice), `single_copy` (the "
     "allreduce at 2 ranks, each with a core, where the group may: `SHOAL_CMA`; each rank reduces half, "
     "reading the other's input for it and then the other half of the result straight from the other "
     "rank's buffers; elsewhere as `auto`) or `auto` (the cheaper by the measured costs, `SHOAL_TUNING`; "
     "single copy for the 2-rank allreduce from 2 MiB where the built-in costs are Intel's, "
     "`SHOAL_TUNING_BUILTIN`)",
     "`auto`"},
    {"SHOAL_DIRECT_ALLTOALL", Kind::choice, 0, 0, "auto,scratch,pairwise",
     "for tuning and tests: how alltoall and alltoallv run when every rank is on this host, above 8 KiB: `scratch` "
     "(through the ranks' shared scratch areas, a barrier per phase, or by single copy), `pairwise` (the pairwise "
     "exchange over the shared-memory rings) or `auto` (the cheaper by the measured costs, `SHOAL_TUNING`)",
     "`auto`"},
    {"SHOAL_DIRECT_BROADCAST", Kind::choice, 0, 0, "auto,scratch,single_copy",
     "for tuning and tests: how broadcast runs when every rank is on this host, above 8 KiB: `scratch` (the root "
     "copies into its shared scratch area, the others copy out), `single_copy` (at 2 ranks, the root writes half the "
     "vector straight into the other rank's buffer while that rank reads the other half from the root's, where the "
     "group may: `SHOAL_CMA`) or `auto` (the cheaper by the measured costs, `SHOAL_TUNING`)",
     "`auto`"},
    {"SHOAL_DIRECT_ALLGATHER", Kind::choice, 0, 0, "auto,scratch,single_copy",
     "for tuning and tests: how allgather runs when every rank is on this host, above 8 KiB: `scratch` (each rank "
     "copies its block into its shared scratch area, the others copy it out), `single_copy` (at 2 ranks, each rank "
     "reads the other's input straight, where the group may: `SHOAL_CMA`) or `auto` (the cheaper by the measured "
     "costs, `SHOAL_TUNING`)",
     "`auto`"},
    {"SHOAL_DIRECT_SCATTER", Kind::choice, 0, 0, "auto,scratch,single_copy",
     "for tuning and tests: how scatter runs when every rank is on this host, above 8 KiB: `scratch` (the root "
     "copies the other ranks' blocks into its shared scratch area, each copies its own out), `single_copy` (each "
     "rank reads its block of the root's buffer straight, where the group may: `SHOAL_CMA`) or `auto` (the cheaper "
     "by the measured costs, `SHOAL_TUNING`)",
     "`auto`"},
    {"SHOAL_DIRECT_GATHER", Kind::choice, 0, 0, "auto,scratch,single_copy",
     "for tuning and tests: how gather runs when every rank is on this host, above 8 KiB: `scratch` (each rank "
     "copies its block into its shared scratch area, the root copies them out), `single_copy` (each rank writes its "
     "block into the root's output straight, where the group may: `SHOAL_CMA`) or `auto` (the cheaper by the "
     "measured costs, `SHOAL_TUNING`)",
     "`auto`"},
    {"SHOAL_DIRECT_STORES", Kind::choice, 0, 0, "auto,cached,streaming",
     "how a rank writes data for others into shared memory, its scratch area (every op on one host above 8 KiB that "
     "goes through the scratch, and the data of smaller ops of more than 512 B) and its rings (every send on one host of 4 "
     "KiB or more): `cached` (ordinary stores), `streaming` (non-temporal stores, to memory, from 512 B: "
     "faster where ranks sit on different core complexes of an AMD EPYC, slower where cores share a cache) or "
     "`auto` (ordinary stores, timed to their last store, each copy from 16 KiB and, from 1 KiB, one in every "
     "128 KiB of them, until, in two samples in a row (each of 256 KiB and four copies or more), more than half "
     "of the bytes timed are in copies that cost more than 300 ns per KiB, or 280 for copies under 16 KiB: then "
     "non-temporal ones, until a second has passed, looked at every 64 of those copies; the copies timed within "
     "10 ms after 20 ms without one, from 16 KiB, do not count; with more than two ranks "
     "a core, non-temporal ones while a cache-line round trip between two CPUs, measured once a second, takes 300 "
     "ns or more; `BENCHMARKS.md`, \"Choosing the stores as the op runs\", \"Short copies timed to their last "
     "store\", \"Short copies on an Intel Xeon\", \"Long copies that lose their core\" and \"The stores after a pause\")",
     "`auto`"},
    {"SHOAL_DIRECT_PLACES", Kind::choice, 0, 0, "auto,moving,fixed",
     "where a rank's ops on one host that go through its scratch area, above 8 KiB, put their data in it, where "
     "each rank has a core and the L2's size is known (successive ops alternate between two slots): `moving` "
     "(each op on a slot at the next place within a share of one L2, L2/(p-1), so that its stores go to lines the "
     "readers have let go), `fixed` (every op at its slot's start) or `auto` (moving once ops have come fast "
     "enough that a place comes back within 10 ms, for more ops than the slots have places, with no gap of 10 ms; "
     "else the slot keeps its place: on a virtual machine a page left unwritten for longer may cost a trap to the "
     "host at its next write). Each rank may take its own: its readers look up where it wrote (`BENCHMARKS.md`, \"Direct ops: "
     "each op's place in the slot\" and \"Places that move while ops come fast\")",
     "`auto`"},
    {"SHOAL_TIMEOUT", Kind::seconds, 0.001, 1e9, nullptr, "deadline of every op, seconds", "300"},
    {"SHOAL_TCP_STREAMS", Kind::integer, 1, 64, nullptr,
     "TCP data connections per peer (large messages are striped over them), besides the one control connection "
     "that carries flow control; set, it applies to every peer",
     "4 to a peer on another host, 1 to one on this host (`src/transport/tcp_link.h`)"},
    {"SHOAL_TCP_NOTSENT_LOWAT", Kind::bytes, 0, 1 << 30, nullptr,
     "bytes of not-yet-sent data each TCP socket may queue in the kernel (`TCP_NOTSENT_LOWAT`; 0 = no limit, the "
     "kernel's default). Small keeps the copies in cache across hosts; it does not limit the window "
     "(`docs/multihost.md`); set, it applies to every peer",
     "16384 to a peer on another host, 0 to one on this host"},
    {"SHOAL_HOST", Kind::text, 0, 0, nullptr, "address (or name) this rank advertises for TCP; wins over `SHOAL_SOCKET_IFNAME`",
     "the address that reaches the store, unless that is loopback and a peer is on another host: then the first "
     "interface `^docker,lo` admits"},
    {"SHOAL_SOCKET_IFNAME", Kind::text, 0, 0, nullptr,
     "the interface whose address this rank advertises for TCP, in NCCL's syntax: name prefixes `eth,ib`, exact "
     "names `=eth0`, exclusions `^docker,lo` or `^=eth1` (`docs/deploy.md`)",
     "unset (the rule above)"},
    {"SHOAL_SOCKET_FAMILY", Kind::choice, 0, 0, "AF_INET,AF_INET6", "`AF_INET` or `AF_INET6`: which of an interface's addresses to advertise",
     "IPv4 first, then IPv6"},
    {"SHOAL_HOST_ID", Kind::text, 0, 0, nullptr,
     "for tests: this rank's host identity; ranks with different ids act as on different hosts (TCP between them, "
     "hierarchical algorithms)",
     "hostname + boot id + PID namespace"},
    {"SHOAL_SHM_RING", Kind::bytes, 1, 1 << 30, nullptr,
     "bytes of each shared-memory ring (one per other rank of the host; suffixes K, M, G), rounded up to a power "
     "of two. A rank reserves its whole segment in `/dev/shm` when the group is made: too little room there is "
     "an error then, saying how much is needed and free. Ranks of a host whose setting differs talk over TCP",
     "1 MiB up to 9 ranks on a host, then smaller (8 MiB of rings per rank, at least 64 KiB each)"},
    {"SHOAL_SHM_SCRATCH", Kind::bytes, 256 << 10, 4.0 * (1 << 30), nullptr,
     "bytes of each rank's shared-memory scratch area, through which the direct algorithms move data (suffixes K, "
     "M, G; at least 256 KiB). Ranks of a host whose setting differs talk over TCP",
     "16 MiB"},
    {"SHOAL_CMA", Kind::flag, 0, 0, nullptr,
     "`0`: ranks on one host never copy straight between each other's buffers (Linux cross-memory attach, "
     "`process_vm_readv`/`writev`, as Open MPI's CMA), and every transfer takes two copies through shared memory. "
     "With `1` a group probes, when it forms, whether the kernel lets every rank read every other's memory (the "
     "same user, Yama's `ptrace_scope` 0, no seccomp profile forbidding it: containers often do) and uses single "
     "copy for broadcast, allgather, scatter and gather where the measured costs say (`SHOAL_TUNING`), and for "
     "alltoall's blocks from a size that the CPU's built-in costs set (`docs/algorithms.md`), only if it does (`Communicator::single_copy()`; `BENCHMARKS.md`, \"Single-copy transfers\")",
     "`1`"},
    {"SHOAL_SPIN_US", Kind::integer, 0, 1e7, nullptr, "how long a waiter polls before it yields or sleeps (futex/epoll), µs: at 0 it yields or sleeps after one look. Where ranks outnumber cores the shared-memory waits also skip their few quick polls before it, whatever this says (`BENCHMARKS.md`, \"Ranks that share cores\"). The cores counted are those the group's ranks on a machine may run on between them: the union of their affinity masks (`taskset`, cpusets, mpirun's binding; `docs/deploy.md`)",
     "50, 0 when a machine's ranks outnumber their cores"},
    {"SHOAL_YIELD_US", Kind::integer, 0, 1e7, nullptr,
     "after polling, how long a waiter yields its core (`sched_yield`) before it sleeps, µs, so a peer queued "
     "behind it on the core runs at once. Not for a wait that only sends, or only receives, ≥ 1 MiB over TCP: "
     "that one sleeps on epoll at once (`BENCHMARKS.md`, \"Waiting for one-way TCP transfers\")",
     "1000 when a machine's ranks outnumber their cores, else 0"},
    {"SHOAL_SIMD", Kind::choice, 0, 0, "auto,scalar,avx2,avx512", "force the reduction kernels: `scalar`, `avx2`, `avx512` (`auto`: the best the CPU has)",
     "the best the CPU has"},
    {"SHOAL_LOG", Kind::choice, 0, 0, "error,warn,info,debug,trace", "`error`, `warn`, `info`, `debug`, `trace` (stderr, one line per event, rank prefixed); `info` "
                  "also prints the `SHOAL_*` settings in effect when a group forms, `debug` each op a rank runs "
                  "(e.g. `allreduce #7 (count 1024, f32, sum, algorithm direct)`)",
     "`warn`"},
    {"SHOAL_RUN_GRACE", Kind::seconds, 0, 1e6, nullptr,
     "`shoal-run`: seconds the other ranks get to exit after one failed, before they are killed", "10"},
    {"SHOAL_RDT_POOL_BYTES", Kind::bytes, 0, 1e15, nullptr, "idle receive buffers the Ray direct transport keeps for reuse, bytes (0 = none)",
     "1 GiB"},
    {"SHOAL_RAY_AUTOLOAD", Kind::flag, 0, 0, nullptr,
     "`0`: the wheel's startup hook does not register shoal with Ray (then `import shoal` in the driver and each "
     "actor does; `docs/ray.md`)",
     "on"},
};

const Param& find(const char* name) {
  for (const Param& p : kParams)
    if (!std::strcmp(p.name, name)) return p;
  throw Error(std::string("internal error: ") + name + " is not a registered setting (src/base/params.cpp)");
}

[[noreturn]] void bad(const char* name, const std::string& value, const std::string& expected) {
  throw InvalidArgument(std::string(name) + "='" + value + "': expected " + expected);
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

const std::vector<Param>& all() { return kParams; }

namespace {

// The registered variable `name`, which its caller reads as `kind`.
const Param& find(const char* name, Kind kind) {
  const Param& p = find(name);
  if (p.kind != kind) throw Error(std::string("internal error: ") + name + " is read as another kind than registered");
  return p;
}

std::optional<std::string> raw(const Param& p) {
  const char* v = std::getenv(p.name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

std::string number(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.15g", x);
  return b;
}

}  // namespace

std::optional<std::string> text(const char* name) { return raw(find(name, Kind::text)); }

std::optional<std::string> choice(const char* name) {
  const Param& p = find(name, Kind::choice);
  auto v = raw(p);
  if (!v) return v;
  std::string list;
  for (const char* c = p.choices; *c;) {
    const char* end = std::strchr(c, ',');
    const std::string one = end ? std::string(c, static_cast<size_t>(end - c)) : std::string(c);
    if (*v == one) return v;
    list += (list.empty() ? "" : ", ") + one;
    c = end ? end + 1 : c + one.size();
  }
  bad(name, *v, "one of " + list);
}

std::optional<long long> integer(const char* name) {
  const Param& p = find(name, Kind::integer);
  auto v = raw(p);
  if (!v) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(v->c_str(), &end, 10);
  if (*end || errno || n < p.lo || n > p.hi) bad(name, *v, "an integer from " + number(p.lo) + " to " + number(p.hi));
  return n;
}

std::optional<uint64_t> bytes(const char* name) {
  const Param& p = find(name, Kind::bytes);
  auto v = raw(p);
  if (!v) return std::nullopt;
  const auto lo = static_cast<uint64_t>(p.lo), hi = static_cast<uint64_t>(p.hi);
  const std::string expected = "bytes from " + std::to_string(lo) + " to " + std::to_string(hi) + " (suffixes K, M, G)";
  char* end = nullptr;
  errno = 0;
  if ((*v)[0] == '-') bad(name, *v, expected);
  uint64_t n = std::strtoull(v->c_str(), &end, 10);
  if (end == v->c_str() || errno) bad(name, *v, expected);
  int shift = 0;
  if (*end == 'K' || *end == 'k') shift = 10;
  if (*end == 'M' || *end == 'm') shift = 20;
  if (*end == 'G' || *end == 'g') shift = 30;
  if (shift) ++end;
  if (*end || n > (hi >> shift)) bad(name, *v, expected);
  n <<= shift;
  if (n < lo) bad(name, *v, expected);
  return n;
}

std::optional<double> seconds(const char* name) {
  const Param& p = find(name, Kind::seconds);
  auto v = raw(p);
  if (!v) return std::nullopt;
  char* end = nullptr;
  const double s = std::strtod(v->c_str(), &end);
  if (*end || !std::isfinite(s) || s < p.lo || s > p.hi)
    bad(name, *v, "seconds from " + number(p.lo) + " to " + number(p.hi));
  return s;
}

std::optional<bool> flag(const char* name) {
  auto v = raw(find(name, Kind::flag));
  if (!v) return std::nullopt;
  if (*v == "1" || *v == "true" || *v == "yes") return true;
  if (*v == "0" || *v == "false" || *v == "no") return false;
  bad(name, *v, "0 or 1 (or false/true, no/yes)");
}

std::string check(const Param& p) {
  try {
    switch (p.kind) {
      case Kind::text: text(p.name); break;
      case Kind::choice: choice(p.name); break;
      case Kind::integer: integer(p.name); break;
      case Kind::bytes: bytes(p.name); break;
      case Kind::seconds: seconds(p.name); break;
      case Kind::flag: flag(p.name); break;
    }
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

std::string markdown_table() {
  std::string t = "| variable | meaning | default |\n| --- | --- | --- |\n";
  for (const Param& p : kParams) t += std::string("| `") + p.name + "` | " + p.meaning + " | " + p.fallback + " |\n";
  return t;
}

std::optional<std::string> shown(const Param& p) {
  const char* v = std::getenv(p.name);
  if (!v || !*v) return std::nullopt;  // empty reads as unset
  // The token is a secret: say that it is set, not what it is.
  return std::strcmp(p.name, "SHOAL_STORE_TOKEN") ? std::string(v) : std::string("(set)");
}

std::vector<std::string> set_in_environment() {
  std::vector<std::string> out;
  for (const Param& p : kParams)
    if (auto v = shown(p)) out.push_back(std::string(p.name) + "=" + *v);
  return out;
}

std::vector<std::string> probable_typos() {
  std::vector<std::string> out;
  for (char** e = environ; e && *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (!eq || std::strncmp(*e, "SHOAL_", 6)) continue;
    const std::string name(*e, static_cast<size_t>(eq - *e));
    const Param* near = nullptr;
    size_t best = 3;
    for (const Param& p : kParams) {
      const size_t d = edit_distance(name, p.name);
      if (d == 0) {
        near = nullptr;
        break;
      }
      if (d < best) best = d, near = &p;
    }
    if (near) out.push_back(name + " (did you mean " + near->name + "?)");
  }
  return out;
}

}  // namespace shoal::params
