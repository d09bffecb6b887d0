// The machine-dependent part of the automatic choice, as data measured on the machine: where an
// op has two ways of running on one host, each has a cost curve, and the choice is the cheaper
// curve at the op's size; between ranks that do not share memory, the sizes at which the choice
// changes algorithm (Switch, below). Both come from one file: the one SHOAL_TUNING names, over
// the built-in points of the CPU's maker (cost_points_intel.inc on Intel, over cost_points.inc,
// measured on an AMD EPYC, which also gives the switches).
//
// - The direct allreduce and reduce above the small protocol (direct_allreduce.cpp): way 0 is one
//   shot (every rank, or the root, reads every peer's whole input after one barrier), way 1 two
//   shot (each rank reduces one slice, then the slices are copied out, N+2 barriers for N chunks).
//   One shot saves barriers and two shot bytes.
// - alltoall and alltoallv over shared memory (direct_alltoall.cpp, direct_alltoallv.cpp): way 0
//   goes through the ranks' scratch slots (or by single copy), a barrier per phase; way 1 is the
//   pairwise exchange over the shm rings, no barrier. Barriers among many ranks sharing few cores
//   cost more than the rings' handshakes once blocks are large. alltoallv has curves of its own:
//   its round of count tables, which both ways pay, serves the slots as their first barrier.
// - The direct broadcast above the small protocol at 2 ranks, where the group may copy between
//   processes (direct_broadcast.cpp): way 0 goes through the root's scratch (the root copies in,
//   the other rank copies out, chunk by chunk), way 1 by single copy (the root writes the first
//   half into the other rank's buffer with process_vm_writev while that rank reads the second
//   half with process_vm_readv). Single copy saves a copy, the scratch path the kernel's page
//   walk: on our machines single copy wins up to 512 KiB and the scratch at most sizes above.
// - The direct allgather(v) above the small protocol at 2 ranks, likewise (direct_allgather.cpp):
//   way 0 through the ranks' scratch, way 1 each rank reading the other's input by single copy.
// - The direct scatter above the small protocol, likewise (direct_broadcast.cpp): way 0 through
//   the root's scratch, way 1 each rank reading its block of the root's buffer by single copy.
// - The direct gather above the small protocol, likewise (direct_allgather.cpp): way 0 through the
//   ranks' scratch, way 1 each rank writing its block into the root's output by single copy.
//
// Where they cross depends on what a barrier costs (tens of µs once ranks outnumber cores), on how
// fast a core reads what another just wrote, and on where the data leaves the caches, so it is
// measured, not derived: `scripts/tune_algos.py --direct` times both ways at several group sizes
// and message sizes and writes the medians to the file SHOAL_TUNING names. The built-in points
// come from the same script on our 2-core machines, one file per CPU maker, as the crossings
// differ by CPU: on the Intel Xeon single copy wins from 16-32 KiB at 2 ranks, where on the AMD
// EPYC the scratch wins at most sizes up to 8 MiB (docs/algorithms.md, "Measured cost curves").
//
// A machine may switch between states for minutes at a time (on our VMs, a cache-line round trip
// between the cores of ~120 or ~500 ns: BENCHMARKS.md, "Near and far cores"), and the faster way
// may differ between them. A point then holds two pairs of times, each from one round of the tune
// that ran both ways back to back: the round least favourable to way 0 and the one least
// favourable to way 1. The choice is the way whose time over the faster way's is smallest in the
// worse of the two: the way that holds in every stretch the tune saw.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <cstdint>

#include "algo/slot_places.h"
#include "transport/stores.h"

