// Barriers: dissemination (Algo::rd) and the shared-memory barrier (Algo::direct).
//
// Dissemination cost: ⌈lg p⌉·α (1-byte messages): at distance 1, 2, 4, .. each rank sends to
// rank + d and receives from rank - d; after ⌈lg p⌉ rounds every rank has heard, transitively,
// from every other, and no round has a hot spot. The choice whenever some rank is off-host.
//
// Direct: the small direct protocol with no data (direct_small.cpp): each rank publishes the op's
// number and token in its slot and waits for every peer's: one round of cache-line traffic, far
// below any message exchange. A peer in another direct call shows another token: PeerError.
#include "algo/common.h"
#include "algo/direct_common.h"

namespace shoal::algo {

void barrier_dissemination(Ctx& c) {
  const int p = c.size, r = c.rank;
  static const uint8_t kByte = 1;
  uint8_t sink = 0;
  for (int d = 1; d < p; d *= 2) c.sendrecv(mod(r + d, p), &kByte, 1, mod(r - d, p), &sink, 1);
}

void barrier_direct(Ctx& c) { direct::barrier_small(c, direct::Sig(OpKind::barrier, c).value()); }

}  // namespace shoal::algo
