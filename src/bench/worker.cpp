// shoal-bench: one rank. Builds the communicator (and the peers': a Gloo context, Open MPI), sweeps
// the sizes, and on rank 0 prints the table and writes the JSON.
//
// Per size, for each backend (shoal, then each peer): optional check run, warmup; then the ranks
// agree on the iteration count (through the store: same count on every rank and for every
// backend); then for each backend: store sync, the backend's own barrier, the timed loop. The
// per-rank averages go through the store to every rank; the row shows the max over ranks.
//
// All coordination goes through the store, never through the backends, so a failing backend only
// fills its columns with the error. An InvalidArgument (e.g. an --algo that does not apply to the
// op) is the same on every rank and only affects its row; any other error disables that backend
// for the remaining sizes (its connections are in an unknown state).
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <stdexcept>

#include "bench/bench.h"
#include "base/text.h"
#include "shoal/error.h"

namespace shoal::bench {

namespace {

using Clock = std::chrono::steady_clock;

double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

// Store-based coordination among the ranks (keys under "bench/").
class Coord {
 public:
  Coord(std::shared_ptr<Store> store, int rank, int size, Millis timeout)
      : store_(std::move(store)), rank_(rank), size_(size), timeout_(timeout) {}

  void sync() {
    std::string k = "bench/sync/" + std::to_string(seq_++);
    if (store_->add(k, 1) == size_) store_->set(k + "/go", Bytes{1});
    store_->wait({k + "/go"}, timeout_);
  }

  // Every rank's string for `name`, in rank order.
  std::vector<std::string> exchange(const std::string& name, const std::string& mine) {
    std::string base = "bench/x/" + std::to_string(seq_++) + "/" + name + "/";
    store_->set_string(base + std::to_string(rank_), mine);
    std::vector<std::string> all(size_);
    for (int r = 0; r < size_; ++r) all[r] = r == rank_ ? mine : store_->get_string(base + std::to_string(r), timeout_);
    return all;
  }

 private:
  std::shared_ptr<Store> store_;
  int rank_, size_;
  Millis timeout_;
  uint64_t seq_ = 0;
};

// Messages travel in tab-separated records: keep them on one line, without tabs.
std::string clean(std::string s) {
  for (char& c : s)
    if (c == '\t' || c == '\n' || c == '\r') c = ' ';
  if (s.size() > 300) s = s.substr(0, 297) + "...";
  return s;
}

std::vector<std::string> split_tabs(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    size_t t = s.find('\t', start);
    out.push_back(s.substr(start, t == std::string::npos ? std::string::npos : t - start));
    if (t == std::string::npos) break;
    start = t + 1;
  }
  return out;
}

bool is_symmetric_error(const std::exception& e) {
  return dynamic_cast<const InvalidArgument*>(&e) != nullptr || dynamic_cast<const std::invalid_argument*>(&e) != nullptr;
}

// One backend's state on this rank, for the current size.
struct Phase {
  Runner* runner = nullptr;
  bool enabled = false;    // not disabled by an earlier fatal error (same on every rank)
  std::string disabled_why;
  std::string error;       // this size's error on this rank ("" = none)
  bool fatal = false;      // the error disables the backend from now on
  std::string check;       // "ok", the error, or "" when not checked
  double est = 0;          // seconds of the fastest measured warm-up iteration
  double avg = 0;          // seconds per timed iteration

  void reset() {
    error.clear();
    fatal = false;
    check.clear();
    est = avg = 0;
  }
  void fail(const std::exception& e) {
    error = clean(e.what());
    fatal = !is_symmetric_error(e);
    if (error.empty()) error = "error";
  }
};

// The row as seen by rank 0 after the exchange.
struct Result {
  bool ran = false;
  std::string error;  // first error among the ranks, "rank R: ..."
  std::string check;  // "ok" or the first failure
  double us = 0;      // max over ranks of the per-rank average
};

struct Row {
  size_t bytes = 0, count = 0;
  int iters = 0;
  std::vector<Result> res;  // by backend: shoal first, then the peers in the order of Backends
  std::string skipped;      // why the size was not run at all
  std::string algo;         // the algorithm shoal ran (its automatic choice or --algo); "" for sendrecv
};

// The backends of this run: shoal, then the peers asked for with --vs (those built in), and the
// line describing each peer for the table header and the JSON.
struct Backends {
  std::vector<std::string> names;
  std::vector<std::string> lines;  // by backend; "" for shoal
  std::vector<std::string> notes;  // header lines of peers asked for but not available
};

int machine_nproc() {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

// The cores rank 0 may run on, where a launcher bound it (mpirun binds each of 2 ranks to a core).
std::string affinity_note() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) != 0 || CPU_COUNT(&set) >= machine_nproc()) return "";
  return ", rank 0 bound to " + std::to_string(CPU_COUNT(&set)) + " of them";
}

