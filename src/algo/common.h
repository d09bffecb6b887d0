// Internal to src/algo: helpers shared by the algorithm files and the per-algorithm entry points
// that dispatch.cpp calls. Nothing here is visible outside the algorithms.
//
// Conventions every helper keeps:
// - Sizes are bytes unless a name says elements; reductions convert with ctx.esize.
// - A transfer larger than kChunkBytes travels as several messages of kChunkBytes (the last one
//   shorter); both sides cut the same way (chunk_count/chunk_len), because the framing matches
//   message by message. A zero-byte transfer is still one (empty) message, so a rank whose count
//   differs is caught by the framing even when its own count is 0.
// - Scratch buffers: index 0 belongs to the innermost helper (send_recv_reduce's slots, the ring
//   reduce-scatter's buffers, staging copies); algorithms that hold a buffer across helper calls
//   use index 1 (or 2).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "algo/algorithms.h"
#include "algo/context.h"
#include "reduce/copy.h"

namespace shoal::algo {

// Pipelining granularity of large point-to-point transfers: a ring step, a halving exchange or a
// tree edge moves its data in messages of this size so that the receiver reduces (or forwards)
// chunk k while chunk k+1 is on the wire. A multiple of every element size.
inline constexpr size_t kChunkBytes = size_t(512) << 10;
// Receives posted ahead of the one being reduced when they land in scratch slots.
inline constexpr int kRecvWindow = 4;
// alltoallv: pairwise steps in flight at once (each to a different peer, so still no flooding),
// while a step's blocks are smaller than kAlltoallBulkBlock; a step with a block that large runs
// alone (window 1): there the overlap hides no latency worth having, and several large exchanges
// at once cost more than they hide when ranks share cores (measured: alltoallv_pairwise.cpp).
inline constexpr int kAlltoallWindow = 4;
inline constexpr size_t kAlltoallBulkBlock = size_t(1) << 20;

inline uint8_t* u8(void* p) { return static_cast<uint8_t*>(p); }
inline const uint8_t* u8(const void* p) { return static_cast<const uint8_t*>(p); }

// Where an op's outputs stream (output_copy), once three or more ranks of the host write one at
// the same time: from `shared` bytes an output, or from `host` bytes in all, since those ranks
// share the host's last-level cache. Measured on an AMD EPYC with a 32 MiB L3 (2 cores;
// BENCHMARKS.md, "Outputs streamed by what the host's ranks write together"):
// - allreduce and alltoall, whose input is as large as the output (the allgather's is 1/p of
//   it): from 10 MiB in all. At 3-8 ranks they took 0.57-0.95x the time streamed with 10-56 MiB
//   in all (4 ranks with 10-14 MiB: 0.86-1.07x, level; one run of the 4-rank allreduce of 4 MiB
//   1.06, its rerun 0.74), at 12-16 ranks with 10-32 MiB 0.69-1.02x, and 0.83-1.18x with 8-9
//   MiB in all (8 ranks of 1 MiB, 4 of 2 MiB, 12 of 768 KiB).
// - allgather: from 3.5 MiB an output or 24 MiB in all. Streamed, it took 0.62-0.97x the time
//   from 3.5 MiB at 3-5 ranks but for three cells at 1.03-1.07x (level: the 3-rank ones of
//   3.5-3.9 MiB, one run of five of the 4-rank one of 4 MiB), 0.66-1.09x with 24 MiB in all and
//   0.77-0.93x with 28-32 MiB at 4-16 ranks, but 0.93-1.52x below both at 3-16 ranks (the
//   16-rank one of 1 MiB: 1.25-1.36x in four runs of five).
// - broadcast, whose ranks all read one root's chunks (its root counts as a writer: its buffer
//   is the output too): from 24 MiB in all. It took 1.12-1.54x streamed with 12-20 MiB in all
//   (4 ranks of 4-5 MiB: 1.12-1.21x) and 0.65-0.98x from 24 MiB (16 ranks of 1.5 MiB: 1.13x,
//   where the cells it did not change moved 0.86-1.28x).
struct StreamFrom {
  size_t shared, host;
};
inline constexpr StreamFrom kStreamReduceAlltoall{kStreamingOutputBytes, size_t(10) << 20};
inline constexpr StreamFrom kStreamAllgather{size_t(7) << 19, size_t(24) << 20};
inline constexpr StreamFrom kStreamBroadcast{kStreamingOutputBytes, size_t(24) << 20};

// How an op writes an output of `output_bytes` in all that its caller does not read back at once,
// where `writers` ranks of this host write such an output at the same time: copy_streaming where
// one output is kStreamingOutputBytes or more (reduce/copy.h), or, with three writers or more,
// where the op's StreamFrom says; copy_bytes below. Two writers keep the threshold of one: at 5-7
// MiB each, streamed allreduce and alltoall took 0.85-1.32x the time.
using CopyFn = void (*)(void* dst, const void* src, size_t n);
inline CopyFn output_copy(size_t output_bytes, size_t writers, StreamFrom from) {
  const bool shared = writers > 2 && (output_bytes >= from.shared || output_bytes * writers >= from.host);
  const bool streams = output_bytes >= kStreamingOutputBytes || shared;
  return streams ? copy_streaming : copy_bytes;
}
inline bool overlaps(const void* a, size_t an, const void* b, size_t bn) {
  if (!an || !bn) return false;
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + bn && y < x + an;
}
// The input as an op may read it while it writes `out`: `in` itself, or, where the two overlap
// (in place), a copy of it in scratch slot 0.
inline const uint8_t* apart_from_out(Ctx& c, const void* in, size_t in_bytes, const void* out, size_t out_bytes) {
  if (!overlaps(in, in_bytes, out, out_bytes)) return u8(in);
  uint8_t* t = c.scratch(in_bytes, 0);
  copy_bytes(t, in, in_bytes);
  return t;
}
inline int mod(int a, int p) { return ((a % p) + p) % p; }
inline int lowbit(int v) { return v & -v; }
inline int pow2_floor(int p) {
  int m = 1;
  while (m * 2 <= p) m *= 2;
  return m;
}
inline int pow2_ceil(int p) {
  int m = 1;
  while (m < p) m *= 2;
  return m;
}
inline bool is_pow2(int p) { return p > 0 && (p & (p - 1)) == 0; }

inline size_t chunk_count(size_t bytes) { return bytes == 0 ? 1 : (bytes + kChunkBytes - 1) / kChunkBytes; }
inline size_t chunk_len(size_t bytes, size_t k) { return std::min(kChunkBytes, bytes - k * kChunkBytes); }

// A vector cut into p blocks, in bytes: block b is [off[b], off[b] + len[b]); off[p] == total.
struct Blocks {
  std::vector<size_t> off;  // p + 1 entries
  std::vector<size_t> len;  // p entries
  size_t total() const { return off.back(); }
  // Bytes of blocks [a, e).
  size_t span(int a, int e) const { return off[e] - off[a]; }
  size_t max_len() const { return len.empty() ? 0 : *std::max_element(len.begin(), len.end()); }
};
// p blocks of near-equal element counts (the first count % p blocks one element larger).
Blocks even_blocks(size_t count, int p, size_t esize);
// p blocks of `count` elements each.
Blocks uniform_blocks(size_t count, int p, size_t esize);
// Block b holds counts[b] elements.
Blocks counted_blocks(const std::vector<size_t>& counts, size_t esize);

// Posts `bytes` from buf to peer as chunk_count(bytes) messages; appends the requests to `reqs`.
void post_send_chunks(Ctx& c, int peer, const void* buf, size_t bytes, std::vector<Request*>& reqs);
void post_recv_chunks(Ctx& c, int peer, void* buf, size_t bytes, std::vector<Request*>& reqs);
// Blocking chunked send / receive (the counterpart of the chunked posts above).
void send_chunks(Ctx& c, int peer, const void* buf, size_t bytes);
void recv_chunks(Ctx& c, int peer, void* buf, size_t bytes);

// Sends sbytes of sbuf to `to` (chunked; to < 0: no send) while receiving rbytes from `from`
// (chunked) and combining: acc = own OP received, chunk by chunk as the chunks arrive (the next
// chunks are already posted while one is reduced). When own != acc the chunks land in acc
// directly and are reduced with own; when own == acc (the accumulator already holds this rank's
// contribution) they land in scratch slots (index 0). acc must not overlap sbuf.
void send_recv_reduce(Ctx& c, int to, const void* sbuf, size_t sbytes, int from, const void* own, void* acc,
                      size_t rbytes);

// Ring allgather over `b` in buf: ring position v (0..p-1) already holds block v; after p-1 steps
// every block is in place. Step s sends block v-s to `right` and receives block v-s-1 from `left`,
// chunk by chunk, each received chunk forwarded at the next step as soon as it lands.
void ring_allgather(Ctx& c, uint8_t* buf, const Blocks& b, int v, int left, int right);

// Ring reduce-scatter of `in` (b.total() bytes) among ranks in rank order: afterwards this rank's
// block (c.rank) holds the reduction over all ranks.
// - acc != nullptr (allreduce): acc is a full-size buffer (acc == in allowed: in place); partial
//   blocks are reduced in acc, and the result lands at acc + b.off[rank]. `dst` is ignored.
// - acc == nullptr: partials live in two block-sized scratch buffers (index 0) and the result is
//   written to dst (b.len[rank] bytes; dst == in + b.off[rank] allowed: in place).
void ring_reduce_scatter(Ctx& c, const uint8_t* in, uint8_t* acc, uint8_t* dst, const Blocks& b);

// The binomial tree over p relative ranks (relative rank 0 is the root): v's parent (-1 at the
// root) and its children, largest subtree first.
void binomial_tree(int v, int p, int& parent, std::vector<int>& children);

// Broadcast down a tree, pipelined: receives buf (bytes) from parent (-1 at the root) chunk by
// chunk and forwards each chunk to every child as soon as it arrives.
void tree_bcast(Ctx& c, uint8_t* buf, size_t bytes, int parent, const std::vector<int>& children);

// Binomial-tree reduce of `in` (count elements) to `root`, pipelined per edge: at the root the
// result is in acc (acc == in allowed). Non-root ranks with children use acc as their accumulator
// (clobbered); leaves never touch it (may be null).
void binomial_reduce(Ctx& c, const void* in, void* acc, size_t count, int root);

// The fold and the recursive halving shared by BDE allreduce and recursive-halving reduce-scatter
// (p' = pow2_floor(p) participants, rem = p - p' extra ranks).
// fold_in: among ranks 0 .. 2·rem-1 each even rank sends its whole input (n bytes) to the next odd
// rank, which reduces it with its own into acc. Returns this rank's participant number (odd fold
// ranks r/2, the others r - rem), or -1 for an even fold rank, which sits out and is sent its
// result at the end.
int fold_in(Ctx& c, const void* in, void* acc, size_t n);
// The rank that participant q is.
inline int fold_rank(int q, int rem) { return q < rem ? 2 * q + 1 : q + rem; }
// Recursive halving among the participants over p' blocks with byte boundaries edge[0..p']: at
// distances p'/2, .., 1 each keeps the upper or lower half of its current range of blocks
// (its bit set: the upper) and receives the partner's partial of that half, reduced into acc as
// the chunks land (src: this rank's partial before the first step; acc afterwards). Afterwards
// participant q holds block q of the reduction in acc.
void recursive_halving(Ctx& c, int q, int rem, const uint8_t* src, uint8_t* acc, const std::vector<size_t>& edge);

// Per-algorithm entry points (one file per family; dispatch.cpp picks). size >= 2 in all of them.
void allreduce_ring(Ctx& c, const void* in, void* out, size_t count);
void allreduce_bde(Ctx& c, const void* in, void* out, size_t count);
void allreduce_mst(Ctx& c, const void* in, void* out, size_t count);
void broadcast_binomial(Ctx& c, void* buf, size_t count, int root);
void broadcast_chain(Ctx& c, void* buf, size_t count, int root);
void broadcast_scatter_allgather(Ctx& c, void* buf, size_t count, int root);
void reduce_binomial(Ctx& c, const void* in, void* out, size_t count, int root);
void reduce_ring(Ctx& c, const void* in, void* out, size_t count, int root);
void allgatherv_ring(Ctx& c, const void* in, void* out, const std::vector<size_t>& counts);
void allgatherv_rd(Ctx& c, const void* in, void* out, const std::vector<size_t>& counts);
void reduce_scatter_ring(Ctx& c, const void* in, void* out, size_t count);
void reduce_scatter_halving(Ctx& c, const void* in, void* out, size_t count);
void gather_binomial(Ctx& c, const void* in, void* out, size_t count, int root);
void scatter_binomial(Ctx& c, const void* in, void* out, size_t count, int root);
void gather_linear(Ctx& c, const void* in, void* out, size_t count, int root);
void scatter_linear(Ctx& c, const void* in, void* out, size_t count, int root);
void broadcast_linear(Ctx& c, void* buf, size_t count, int root);
void alltoallv_pairwise(Ctx& c, const void* in, const std::vector<size_t>& send_counts, void* out,
                        const std::vector<size_t>& recv_counts);
void barrier_dissemination(Ctx& c);

// Hierarchical versions for groups spanning hosts (ctx.hosts() non-null; hierarchical.cpp).
void allreduce_hier(Ctx& c, const void* in, void* out, size_t count);
void broadcast_hier(Ctx& c, void* buf, size_t count, int root);
void reduce_hier(Ctx& c, const void* in, void* out, size_t count, int root);
void allgatherv_hier(Ctx& c, const void* in, void* out, const std::vector<size_t>& counts);

// Direct shared-memory versions (ctx.shm() non-null; direct_*.cpp).
void allreduce_direct(Ctx& c, const void* in, void* out, size_t count);
void reduce_direct(Ctx& c, const void* in, void* out, size_t count, int root);
void broadcast_direct(Ctx& c, void* buf, size_t count, int root);
void scatter_direct(Ctx& c, const void* in, void* out, size_t count, int root);
void allgatherv_direct(Ctx& c, const void* in, void* out, const std::vector<size_t>& counts);
void gather_direct(Ctx& c, const void* in, void* out, size_t count, int root);
void allgather_direct(Ctx& c, const void* in, void* out, size_t count);  // equal blocks
void reduce_scatter_direct(Ctx& c, const void* in, void* out, size_t count);
void barrier_direct(Ctx& c);
void alltoall_direct(Ctx& c, const void* in, void* out, size_t count);  // equal blocks
void alltoallv_direct(Ctx& c, const void* in, const std::vector<size_t>& send_counts, void* out,
                      const std::vector<size_t>& recv_counts);

}  // namespace shoal::algo
