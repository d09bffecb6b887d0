// Ranks as threads of this process, over the in-process transport (src/transport/loop_link.h): the
// test seam below the communicator. run_loop(n, op, fn) gives each of n threads an engine, scratch
// and Ctx of its own, runs fn(ctx) on them at once, and once every thread has ended rethrows the
// exception of the rank that failed first, the cause (a rank that throws closes its links, so
// that its peers fail at once, after it, instead of waiting for the deadline).
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