std::string json_num(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

double algbw(size_t bytes, double us) { return us > 0 ? static_cast<double>(bytes) / (us * 1e-6) / 1e9 : 0; }

std::vector<size_t> sizes_of(const Config& cfg) {
  std::vector<size_t> v;
  if (cfg.op == Op::barrier) return {0};
  const bool blocks = cfg.op == Op::allgather || cfg.op == Op::reduce_scatter || cfg.op == Op::gather ||
                      cfg.op == Op::scatter || cfg.op == Op::alltoall || cfg.op == Op::alltoallv;
  const size_t plus = cfg.plus * (blocks ? static_cast<size_t>(cfg.ranks) : 1);
  double s = static_cast<double>(cfg.min_bytes);
  size_t last = SIZE_MAX;
  while (s <= static_cast<double>(cfg.max_bytes) * (1 + 1e-12)) {
    size_t b = static_cast<size_t>(std::llround(s));
    if (b != last) v.push_back(b + plus);
    last = b;
    if (s == 0) break;  // -b 0: a single row
    s *= cfg.factor;
  }
  return v;
}

class Printer {
 public:
  Printer(const Config& cfg, const Backends& be, std::optional<Floors> floors)
      : cfg_(cfg), be_(be), floors_(floors) {}

  void header(const std::string& transport_used, int p) {
    std::printf("# shoal-bench %s  ranks %d  dtype %s  op %s  algo %s  transport %s (%s)\n", op_name(cfg_.op), p,
                dtype_name(cfg_.dtype), reduce_op_name(cfg_.rop), cfg_.algo_str.c_str(), cfg_.transport.c_str(),
                transport_used.c_str());
    std::printf("# machine: %d x %s%s\n", machine_nproc(), cpu_model().c_str(), affinity_note().c_str());
    if (cfg_.iters > 0)
      std::printf("# timing: %d iterations per size", cfg_.iters);
    else
      std::printf("# timing: adaptive iterations per size (~0.2 s for the fastest backend, at most ~2 s for the "
                  "slowest, 3..100000)");
    std::printf(", same count for every backend; time = max over ranks of the per-rank average%s\n",
                cfg_.fresh ? "; each op after a rewrite of every cache line of the input (--fresh), in the time" : "");
    if (cfg_.in_place) std::printf("# in place: the output buffer is the input too (--in-place)\n");
    std::printf("# busbw = algbw * %s (nccl-tests)\n", busbw_text().c_str());
    for (size_t b = 1; b < be_.names.size(); ++b) std::printf("# %s\n", be_.lines[b].c_str());
    for (const auto& n : be_.notes) std::printf("# %s\n", n.c_str());
    if (floors_) {
      std::printf("# floors: memory bandwidth B = %.1f GB/s (memcpy of 64 MiB per thread, %d threads, read + written); ",
                  floors_->bw_bytes_per_s / 1e9, floors_->bw_threads);
      if (floors_->rtt_ns > 0) std::printf("cache-line round trip between two cores = %.0f ns\n", floors_->rtt_ns);
      else std::printf("cache-line round trip: not measured (one core allowed)\n");
      std::printf("# floors: one process hands its core to another (sched_yield) in %.0f ns; with ranks sharing cores "
                  "a small op costs at least (ranks per core) hand-overs\n",
                  floors_->handover_ns);
      std::printf("# t/mem: shoal's time over the memory floor 2*p*n/B (allreduce); t/rtt: over the round trip\n");
    }
    std::printf("#\n");
    std::string l1 = "#       size       count  iters |  shoal time     algbw     busbw";
    std::string l2 = "#        (B)    (elements)       |       (us)    (GB/s)    (GB/s)";
    if (cfg_.check) l1 += "  check", l2 += "       ";
    for (size_t b = 1; b < be_.names.size(); ++b) {
      char c1[64], c2[64];
      std::snprintf(c1, sizeof c1, " | %6s time     busbw", be_.names[b].c_str());
      std::snprintf(c2, sizeof c2, " |        (us)    (GB/s)");
      l1 += c1, l2 += c2;
      if (cfg_.check) l1 += "  check", l2 += "       ";
      std::snprintf(c1, sizeof c1, " | %10s", "ratio");
      std::snprintf(c2, sizeof c2, " | %10s", (be_.names[b] + "/shoal").c_str());
      l1 += c1, l2 += c2;
    }
    if (floors_) l1 += " |    t/mem    t/rtt", l2 += " |   (floors)       ";
    std::printf("%s\n%s\n", l1.c_str(), l2.c_str());
    std::fflush(stdout);
  }

  void row(const Row& r) {
    std::string notes;
    std::printf(" %12zu %11zu %6d |", r.bytes, r.count, r.iters);
    if (!r.skipped.empty()) {
      std::printf(" %s\n", r.skipped.c_str());
      std::fflush(stdout);
      return;
    }
    print_backend(r.res[0], true, "shoal", notes);
    for (size_t b = 1; b < be_.names.size(); ++b) {
      std::printf(" |");
      print_backend(r.res[b], false, be_.names[b].c_str(), notes);
      const double ratio = ratio_of(r, b);
      if (std::isfinite(ratio))
        std::printf(" | %10.2f", ratio);
      else
        std::printf(" | %10s", "-");
    }
    if (floors_) {
      std::printf(" |");
      const Result& s = r.res[0];
      const double us = s.ran && s.error.empty() ? s.us : NAN;
      for (double x : {over_memory_floor(us, cfg_.op, r.bytes, p_, *floors_), over_round_trip(us, *floors_)}) {
        if (std::isfinite(x)) std::printf(" %8.2f", x);
        else std::printf(" %8s", "-");
      }
    }
    std::printf("%s\n", notes.c_str());
    std::fflush(stdout);
  }

  // peer time / shoal time, NaN where either did not run cleanly.
  static double ratio_of(const Row& r, size_t b) {
    const Result& s = r.res[0];
    const Result& x = r.res[b];
    if (s.ran && x.ran && s.error.empty() && x.error.empty() && s.us > 0) return x.us / s.us;
    return NAN;
  }

 private:
  void print_backend(const Result& res, bool full, const char* name, std::string& notes) {
    const double factor = busbw_factor(cfg_.op, p_);
    if (!res.error.empty() || !res.ran) {
      std::printf(full ? " %10s %9s %9s" : " %11s %9s", "error", "-", "-");
      notes += std::string("  [") + name + ": " + (res.error.empty() ? "not run" : res.error) + "]";
    } else {
      double ab = algbw(bytes_, res.us);
      if (bytes_ == 0) {  // barrier: no bandwidth
        if (full) std::printf(" %10.2f %9s %9s", res.us, "-", "-");
        else std::printf(" %11.2f %9s", res.us, "-");
      } else if (full)
        std::printf(" %10.2f %9.3f %9.3f", res.us, ab, ab * factor);
      else
        std::printf(" %11.2f %9.3f", res.us, ab * factor);
    }
    if (cfg_.check) {
      if (res.check.empty() || res.check == "not run") std::printf(" %6s", "-");
      else if (res.check == "ok") std::printf(" %6s", "ok");
      else {
        std::printf(" %6s", "FAIL");
        notes += std::string("  [") + name + " check: " + res.check + "]";
      }
    }
  }

  std::string busbw_text() const {
    switch (cfg_.op) {
      case Op::allreduce: return "2(p-1)/p";
      case Op::allgather:
      case Op::reduce_scatter:
      case Op::alltoall:
      case Op::alltoallv: return "(p-1)/p";
      default: return "1";
    }
  }

 public:
  void set_row_context(size_t bytes, int p) { bytes_ = bytes, p_ = p; }

 private:
  const Config& cfg_;
  const Backends& be_;
  std::optional<Floors> floors_;
  size_t bytes_ = 0;
  int p_ = 1;
};

// --fresh: each cache line of `b` stored to (its first byte, unchanged), so that the line is
// modified in this rank's cache and invalid in every other, as after a producer wrote new data.
void rewrite_lines(const Buffer& b) {
  for (size_t i = 0; i < b.size(); i += 64) {
    volatile uint8_t* q = b.data() + i;
    *q = *q;
  }
}

// Fields per backend: shoal_us, shoal_algbw, shoal_busbw, shoal_error; for each peer X: X_us,
// X_busbw, X_error, X_ratio (X_us / shoal_us), and "ratio" for gloo's (the field's first meaning).
void write_json(const Config& cfg, int p, const std::string& transport_used, const Backends& be,
                const std::optional<Floors>& floors, const std::vector<Row>& rows,
                const std::optional<ModelFit>& model) {
  std::ofstream f(cfg.json_path);
  if (!f) throw std::runtime_error("cannot write " + cfg.json_path);
  const double factor = busbw_factor(cfg.op, p);
  f << "{\n";
  f << "  \"op\": \"" << op_name(cfg.op) << "\",\n";
  f << "  \"ranks\": " << p << ",\n";
  f << "  \"dtype\": \"" << dtype_name(cfg.dtype) << "\",\n";
  f << "  \"reduce_op\": \"" << reduce_op_name(cfg.rop) << "\",\n";
  f << "  \"transport\": \"" << json_escape(cfg.transport) << "\",\n";
  f << "  \"transport_used\": \"" << json_escape(transport_used) << "\",\n";
  f << "  \"algo\": \"" << json_escape(cfg.algo_str) << "\",\n";
  f << "  \"fresh\": " << (cfg.fresh ? "true" : "false") << ",\n";
  f << "  \"in_place\": " << (cfg.in_place ? "true" : "false") << ",\n";
  f << "  \"machine\": {\"nproc\": " << machine_nproc() << ", \"model\": \"" << json_escape(cpu_model()) << "\"},\n";
  if (floors)
    f << "  \"floors\": {\"memory_bw_GBps\": " << json_num(floors->bw_bytes_per_s / 1e9)
      << ", \"memory_bw_threads\": " << floors->bw_threads
      << ", \"cacheline_rtt_ns\": " << (floors->rtt_ns > 0 ? json_num(floors->rtt_ns) : "null")
      << ", \"core_handover_ns\": " << json_num(floors->handover_ns) << "},\n";
  for (size_t b = 1; b < be.names.size(); ++b)
    f << "  \"" << be.names[b] << "\": \"" << json_escape(be.lines[b]) << "\",\n";
  if (!be.notes.empty()) {
    f << "  \"notes\": [";
    for (size_t i = 0; i < be.notes.size(); ++i) f << (i ? ", " : "") << "\"" << json_escape(be.notes[i]) << "\"";
    f << "],\n";
  }
  f << "  \"rows\": [";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    f << (i ? ",\n" : "\n") << "    {\"bytes\": " << r.bytes << ", \"count\": " << r.count << ", \"iters\": " << r.iters;
    if (!r.algo.empty()) f << ", \"shoal_algo\": \"" << r.algo << "\"";
    if (!r.skipped.empty()) f << ", \"skipped\": \"" << json_escape(r.skipped) << "\"";
    for (size_t b = 0; b < be.names.size(); ++b) {
      const std::string& n = be.names[b];
      const Result empty;
      const Result& res = r.res.empty() ? empty : r.res[b];
      const bool good = res.ran && res.error.empty();
      const double ab = good ? algbw(r.bytes, res.us) : NAN;
      f << ", \"" << n << "_us\": " << (good ? json_num(res.us) : "null");
      if (b == 0) f << ", \"shoal_algbw\": " << json_num(ab);
      if (b == 0 && floors) {
        const double us = good ? res.us : NAN;
        f << ", \"shoal_over_mem_floor\": " << json_num(over_memory_floor(us, cfg.op, r.bytes, p, *floors));
        f << ", \"shoal_over_rtt\": " << json_num(over_round_trip(us, *floors));
      }
      f << ", \"" << n << "_busbw\": " << json_num(ab * factor);
      if (!res.error.empty()) f << ", \"" << n << "_error\": \"" << json_escape(res.error) << "\"";
      if (b > 0) {
        const double ratio = r.res.empty() ? NAN : Printer::ratio_of(r, b);
        f << ", \"" << n << "_ratio\": " << json_num(ratio);
        if (n == "gloo") f << ", \"ratio\": " << json_num(ratio);
      }
      if (cfg.check)
        f << ", \"" << (b == 0 ? std::string("check") : n + "_check") << "\": \""
          << json_escape(res.check.empty() ? "not run" : res.check) << "\"";
    }
    f << "}";
  }
  f << "\n  ]";
  if (model && !model->fitted) f << ",\n  \"model\": {\"fitted\": false}";
  if (model && model->fitted) {
    const algo::Model& m = model->fit.model;
    f << ",\n  \"model\": {\"fitted\": true, \"alpha_us\": " << json_num(m.alpha * 1e6) << ", \"beta_ns_per_byte\": " << json_num(m.beta * 1e9)
      << ", \"gamma_ns_per_byte\": " << json_num(m.gamma * 1e9)
      << ", \"rms_relative_error\": " << json_num(model->fit.rms_relative_error) << ", \"rows\": [";
    for (size_t i = 0; i < model->sizes.size(); ++i)
      f << (i ? ", " : "") << "{\"bytes\": " << model->sizes[i] << ", \"shoal_us\": " << json_num(model->shoal_us[i])
        << ", \"model_us\": " << json_num(model->model_us[i]) << "}";
    f << "]}";
  }
  f << "\n}\n";
  if (!f) throw std::runtime_error("error writing " + cfg.json_path);
}

