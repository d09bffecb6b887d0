// shoal-bench: command line, sizes, and the nccl-tests definitions of size, count and busbw.
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <stdexcept>

#include "bench/bench.h"
#include "shoal/error.h"

namespace shoal::bench {

namespace {

struct OpEntry {
  Op op;
  const char* name;
};
constexpr OpEntry kOps[] = {
    {Op::allreduce, "allreduce"}, {Op::broadcast, "broadcast"},
    {Op::reduce, "reduce"},       {Op::allgather, "allgather"},
    {Op::reduce_scatter, "reduce_scatter"}, {Op::gather, "gather"},
    {Op::scatter, "scatter"},     {Op::alltoall, "alltoall"},
    {Op::alltoallv, "alltoallv"}, {Op::sendrecv, "sendrecv"},
    {Op::barrier, "barrier"},
};

long long parse_int(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno != 0) throw std::invalid_argument(flag + ": not an integer: '" + v + "'");
  return x;
}

}  // namespace

const char* op_name(Op op) {
  for (const auto& e : kOps)
    if (e.op == op) return e.name;
  return "?";
}

std::optional<Op> parse_op(const std::string& s) {
  for (const auto& e : kOps)
    if (s == e.name) return e.op;
  if (s == "reducescatter" || s == "reduce-scatter") return Op::reduce_scatter;
  if (s == "all_reduce") return Op::allreduce;
  if (s == "all_gather") return Op::allgather;
  if (s == "all_to_all" || s == "alltoall") return Op::alltoall;
  return std::nullopt;
}

size_t parse_size(const std::string& s) {
  if (s.empty()) throw std::invalid_argument("empty size");
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) throw std::invalid_argument("bad size '" + s + "'");
  double v = std::strtod(s.substr(0, i).c_str(), nullptr);
  std::string suf = s.substr(i);
  double mult = 1;
  if (suf.empty() || suf == "B" || suf == "b") mult = 1;
  else if (suf == "K" || suf == "k" || suf == "KB" || suf == "KiB") mult = 1024.0;
  else if (suf == "M" || suf == "m" || suf == "MB" || suf == "MiB") mult = 1024.0 * 1024;
  else if (suf == "G" || suf == "g" || suf == "GB" || suf == "GiB") mult = 1024.0 * 1024 * 1024;
  else throw std::invalid_argument("bad size suffix in '" + s + "' (use K, M or G)");
  double bytes = v * mult;
  if (!(bytes >= 0) || bytes > 1e15) throw std::invalid_argument("size out of range: '" + s + "'");
  return static_cast<size_t>(std::llround(bytes));
}

