// ShmGroup over the segments mapped at rendezvous; its barrier waits through the engine, so a
// dead or aborted peer and the op's deadline end the wait.
#pragma once
#include <vector>

#include "core/engine.h"
#include "transport/shm_group.h"
#include "transport/shm_segment.h"

namespace shoal {

class ShmGroupImpl : public ShmGroup {
 public:
  // segs[r] is rank r's segment mapped here (segs[rank] is this rank's own).
  ShmGroupImpl(Engine& engine, const std::vector<ShmSegment>& segs);
  int rank() const override { return engine_.rank; }
  int size() const override { return engine_.size; }
  uint8_t* scratch(int r) override { return scratch_[r]; }
  size_t scratch_bytes() const override { return scratch_bytes_; }
  void barrier() override;
  void wait(bool (*done)(void*), void* arg, int peer) override;
  void ring_peers() override;

 private:
  Engine& engine_;
  std::vector<ShmControl*> ctl_;
  std::vector<uint8_t*> scratch_;
  std::vector<int> others_;
  size_t scratch_bytes_;
  uint64_t seq_ = 0;
};

}  // namespace shoal
