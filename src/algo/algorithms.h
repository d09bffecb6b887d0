// Every algorithm shoal has, written over Ctx (src/core/context.h), and the automatic choice.
// One file per algorithm family under src/algo/, each opening with its alpha-beta-gamma cost
// (alpha = latency per message, beta = time per byte, gamma = reduction time per byte, p ranks,
// n bytes). Counts are in elements of ctx.dt; buffers are raw. Every function supports in == out
// where the op allows in-place use, count == 0, and size == 1.
//
// Reductions use ctx.reduce (the op is never avg here: the communicator turns avg into sum and
// scales the result).
#pragma once
#include <cstddef>
#include <vector>

#include "core/context.h"
#include "shoal/communicator.h"

namespace shoal {

enum class OpKind : uint8_t { allreduce, broadcast, reduce, allgatherv, reduce_scatter, gather, scatter, alltoallv, barrier };
const char* op_kind_name(OpKind k);

// Topo (where the ranks are) is in core/context.h.

// The algorithm that runs `kind` for a message of `bytes` (allgatherv: the total) among `size`
// ranks. `requested` is the per-call choice (or SHOAL_ALGO, applied by the caller); automatic
// picks from the measured table in docs/algorithms.md. A requested algorithm that does not apply
// to the op or topology throws InvalidArgument. Pure: the same answer on every rank.
Algo choose_algo(OpKind kind, Algo requested, size_t bytes, int size, Topo topo);

void allreduce(Ctx& c, Algo a, const void* in, void* out, size_t count);
void broadcast(Ctx& c, Algo a, void* buf, size_t count, int root);
void reduce(Ctx& c, Algo a, const void* in, void* out, size_t count, int root);  // out: root only
void allgatherv(Ctx& c, Algo a, const void* in, void* out, const std::vector<size_t>& counts);
void reduce_scatter(Ctx& c, Algo a, const void* in, void* out, size_t count);
void gather(Ctx& c, Algo a, const void* in, void* out, size_t count, int root);
void scatter(Ctx& c, Algo a, const void* in, void* out, size_t count, int root);
void alltoallv(Ctx& c, Algo a, const void* in, const std::vector<size_t>& send_counts, void* out,
               const std::vector<size_t>& recv_counts);
// alltoall with equal blocks of `count` elements: direct (direct_alltoall.cpp) or alltoallv's.
void alltoall(Ctx& c, Algo a, const void* in, void* out, size_t count);
void barrier(Ctx& c, Algo a);

}  // namespace shoal