std::string usage() {
  return
      "usage: shoal-bench OP -n RANKS [-b MIN] [-e MAX] [-f FACTOR] [options]\n"
      "  OP: allreduce broadcast reduce allgather reduce_scatter gather scatter alltoall alltoallv sendrecv barrier\n"
      "  -n, --ranks N          number of ranks (processes) to start on this host\n"
      "  -b, --minbytes SIZE    smallest size (suffix K, M, G; default 4K)\n"
      "  -e, --maxbytes SIZE    largest size (default = MIN)\n"
      "  -f, --stepfactor F     multiply the size by F between rows (default 2)\n"
      "  --plus B               add B bytes to every rank's block of each size (allgather, reduce_scatter, gather,\n"
      "                         scatter, alltoall: the total grows by RANKS*B; the others: the buffer by B), for\n"
      "                         blocks that are not multiples of a page, as a tensor of 1,025 floats makes\n"
      "  --dtype T              f16 bf16 f32 f64 i8 u8 i32 i64 bool (default f32)\n"
      "  --op R                 sum prod min max avg band bor bxor (default sum)\n"
      "  --algo A               auto ring bde mst direct rd scatter_allgather linear hier (default auto)\n"
      "  --transport T          auto shm tcp (sets SHOAL_TRANSPORT for the ranks)\n"
      "  --check                verify every result against a reference computed on each rank\n"
      "  --vs PEER              also run PEER and print its time, busbw and ratio to shoal: gloo (its TCP\n"
      "                         transport), ompi (Open MPI, ranks started by mpirun); repeat or list: gloo,ompi\n"
      "  --mpirun-args ARGS     extra mpirun arguments for --vs ompi (e.g. \"--mca coll_tuned_use_dynamic_rules 1\")\n"
      "  --json FILE            rank 0 writes the results to FILE as JSON\n"
      "  --floors               first measure this machine's memory bandwidth B (a copy, one thread per core)\n"
      "                         and a cache-line round trip between two cores; print each row's time over\n"
      "                         them: allreduce's memory floor 2*p*n/B, and the round trip\n"
      "  --queued               run shoal's ops as calls that return a Work, then wait for it (as torch's\n"
      "                         backend does), instead of blocking calls (CallOptions::blocking)\n"
      "  --fresh                rewrite every cache line of each rank's input (with the value it holds) before\n"
      "                         each timed op, for shoal and the peers alike (the time includes it): as a\n"
      "                         training step makes new data, a rank that reads a peer's input then fetches\n"
      "                         it from that peer's cache, not from its own copy of an unchanged buffer\n"
      "  --in-place             allreduce only: the output buffer is the input too, for shoal and the peers\n"
      "                         alike (MPI_IN_PLACE; torch.distributed's all_reduce). Each timed op then\n"
      "                         reduces the last one's result: the check runs on the first, from fresh input\n"
      "  --resources            after the run, print what a rank cost: the Communicator's construction\n"
      "                         time, RSS, /dev/shm reserved and mapped, open file descriptors\n"
      "  --model                after the run, fit the algorithm's alpha-beta-gamma model (its cost function in\n"
      "                         src/algo/registry.cpp) to the measured times and print each size's time over\n"
      "                         the model's; needs --algo (one algorithm) and two sizes or more\n"
      "  --iters N              timed iterations per size (default adaptive: ~0.2 s, 3..100000)\n"
      "  --warmup N             untimed iterations per size (default 5, or 2 from 8M)\n"
      "SIZE is the nccl-tests size: the buffer of allreduce/broadcast/reduce/sendrecv, the total\n"
      "(all ranks' blocks) of allgather/reduce_scatter/alltoall/gather/scatter. See docs/bench.md.\n";
}

Config parse_args(const std::vector<std::string>& args) {
  Config c;
  c.argv = args;
  bool have_op = false, have_n = false, have_e = false;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i];
    std::string val;
    bool has_inline = false;
    if (a.rfind("--", 0) == 0) {
      auto eq = a.find('=');
      if (eq != std::string::npos) {
        val = a.substr(eq + 1);
        a = a.substr(0, eq);
        has_inline = true;
      }
    }
    auto next = [&]() -> std::string {
      if (has_inline) return val;
      if (i + 1 >= args.size()) throw std::invalid_argument(a + " needs a value");
      return args[++i];
    };
    if (a == "-h" || a == "--help") {
      throw std::invalid_argument("");
    } else if (a == "-n" || a == "--ranks" || a == "-np") {
      long long n = parse_int(a, next());
      if (n < 1 || n > 1024) throw std::invalid_argument("-n: ranks must be in 1..1024");
      c.ranks = static_cast<int>(n);
      have_n = true;
    } else if (a == "-b" || a == "--minbytes") {
      c.min_bytes = parse_size(next());
    } else if (a == "-e" || a == "--maxbytes") {
      c.max_bytes = parse_size(next());
      have_e = true;
    } else if (a == "-f" || a == "--stepfactor") {
      std::string v = next();
      char* end = nullptr;
      c.factor = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !(c.factor > 1.0)) throw std::invalid_argument("-f: factor must be a number > 1");
    } else if (a == "--plus") {
      c.plus = parse_size(next());
    } else if (a == "--dtype" || a == "-d") {
      c.dtype = parse_dtype(next());
    } else if (a == "--op" || a == "-o") {
      c.rop = parse_reduce_op(next());
    } else if (a == "--algo" || a == "-a") {
      c.algo_str = next();
      c.algo = parse_algo(c.algo_str);
    } else if (a == "--transport" || a == "-t") {
      c.transport = next();
      if (c.transport != "auto" && c.transport != "shm" && c.transport != "tcp")
        throw std::invalid_argument("--transport: auto, shm or tcp");
      c.transport_given = true;
    } else if (a == "--check" || a == "-c") {
      c.check = true;
    } else if (a == "--vs") {
      std::string v = next();
      size_t start = 0;
      for (;;) {
        const size_t comma = v.find(',', start);
        const std::string peer = v.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        if (peer == "gloo") c.vs_gloo = true;
        else if (peer == "ompi") c.vs_ompi = true;
        else throw std::invalid_argument("--vs: '" + peer + "' is not a peer (gloo, ompi)");
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    } else if (a == "--mpirun-args") {
      c.mpirun_args = next();
    } else if (a == "--floors") {
      c.floors = true;
    } else if (a == "--queued") {
      c.queued = true;
    } else if (a == "--fresh") {
      c.fresh = true;
    } else if (a == "--in-place") {
      c.in_place = true;
    } else if (a == "--resources") {
      c.resources = true;
    } else if (a == "--model") {
      c.model = true;
    } else if (a == "--json") {
      c.json_path = next();
    } else if (a == "--iters" || a == "-i" || a == "--iterations") {
      long long n = parse_int(a, next());
      if (n < 1 || n > 100000000) throw std::invalid_argument("--iters must be >= 1");
      c.iters = static_cast<int>(n);
    } else if (a == "--warmup" || a == "-w") {
      long long n = parse_int(a, next());
      if (n < 0 || n > 100000000) throw std::invalid_argument("--warmup must be >= 0");
      c.warmup = static_cast<int>(n);
    } else if (!a.empty() && a[0] == '-') {
      throw std::invalid_argument("unknown option " + a);
    } else {
      if (have_op) throw std::invalid_argument("unexpected argument '" + a + "'");
      auto op = parse_op(a);
      if (!op) throw std::invalid_argument("unknown OP '" + a + "'");
      c.op = *op;
      have_op = true;
    }
  }
  if (!have_op) throw std::invalid_argument("missing OP");
  if (!have_n) throw std::invalid_argument("missing -n RANKS");
  if (!have_e) c.max_bytes = c.min_bytes;
  if (c.max_bytes < c.min_bytes) throw std::invalid_argument("-e MAX is below -b MIN");
  if (c.op == Op::sendrecv && c.ranks < 2) throw std::invalid_argument("sendrecv needs -n 2 or more");
  if (c.in_place && c.op != Op::allreduce) throw std::invalid_argument("--in-place: allreduce only");
  if (c.model) check_model_args(c);
  bool reduction = c.op == Op::allreduce || c.op == Op::reduce || c.op == Op::reduce_scatter;
  if (reduction && !reduce_op_supported(c.dtype, c.rop))
    throw std::invalid_argument(std::string("--op ") + reduce_op_name(c.rop) + " is not defined on " +
                                dtype_name(c.dtype));
  return c;
}

