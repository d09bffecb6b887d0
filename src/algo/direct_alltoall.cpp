// Direct shared-memory alltoall with equal blocks (single host; blocks of any size:
// direct_alltoallv.cpp).
//
// Cost: (N + 1)·α + 2·n·β per rank (α = one barrier, n = bytes each rank sends, N = ⌈block /
// piece⌉): each rank copies its whole send buffer into its scratch once, and copies its own block
// out of every peer's scratch. Up to kSmallBytes per rank it runs as a small op (no barrier: every
// rank publishes its p blocks in its slot and reads its block from each peer's slot). Above, the
// pairwise exchange over the shm rings also copies twice, but pays a frame, a doorbell and a
// flow-control round trip per step and peer; here a phase costs one barrier for all peers. Which
// is cheaper depends on the machine and the ranks per core: measured (cost.h).
//
// Pipeline: phase m copies piece m of each of its p blocks into slot m % 2 (piece j of the slot
// holds block j's), and piece m-1 of its own block out of every peer's slot; barriers between
// phases, end() as the other chunked direct ops (direct_common.h).
//
// Single copy (direct_common.h), where the kernel permits it and blocks are kSingleCopyMinBlock or
// more (where the group's built-in points are AMD's: up to kSingleCopyMaxBlockAmd, every rank on a
// core of its own; where they are Intel's: from kSingleCopyMinBlockOwnCores where every rank has a
// core, from kSingleCopyMinBlockSharedCores where ranks share cores): 2·α + (p-1)·b·β' per rank
// (b = block bytes, β' = a process_vm_writev per byte). Each rank writes its block for j straight
// into j's output, all p-1 writes of all ranks at once, with two barriers in all. On the AMD EPYC a kernel copy costs more CPU per byte than a copy in user space
// (BENCHMARKS.md, "alltoall by single copy"), so it pays only where the copies run in parallel on
// cores of their own and where the pipeline's barriers weigh: there, with ranks sharing cores or
// from 2 MiB blocks, the pipeline was as fast or faster. On the Intel Xeon the kernel's copy beats
// the pipeline's two at every block size from 64 KiB, with ranks sharing cores too (BENCHMARKS.md,
// "The built-in costs of an Intel Xeon"), and from 32 KiB where ranks share cores (ahead at 6 ranks
// or more, level at 3 and 4). Writing beats reading: the writer's block is in its own cache (a
// producer just wrote it); a reader would fetch it from the writer's.
#include <algorithm>

#include "algo/cost.h"
#include "algo/direct_common.h"