namespace shoal::algo {

// The ops whose way on one host the measured costs choose; a tuning file names them so.
enum class Choice : uint8_t { allreduce, reduce, alltoall, alltoallv, broadcast, allgather, scatter, gather };
const char* choice_name(Choice c);

// Where the automatic choice between ranks that do not share memory changes algorithm
// (select.cpp), and where a hierarchical op changes form (hierarchical.cpp): bytes of the op's
// message as choose_algo counts them. Each is a point measured on the machine: a tuning file's
// `switch NAME BYTES` lines, else the built-in ones (docs/algorithms.md, "Where the choice
// changes", has each one's meaning and the command that measures it). A line `switch NAME@P BYTES`
// holds for groups of exactly P ranks (what a tune at P ranks measured), the line without @ for
// the others.
enum class Switch : uint8_t {
  allreduce_mst_below,           // allreduce: mst below
  allreduce_bde_up_to,           //   bde up to here (p a power of two), ring above
  allreduce_bde_up_to_odd_p,     //   bde up to here otherwise
  broadcast_mst_below,           // broadcast: mst below, scatter_allgather above
  broadcast_one_host_mst_below,  //   one host over TCP: mst below,
  broadcast_chain_from,          //   linear below, the chain (ring) from here
  reduce_mst_below,              // reduce: mst below, ring from here
  allgather_rd_below,            // allgather: rd below, ring from here
  reduce_scatter_halving_below,  // reduce_scatter: halving (rd) below, ring from here (p a power of two)
  reduce_scatter_halving_below_odd_p,  //   the same otherwise
  gather_mst_below,              // gather: mst below, linear from here
  scatter_mst_below,             // scatter: the same
  hier_allreduce_split_from,     // hier allreduce: the leader form below, the split form from here
  hier_broadcast_chain_from,     // hier broadcast: the two-level tree below, the chain from here
  hier_allgather_ring_from,      // hier allgather: the leader form below, the ring from here
  count
};
inline constexpr size_t kSwitches = static_cast<size_t>(Switch::count);
const char* switch_name(Switch s);  // as a tuning file names it: "allreduce.mst_below"
inline constexpr size_t kNever = SIZE_MAX;  // a switch at this many bytes: the first way everywhere

// One measured point: both ways of `op` at `ranks` ranks and `bytes` (allreduce, reduce: per
// rank; alltoall(v): all blocks of a rank; broadcast: the buffer; allgather: the output; scatter: the root's input;
// gather: the root's output).
struct CostPoint {
  Choice op = Choice::allreduce;
  int ranks = 0;
  size_t bytes = 0;
  double us[2] = {0, 0};   // way 0, way 1 (above)
  double us2[2] = {0, 0};  // the second pair (above); us where there is one only
};
// Every field of a point, to order points by: the tuning in effect holds its points in this order,
// whatever order its files and their merge gave, so that ranks holding the same points digest them
// alike (Ways::digest).
inline auto point_key(const CostPoint& q) {
  return std::make_tuple(q.op, q.ranks, q.bytes, q.us[0], q.us[1], q.us2[0], q.us2[1]);
}

// What a tuning file holds: the measured points of the direct ops' two ways, and the switches.
struct Tuning {
  struct AtRanks {  // a `switch NAME@P BYTES` line
    Switch s;
    int ranks;
    size_t bytes;
  };
  std::vector<CostPoint> points;
  size_t switches[kSwitches] = {};  // by Switch, for any group size,
  bool has_all[kSwitches] = {};     // where the file has that line (without @)
  bool has[kSwitches] = {};         // where it has any line for the switch
  std::vector<AtRanks> at_ranks;    // for one group size
  // Switch s for a group of p ranks: its line for p, else its line for any size.
  size_t at(Switch s, int p) const {
    for (const AtRanks& a : at_ranks)
      if (a.s == s && a.ranks == p) return a.bytes;
    return switches[static_cast<size_t>(s)];
  }
};

// The CPU whose built-in points the choices read: SHOAL_TUNING_BUILTIN's, else this CPU's maker's
// (AMD's for a CPU of another maker). The switches are the same for both.
enum class BuiltInCpu { amd, intel };
BuiltInCpu built_in_cpu();

// The tuning in effect: SHOAL_TUNING's (with the built-in points for an op it has none of, and
// the built-in switches it does not name) over the built-in one of built_in_cpu(); the file is
// read when first needed and again only if SHOAL_TUNING or SHOAL_TUNING_BUILTIN changes. Throws
// InvalidArgument naming the file if it cannot be used.
std::shared_ptr<const Tuning> tuning(BuiltInCpu cpu = built_in_cpu());

// The cost of `way` of `op` at p ranks and n bytes, from `points`. Along n:
// the straight line through the two measured sizes around n (below the smallest: its time; above
// the largest: the last segment extended). Along p: interpolated between the nearest measured
// group sizes, else scaled from the nearest by the way's structure (one shot moves (p+2)·p bytes
// in all, the others ∝ p). Throws Error if `points` has none for `op`.
// `second`: from the second pair of times (us2).
double way_us(const std::vector<CostPoint>& points, Choice op, int p, size_t n, int way, bool second = false);

// The settings that force a way (SHOAL_DIRECT_*).
inline constexpr size_t kForcedWays = 6;

// What the choices read, taken once when a group forms: the points in effect and the ways
// SHOAL_DIRECT_REDUCE, SHOAL_DIRECT_ALLTOALL, SHOAL_DIRECT_BROADCAST, SHOAL_DIRECT_ALLGATHER,
// SHOAL_DIRECT_SCATTER and SHOAL_DIRECT_GATHER force. Each communicator keeps its own (Ctx::ways),
// so a setting changed later in one process cannot make its ranks run one op different ways.
class Ways {
 public:
  // From the settings now. Throws InvalidArgument for a SHOAL_TUNING file that cannot be used.
  static Ways current();