double busbw_factor(Op op, int p) {
  switch (op) {
    case Op::allreduce:
      return p > 0 ? 2.0 * (p - 1) / p : 0;
    case Op::allgather:
    case Op::reduce_scatter:
    case Op::alltoall:
    case Op::alltoallv:
      return p > 0 ? static_cast<double>(p - 1) / p : 0;
    default:
      return 1.0;
  }
}

Spec make_spec(Op op, DType dt, ReduceOp rop, int p, int rank, size_t size_bytes) {
  Spec s{};
  s.op = op;
  s.dt = dt;
  s.rop = rop;
  s.p = p;
  s.rank = rank;
  s.esize = dtype_size(dt);
  switch (op) {
    case Op::allreduce:
    case Op::reduce:
      s.block = size_bytes / s.esize;
      s.in_elems = s.out_elems = s.block;
      s.count = s.block;
      break;
    case Op::broadcast:
    case Op::sendrecv:
      s.block = size_bytes / s.esize;
      s.in_elems = s.block;  // in place
      s.out_elems = op == Op::sendrecv ? s.block : 0;
      s.count = s.block;
      break;
    case Op::allgather:
    case Op::gather:
      s.block = size_bytes / (s.esize * p);
      s.in_elems = s.block;
      s.out_elems = s.block * p;
      s.count = s.block * p;
      break;
    case Op::reduce_scatter:
    case Op::scatter:
      s.block = size_bytes / (s.esize * p);
      s.in_elems = s.block * p;
      s.out_elems = s.block;
      s.count = s.block * p;
      break;
    case Op::alltoall:
    case Op::alltoallv:
      s.block = size_bytes / (s.esize * p);
      s.in_elems = s.out_elems = s.block * p;
      s.count = s.block * p;
      break;
    case Op::barrier:
      s.block = 0;
      s.in_elems = s.out_elems = 0;
      s.count = 0;
      break;
  }
  s.bytes = s.count * s.esize;
  return s;
}

}  // namespace shoal::bench
