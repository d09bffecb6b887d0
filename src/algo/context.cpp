#include "algo/context.h"

#include <vector>

#include "engine/engine.h"
#include "base/scratch.h"
#include "shoal/error.h"

namespace shoal {

HostMap HostMap::from_ids(const std::vector<std::string>& ids) {
  HostMap m;
  std::vector<const std::string*> seen;
  for (size_t r = 0; r < ids.size(); ++r) {
    size_t h = 0;
    while (h < seen.size() && *seen[h] != ids[r]) ++h;
    if (h == seen.size()) {
      seen.push_back(&ids[r]);
      m.ranks.emplace_back();
    }
    m.host_of.push_back(static_cast<int>(h));
    m.ranks[h].push_back(static_cast<int>(r));
  }
  return m;
}

bool HostMap::uniform() const {
  for (auto& h : ranks)
    if (h.size() != ranks[0].size()) return false;
  return true;
}

namespace {
int index_in(const std::vector<int>& v, int x) {
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] == x) return static_cast<int>(i);
  throw Error("internal error: a subgroup must include its own rank");
}
}  // namespace

Ctx::Ctx(Ctx& parent, const std::vector<int>& members, Topo topo_)
    : rank(index_in(members, parent.rank)),
      size(static_cast<int>(members.size())),
      dt(parent.dt),
      op(parent.op),
      esize(parent.esize),
      what(parent.what),
      topo(topo_),
      engine_(parent.engine_),
      shm_(nullptr),
      scratch_(parent.scratch_),
      sig_(parent.sig_),
      hosts_(nullptr),
      ways_(parent.ways_) {
  for (int m : members) engine_rank_.push_back(parent.engine_rank(m));
}

Request* Ctx::isend(int peer, const void* buf, size_t bytes) {
  reqs_.push_back(Request{Request::Dir::send, engine_rank(peer), static_cast<uint8_t*>(const_cast<void*>(buf)), bytes, sig_, what});
  engine_.post(&reqs_.back());
  return &reqs_.back();
}

Request* Ctx::irecv(int peer, void* buf, size_t bytes) {
  reqs_.push_back(Request{Request::Dir::recv, engine_rank(peer), static_cast<uint8_t*>(buf), bytes, sig_, what});
  engine_.post(&reqs_.back());
  return &reqs_.back();
}

void Ctx::start() { engine_.poll(); }

void Ctx::wait(std::initializer_list<Request*> reqs) { engine_.wait(reqs.begin(), reqs.size()); }
void Ctx::wait(const std::vector<Request*>& reqs) { engine_.wait(reqs.data(), reqs.size()); }

void Ctx::wait_all() {
  if (reqs_.empty()) return;  // most direct ops post none
  std::vector<Request*> all;
  for (auto& r : reqs_)
    if (!r.complete) all.push_back(&r);
  engine_.wait(all.data(), all.size());
}

uint8_t* Ctx::scratch(size_t bytes, int index) { return scratch_.get(bytes, index); }

}  // namespace shoal
