// The C API (include/shoal/c.h): each call runs the C++ one as a blocking call and turns its
// exception into a result code and a thread-local message.
#include "shoal/c.h"

#include <chrono>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>

#include "shoal/communicator.h"
#include "shoal/error.h"

struct shoal_comm {
  std::unique_ptr<shoal::Communicator> c;
};

namespace {

thread_local std::string g_last_error;

shoal_result fail(shoal_result r, const char* what) noexcept {
  try {
    g_last_error = what;
  } catch (...) {  // no memory for the message: the code still says what kind of failure
  }
  return r;
}

// Runs f, mapping shoal's exceptions (most derived first) to result codes.
template <class F>
shoal_result guard(F&& f) noexcept {
  try {
    g_last_error.clear();
    f();
    return SHOAL_SUCCESS;
  } catch (const shoal::InvalidArgument& e) {
    return fail(SHOAL_INVALID_ARGUMENT, e.what());
  } catch (const shoal::Timeout& e) {
    return fail(SHOAL_TIMEOUT, e.what());
  } catch (const shoal::PeerError& e) {
    return fail(SHOAL_PEER_ERROR, e.what());
  } catch (const std::exception& e) {
    return fail(SHOAL_ERROR, e.what());
  } catch (...) {
    return fail(SHOAL_ERROR, "unknown error");
  }
}

shoal::Communicator& comm_of(shoal_comm* c) {
  if (!c || !c->c) throw shoal::InvalidArgument("shoal C API: null communicator");
  return *c->c;
}

// The C enums are the C++ ones in the same order; values outside them are refused.
shoal::DType dtype(shoal_dtype d) {
  if (d < SHOAL_F16 || d > SHOAL_BOOL) throw shoal::InvalidArgument("shoal C API: unknown dtype " + std::to_string(d));
  return static_cast<shoal::DType>(d);
}
shoal::ReduceOp reduce_op(shoal_op o) {
  if (o < SHOAL_SUM || o > SHOAL_BXOR) throw shoal::InvalidArgument("shoal C API: unknown reduce op " + std::to_string(o));
  return static_cast<shoal::ReduceOp>(o);
}

shoal::CallOptions blocking() {
  shoal::CallOptions o;
  o.blocking = true;
  return o;
}

}  // namespace

static_assert(int(shoal::DType::f16) == SHOAL_F16 && int(shoal::DType::bf16) == SHOAL_BF16 &&
              int(shoal::DType::f32) == SHOAL_F32 && int(shoal::DType::f64) == SHOAL_F64 &&
              int(shoal::DType::i8) == SHOAL_I8 && int(shoal::DType::u8) == SHOAL_U8 &&
              int(shoal::DType::i32) == SHOAL_I32 && int(shoal::DType::i64) == SHOAL_I64 &&
              int(shoal::DType::boolean) == SHOAL_BOOL);
static_assert(int(shoal::ReduceOp::sum) == SHOAL_SUM && int(shoal::ReduceOp::prod) == SHOAL_PROD &&
              int(shoal::ReduceOp::min) == SHOAL_MIN && int(shoal::ReduceOp::max) == SHOAL_MAX &&
              int(shoal::ReduceOp::avg) == SHOAL_AVG && int(shoal::ReduceOp::band) == SHOAL_BAND &&
              int(shoal::ReduceOp::bor) == SHOAL_BOR && int(shoal::ReduceOp::bxor) == SHOAL_BXOR);
static_assert(shoal::Communicator::kAnySource == SHOAL_ANY_SOURCE);

extern "C" {

const char* shoal_last_error(void) { return g_last_error.c_str(); }

shoal_result shoal_comm_create_from_env(int64_t timeout_ms, shoal_comm** out) {
  return guard([&] {
    if (!out) throw shoal::InvalidArgument("shoal_comm_create_from_env: null output pointer");
    *out = nullptr;
    const auto [rank, size] = shoal::placement_from_env();
    shoal::Options opts = shoal::Options::from_env({});
    if (timeout_ms > 0) opts.timeout = std::chrono::milliseconds(timeout_ms);
    auto c = std::make_unique<shoal_comm>();
    c->c = std::make_unique<shoal::Communicator>(shoal::store_from_env(rank, opts.timeout), rank, size, opts);
    *out = c.release();
  });
}

void shoal_comm_destroy(shoal_comm* comm) { delete comm; }

int shoal_comm_rank(const shoal_comm* comm) { return comm && comm->c ? comm->c->rank() : -1; }
int shoal_comm_size(const shoal_comm* comm) { return comm && comm->c ? comm->c->size() : -1; }

shoal_result shoal_allreduce(shoal_comm* c, const void* in, void* out, size_t count, shoal_dtype dt, shoal_op op) {
  return guard([&] { comm_of(c).allreduce(in, out, count, dtype(dt), reduce_op(op), blocking()); });
}
shoal_result shoal_broadcast(shoal_comm* c, void* buf, size_t count, shoal_dtype dt, int root) {
  return guard([&] { comm_of(c).broadcast(buf, count, dtype(dt), root, blocking()); });
}
shoal_result shoal_reduce(shoal_comm* c, const void* in, void* out, size_t count, shoal_dtype dt, shoal_op op, int root) {
  return guard([&] { comm_of(c).reduce(in, out, count, dtype(dt), reduce_op(op), root, blocking()); });
}
shoal_result shoal_allgather(shoal_comm* c, const void* in, void* out, size_t count, shoal_dtype dt) {
  return guard([&] { comm_of(c).allgather(in, out, count, dtype(dt), blocking()); });
}
shoal_result shoal_reduce_scatter(shoal_comm* c, const void* in, void* out, size_t count, shoal_dtype dt, shoal_op op) {
  return guard([&] { comm_of(c).reduce_scatter(in, out, count, dtype(dt), reduce_op(op), blocking()); });
}
shoal_result shoal_gather(shoal_comm* c, const void* in, void* out, size_t count, shoal_dtype dt, int root) {
  return guard([&] { comm_of(c).gather(in, out, count, dtype(dt), root, blocking()); });
}
shoal_result shoal_scatter(shoal_comm* c, const void* in, void* out, size_t count, shoal_dtype dt, int root) {
  return guard([&] { comm_of(c).scatter(in, out, count, dtype(dt), root, blocking()); });
}
shoal_result shoal_alltoall(shoal_comm* c, const void* in, void* out, size_t count, shoal_dtype dt) {
  return guard([&] { comm_of(c).alltoall(in, out, count, dtype(dt), blocking()); });
}
shoal_result shoal_barrier(shoal_comm* c) {
  return guard([&] { comm_of(c).barrier({.blocking = true}); });
}
shoal_result shoal_send(shoal_comm* c, const void* buf, size_t count, shoal_dtype dt, int peer, uint64_t tag) {
  return guard([&] { comm_of(c).send(buf, count, dtype(dt), peer, tag, blocking()); });
}
shoal_result shoal_recv(shoal_comm* c, void* buf, size_t count, shoal_dtype dt, int peer, uint64_t tag) {
  return guard([&] { comm_of(c).recv(buf, count, dtype(dt), peer, tag, blocking()); });
}

}  // extern "C"