int env_int(const char* name, int dflt) {
  const char* v = std::getenv(name);
  if (!v || !*v) return dflt;
  return std::atoi(v);
}

}  // namespace

int worker_main(const Config& cfg) {
  const int rank = env_int("SHOAL_RANK", env_int("OMPI_COMM_WORLD_RANK", 0));
  const int p = env_int("SHOAL_WORLD_SIZE", cfg.ranks);
  if (p < 1 || rank < 0 || rank >= p) throw std::invalid_argument("bad SHOAL_RANK / SHOAL_WORLD_SIZE");
  if (cfg.op == Op::sendrecv && p < 2) throw std::invalid_argument("sendrecv needs 2 ranks or more");

  Options opts = Options::from_env({});
  auto store = store_from_env(rank, Millis(60000));
  // Coordination may wait for a slow backend's timeout on another rank: be more patient than it.
  const Millis coord_timeout = opts.timeout * 2 + Millis(std::chrono::minutes(10));
  Coord coord(store, rank, p, coord_timeout);

  const double init_t0 = now_s();
  Communicator comm(store, rank, p, opts);
  const double init_s = now_s() - init_t0;
  std::string transport_used = p > 1 ? "rank " + std::to_string(rank) + " -> " + std::to_string((rank + 1) % p) +
                                           ": " + comm.transport_to((rank + 1) % p)
                                     : "single rank";

  // The backends, each with its runner or the reason it cannot run (the same on every rank).
  Backends be;
  std::vector<std::unique_ptr<Runner>> runners;
  std::vector<std::string> setup_errors;
  be.names.push_back("shoal");
  be.lines.push_back("");
  runners.push_back(make_shoal_runner(comm, cfg.algo, cfg.queued));
  setup_errors.push_back("");
  auto add_peer = [&](const std::string& name, const std::function<std::unique_ptr<Runner>(std::string*)>& make) {
    std::unique_ptr<Runner> r;
    std::string why;
    try {
      r = make(&why);
      if (!r && why.empty()) why = name + ": not available";
    } catch (const std::exception& e) {
      why = name + " setup: " + clean(e.what());
    }
    auto all = coord.exchange(name + "-setup", why);
    why.clear();
    for (int q = 0; q < p && why.empty(); ++q)
      if (!all[q].empty()) why = "rank " + std::to_string(q) + ": " + all[q];
    be.names.push_back(name);
    runners.push_back(why.empty() ? std::move(r) : nullptr);
    setup_errors.push_back(why);
  };
  if (cfg.vs_gloo)
    add_peer("gloo", [&](std::string* why) { return make_gloo_runner(store, rank, p, opts.timeout, why); });
  if (cfg.vs_ompi && have_ompi())
    add_peer("ompi", [&](std::string* why) { return make_ompi_runner(rank, p, why); });
  else if (cfg.vs_ompi)
    be.notes.push_back("ompi: not available: shoal-bench was built without Open MPI (apt-get install "
                       "openmpi-bin libopenmpi-dev, then rebuild)");
  for (size_t b = 1; b < be.names.size(); ++b)
    be.lines.push_back(be.names[b] == "gloo" ? gloo_description(cfg.op, runners[b].get()) : ompi_description());
  const size_t nb = be.names.size();

  std::vector<Phase> ph(nb);
  for (size_t b = 0; b < nb; ++b) {
    ph[b].runner = runners[b].get();
    ph[b].enabled = setup_errors[b].empty() && runners[b];
    ph[b].disabled_why = setup_errors[b];
  }

  const std::optional<Floors> floors = cfg.floors ? floors_from_env() : std::nullopt;
  Printer printer(cfg, be, floors);
  if (rank == 0) printer.header(transport_used, p);

  std::vector<Row> rows;
  for (size_t size : sizes_of(cfg)) {
    Spec spec = make_spec(cfg.op, cfg.dtype, cfg.rop, p, rank, size);
    spec.in_place = cfg.in_place;
    Row row;
    row.bytes = spec.bytes;
    row.count = spec.count;
    row.res.resize(nb);
    if (cfg.op != Op::sendrecv) {
      try {
        row.algo = algo_name(comm.algo_for(op_name(cfg.op), spec.bytes, {cfg.algo}));
      } catch (const InvalidArgument&) {  // --algo the op does not have: the row reports the error
      }
    }
    if (spec.count == 0 && cfg.op != Op::barrier) {
      row.skipped = "skipped: smaller than one element per rank";
      if (rank == 0) {
        printer.set_row_context(row.bytes, p);
        printer.row(row);
      }
      rows.push_back(row);
      continue;
    }
    Buffers buf = alloc_buffers(spec);
    const int warmup = cfg.warmup >= 0 ? cfg.warmup : (spec.bytes < (size_t{8} << 20) ? 5 : 2);

    // 1. Check and warmup, per backend.
    for (Phase& P : ph) {
      P.reset();
      if (!P.enabled) continue;
      try {
        fill_inputs(spec, buf);
        if (cfg.check) {
          fill_sentinel(spec, buf);
          P.runner->run(spec, buf);
          P.check = clean(verify(spec, buf));
          fill_inputs(spec, buf);
        }
        int w = warmup;
        if (cfg.iters == 0 && w == 0) w = 1;  // the adaptive count needs one measured iteration
        if (w > 0) {
          P.runner->run(spec, buf);  // the first one is not measured (first touch, connection setup)
          // The fastest measured one: the next few after a new size still run on cold caches, or
          // wait for a peer that the scheduler has not run yet. Their mean can be 100x the steady
          // time, and the timed loop then lasts a millisecond or two, where the ranks' start from
          // the store's sync weighs as much as the ops (BENCHMARKS.md, "The bench's iteration
          // count").
          for (int i = 1; i < std::max(w, 2); ++i) {
            const double t0 = now_s();
            P.runner->run(spec, buf);
            const double t = now_s() - t0;
            P.est = i == 1 ? t : std::min(P.est, t);
          }
        }
      } catch (const std::exception& e) {
        P.fail(e);
      }
    }

    // 2. Agree on the iteration count; a backend that failed anywhere is not timed.
    std::vector<bool> failed_anywhere(nb, false);
    {
      std::ostringstream mine;
      mine.precision(17);
      for (const Phase& P : ph) mine << P.est << '\t' << (P.error.empty() ? 0 : 1) << '\t';
      auto all = coord.exchange("est", mine.str());
      std::vector<double> est(nb, 0);
      for (int r = 0; r < p; ++r) {
        auto f = split_tabs(all[r]);
        for (size_t b = 0; b < nb; ++b) {
          est[b] = std::max(est[b], std::atof(f.at(2 * b).c_str()));
          if (std::atoi(f.at(2 * b + 1).c_str())) failed_anywhere[b] = true;
        }
      }
      int iters = cfg.iters;
      if (iters == 0) {
        double fast = 0, slow = 0;
        for (size_t b = 0; b < nb; ++b) {
          if (!ph[b].enabled || failed_anywhere[b]) continue;
          double e = std::max(est[b], 1e-7);
          fast = fast == 0 ? e : std::min(fast, e);
          slow = std::max(slow, e);
        }
        double n = fast > 0 ? std::min(0.2 / fast, 2.0 / slow) : 3;
        // Up to 100,000: a loop of 1,000 ops of a microsecond lasts a millisecond, and then the
        // ranks' start from the store sync and one context switch weigh as much as the ops.
        iters = static_cast<int>(std::clamp(std::ceil(n), 3.0, 100000.0));
      }
      row.iters = iters;
    }

    // 3. Timed loops.
    for (size_t b = 0; b < nb; ++b) {
      Phase& P = ph[b];
      if (!P.enabled || failed_anywhere[b]) continue;
      coord.sync();
      try {
        P.runner->barrier();
        double t0 = now_s();
        for (int i = 0; i < row.iters; ++i) {
          if (cfg.fresh) rewrite_lines(input_of(spec, buf));
          P.runner->run(spec, buf);
        }
        double t1 = now_s();
        P.avg = (t1 - t0) / row.iters;
      } catch (const std::exception& e) {
        P.fail(e);
      }
    }

    // A broken group (a peer died, timed out or cannot be reached) ends the run on this rank at
    // once: the result exchange below could wait for peers that will never post (a host whose
    // link is down cannot reach the store either), and the error is the news.
    for (size_t b = 0; b < nb; ++b) {
      if (!ph[b].fatal) continue;
      std::fprintf(stderr, "shoal-bench: rank %d: %s failed: %s\n", rank, be.names[b].c_str(), ph[b].error.c_str());
      std::fflush(stdout);
      std::fflush(stderr);
      std::_Exit(1);
    }

    // 4. Results to every rank (every rank needs to know whether a backend is to be disabled).
    {
      std::ostringstream mine;
      mine.precision(17);
      for (const Phase& P : ph) mine << P.avg << '\t' << P.error << '\t' << (P.fatal ? 1 : 0) << '\t' << P.check << '\t';
      auto all = coord.exchange("res", mine.str());
      for (size_t b = 0; b < nb; ++b) {
        Result& R = row.res[b];
        if (!ph[b].enabled) {
          R.ran = false;
          R.error = ph[b].disabled_why.empty() ? "disabled" : ph[b].disabled_why;
          if (cfg.check) R.check = "not run";
          continue;
        }
        R.ran = true;
        bool fatal = false, all_ok = true;
        std::string first_bad;
        for (int r = 0; r < p; ++r) {
          auto f = split_tabs(all[r]);
          double avg = std::atof(f.at(4 * b).c_str());
          const std::string& err = f.at(4 * b + 1);
          const std::string& chk = f.at(4 * b + 3);
          if (std::atoi(f.at(4 * b + 2).c_str())) fatal = true;
          if (!err.empty() && R.error.empty()) R.error = "rank " + std::to_string(r) + ": " + err;
          if (chk != "ok") {
            all_ok = false;
            if (!chk.empty() && first_bad.empty()) first_bad = chk;
          }
          R.us = std::max(R.us, avg * 1e6);
        }
        if (cfg.check) R.check = all_ok ? "ok" : (first_bad.empty() ? "not run" : first_bad);
        if (fatal) {
          ph[b].enabled = false;
          ph[b].disabled_why = std::string("disabled after an earlier error");
        }
      }
    }

    if (rank == 0) {
      printer.set_row_context(row.bytes, p);
      printer.row(row);
    }
    rows.push_back(row);
  }

  std::optional<ModelFit> model;
  if (rank == 0 && cfg.model) {
    std::vector<std::pair<size_t, double>> times;
    for (const Row& r : rows)
      if (r.skipped.empty() && r.res[0].ran && r.res[0].error.empty()) times.emplace_back(r.bytes, r.res[0].us);
    model = fit_run(cfg, p, times);
    if (model) print_model(cfg, *model);
  }
  if (rank == 0 && !cfg.json_path.empty()) write_json(cfg, p, transport_used, be, floors, rows, model);
  if (cfg.resources) {
    std::vector<Resources> all;
    for (const auto& text : coord.exchange("resources", measure_resources(init_s).encode()))
      all.push_back(Resources::decode(text));
    if (rank == 0) std::printf("# %s\n", resources_line(all).c_str());
  }

  // Leave together: nobody tears its connections down while a peer still uses them.
  coord.sync();
  runners.clear();  // Open MPI's finalize is collective: every rank gets here
  bool any_error = false;
  for (const Row& r : rows) {
    if (!r.res[0].error.empty()) any_error = true;
    if (cfg.check && r.res[0].check != "ok" && r.skipped.empty()) any_error = true;
  }
  return any_error ? 3 : 0;
}

}  // namespace shoal::bench
