// shoal-bench: the Open MPI side (--vs ompi), run as an MPI user runs it: the ranks are started by
// `mpirun --oversubscribe` (launch.cpp; the user's --mpirun-args added), and each op is the MPI
// call a user makes, with Open MPI's default component and algorithm choice: MPI_Allreduce,
// MPI_Bcast, MPI_Reduce, MPI_Allgather, MPI_Reduce_scatter_block, MPI_Gather, MPI_Scatter,
// MPI_Alltoall on MPI_COMM_WORLD, root 0; sendrecv is MPI_Send 0 -> 1 / MPI_Recv. shoal and Gloo
// run in the same processes, so every backend has the same placement.
#include "bench/bench.h"

#if defined(SHOAL_HAVE_MPI) && SHOAL_HAVE_MPI

#include <mpi.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace shoal::bench {

namespace {

MPI_Datatype mpi_type(DType dt) {
  switch (dt) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i8: return MPI_INT8_T;
    case DType::u8: return MPI_UINT8_T;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::boolean: return MPI_C_BOOL;
    case DType::f16:
    case DType::bf16: break;
  }
  throw std::invalid_argument(std::string("MPI has no ") + dtype_name(dt) + " type");
}

MPI_Op mpi_op(ReduceOp op, DType dt) {
  const bool boolean = dt == DType::boolean;
  switch (op) {
    case ReduceOp::sum: return boolean ? MPI_LOR : MPI_SUM;   // bool sum is logical or (torch)
    case ReduceOp::prod: return boolean ? MPI_LAND : MPI_PROD;
    case ReduceOp::min: return boolean ? MPI_LAND : MPI_MIN;
    case ReduceOp::max: return boolean ? MPI_LOR : MPI_MAX;
    case ReduceOp::band: return boolean ? MPI_LAND : MPI_BAND;
    case ReduceOp::bor: return boolean ? MPI_LOR : MPI_BOR;
    case ReduceOp::bxor: return boolean ? MPI_LXOR : MPI_BXOR;
    case ReduceOp::avg: break;
  }
  throw std::invalid_argument("MPI has no avg reduction");
}

void ok(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw std::runtime_error(std::string(what) + ": " + std::string(msg, static_cast<size_t>(len)));
}

class OmpiRunner final : public Runner {
 public:
  OmpiRunner() {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) ok(MPI_Init(nullptr, nullptr), "MPI_Init");
    // Errors come back as codes (turned into exceptions here) rather than aborting the job.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  }
  ~OmpiRunner() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
  const char* name() const override { return "ompi"; }

  void run(const Spec& s, Buffers& b) override {
    void* in = b.in.data();
    void* out = b.out.data();
    const int c = count(s.block);
    const MPI_Comm w = MPI_COMM_WORLD;
    switch (s.op) {
      case Op::allreduce:
        ok(MPI_Allreduce(s.in_place ? MPI_IN_PLACE : in, out, c, mpi_type(s.dt), mpi_op(s.rop, s.dt), w), "MPI_Allreduce");
        break;
      case Op::broadcast:
        ok(MPI_Bcast(in, c, mpi_type(s.dt), 0, w), "MPI_Bcast");
        break;
      case Op::reduce:
        ok(MPI_Reduce(in, out, c, mpi_type(s.dt), mpi_op(s.rop, s.dt), 0, w), "MPI_Reduce");
        break;
      case Op::allgather:
        ok(MPI_Allgather(in, c, mpi_type(s.dt), out, c, mpi_type(s.dt), w), "MPI_Allgather");
        break;
      case Op::reduce_scatter:
        ok(MPI_Reduce_scatter_block(in, out, c, mpi_type(s.dt), mpi_op(s.rop, s.dt), w), "MPI_Reduce_scatter_block");
        break;
      case Op::gather:
        ok(MPI_Gather(in, c, mpi_type(s.dt), out, c, mpi_type(s.dt), 0, w), "MPI_Gather");
        break;
      case Op::scatter:
        ok(MPI_Scatter(in, c, mpi_type(s.dt), out, c, mpi_type(s.dt), 0, w), "MPI_Scatter");
        break;
      case Op::alltoall:
        ok(MPI_Alltoall(in, c, mpi_type(s.dt), out, c, mpi_type(s.dt), w), "MPI_Alltoall");
        break;
      case Op::alltoallv:
        counts_.assign(s.p, c);
        displs_.resize(s.p);
        for (int r = 0; r < s.p; ++r) displs_[r] = r * c;
        ok(MPI_Alltoallv(in, counts_.data(), displs_.data(), mpi_type(s.dt), out, counts_.data(), displs_.data(),
                         mpi_type(s.dt), w),
           "MPI_Alltoallv");
        break;
      case Op::sendrecv:
        if (s.rank == 0) ok(MPI_Send(in, c, mpi_type(s.dt), 1, 0, w), "MPI_Send");
        else if (s.rank == 1) ok(MPI_Recv(out, c, mpi_type(s.dt), 0, 0, w, MPI_STATUS_IGNORE), "MPI_Recv");
        break;
      case Op::barrier:
        ok(MPI_Barrier(w), "MPI_Barrier");
        break;
    }
  }

  void barrier() override { ok(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }

 private:
  std::vector<int> counts_, displs_;  // alltoallv's, kept across calls
  static int count(size_t n) {
    if (n > static_cast<size_t>(INT32_MAX)) throw std::invalid_argument("MPI counts are ints: at most 2^31-1 elements");
    return static_cast<int>(n);
  }
};

}  // namespace

bool have_ompi() { return true; }

std::unique_ptr<Runner> make_ompi_runner(int rank, int size, std::string* why) {
  const char* r = std::getenv("OMPI_COMM_WORLD_RANK");
  const char* n = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (!r || !n) {
    *why = "ompi: this rank was not started by mpirun (shoal-bench starts its ranks with mpirun for --vs ompi)";
    return nullptr;
  }
  auto runner = std::make_unique<OmpiRunner>();
  int mr = -1, mn = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &mr);
  MPI_Comm_size(MPI_COMM_WORLD, &mn);
  if (mr != rank || mn != size) {
    *why = "ompi: MPI rank " + std::to_string(mr) + " of " + std::to_string(mn) + " is shoal rank " +
           std::to_string(rank) + " of " + std::to_string(size);
    return nullptr;
  }
  return runner;
}

std::string ompi_description() {
  char v[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(v, &len);
  std::string s(v, static_cast<size_t>(len));
  s = s.substr(0, s.find_first_of(",\n"));
  return "ompi: " + s + ", started by mpirun --oversubscribe, its default components and algorithms";
}

std::string mpirun_path() { return SHOAL_MPIRUN; }

}  // namespace shoal::bench

#else  // built without MPI

namespace shoal::bench {

bool have_ompi() { return false; }

std::unique_ptr<Runner> make_ompi_runner(int, int, std::string* why) {
  *why = "ompi: not built in";
  return nullptr;
}

std::string ompi_description() { return "ompi: not built in"; }

std::string mpirun_path() { return ""; }

}  // namespace shoal::bench

#endif