namespace shoal::algo {

using namespace direct;

namespace {
constexpr size_t kSingleCopyMinBlock = size_t(64) << 10;
constexpr size_t kSingleCopyMaxBlockAmd = size_t(1) << 20;
// Where the group's built-in points are Intel's and every rank has a core, from blocks this small:
// at 2 ranks 16 KiB blocks took 2.8 µs against 4.0 by the pipeline, 32 KiB ones 4.2 against 5.6
// (BENCHMARKS.md, "The built-in costs of an Intel Xeon"); the bound below, down to the small
// protocol's, is extrapolated.
constexpr size_t kSingleCopyMinBlockOwnCores = size_t(4) << 10;
// And where ranks share cores: at 32 KiB blocks single copy took 130 µs against the pipeline's
// 158 at 8 ranks, 55 against 100 at 6, and tied at 3 and 4; at 16 KiB it tied at 8 ranks, and at
// 8 KiB lost, 55 against 36 (BENCHMARKS.md, "alltoall by single copy from 32 KiB blocks").
constexpr size_t kSingleCopyMinBlockSharedCores = size_t(32) << 10;

// The same answer on every rank: the block size, whether ranks share cores
// (ShmGroup::shares_cores), and the CPU of the group's built-in points (Ways::cpu, which the ranks
// of a host agree on: rendezvous).
bool use_single_copy_alltoall(Ctx& c, size_t block) {
  ShmGroup& g = *c.shm();
  if (!g.single_copy()) return false;
  const bool own_cores = !g.shares_cores();
  if (c.ways().cpu() == BuiltInCpu::intel)
    return block >= (own_cores ? kSingleCopyMinBlockOwnCores : kSingleCopyMinBlockSharedCores);
  return block >= kSingleCopyMinBlock && block <= kSingleCopyMaxBlockAmd && own_cores;
}
}  // namespace

void alltoall_direct(Ctx& c, const void* in, void* out, size_t count) {
  const int p = c.size, r = c.rank;
  const size_t bs = count * c.esize, all = bs * static_cast<size_t>(p);
  Sig sig(OpKind::alltoallv, c);
  sig.add(1);  // 1: the equal-blocks form
  if (small_fits(all)) return alltoall_small(c, in, out, count, sig.value());
  ShmGroup& g = *c.shm();
  // With many ranks a slot holds only small pieces of each block, and each phase costs a barrier
  // among them all: the pairwise exchange (p-1 steps, no barrier) is the better one there.
  // So it is too where the measured costs say the rings beat the slots (cost.h).
  if (chunk_target(g, p) / static_cast<size_t>(p) < kMinPieceBytes || c.ways().alltoall_pairwise(Choice::alltoall, all, p)) {
    const std::vector<size_t> counts(p, count);
    return alltoallv_pairwise(c, in, counts, out, counts);
  }
  // out's blocks are written while in's are still copied in.
  const uint8_t* src = apart_from_out(c, in, all, out, all);
  if (use_single_copy_alltoall(c, bs)) {
    begin_single(c, sig.value(), out);
    copy_bytes(u8(out) + r * bs, src + r * bs, bs);
    for (int k = 1; k < p; ++k) {  // rank r writes to r+1 first: no two ranks write to one rank at once
      const int j = (r + k) % p;
      g.write(j, src + j * bs, const_cast<uint8_t*>(peer_buffer(c, j)) + r * bs, bs);
    }
    return end_single(c);
  }
  begin(c, sig.value());
  const Blocks b = uniform_blocks(count, p, c.esize);
  alltoall_pipeline(c, src, b, out, b, bs);
}

void direct::alltoall_pipeline(Ctx& c, const uint8_t* src, const Blocks& sb, void* out, const Blocks& rb, size_t largest) {
  ShmGroup& g = *c.shm();
  const int p = c.size, r = c.rank;
  const size_t piece_bytes = alltoall_piece(g, p, largest);
  const size_t nchunks = std::max<size_t>(1, (largest + piece_bytes - 1) / piece_bytes);
  auto piece = [&](size_t len, size_t m) { return std::min(piece_bytes, len - std::min(len, m * piece_bytes)); };
  const CopyFn copy_out = output_copy(std::max(sb.total(), rb.total()), static_cast<size_t>(p), kStreamReduceAlltoall);
  copy_out(u8(out) + rb.off[r], src + sb.off[r], sb.len[r]);
  Places places(c, static_cast<size_t>(p) * piece_bytes);
  for (size_t ph = 0; ph <= nchunks; ++ph) {
    if (ph < nchunks) {
      uint8_t* mine = slot(g, r, slot_of(c, ph)) + places[r];
      for (int j = 0; j < p; ++j)
        if (j != r) copy_in(c, mine + j * piece_bytes, src + sb.off[j] + ph * piece_bytes, piece(sb.len[j], ph));
    }
    if (ph >= 1) {
      const size_t m = ph - 1;
      for (int j = 0; j < p; ++j)
        if (j != r)
          copy_out(u8(out) + rb.off[j] + m * piece_bytes, slot(g, j, slot_of(c, m)) + places[j] + r * piece_bytes, piece(rb.len[j], m));
    }
    if (ph == nchunks) break;
    g.barrier();
    if (ph == 0) check(c, places);
  }
  end(c, nchunks);
}

// A piece of each block per phase (the slot holds p of them), at least 4 phases for large blocks
// so that the ranks' copies in and out overlap.
size_t direct::alltoall_piece(ShmGroup& g, int p, size_t largest) {
  return alltoall_piece(chunk_target(g, p), p, largest);
}

size_t direct::alltoall_piece(size_t chunk_target, int p, size_t largest) {
  return std::max<size_t>(64, pipelined(chunk_target / static_cast<size_t>(p), largest) / 64 * 64);
}

}  // namespace shoal::algo
