// How a rank writes the data it copies into shared memory for another rank to read: into its
// scratch slots (every direct op above the small protocol, where it goes through the scratch), into
// the small protocol's data areas (algo/direct_small.cpp: more than 512 B, up to 8 KiB) and into
// its rings to its peers (shm_link.h: every send, and so the pairwise all-to-all and the ring
// algorithms). Ordinary stores, or non-temporal ones that go to memory.
//
// An ordinary store to a line that a reader's core still holds from the last op first takes the
// line from that core. Where the two cores share a cache that costs ~110-150 ns per KiB; where
// they sit on different core complexes (an AMD EPYC; on our VMs the host moves the two vCPUs
// between such placements for minutes at a time) ~450-800 ns, and the op runs 2-6x slower than
// with non-temporal stores, which take no line from anyone. Where cores share a cache,
// non-temporal stores make the readers fetch from memory instead, slower from 1 MiB
// (BENCHMARKS.md, "Non-temporal copy-in", and "Choosing the stores as the op runs"); a ring's
// reader, which reads each slice just after it is written, from 32 KiB messages (1.5-1.9x the
// time: "The rings' stores").
// The direct allreduce streams its reduced slices where its copies in stream (direct_allreduce.cpp).
//
// So in `automatic` a rank times its ordinary copies in to their last store (the stores a copy
// leaves waiting for their lines cost the most), judged kSampleBytes and kSampleCopies of them at a
// time (with more ranks than cores a writer's readers sit on either core, and its single copies
// cost either; with more than two ranks a core a measured round trip decides instead: set_machine
// below): once kWindow samples in a row hold more than half of their bytes in copies slower than
// their lengths at far_ns_per_kib it takes non-temporal stores. A copy into pages of an area
// written for the first time is not timed: it pays for mapping them (~1.5 µs a page on our VMs).
// Nor do the copies just after a pause count (kIdleNs): they pay for pages the host took back.
// What a non-temporal copy costs says nothing of the cores, nor does an ordinary one into lines the
// readers no longer hold (cheap in either state, the readers then fetching the data from the far
// cache), so once kRetryNs have passed (a look at the clock every kRetryCopies non-temporal copies)
// it tries ordinary stores again.
// A rank chooses for its scratch (a group's communicator holds that choice: algo::Ways::stores)
// and for each of its rings, whose one reader may share the writer's core where others do not.
// A ring that turns non-temporal stores on turns them on for the scratch too: the scratch's
// copies of several MiB, into lines no reader holds any more, look cheap in either state, while a
// ring's lines are held by its reader from one message to the next (BENCHMARKS.md, "The rings'
// stores"). No rank needs to choose as another does: its readers see the same bytes either way.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "reduce/copy.h"

