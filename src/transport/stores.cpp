#include "transport/stores.h"

#include <atomic>
#include <cassert>
#include <string>

#include "base/log.h"
#include "base/params.h"
#include "base/steady_ns.h"
#include "reduce/copy.h"
#include "transport/core_probe.h"

namespace shoal {

StoresChoice::Mode stores_setting() {
  const std::string m = params::choice("SHOAL_DIRECT_STORES").value_or("auto");
  return m == "cached" ? StoresChoice::Mode::cached
         : m == "streaming" ? StoresChoice::Mode::streaming
                            : StoresChoice::Mode::automatic;
}

bool streams(const StoresChoice& s) {
  return s.by_round_trip() ? core_round_trip_ns() >= StoresChoice::kFarRoundTripNs : s.streaming();
}

void copy_timed_or_chosen(StoresChoice& s, StoresChoice::Copy how, FreshPages& pages, const uint8_t* area,
                          size_t area_bytes, void* dst, const void* src, size_t n, StoresChoice* also) {
  assert(how != StoresChoice::Copy::plain);
  const auto stream = [&] { copy_streaming_from(kStreamingFromBytes, dst, src, n); };
  if (s.by_round_trip()) return streams(s) ? stream() : copy_bytes(dst, src, n);
  const StoresChoice::Clock now_ns = s.clock() ? s.clock() : steady_ns;
  if (how == StoresChoice::Copy::chosen) {
    stream();
    // Counted from the length at which the copy stores non-temporally.
    if (n >= kStreamingFromBytes && s.mode() == StoresChoice::Mode::automatic && s.streamed(now_ns))
      SHOAL_LOG(debug, "copies into shared memory try ordinary stores again");
  } else if (!pages.first_touch(area, area_bytes, static_cast<const uint8_t*>(dst), n)) {
    // A store waits in the store buffer for its line, and a copy of a few KiB is done before the
    // first lines arrive: the fences (on x86, each waits for the stores before it to land; the
    // clock's read waits for the fence) time the copy from the last store before it to its own
    // last, so the time counts the lines it took back from the readers' cores (far apart, ~3x as
    // long) and none of the copies before it.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    const uint64_t t0 = now_ns();
    copy_bytes(dst, src, n);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    const uint64_t t1 = now_ns();
    SHOAL_LOG(trace, "copy into shared memory by ordinary stores: %zu bytes, %llu ns per KiB", n,
              static_cast<unsigned long long>((t1 - t0) * 1024 / n));
    if (s.timed(n, t1 - t0, t1, also))
      SHOAL_LOG(debug, "copies into shared memory now take non-temporal stores (%u%% of the bytes timed last in slow copies)",
                s.last_slow_percent());
  } else {
    copy_bytes(dst, src, n);
  }
}

}  // namespace shoal