  // The way `op` runs at n bytes and p ranks: the forced one, else the cheaper curve's (with two
  // pairs of times, the one that loses least in the worse).
  int cheaper(Choice op, size_t n, int p) const;
  // Whether the direct allreduce or reduce (`op`) of n bytes per rank at p ranks runs in one
  // shot. The caller checks that one shot fits.
  bool reduce_one_shot(Choice op, size_t n, int p) const { return cheaper(op, n, p) == 0; }
  // Whether an alltoall or alltoallv (`op`) of n bytes (what a rank sends; alltoallv: the most any
  // rank sends, or what this rank sends, where it guesses before the tables) at p ranks on one
  // host takes the pairwise exchange over the rings rather than the scratch slots.
  bool alltoall_pairwise(Choice op, size_t n, int p) const { return cheaper(op, n, p) == 1; }
  // Whether a broadcast, allgather(v), scatter or gather (`op`) of n bytes (as CostPoint counts
  // them) at p ranks on one host takes single copy rather than the scratch. The caller checks that
  // the group may copy between processes (broadcast and allgather take single copy at 2 ranks only).
  bool single_copy(Choice op, size_t n, int p) const { return cheaper(op, n, p) == 1; }
  // Whether the 2-rank allreduce of n bytes runs by single copy (direct_allreduce.cpp): as
  // SHOAL_DIRECT_REDUCE=single_copy forces (the other ops and shapes then choose by the costs), else
  // from kSingleCopyAllreduceBytes where the built-in costs are the Intel Xeon's, whatever
  // SHOAL_TUNING holds (the AMD EPYC's kernel copy is slower, and this way is unmeasured there).
  // The caller checks the group: 2 ranks, each with a core of its own, that may copy.
  bool allreduce_single_copy(size_t n) const;

  // How this rank's copies into its scratch slots for others store, as SHOAL_DIRECT_STORES says
  // (transport/stores.h). It learns from the copies as they run, so it changes while the group's
  // choices above stay fixed; no rank needs to choose as another does: its readers see the same
  // bytes either way. Copies of these Ways share it (not a moved-from Ways: it has none), and the
  // rings hold it: a ring whose copies turn non-temporal stores on turns them on here too.
  StoresChoice& stores() const { return *stores_; }
  const std::shared_ptr<StoresChoice>& shared_stores() const { return stores_; }
  // The pages of this rank's scratch that a timed copy has written (transport/stores.h); each copy
  // of these Ways has its own (at worst a copy's first timed copies are not timed).
  FreshPages& scratch_pages() const { return scratch_pages_; }
  // Which place of its slots this rank's next chunked direct op takes, as SHOAL_DIRECT_PLACES says
  // (slot_places.h). No rank needs to choose as another does: each publishes its place with the
  // op (direct_common.h). Each copy of these Ways has its own.
  SlotPlaces& places() const { return places_; }

  // Where the automatic choice over the network changes (Switch) in a group of p ranks.
  size_t switch_at(Switch s, int p) const { return tuning_->at(s, p); }

  // A digest of the points and forced ways. Ranks of one host with different digests could run
  // one op different ways, so the group's creation compares them (rendezvous).
  uint64_t digest() const;
  // A digest of the switches, which every rank of a group must agree on (the choices they drive
  // run among ranks of any hosts).
  uint64_t switches_digest() const;
  const std::vector<CostPoint>& points() const { return tuning_->points; }
  // The CPU whose built-in points these are (built_in_cpu() when the group formed).
  BuiltInCpu cpu() const { return cpu_; }
  // One core's L2 in bytes, which the direct ops cut their chunks by (direct_common.h,
  // chunk_in_l2): this rank's l2_bytes() (base/cpus.h), then, once the group forms, the smallest
  // that a rank of this host read (0: unknown, no cut). Ranks that cut differently would read
  // each other's scratch at the wrong places.
  size_t l2() const { return l2_; }
  void agree_l2(size_t host_smallest) { l2_ = host_smallest; }

 private:
  std::shared_ptr<const Tuning> tuning_;
  BuiltInCpu cpu_ = BuiltInCpu::amd;
  size_t l2_ = 0;
  int forced_[kForcedWays] = {-1, -1, -1, -1, -1, -1};  // by the setting (cost.cpp, kForcings): the way, or -1
                                                         // (SHOAL_DIRECT_REDUCE's single_copy: 2)
  std::shared_ptr<StoresChoice> stores_ = std::make_shared<StoresChoice>();  // SHOAL_DIRECT_STORES
  mutable FreshPages scratch_pages_;
  mutable SlotPlaces places_;
};

// The settings a host's ranks must agree on, as an error names them: "SHOAL_TUNING, SHOAL_DIRECT_REDUCE, ...".
std::string agreed_settings();

// Parses a tuning file: '#' comments, one line per measured point,
//   direct <allreduce|reduce|alltoall|alltoallv|broadcast|allgather|scatter|gather> <ranks> <bytes> <way 0 µs> <way 1 µs> [<way 0 µs> <way 1 µs>]
// the second pair from another round (above), and one per switch it sets,
//   switch <name>[@<ranks>] <bytes|never>
// Throws InvalidArgument naming `where` and the line.
Tuning parse_tuning(const std::string& text, const std::string& where);

}  // namespace shoal::algo
