// From op to algorithm: each entry resolves the algorithm (choose_algo also rejects one the op or
// topology does not have, with InvalidArgument), handles a group of one locally, runs the
// algorithm's function from the registry (registry.cpp) and waits for every request it posted.
#include "algo/algorithms.h"
#include "algo/common.h"
#include "algo/registry.h"
#include "shoal/error.h"

namespace shoal {
namespace {

using namespace algo;

// An algorithm named here was chosen and checked on the caller's thread (Communicator::algo_for);
// automatic comes from the hierarchical algorithms, for their subgroups.
Algo resolve(Ctx& c, OpKind k, Algo a, size_t bytes) {
  return a == Algo::automatic ? choose_algo(k, a, bytes, c.size, c.topo, c.ways()) : a;
}

// The registry's function of `a` for op `k` (resolve checked that k has it).
template <class Fn>
Fn must(Fn f, OpKind k, Algo a) {
  if (!f)
    throw InvalidArgument(std::string(op_kind_name(k)) + ": algorithm " + std::to_string(static_cast<int>(a)) +
                          " does not apply");
  return f;
}

}  // namespace

void allreduce(Ctx& c, Algo a, const void* in, void* out, size_t count) {
  a = resolve(c, OpKind::allreduce, a, count * c.esize);
  if (c.size == 1) return copy_bytes(out, in, count * c.esize);
  must(allreduce_fn(a), OpKind::allreduce, a)(c, in, out, count);
  c.wait_all();
}

void broadcast(Ctx& c, Algo a, void* buf, size_t count, int root) {
  a = resolve(c, OpKind::broadcast, a, count * c.esize);
  if (c.size == 1) return;
  must(broadcast_fn(a), OpKind::broadcast, a)(c, buf, count, root);
  c.wait_all();
}

void reduce(Ctx& c, Algo a, const void* in, void* out, size_t count, int root) {
  a = resolve(c, OpKind::reduce, a, count * c.esize);
  if (c.size == 1) return copy_bytes(out, in, count * c.esize);
  must(reduce_fn(a), OpKind::reduce, a)(c, in, out, count, root);
  c.wait_all();
}

void allgatherv(Ctx& c, Algo a, const void* in, void* out, const std::vector<size_t>& counts) {
  if (counts.size() != static_cast<size_t>(c.size))
    throw InvalidArgument("allgather: counts has " + std::to_string(counts.size()) + " entries for a group of " +
                          std::to_string(c.size));
  size_t total = 0;
  for (size_t n : counts) total += n;
  a = resolve(c, OpKind::allgatherv, a, total * c.esize);
  if (c.size == 1) return copy_bytes(out, in, counts[0] * c.esize);
  must(allgatherv_fn(a), OpKind::allgatherv, a)(c, in, out, counts);
  c.wait_all();
}

void allgather(Ctx& c, Algo a, const void* in, void* out, size_t count) {
  a = resolve(c, OpKind::allgatherv, a, count * c.esize * c.size);
  if (c.size == 1) return copy_bytes(out, in, count * c.esize);
  if (a == Algo::direct) {  // equal blocks: a direct version of its own
    allgather_direct(c, in, out, count);
    return c.wait_all();
  }
  allgatherv(c, a, in, out, std::vector<size_t>(c.size, count));
}

void reduce_scatter(Ctx& c, Algo a, const void* in, void* out, size_t count) {
  a = resolve(c, OpKind::reduce_scatter, a, count * c.esize * c.size);
  if (c.size == 1) return copy_bytes(out, in, count * c.esize);
  must(reduce_scatter_fn(a), OpKind::reduce_scatter, a)(c, in, out, count);
  c.wait_all();
}

void gather(Ctx& c, Algo a, const void* in, void* out, size_t count, int root) {
  a = resolve(c, OpKind::gather, a, count * c.esize * c.size);
  if (c.size == 1) return copy_bytes(out, in, count * c.esize);
  must(gather_fn(a), OpKind::gather, a)(c, in, out, count, root);
  c.wait_all();
}

void scatter(Ctx& c, Algo a, const void* in, void* out, size_t count, int root) {
  a = resolve(c, OpKind::scatter, a, count * c.esize * c.size);
  if (c.size == 1) return copy_bytes(out, in, count * c.esize);
  must(scatter_fn(a), OpKind::scatter, a)(c, in, out, count, root);
  c.wait_all();
}

void alltoallv(Ctx& c, Algo a, const void* in, const std::vector<size_t>& send_counts, void* out,
               const std::vector<size_t>& recv_counts) {
  if (send_counts.size() != static_cast<size_t>(c.size) || recv_counts.size() != static_cast<size_t>(c.size))
    throw InvalidArgument("alltoall: send_counts and recv_counts need one entry per rank");
  if (send_counts[c.rank] != recv_counts[c.rank])
    throw InvalidArgument("alltoall: this rank sends itself " + std::to_string(send_counts[c.rank]) +
                          " elements but expects " + std::to_string(recv_counts[c.rank]));
  size_t sent = 0, got = 0;
  for (size_t n : send_counts) sent += n;
  for (size_t n : recv_counts) got += n;
  a = resolve(c, OpKind::alltoallv, a, std::max(sent, got) * c.esize);
  if (c.size == 1) return copy_bytes(out, in, send_counts[0] * c.esize);
  must(alltoallv_fn(a), OpKind::alltoallv, a)(c, in, send_counts, out, recv_counts);
  c.wait_all();
}

void alltoall(Ctx& c, Algo a, const void* in, void* out, size_t count) {
  a = resolve(c, OpKind::alltoallv, a, count * c.esize * c.size);
  if (c.size == 1) return copy_bytes(out, in, count * c.esize);
  if (a == Algo::direct) {  // equal blocks: a direct version of its own
    alltoall_direct(c, in, out, count);
    return c.wait_all();
  }
  const std::vector<size_t> counts(c.size, count);
  must(alltoallv_fn(a), OpKind::alltoallv, a)(c, in, counts, out, counts);
  c.wait_all();
}

void barrier(Ctx& c, Algo a) {
  a = resolve(c, OpKind::barrier, a, 0);
  if (c.size == 1) return;
  must(barrier_fn(a), OpKind::barrier, a)(c);
  c.wait_all();
}

void run_op(Ctx& c, const OpDesc& d) {
  const bool avg = d.op == ReduceOp::avg;
  switch (d.kind) {
    case OpKind::allreduce:
      allreduce(c, d.algo, d.in, d.out, d.count);
      if (avg) scale_avg(d.out, d.count, d.dt, c.size);
      break;
    case OpKind::broadcast: broadcast(c, d.algo, d.out, d.count, d.root); break;
    case OpKind::reduce:
      reduce(c, d.algo, d.in, d.out, d.count, d.root);
      if (avg && c.rank == d.root) scale_avg(d.out, d.count, d.dt, c.size);
      break;
    case OpKind::allgatherv:
      if (d.counts.empty())
        allgather(c, d.algo, d.in, d.out, d.count);
      else
        allgatherv(c, d.algo, d.in, d.out, d.counts);
      break;
    case OpKind::reduce_scatter:
      reduce_scatter(c, d.algo, d.in, d.out, d.count);
      if (avg) scale_avg(d.out, d.count, d.dt, c.size);
      break;
    case OpKind::gather: gather(c, d.algo, d.in, d.out, d.count, d.root); break;
    case OpKind::scatter: scatter(c, d.algo, d.in, d.out, d.count, d.root); break;
    case OpKind::alltoallv:
      if (d.counts.empty())
        alltoall(c, d.algo, d.in, d.out, d.count);
      else
        alltoallv(c, d.algo, d.in, d.counts, d.out, d.counts2);
      break;
    case OpKind::barrier: barrier(c, d.algo); break;
  }
}

}  // namespace shoal
