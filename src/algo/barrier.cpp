// Barriers: dissemination (Algo::rd) and the shared-memory barrier (Algo::direct).
//
// Dissemination cost: ⌈lg p⌉·α (1-byte messages): at distance 1, 2, 4, .. each rank sends to
// rank + d and receives from rank - d; after ⌈lg p⌉ rounds every rank has heard, transitively,
// from every other, and no round has a hot spot. The choice whenever some rank is off-host.
//
// Direct: ShmGroup::barrier (a sequence counter per rank in shared memory, futex sleep after a
// short spin): one round of cache-line traffic, far below any message exchange. It publishes
// and checks the op token in the scratch headers like every direct op (see direct_common.h), so a
// barrier called against another rank's direct collective fails on every rank; it reads no
// scratch data, so it needs no second barrier.
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
