// shoal-bench: the shoal side. Each op completes before the next one starts, as for a synchronous
// caller (and the Gloo and Open MPI sides): a blocking call (CallOptions::blocking), or with
// --queued a call that returns a Work, waited for at once (the path of torch's backend). Roots are
// rank 0; sendrecv sends rank 0 -> rank 1.
#include "bench/bench.h"

namespace shoal::bench {

namespace {

class ShoalRunner final : public Runner {
 public:
  ShoalRunner(Communicator& comm, Algo algo, bool queued) : comm_(comm) {
    co_.algo = algo;
    co_.blocking = !queued;
  }
  const char* name() const override { return "shoal"; }

  void run(const Spec& s, Buffers& b) override {
    void* in = input_of(s, b).data();
    void* out = b.out.data();
    const size_t c = s.block;
    WorkPtr w;
    switch (s.op) {
      case Op::allreduce:
        w = comm_.allreduce(in, out, c, s.dt, s.rop, co_);
        break;
      case Op::broadcast:
        w = comm_.broadcast(in, c, s.dt, 0, co_);
        break;
      case Op::reduce:
        w = comm_.reduce(in, out, c, s.dt, s.rop, 0, co_);
        break;
      case Op::allgather:
        w = comm_.allgather(in, out, c, s.dt, co_);
        break;
      case Op::reduce_scatter:
        w = comm_.reduce_scatter(in, out, c, s.dt, s.rop, co_);
        break;
      case Op::gather:
        w = comm_.gather(in, out, c, s.dt, 0, co_);
        break;
      case Op::scatter:
        w = comm_.scatter(in, out, c, s.dt, 0, co_);
        break;
      case Op::alltoall:
        w = comm_.alltoall(in, out, c, s.dt, co_);
        break;
      case Op::alltoallv:
        counts_.assign(s.p, c);
        w = comm_.alltoallv(in, counts_, out, counts_, s.dt, co_);
        break;
      case Op::sendrecv:
        if (s.rank == 0) w = comm_.send(in, c, s.dt, 1, 0, co_);
        else if (s.rank == 1) w = comm_.recv(out, c, s.dt, 0, 0, co_);
        break;
      case Op::barrier:
        w = comm_.barrier(co_);
        break;
    }
    if (w) w->wait();
  }

  void barrier() override { comm_.barrier()->wait(); }

 private:
  Communicator& comm_;
  CallOptions co_;
  std::vector<size_t> counts_;  // alltoallv's, kept: assigning the same size allocates nothing
};

}  // namespace

std::unique_ptr<Runner> make_shoal_runner(Communicator& comm, Algo algo, bool queued) {
  return std::make_unique<ShoalRunner>(comm, algo, queued);
}

}  // namespace shoal::bench
