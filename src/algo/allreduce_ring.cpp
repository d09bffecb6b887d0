// Ring allreduce: ring reduce-scatter, then ring allgather (Patarasuk & Yuan).
//
// Cost: 2·(p-1)·α + 2·(p-1)/p·n·β + (p-1)/p·n·γ.
//
// The β and γ terms are the lower bounds for allreduce, and each rank only ever talks to its two
// neighbours, so every link is used once per step in each direction. Its 2·(p-1) latency terms
// are what BDE (2·lg p·α) saves. The automatic choice takes it above the switch
// allreduce.bde_up_to, or allreduce.bde_up_to_odd_p when p is not a power of two (cost.h:
// measured). The output buffer is the accumulator; in place
// (in == out) works because received chunks then go through scratch slots. Steps are pipelined
// in kChunkBytes messages (see reduce_scatter_ring.cpp and allgather_ring.cpp).
#include "algo/common.h"

namespace shoal::algo {

void allreduce_ring(Ctx& c, const void* in, void* out, size_t count) {
  const int p = c.size, r = c.rank;
  Blocks b = even_blocks(count, p, c.esize);
  ring_reduce_scatter(c, u8(in), u8(out), nullptr, b);
  ring_allgather(c, u8(out), b, r, mod(r - 1, p), mod(r + 1, p));
}

}  // namespace shoal::algo
