// Allgather(v) by recursive doubling (p a power of two) or Bruck (any other p).
//
// Cost: ⌈lg p⌉·α + (p-1)/p·n·β  (Bruck adds two local copies of n: into a rotated staging buffer
// and back out).
//
// lg p latency terms instead of the ring's p-1; the ring's neighbour-only traffic keeps every link
// between hosts busy. The automatic choice changes from this one to the ring at the switch
// allgather.rd_below (cost.h: measured).
//
// Unequal counts work in both: every rank knows every count, so each exchange's size is known on
// both sides.
// - Recursive doubling: at distance 1, 2, .., p/2 each rank swaps the aligned group of blocks it
//   has (contiguous in the output, in rank order) with its partner's group, straight in the output.
// - Bruck: a staging buffer holds blocks in the order rank, rank+1, ..; at distance 2^k each
//   rank sends its first min(2^k, p-2^k) blocks to rank-2^k and appends as many from rank+2^k.
//   ⌈lg p⌉ steps, then the staging buffer is rotated into the output.
#include "algo/common.h"

namespace shoal::algo {

void allgatherv_rd(Ctx& c, const void* in, void* out, const std::vector<size_t>& counts) {
  const int p = c.size, r = c.rank;
  Blocks b = counted_blocks(counts, c.esize);
  uint8_t* o = u8(out);
  if (is_pow2(p)) {
    copy_bytes(o + b.off[r], in, b.len[r]);
    for (int mask = 1; mask < p; mask *= 2) {
      const int peer = r ^ mask;
      const int mine = r & ~(mask - 1), theirs = mine ^ mask;
      c.sendrecv(peer, o + b.off[mine], b.span(mine, mine + mask), peer, o + b.off[theirs],
                 b.span(theirs, theirs + mask));
    }
    return;
  }
  uint8_t* tmp = c.scratch(std::max<size_t>(b.total(), 1), 0);
  copy_bytes(tmp, in, b.len[r]);
  size_t held = b.len[r];
  for (int dist = 1; dist < p; dist *= 2) {
    const int m = std::min(dist, p - dist);
    size_t sbytes = 0, rbytes = 0;
    for (int i = 0; i < m; ++i) {
      sbytes += b.len[mod(r + i, p)];
      rbytes += b.len[mod(r + dist + i, p)];
    }
    c.sendrecv(mod(r - dist, p), tmp, sbytes, mod(r + dist, p), tmp + held, rbytes);
    held += rbytes;
  }
  size_t pos = 0;
  for (int i = 0; i < p; ++i) {
    const int blk = mod(r + i, p);
    copy_bytes(o + b.off[blk], tmp + pos, b.len[blk]);
    pos += b.len[blk];
  }
}

}  // namespace shoal::algo
