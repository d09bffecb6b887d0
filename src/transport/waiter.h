// What the blocking parts of a transport (the shared-memory group's barrier and waits) need from
// the layer that progresses the links, the engine, which implements it: a wait that keeps every
// link moving, watches the peers and enforces the op's deadline, and failing the op on a peer.
// The transport names no engine.
#pragma once
#include <string>
#include <vector>

namespace shoal {

class Waiter {
 public:
  // Returns once done(arg) holds; throws PeerError if a rank in `waiting_for` dies or aborts, or
  // Timeout at the op's deadline.
  virtual void wait_until(bool (*done)(void*), void* arg, const std::vector<int>& waiting_for) = 0;
  // Fails the op (and the group) on `peer` for the reason `what`: throws PeerError.
  [[noreturn]] virtual void fail_peer(int peer, const std::string& what) = 0;
  // Whether rank r's process has exited (same host).
  virtual bool exited(int r) const = 0;

  // wait_until with a callable.
  template <class F>
  void wait_for(F& done, const std::vector<int>& waiting_for) {
    wait_until([](void* f) { return (*static_cast<F*>(f))(); }, &done, waiting_for);
  }

 protected:
  ~Waiter() = default;
};

}  // namespace shoal
