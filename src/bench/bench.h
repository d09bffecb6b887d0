// shoal-bench: shared declarations of the benchmark CLI (src/bench/*.cpp). See docs/bench.md.
//
// One process (the launcher) starts a TcpStore server and forks/execs itself once per rank (with
// --vs ompi: runs mpirun, which starts them); each rank builds a shoal::Communicator (and the
// peers: with --vs gloo a Gloo context, with --vs ompi Open MPI) and runs the sweep; rank 0
// prints the table. Coordination between ranks (syncs, the iteration count, the results)
// goes through the store only, so that a failing backend never desynchronises the sweep.
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "algo/model.h"
#include "shoal/communicator.h"
#include "shoal/store.h"
#include "shoal/types.h"

namespace shoal::bench {

enum class Op : uint8_t {
  allreduce, broadcast, reduce, allgather, reduce_scatter, gather, scatter, alltoall, alltoallv, sendrecv, barrier
};
// alltoallv: alltoall's equal blocks through the call with a count per rank (torch's all_to_all_single).
const char* op_name(Op op);
std::optional<Op> parse_op(const std::string& s);

struct Config {
  Op op = Op::allreduce;
  int ranks = 2;
  size_t min_bytes = 4096;
  size_t max_bytes = 4096;
  double factor = 2;
  size_t plus = 0;  // bytes added to every rank's block (--plus): sizes_of, worker.cpp
  DType dtype = DType::f32;
  ReduceOp rop = ReduceOp::sum;
  std::string algo_str = "auto";
  Algo algo = Algo::automatic;
  std::string transport = "auto";  // as given on the command line
  bool transport_given = false;
  bool check = false;
  bool vs_gloo = false;
  bool vs_ompi = false;
  std::string mpirun_args;  // extra arguments for mpirun (--vs ompi), split at spaces
  std::string json_path;
  bool floors = false;  // measure the machine's limits first and print each row against them
  bool queued = false;  // shoal's ops return a Work waited for at once, instead of blocking calls
  bool fresh = false;   // every line of the input rewritten before each timed op (worker.cpp)
  bool in_place = false;  // allreduce only: the output buffer is the input too (MPI_IN_PLACE; torch's calls)
  bool resources = false;  // print what a rank costs: init time, memory, /dev/shm, fds (resources.cpp)
  bool model = false;      // after the run, fit the algorithm's α-β-γ model to its times (model.cpp)
  int iters = 0;    // 0 = adaptive
  int warmup = -1;  // -1 = by size (5 below 8 MiB, 2 from there)
  std::vector<std::string> argv;  // the original arguments, passed on to the ranks
};

// --model (model.cpp): the α-β-γ model of the algorithm run (src/algo/model.h) fitted to its
// measured times, `times` (bytes, µs) one per size; printed after the table as comment lines, and
// in the JSON. nullopt without --model.
struct ModelFit {
  bool fitted = false;  // two sizes or more ran
  algo::Fit fit;
  std::vector<size_t> sizes;
  std::vector<double> shoal_us, model_us;
};
// Throws std::invalid_argument unless --model can fit: one algorithm the op has (not auto; not
// hier, whose model needs the hosts), 2 ranks or more, and shared memory for direct.
void check_model_args(const Config& cfg);
std::optional<ModelFit> fit_run(const Config& cfg, int p, const std::vector<std::pair<size_t, double>>& times);
void print_model(const Config& cfg, const ModelFit& m);

// Parses argv (without argv[0]). Throws std::invalid_argument with a message on bad input.
Config parse_args(const std::vector<std::string>& args);
std::string usage();
size_t parse_size(const std::string& s);  // "4K", "64M", "1G", "123"

// Busbw factor of nccl-tests for `op` among p ranks.
double busbw_factor(Op op, int p);

// The shape of one benchmarked op at one size.
struct Spec {
  Op op;
  DType dt;
  ReduceOp rop;
  int p;        // ranks
  int rank;
  size_t block; // elements per rank block (allreduce etc: the whole buffer)
  size_t esize; // bytes per element
  size_t bytes; // the size the row reports (nccl-tests definition)
  size_t count; // the count the row reports: bytes / esize
  size_t in_elems;
  size_t out_elems;
  bool in_place = false;  // the input is in `out`, which the op overwrites (Config::in_place)
};
Spec make_spec(Op op, DType dt, ReduceOp rop, int p, int rank, size_t size_bytes);

// 64-byte aligned byte buffer.
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t bytes);
  uint8_t* data() const { return p_.get(); }
  size_t size() const { return n_; }

 private:
  struct Free { void operator()(uint8_t* p) const; };
  std::unique_ptr<uint8_t, Free> p_;
  size_t n_ = 0;
};

