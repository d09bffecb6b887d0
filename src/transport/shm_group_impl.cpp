#include "transport/shm_group_impl.h"

namespace shoal {

ShmGroupImpl::ShmGroupImpl(Engine& engine, const std::vector<ShmSegment>& segs)
    : engine_(engine), scratch_bytes_(segs[engine.rank].control()->scratch_bytes) {
  for (int r = 0; r < engine.size; ++r) {
    ctl_.push_back(segs[r].control());
    scratch_.push_back(segs[r].scratch());
    if (r != engine.rank) others_.push_back(r);
  }
  seq_ = ctl_[engine.rank]->barrier_seq.load();
}

void ShmGroupImpl::barrier() {
  ++seq_;
  ctl_[engine_.rank]->barrier_seq.store(seq_, std::memory_order_seq_cst);
  for (int r : others_) Engine::ring(ctl_[r]);
  auto arrived = [&] {
    for (int r : others_)
      if (ctl_[r]->barrier_seq.load(std::memory_order_acquire) < seq_) return false;
    return true;
  };
  if (arrived()) return;
  std::vector<int> late;
  for (int r : others_)
    if (ctl_[r]->barrier_seq.load(std::memory_order_acquire) < seq_) late.push_back(r);
  engine_.wait_until(arrived, late);
}

}  // namespace shoal
