// Reduce-scatter by recursive halving (Algo::rd).
//
// Cost (p a power of two): lg p·α + (p-1)/p·n·β + (p-1)/p·n·γ  (n = bytes of the whole input).
// Other p: the rem = p - p' extra ranks fold into a partner first (+ α + n·β + n·γ) and get their
// block back at the end (+ α + n/p·β).
//
// Same β and γ terms as the ring with lg p latency terms instead of p-1: the choice for small and
// mid-sized reduce-scatters (below 64 KiB of input by default).
//
// Fold: among ranks 0 .. 2·rem-1 each even rank sends its whole input to the next odd rank,
// which reduces and takes part (new rank r/2) on behalf of both; the others take part as r - rem.
// Participant q stands for a "group" of output blocks: {2q, 2q+1} for q < rem, {q + rem} else,
// so the groups are contiguous in rank order. Halving at distances p'/2, .., 1 keeps the upper or
// lower half of the current range of groups (chunked exchanges, reduced as they land, into a
// full-size scratch accumulator); at the end participant q holds its group reduced, copies its
// own block out and, if it stands for an even rank too, sends that rank its block.
#include "algo/common.h"

namespace shoal::algo {

void reduce_scatter_halving(Ctx& c, const void* in, void* out, size_t count) {
  const int p = c.size, r = c.rank;
  const size_t bs = count * c.esize, n = bs * p;
  const int pp = pow2_floor(p), rem = p - pp;
  auto gstart = [&](int g) -> size_t { return static_cast<size_t>(g < rem ? 2 * g : g + rem) * bs; };
  auto real = [&](int q) { return q < rem ? 2 * q + 1 : q + rem; };
  uint8_t* acc = c.scratch(std::max<size_t>(n, 1), 1);
  const uint8_t* src = u8(in);
  int nr;
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      send_chunks(c, r + 1, in, n);
      recv_chunks(c, r + 1, out, bs);
      return;
    }
    send_recv_reduce(c, -1, nullptr, 0, r - 1, in, acc, n);
    src = acc;
    nr = r / 2;
  } else {
    nr = r - rem;
  }
  int lo = 0, hi = pp;
  for (int mask = pp / 2; mask >= 1; mask /= 2) {
    const int peer = real(nr ^ mask), mid = lo + mask;
    const bool upper = (nr & mask) != 0;
    const int klo = upper ? mid : lo, khi = upper ? hi : mid;
    const int slo = upper ? lo : mid, shi = upper ? mid : hi;
    send_recv_reduce(c, peer, src + gstart(slo), gstart(shi) - gstart(slo), peer, src + gstart(klo),
                     acc + gstart(klo), gstart(khi) - gstart(klo));
    src = acc;
    lo = klo;
    hi = khi;
  }
  if (r < 2 * rem) send_chunks(c, r - 1, acc + static_cast<size_t>(r - 1) * bs, bs);
  copy_bytes(out, acc + static_cast<size_t>(r) * bs, bs);
}

}  // namespace shoal::algo
