// Ranks as threads of this process, over the in-process transport (src/transport/loop_link.h): the
// test seam below the communicator. run_loop(n, op, fn) gives each of n threads an engine, scratch
// and Ctx of its own, runs fn(ctx) on them at once, and once every thread has ended rethrows the
// exception of the rank that failed first. A rank that fails closes its links, so that its peers
// fail at once instead of waiting for the deadline, and their errors quote its reason (the
// engine's peer_abort_reason, here read from the failed rank's engine), so whichever error is
// rethrown names the cause.
#pragma once
#include <chrono>
#include <functional>

#include "algo/context.h"

namespace shoal_test {

struct LoopOp {
  shoal::DType dt = shoal::DType::f32;
  shoal::ReduceOp op = shoal::ReduceOp::sum;
  std::chrono::milliseconds timeout{std::chrono::seconds(20)};  // the deadline of the whole run
};

void run_loop(int n, const LoopOp& op, const std::function<void(shoal::Ctx&)>& fn);

}  // namespace shoal_test