namespace shoal {

// The choice, apart from copying, so that tests can drive it with chosen times (timed) or a clock
// of their own (copy_for_readers and streamed read it).
class StoresChoice {
 public:
  enum class Mode : uint8_t { automatic, cached, streaming };
  static constexpr size_t kTimedBytes = size_t(16) << 10;  // ordinary copies this long are all timed
  static constexpr uint32_t kFarNsPerKiB = 300;
  // Shorter ones from kShortTimedBytes (the small ops' data areas, a chunked op's short pieces, a
  // ring's messages from kStreamingMinBytes: shm_link.cpp) are timed once every kShortTimedSpan of
  // them (one in 128 of 1 KiB, one in 16 of 8 KiB): the fences of a timed copy (copy_for_readers)
  // wait for the stores before it and its own, which a broadcast's root, running ahead, leaves to
  // land while it goes on; timed one in 16, its 1 KiB ops took 0.143 µs in the near state, against
  // 0.137 timed so (BENCHMARKS.md, "Short copies timed to their last store").
  static constexpr size_t kShortTimedBytes = size_t(1) << 10;
  static constexpr size_t kShortTimedSpan = size_t(128) << 10;
  // They are slow above kShortFarNsPerKiB: timed to their last store (the fence), copies of 1-8
  // KiB take 78-109 ns per KiB near and 296-421 far on an AMD EPYC, in the mean (BENCHMARKS.md,
  // "Short copies timed to their last store"), with medians of 290 and more far; on an Intel
  // Xeon whose cores share a cache, those of 1.5-2 KiB spread from ~110 to ~330, with medians of
  // 176-256 ("Short copies on an Intel Xeon").
  static constexpr uint32_t kShortFarNsPerKiB = 280;
  // An ordinary copy of `bytes` is slow above this.
  static constexpr uint32_t far_ns_per_kib(size_t bytes) { return bytes < kTimedBytes ? kShortFarNsPerKiB : kFarNsPerKiB; }
  static constexpr uint32_t kFarRoundTripNs = 300;  // core_probe.h's, where it decides (set_machine)
  // Timed copies are judged by this much at a time, and by kSampleCopies copies or more, by the
  // share of their bytes in slow copies, not by their mean: a sample is slow where more than half
  // of its bytes are. So a copy that lost its core meanwhile (one in a few hundred of 64-256 KiB
  // on an Intel Xeon whose cores share a cache: BENCHMARKS.md, "Long copies that lose their
  // core") never makes a sample slow by itself, whatever its length, nor do two such among four
  // alike, and the long tail of the near state on an Intel Xeon (above) does not weigh in beyond
  // its share.
  static constexpr size_t kSampleBytes = size_t(256) << 10;
  static constexpr uint32_t kSampleCopies = 4;
  static constexpr int kWindow = 2;
  static constexpr uint32_t kRetryCopies = 64;
  static constexpr uint64_t kRetryNs = 1000000000;
  // Copies from kTimedBytes (every one timed) that start within kSettleNs after kIdleNs or more
  // without one count for nothing. On our VMs the first write to a page not written for a while
  // traps to the host: in pieces of 16 KiB, a few in a thousand took 100-200 µs after a pause of 10
  // ms, one in twenty after 100 ms, one in five after a second (BENCHMARKS.md, "Writes after a
  // pause"). So the copies after a pause (the program computed, or another library ran) come out
  // slow in either state until the places they reuse have been written again, which ops that
  // follow each other at once do within a few milliseconds ("The stores after a pause"). Shorter
  // copies are timed one in a span, and the untimed ones between keep their pages written.
  static constexpr uint64_t kIdleNs = 20000000;
  static constexpr uint64_t kSettleNs = 10000000;

  // What timed copies read as the time, ns (the steady clock where none is given: tests give one).
  using Clock = uint64_t (*)();

  explicit StoresChoice(Mode m = Mode::cached, Clock clock = nullptr) : mode_(m), clock_(clock) {}
  // Not copied: a copy would lose what the choice has learned. Whoever needs it holds it
  // (algo::Ways by shared_ptr, which the rings share).
  StoresChoice(const StoresChoice&) = delete;
  StoresChoice& operator=(const StoresChoice&) = delete;
  // A choice of its own with the settings of `other` (mode, round trip, clock), learning afresh:
  // a ring's, from the rank's choice for its scratch.
  static StoresChoice same_settings(const StoresChoice& other) {
    return StoresChoice(other.mode_, other.clock_, other.by_round_trip_);
  }

  Mode mode() const { return mode_; }
  Clock clock() const { return clock_; }

  // `ranks` of this machine run on `cores`. With more than two ranks a core, a writer's readers sit
  // on every core, and what its copies cost tells the state too little (judged by them, 8 ranks on
  // 2 cores ran 1.07-1.26x slower than ordinary stores in the near state; BENCHMARKS.md, "Choosing
  // the stores as the op runs"): `automatic` then follows the cache-line round trip that
  // core_probe.h measures instead, and times no copies.
  void set_machine(int ranks, int cores) { by_round_trip_ = mode_ == Mode::automatic && ranks > 2 * cores; }
  bool by_round_trip() const { return by_round_trip_; }
  // Whether copies in take non-temporal stores now.
  bool streaming() const { return streaming_.load(std::memory_order_relaxed); }
  // Whether ordinary copies in are timed (then pass each that next_copy says `timed` of, but one
  // into pages written for the first time (FreshPages), to timed()).
  bool learning() const { return mode_ == Mode::automatic && !by_round_trip_ && !streaming(); }
  // How the next copy in of `bytes` goes: by ordinary stores, untimed (plain: most of a small op's
  // data, which need not leave the caller's code); by ordinary stores, timed where its pages were
  // written before (while learning); or as streams() says (chosen: while the choice streams or
  // follows the round trip). Asked once per copy: it counts the short copies it does not time.
  enum class Copy : uint8_t { plain, timed, chosen };
  Copy next_copy(size_t bytes) {
    if (by_round_trip_ || streaming()) return Copy::chosen;
    return mode_ == Mode::automatic && times_copy(bytes) ? Copy::timed : Copy::plain;
  }