struct Buffers {
  Buffer in, out, tmp;  // tmp: scratch of a backend (gloo reduce_scatter)
};
Buffers alloc_buffers(const Spec& s);
// The buffer that holds a rank's input: `out` where the op runs in place (Spec::in_place).
inline const Buffer& input_of(const Spec& s, const Buffers& b) { return s.in_place ? b.out : b.in; }

// Deterministic inputs (small integers, exact in every dtype), a sentinel in the outputs, and
// verification of the outputs against a reference computed here, independently of shoal.
void fill_inputs(const Spec& s, Buffers& b);
void fill_sentinel(const Spec& s, Buffers& b);
std::string verify(const Spec& s, const Buffers& b);  // "ok" or a description of the first error

// A backend runs one op of `spec` to completion, synchronously.
class Runner {
 public:
  virtual ~Runner() = default;
  virtual const char* name() const = 0;
  virtual void run(const Spec& s, Buffers& b) = 0;
  virtual void barrier() = 0;
};

std::unique_ptr<Runner> make_shoal_runner(Communicator& comm, Algo algo, bool queued);

// Gloo over its TCP transport on 127.0.0.1, rendezvous through `store` (keys under "bench-gloo/").
// Returns null with `why` set when built without Gloo.
std::unique_ptr<Runner> make_gloo_runner(std::shared_ptr<Store> store, int rank, int size,
                                         std::chrono::milliseconds timeout, std::string* why);
// One line describing how gloo runs `op` (device and algorithm), for the table header.
std::string gloo_description(Op op, const Runner* gloo);
bool have_gloo();

// Open MPI in the ranks' own processes (launch.cpp starts them with mpirun for --vs ompi). Returns
// null with `why` set when the rank was not started by mpirun or its MPI rank differs.
std::unique_ptr<Runner> make_ompi_runner(int rank, int size, std::string* why);
std::string ompi_description();  // the table header's line
bool have_ompi();                // built with Open MPI
std::string mpirun_path();       // the mpirun found at build time

// The machine's limits (--floors, floors.cpp): B, memory bandwidth of a copy with one thread per
// core (bytes read + written per second, all threads); the cache-line round trip between two cores
// (0 where only one core is allowed); the time for one process to hand its core to another
// (sched_yield between two processes pinned to one core).
struct Floors {
  double bw_bytes_per_s = 0;
  int bw_threads = 0;
  double rtt_ns = 0;
  double handover_ns = 0;
};
Floors measure_floors();  // takes ~2 s; run by the launcher before it starts the ranks
std::string floors_env(const Floors& f);  // "SHOAL_BENCH_FLOORS=..." for the ranks
std::optional<Floors> floors_from_env();
// A time of `us` over the memory floor of one op of `bytes` (the row's size) on p ranks: 2·p·n/B for
// allreduce (every input read, every output written), NaN for the other ops; and over the
// cache-line round trip (NaN where it was not measured).
double over_memory_floor(double us, Op op, size_t bytes, int p, const Floors& f);
double over_round_trip(double us, const Floors& f);

// --resources (resources.cpp): one rank's costs, measured from /proc after the run.
struct Resources {
  double init_s = 0;          // the Communicator's construction
  double rss_mib = 0, hwm_mib = 0;
  double shm_own_mib = 0;     // its own segment: what it reserves in /dev/shm
  double shm_mapped_mib = 0;  // every segment it maps (its peers' too): address space, not /dev/shm
  int fds = 0;
  std::string encode() const;
  static Resources decode(const std::string& text);
};
Resources measure_resources(double init_seconds);
std::string resources_line(const std::vector<Resources>& all);  // mean and max over ranks

// Launcher side: forks/execs this binary `cfg.ranks` times and waits. Returns the exit status.
int launch(const Config& cfg, const char* self);
// Rank side (SHOAL_RANK set). Returns the exit status.
int worker_main(const Config& cfg);

}  // namespace shoal::bench
