// Helpers shared by the point-to-point algorithms: block partitions, chunked transfers and the
// pipelined receive-and-reduce that ring, BDE and the binomial reduce are built on.
#include "algo/common.h"

#include <deque>

namespace shoal::algo {

Blocks even_blocks(size_t count, int p, size_t esize) {
  Blocks b;
  b.off.resize(p + 1);
  b.len.resize(p);
  size_t q = count / p, extra = count % p, pos = 0;
  for (int i = 0; i < p; ++i) {
    b.off[i] = pos;
    b.len[i] = (q + (static_cast<size_t>(i) < extra ? 1 : 0)) * esize;
    pos += b.len[i];
  }
  b.off[p] = pos;
  return b;
}

Blocks uniform_blocks(size_t count, int p, size_t esize) {
  Blocks b;
  b.off.resize(p + 1);
  b.len.assign(p, count * esize);
  for (int i = 0; i <= p; ++i) b.off[i] = static_cast<size_t>(i) * count * esize;
  return b;
}

Blocks counted_blocks(const std::vector<size_t>& counts, size_t esize) {
  const int p = static_cast<int>(counts.size());
  Blocks b;
  b.off.resize(p + 1);
  b.len.resize(p);
  size_t pos = 0;
  for (int i = 0; i < p; ++i) {
    b.off[i] = pos;
    b.len[i] = counts[i] * esize;
    pos += b.len[i];
  }
  b.off[p] = pos;
  return b;
}

void post_send_chunks(Ctx& c, int peer, const void* buf, size_t bytes, std::vector<Request*>& reqs) {
  const size_t n = chunk_count(bytes);
  for (size_t k = 0; k < n; ++k) reqs.push_back(c.isend(peer, u8(buf) + k * kChunkBytes, chunk_len(bytes, k)));
}

void post_recv_chunks(Ctx& c, int peer, void* buf, size_t bytes, std::vector<Request*>& reqs) {
  const size_t n = chunk_count(bytes);
  for (size_t k = 0; k < n; ++k) reqs.push_back(c.irecv(peer, u8(buf) + k * kChunkBytes, chunk_len(bytes, k)));
}

void send_chunks(Ctx& c, int peer, const void* buf, size_t bytes) {
  std::vector<Request*> reqs;
  post_send_chunks(c, peer, buf, bytes, reqs);
  c.wait(reqs);
}

void recv_chunks(Ctx& c, int peer, void* buf, size_t bytes) {
  std::vector<Request*> reqs;
  post_recv_chunks(c, peer, buf, bytes, reqs);
  c.wait(reqs);
}

void send_recv_reduce(Ctx& c, int to, const void* sbuf, size_t sbytes, int from, const void* own, void* acc,
                      size_t rbytes) {
  std::vector<Request*> sends;
  if (to >= 0) post_send_chunks(c, to, sbuf, sbytes, sends);
  if (from >= 0) {
    const size_t n = chunk_count(rbytes);
    const bool direct = own != acc;
    // Direct: every chunk has its own place in acc, so all receives go up at once. Staged: a ring
    // of kRecvWindow slots; the receive for chunk k+W reuses chunk k's slot once it is reduced.
    const size_t window = direct ? n : std::min<size_t>(n, kRecvWindow);
    uint8_t* slots = direct ? nullptr : c.scratch(window * std::min(kChunkBytes, std::max<size_t>(rbytes, 1)), 0);
    const size_t slot_bytes = std::min(kChunkBytes, std::max<size_t>(rbytes, 1));
    auto target = [&](size_t k) -> uint8_t* {
      return direct ? u8(acc) + k * kChunkBytes : slots + (k % window) * slot_bytes;
    };
    std::vector<Request*> recvs(n, nullptr);
    size_t posted = 0;
    for (; posted < window; ++posted) recvs[posted] = c.irecv(from, target(posted), chunk_len(rbytes, posted));
    for (size_t k = 0; k < n; ++k) {
      c.wait({recvs[k]});
      const size_t len = chunk_len(rbytes, k);
      uint8_t* dst = u8(acc) + k * kChunkBytes;
      if (len) c.reduce(dst, direct ? u8(own) + k * kChunkBytes : target(k), len / c.esize);
      if (posted < n) {
        recvs[posted] = c.irecv(from, target(posted), chunk_len(rbytes, posted));
        ++posted;
      }
    }
  }
  if (!sends.empty()) c.wait(sends);
}

int fold_in(Ctx& c, const void* in, void* acc, size_t n) {
  const int r = c.rank, rem = c.size - pow2_floor(c.size);
  if (r >= 2 * rem) return r - rem;
  if (r % 2 == 0) {
    send_chunks(c, r + 1, in, n);
    return -1;
  }
  send_recv_reduce(c, -1, nullptr, 0, r - 1, in, acc, n);
  return r / 2;
}

void recursive_halving(Ctx& c, int q, int rem, const uint8_t* src, uint8_t* acc, const std::vector<size_t>& edge) {
  const int pp = static_cast<int>(edge.size()) - 1;
  int lo = 0, hi = pp;
  for (int mask = pp / 2; mask >= 1; mask /= 2) {
    const int peer = fold_rank(q ^ mask, rem), mid = lo + mask;
    const bool upper = (q & mask) != 0;
    const int klo = upper ? mid : lo, khi = upper ? hi : mid;
    const int slo = upper ? lo : mid, shi = upper ? mid : hi;
    send_recv_reduce(c, peer, src + edge[slo], edge[shi] - edge[slo], peer, src + edge[klo], acc + edge[klo],
                     edge[khi] - edge[klo]);
    src = acc;
    lo = klo;
    hi = khi;
  }
}

}  // namespace shoal::algo