  // What an ordinary copy of `bytes` (at least kShortTimedBytes) into shared memory took, `ns`,
  // ending at time `now` (ns, the choice's clock). A copy is slow where it took longer than its
  // length at its threshold (far_ns_per_kib); a sample, where more than half of its bytes are in
  // slow copies. A copy from kTimedBytes that starts kIdleNs or more after the last such one ended
  // forgets the sample under way and the slow samples before it, and it and those that start
  // within kSettleNs of it count for nothing. True where that turned non-temporal stores on; then
  // `also` (a ring's copy: the rank's choice for its scratch) takes them too (stream_from).
  bool timed(size_t bytes, uint64_t ns, uint64_t now, StoresChoice* also = nullptr) {
    if (!learning()) return false;
    if (bytes >= kTimedBytes) {
      const uint64_t start = now - std::min(ns, now);
      if (last_ns_ != 0 && start >= last_ns_ + kIdleNs) {
        settle_until_ = start + kSettleNs;
        forget_samples();
      }
      last_ns_ = now;
      if (start < settle_until_) return false;
    }
    bytes_ += bytes;
    ++copies_;
    if (ns * 1024 > uint64_t(bytes) * far_ns_per_kib(bytes)) slow_bytes_ += bytes;
    if (bytes_ < kSampleBytes || copies_ < kSampleCopies) return false;
    last_slow_percent_ = static_cast<uint32_t>(slow_bytes_ * 100 / bytes_);
    const bool slow = 2 * slow_bytes_ > bytes_;
    start_sample();
    if (!slow) {
      count_.store(0, std::memory_order_relaxed);
      return false;
    }
    const uint32_t k = count_.load(std::memory_order_relaxed) + 1;
    count_.store(k < kWindow ? k : 0, std::memory_order_relaxed);
    if (k < kWindow) return false;
    stream_from(now);
    if (also) also->stream_from(now);
    return true;
  }
  // The share of the last sample's bytes in slow copies, percent.
  uint32_t last_slow_percent() const { return last_slow_percent_; }

  // Takes non-temporal stores from time `now` (automatic only), as if its own copies had turned
  // them on: what another choice of the rank learned (below).
  void stream_from(uint64_t now) {
    if (mode_ != Mode::automatic || streaming()) return;
    forget_samples();
    since_.store(now, std::memory_order_relaxed);
    streaming_.store(true, std::memory_order_relaxed);
  }

  // A non-temporal copy in (of any length that takes non-temporal stores). Every kRetryCopies-th
  // one reads the clock `now` (a small op costs ~1 µs where it streams, a clock read ~20 ns): once
  // kRetryNs have passed, it turns them off, and true: the next copies are ordinary again, and timed.
  bool streamed(Clock now) {
    if (mode_ != Mode::automatic || !streaming()) return false;
    const uint32_t k = count_.load(std::memory_order_relaxed) + 1;
    count_.store(k < kRetryCopies ? k : 0, std::memory_order_relaxed);
    if (k < kRetryCopies || now() - since_.load(std::memory_order_relaxed) < kRetryNs) return false;
    streaming_.store(false, std::memory_order_relaxed);
    last_ns_ = 0;  // no pause to settle from: the non-temporal copies, until now, kept the pages written
    return true;
  }

 private:
  // Forgets the timed copies of the sample under way.
  void start_sample() {
    bytes_ = slow_bytes_ = 0;
    copies_ = 0;
  }
  // Starts a sample and forgets the slow samples before it.
  void forget_samples() {
    start_sample();
    count_.store(0, std::memory_order_relaxed);
  }
  // Whether to time an ordinary copy of `bytes` while learning: every one from kTimedBytes, and
  // from kShortTimedBytes the one that brings the short copies since the last timed one to
  // kShortTimedSpan.
  bool times_copy(size_t bytes) {
    if (bytes >= kTimedBytes) return true;
    if (bytes < kShortTimedBytes) return false;
    if (short_bytes_ + bytes < kShortTimedSpan) {
      short_bytes_ += bytes;
      return false;
    }
    short_bytes_ = 0;
    return true;
  }

  StoresChoice(Mode m, Clock clock, bool by_round_trip) : mode_(m), clock_(clock), by_round_trip_(by_round_trip) {}

