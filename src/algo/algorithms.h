// Every algorithm shoal has, written over Ctx (src/algo/context.h), and the automatic choice.
// One file per algorithm family under src/algo/, each opening with its alpha-beta-gamma cost
// (alpha = latency per message, beta = time per byte, gamma = reduction time per byte, p ranks,
// n bytes; as code, the cost function in its row of registry.cpp: model.h). Counts are in elements of ctx.dt; buffers are raw. Every function supports in == out
// where the op allows in-place use, count == 0, and size == 1.
//
// Reductions use ctx.reduce (the op is never avg here: the communicator turns avg into sum and
// scales the result).
#pragma once
#include <cstddef>
#include <utility>
#include <vector>

#include "algo/context.h"
#include "shoal/algo.h"

namespace shoal {

enum class OpKind : uint8_t { allreduce, broadcast, reduce, allgatherv, reduce_scatter, gather, scatter, alltoallv, barrier };
inline const char* op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::allreduce: return "allreduce";
    case OpKind::broadcast: return "broadcast";
    case OpKind::reduce: return "reduce";
    case OpKind::allgatherv: return "allgather";
    case OpKind::reduce_scatter: return "reduce_scatter";
    case OpKind::gather: return "gather";
    case OpKind::scatter: return "scatter";
    case OpKind::alltoallv: return "alltoall";
    case OpKind::barrier: return "barrier";
  }
  return "op";
}
// Which algorithms each op has, and where they apply: algo/registry.h.

// One collective as the communicator queues it: plain data, so that queuing an op allocates
// nothing beyond its Work (a closure over the arguments did) and an op can be logged or compared.
struct OpDesc {
  OpKind kind = OpKind::barrier;
  Algo algo = Algo::automatic;  // as chosen on the caller's thread (Communicator::algo_for)
  DType dt = DType::u8;
  ReduceOp op = ReduceOp::sum;  // as the caller gave it: avg included (run_op scales)
  int root = -1;
  const void* in = nullptr;
  void* out = nullptr;          // broadcast: the buffer
  size_t count = 0;             // per rank, in elements (allgatherv, alltoallv: see counts)
  std::vector<size_t> counts;   // allgatherv: per rank; alltoallv: sent to each rank (both: empty for equal blocks of count)
  std::vector<size_t> counts2;  // alltoallv: received from each rank
  uint64_t call = 0;            // kind, dt, op, algo and root in one word (the core's CallRecord::what)
  uint64_t sig = 0;             // the op's signature and number, the same on every rank
};

// Runs `d` on `c` (whose op is d.op with avg as sum) to completion, avg's scaling included.
void run_op(Ctx& c, const OpDesc& d);

// Topo (where the ranks are) is in algo/context.h.

// The parts of every rank's shared scratch area (offset, bytes) that a group's first ops touch: the
// header and the small slots, which small ops rotate through, and the share of each data slot
// that successive chunked ops move through (src/algo/direct_common.h, Places) where the
// group's ranks have a core each and cut chunks by an L2 of `l2` bytes. A group maps them into
// its processes when it is made (ShmGroupImpl::prefault), so that its first ops take no page
// faults: each of the first ops of 16 KiB at 2 ranks would otherwise touch pages of its own and
// of its peer's that no op touched before (BENCHMARKS.md, "A group's first chunked ops").
std::vector<std::pair<size_t, size_t>> shm_first_ops_areas(const ShmGroup& g, size_t l2);

// The algorithm that runs `kind` for a message of `bytes` (allgatherv: the total) among `size`
// ranks. `requested` is the per-call choice (or SHOAL_ALGO, applied by the caller); automatic
// picks by the group's tuning (`ways`: where each choice over the network switches, measured;
// docs/algorithms.md). A requested algorithm that does not apply to the op or topology throws
// InvalidArgument. Pure: the same answer on every rank of a group.
Algo choose_algo(OpKind kind, Algo requested, size_t bytes, int size, Topo topo, const algo::Ways& ways);

void allreduce(Ctx& c, Algo a, const void* in, void* out, size_t count);
void broadcast(Ctx& c, Algo a, void* buf, size_t count, int root);
void reduce(Ctx& c, Algo a, const void* in, void* out, size_t count, int root);  // out: root only
void allgatherv(Ctx& c, Algo a, const void* in, void* out, const std::vector<size_t>& counts);
void allgather(Ctx& c, Algo a, const void* in, void* out, size_t count);  // allgatherv of equal counts
void reduce_scatter(Ctx& c, Algo a, const void* in, void* out, size_t count);
void gather(Ctx& c, Algo a, const void* in, void* out, size_t count, int root);
void scatter(Ctx& c, Algo a, const void* in, void* out, size_t count, int root);
void alltoallv(Ctx& c, Algo a, const void* in, const std::vector<size_t>& send_counts, void* out,
               const std::vector<size_t>& recv_counts);
// alltoall with equal blocks of `count` elements: direct (direct_alltoall.cpp) or alltoallv's.
void alltoall(Ctx& c, Algo a, const void* in, void* out, size_t count);
void barrier(Ctx& c, Algo a);

}  // namespace shoal
