// MST allreduce: binomial-tree reduce to rank 0, then binomial-tree broadcast from rank 0.
//
// Cost: 2·lg p·(α + n·β) + lg p·n·γ  (per edge pipelined in kChunkBytes messages, so for large n
// the broadcast half approaches (lg p + n/kChunkBytes)·(α + kChunkBytes·β)).
//
// The fewest messages on the critical path (2·⌈lg p⌉) and no splitting of the vector: for small
// messages, where α dominates and BDE's and the ring's per-block bookkeeping buys nothing (the
// automatic choice: below the switch allreduce.mst_below, cost.h). Its lg p·n·β term makes it
// the worst choice for large messages. The output doubles as every rank's accumulator (in == out works).
#include "algo/common.h"

namespace shoal::algo {

void allreduce_mst(Ctx& c, const void* in, void* out, size_t count) {
  binomial_reduce(c, in, out, count, 0);
  broadcast_binomial(c, out, count, 0);
}

}  // namespace shoal::algo
