// Ring reduce-scatter (also the first half of ring allreduce and of ring reduce).
//
// Cost: (p-1)·α + (p-1)/p·n·β + (p-1)/p·n·γ  (n = bytes of the whole input, p blocks of n/p).
//
// Step s: send the partial of block (rank-s-1) to the right neighbour, receive the partial of
// block (rank-s-2) from the left one and fold this rank's own contribution into it; after p-1
// steps block `rank` holds every contribution. Like the ring allgather it is bandwidth-optimal
// (each rank sends and receives (p-1)/p·n once, reduces (p-1)/p·n), so it is the choice for large
// messages; its p-1 latency terms make recursive halving better below the measured switch
// reduce_scatter.halving_below (cost.h).
//
// Pipelining: each step moves kChunkBytes messages; a chunk is reduced as soon as it lands and
// sent on at the next step right away, while the following chunks are already posted. Two
// buffer disciplines:
// - allreduce (acc = the output, a full-size buffer): partials are reduced in place in acc. If
//   acc != in, chunks are received straight into acc (all receives posted at once) and reduced
//   with in; in place (acc == in) they land in kRecvWindow scratch slots and are reduced into acc.
//   Sends never come from the slots, so a slot is free as soon as it is reduced.
// - reduce-scatter proper (the output is one block): partials live in two block-sized scratch
//   buffers, alternating by step; a chunk's region is reused two steps later, once the item that
//   used it has been reduced (receives go up at most one step ahead) and its forwarding send has
//   completed. That wait cannot deadlock: the right neighbour posts that
//   receive once it has processed an item at least one whole step behind ours, and a rank
//   waiting for a receive waits on a left neighbour that is strictly behind it too, so every
//   chain of waits strictly decreases the progress count and cannot close into a cycle.
#include "algo/common.h"

namespace shoal::algo {

void ring_reduce_scatter(Ctx& c, const uint8_t* in, uint8_t* acc, uint8_t* dst, const Blocks& b) {
  const int p = c.size, v = c.rank, left = mod(v - 1, p), right = mod(v + 1, p);
  const size_t es = c.esize;
  struct Item {
    int step;
    int blk;
    size_t k;    // chunk index within the block
    size_t off;  // byte offset within the block
    size_t len;
  };
  std::vector<Item> items;
  for (int s = 0; s < p - 1; ++s) {
    int blk = mod(v - s - 2, p);
    size_t n = chunk_count(b.len[blk]);
    for (size_t k = 0; k < n; ++k) items.push_back({s, blk, k, k * kChunkBytes, chunk_len(b.len[blk], k)});
  }
  const size_t total = items.size();

  std::vector<Request*> sends;
  const int b0 = mod(v - 1, p);
  post_send_chunks(c, right, in + b.off[b0], b.len[b0], sends);

  std::vector<Request*> recvs(total, nullptr);
  if (acc) {
    const bool direct = acc != in;
    const size_t window = direct ? total : std::min<size_t>(total, kRecvWindow);
    const size_t slot_bytes = std::min(kChunkBytes, std::max<size_t>(b.max_len(), 1));
    uint8_t* slots = direct ? nullptr : c.scratch(window * slot_bytes, 0);
    auto target = [&](size_t i) -> uint8_t* {
      const Item& it = items[i];
      return direct ? acc + b.off[it.blk] + it.off : slots + (i % window) * slot_bytes;
    };
    size_t posted = 0;
    for (; posted < window; ++posted) recvs[posted] = c.irecv(left, target(posted), items[posted].len);
    for (size_t i = 0; i < total; ++i) {
      c.wait({recvs[i]});
      const Item& it = items[i];
      uint8_t* a = acc + b.off[it.blk] + it.off;
      if (it.len) c.reduce(a, direct ? in + b.off[it.blk] + it.off : target(i), it.len / es);
      if (it.step < p - 2) sends.push_back(c.isend(right, a, it.len));
      if (posted < total) {
        recvs[posted] = c.irecv(left, target(posted), items[posted].len);
        ++posted;
      }
    }
  } else {
    const size_t blk_bytes = std::max<size_t>(b.max_len(), 1);
    uint8_t* bufs = c.scratch(2 * blk_bytes, 0);
    const bool dst_direct = dst != in + b.off[v];  // in place: dst holds this rank's own block
    std::vector<Request*> pending[2];              // send forwarding chunk k out of buffer x
    const size_t max_chunks = chunk_count(blk_bytes);
    pending[0].assign(max_chunks + 1, nullptr);
    pending[1].assign(max_chunks + 1, nullptr);
    auto last = [&](const Item& it) { return it.step == p - 2; };
    auto target = [&](const Item& it) -> uint8_t* {
      if (last(it) && dst_direct) return dst + it.off;
      return bufs + (it.step % 2) * blk_bytes + it.off;
    };
    size_t posted = 0;
    auto post_next = [&] {
      const Item& it = items[posted];
      if (!(last(it) && dst_direct)) {
        Request*& prev = pending[it.step % 2][it.k];
        if (prev) {
          c.wait({prev});
          prev = nullptr;
        }
      }
      recvs[posted] = c.irecv(left, target(it), it.len);
      ++posted;
    };
    // A receive may go up only once the region's previous user (same chunk, two steps back) has
    // been reduced and forwarded: at most one step ahead of the item being processed.
    auto fill = [&](size_t next) {
      const int limit = (next < total ? items[next].step : p) + 1;
      while (posted < total && posted < next + kRecvWindow && items[posted].step <= limit) post_next();
    };
    fill(0);
    for (size_t i = 0; i < total; ++i) {
      c.wait({recvs[i]});
      const Item& it = items[i];
      const uint8_t* mine = in + b.off[it.blk] + it.off;
      if (last(it)) {
        // Block v: dst = received OP own (direct), or dst (= own) OP received (in place).
        if (it.len) {
          if (dst_direct)
            c.reduce(dst + it.off, mine, it.len / es);
          else
            c.reduce(dst + it.off, target(it), it.len / es);
        }
      } else {
        uint8_t* t = target(it);
        if (it.len) c.reduce(t, mine, it.len / es);
        Request* s = c.isend(right, t, it.len);
        sends.push_back(s);
        pending[it.step % 2][it.k] = s;
      }
      fill(i + 1);
    }
  }
  c.wait(sends);
}

void reduce_scatter_ring(Ctx& c, const void* in, void* out, size_t count) {
  Blocks b = uniform_blocks(count, c.size, c.esize);
  ring_reduce_scatter(c, u8(in), nullptr, u8(out), b);
}

}  // namespace shoal::algo