  Mode mode_;
  Clock clock_;
  bool by_round_trip_ = false;  // set before the first copy (set_machine)
  // Relaxed atomics: one communicator's ops run one at a time, but not always on one thread (the
  // plain fields rely on the one at a time: the scratch's choice is also written by the rings'
  // copies, which run only on the thread that holds the engine, as the ops do).
  std::atomic<bool> streaming_{mode_ == Mode::streaming};
  std::atomic<uint32_t> count_{0};  // ordinary: slow samples in a row; non-temporal: copies since the clock was read
  std::atomic<uint64_t> since_{0};  // when non-temporal stores were turned on
  uint64_t bytes_ = 0;              // timed copies since the last sample
  uint64_t slow_bytes_ = 0;         // of which in copies slower than their thresholds
  uint32_t copies_ = 0;             // timed copies since the last sample
  size_t short_bytes_ = 0;          // bytes of the short copies since the last one timed
  uint64_t last_ns_ = 0;            // when the last timed copy from kTimedBytes ended (0: none since it learns)
  uint64_t settle_until_ = 0;       // timed copies before this count for nothing (kSettleNs)
  uint32_t last_slow_percent_ = 0;
};

// The pages of one area a rank writes for others (its scratch, or one of its rings) that a timed
// copy has written: a copy into pages written for the first time is not timed, as it pays for
// mapping them (~1.5 µs a page on our VMs). One map per area, whatever StoresChoice the areas share.
class FreshPages {
 public:
  // Whether [dst, dst + n) holds pages of the area [area, area + area_bytes) that no
  // copy asked about here has written yet; marks them written. A copy outside the area is never
  // fresh. (Copies not asked about, while streaming, leave their pages fresh: at worst untimed.)
  bool first_touch(const uint8_t* area, size_t area_bytes, const uint8_t* dst, size_t n) {
    if (area != area_ || area_bytes != area_bytes_) {  // the first copy, or another area: start over
      area_ = area;
      area_bytes_ = area_bytes;
      written_.assign((area_bytes / kPage + 64) / 64, 0);
    }
    const uintptr_t a = reinterpret_cast<uintptr_t>(area), d = reinterpret_cast<uintptr_t>(dst);
    if (d < a || n == 0 || n > area_bytes || d - a > area_bytes - n) return false;
    bool fresh = false;
    for (size_t pg = (d - a) / kPage, last = (d - a + n - 1) / kPage; pg <= last; ++pg) {
      const uint64_t bit = uint64_t(1) << (pg % 64);
      fresh |= !(written_[pg / 64] & bit);
      written_[pg / 64] |= bit;
    }
    return fresh;
  }

 private:
  static constexpr size_t kPage = 4096;
  const uint8_t* area_ = nullptr;
  size_t area_bytes_ = 0;
  std::vector<uint64_t> written_;  // its pages a timed copy has written, a bit each
};

// The mode SHOAL_DIRECT_STORES sets (`auto`, the default: automatic).
StoresChoice::Mode stores_setting();

// Whether copies in with `s` take non-temporal stores now.
bool streams(const StoresChoice& s);

// Copies in of this length and more take non-temporal stores while `s` streams: with the cores
// far apart, an exchange of 1-8 KiB written so took 1.4-3.4x less time (BENCHMARKS.md, "Short
// copies where the cores sit far apart"). A ring copies messages shorter than kStreamingMinBytes
// with ordinary stores, untimed, whatever the choice (shm_link.cpp).
inline constexpr size_t kStreamingFromBytes = 512;

// A copy that next_copy says is timed or chosen, never plain (copy_for_readers).
void copy_timed_or_chosen(StoresChoice& s, StoresChoice::Copy how, FreshPages& pages, const uint8_t* area,
                          size_t area_bytes, void* dst, const void* src, size_t n, StoresChoice* also = nullptr);

// dst = src (n bytes, no overlap), into this rank's shared memory for others ([area, area +
// area_bytes): its scratch, or a ring, whose written pages `pages` keeps), with the stores `s`
// chooses, timing the ordinary ones it learns from. Where this copy turns non-temporal stores on,
// `also` (a ring's copy: the rank's scratch choice) takes them too. A plain copy stays inline.
inline void copy_for_readers(StoresChoice& s, FreshPages& pages, const uint8_t* area, size_t area_bytes, void* dst,
                             const void* src, size_t n, StoresChoice* also = nullptr) {
  const StoresChoice::Copy how = s.next_copy(n);
  if (how == StoresChoice::Copy::plain) return copy_bytes(dst, src, n);
  copy_timed_or_chosen(s, how, pages, area, area_bytes, dst, src, n, also);
}

}  // namespace shoal
