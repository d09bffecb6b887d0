#include "core/context.h"

#include <vector>

#include "core/engine.h"
#include "core/scratch.h"
#include "shoal/error.h"

namespace shoal {

Ctx::Ctx(Engine& engine, ShmGroup* shm, Scratch& scratch, int rank_, int size_, DType dt_, ReduceOp op_,
         const char* what_, uint64_t sig)
    : rank(rank_),
      size(size_),
      dt(dt_),
      op(op_),
      esize(dtype_size(dt_)),
      what(what_),
      engine_(engine),
      shm_(shm),
      scratch_(scratch),
      sig_(sig) {}

Ctx::~Ctx() {
  // An algorithm that throws may leave requests posted; they must not outlive this op's buffers.
  // The engine is aborted in that case (every error path aborts it), so the links are dead.
}

Request* Ctx::isend(int peer, const void* buf, size_t bytes) {
  reqs_.push_back(Request{Request::Dir::send, peer, static_cast<uint8_t*>(const_cast<void*>(buf)), bytes, sig_, what});
  engine_.post(&reqs_.back());
  return &reqs_.back();
}

Request* Ctx::irecv(int peer, void* buf, size_t bytes) {
  reqs_.push_back(Request{Request::Dir::recv, peer, static_cast<uint8_t*>(buf), bytes, sig_, what});
  engine_.post(&reqs_.back());
  return &reqs_.back();
}

void Ctx::wait(std::initializer_list<Request*> reqs) { engine_.wait(reqs.begin(), reqs.size()); }
void Ctx::wait(const std::vector<Request*>& reqs) { engine_.wait(reqs.data(), reqs.size()); }

void Ctx::wait_all() {
  std::vector<Request*> all;
  for (auto& r : reqs_)
    if (!r.complete) all.push_back(&r);
  engine_.wait(all.data(), all.size());
}

uint8_t* Ctx::scratch(size_t bytes, int index) { return scratch_.get(bytes, index); }

}  // namespace shoal
