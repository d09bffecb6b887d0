// shoal-bench: the Gloo side, run as PyTorch's ProcessGroupGloo runs it on CPU tensors: the TCP
// transport (on the address shoal's TCP transport advertises), the unbound-buffer collectives of
// gloo/*.h with their default algorithms, gloo::sum/product/min/max as reduction functions,
// root 0. reduce_scatter is what ProcessGroupGloo::reduce_scatter_tensor_coalesced does: clone the
// input, allreduce it in place, copy this rank's block out. sendrecv is an unbound buffer send
// 0 -> 1 (ProcessGroupGloo::send).
#include "bench/bench.h"

#if defined(SHOAL_HAVE_GLOO) && SHOAL_HAVE_GLOO

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/config.h>
#include <gloo/gather.h>
#include <gloo/math.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/scatter.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "bench/dtypes.h"

namespace shoal::bench {

namespace {

constexpr const char* kGlooKeyPrefix = "bench-gloo/";
constexpr uint64_t kSendRecvSlot = 0x5348;  // like a user tag of ProcessGroupGloo::send

// gloo's rendezvous store interface over a shoal store.
class StoreAdapter final : public gloo::rendezvous::Store {
 public:
  StoreAdapter(std::shared_ptr<shoal::Store> s, std::chrono::milliseconds timeout)
      : s_(std::move(s)), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    s_->set(kGlooKeyPrefix + key, Bytes(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    Bytes b = s_->get(kGlooKeyPrefix + key, timeout_);
    return std::vector<char>(b.begin(), b.end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> k;
    k.reserve(keys.size());
    for (const auto& key : keys) k.push_back(kGlooKeyPrefix + key);
    s_->wait(k, timeout.count() > 0 ? timeout : timeout_);
  }

 private:
  std::shared_ptr<shoal::Store> s_;
  std::chrono::milliseconds timeout_;
};

using Func = std::function<void(void*, const void*, const void*, size_t)>;
using FnPtr = void (*)(void*, const void*, const void*, size_t);

template <class T, class F>
void apply_f(void* c_, const void* a_, const void* b_, size_t n, F f) {
  auto* c = static_cast<T*>(c_);
  const auto* a = static_cast<const T*>(a_);
  const auto* b = static_cast<const T*>(b_);
  for (size_t i = 0; i < n; ++i) c[i] = f(a[i], b[i]);
}

// 16-bit floats: computed in f32 and rounded back (gloo::float16 does the same without AVX).
template <class T, float (*Load)(uint16_t), uint16_t (*Store)(float)>
Func half_fn(ReduceOp op) {
  auto wrap = [](auto g) {
    return [g](void* c_, const void* a_, const void* b_, size_t n) {
      auto* c = static_cast<T*>(c_);
      const auto* a = static_cast<const T*>(a_);
      const auto* b = static_cast<const T*>(b_);
      for (size_t i = 0; i < n; ++i) c[i].bits = Store(g(Load(a[i].bits), Load(b[i].bits)));
    };
  };
  switch (op) {
    case ReduceOp::sum: return wrap([](float x, float y) { return x + y; });
    case ReduceOp::prod: return wrap([](float x, float y) { return x * y; });
    case ReduceOp::min: return wrap([](float x, float y) { return x < y ? x : y; });
    case ReduceOp::max: return wrap([](float x, float y) { return x > y ? x : y; });
    default: throw std::invalid_argument(std::string(reduce_op_name(op)) + " is not supported by gloo on this dtype");
  }
}

template <class T>
Func reduce_fn(ReduceOp op) {
  if (op == ReduceOp::avg) throw std::invalid_argument("avg is not supported by gloo (nor by ProcessGroupGloo)");
  if constexpr (std::is_same_v<T, F16>) {
    return half_fn<F16, f16_to_f32, f32_to_f16>(op);
  } else if constexpr (std::is_same_v<T, BF16>) {
    return half_fn<BF16, bf16_to_f32, f32_to_bf16>(op);
  } else {
    switch (op) {
      case ReduceOp::sum: return static_cast<FnPtr>(&gloo::sum<T>);
      case ReduceOp::prod: return static_cast<FnPtr>(&gloo::product<T>);
      case ReduceOp::min: return static_cast<FnPtr>(&gloo::min<T>);
      case ReduceOp::max: return static_cast<FnPtr>(&gloo::max<T>);
      default: break;
    }
    if constexpr (std::is_integral_v<T>) {
      // Bitwise ops, as ProcessGroupGloo defines them for integral types.
      switch (op) {
        case ReduceOp::band:
          return [](void* c, const void* a, const void* b, size_t n) { apply_f<T>(c, a, b, n, [](T x, T y) { return static_cast<T>(x & y); }); };
        case ReduceOp::bor:
          return [](void* c, const void* a, const void* b, size_t n) { apply_f<T>(c, a, b, n, [](T x, T y) { return static_cast<T>(x | y); }); };
        case ReduceOp::bxor:
          return [](void* c, const void* a, const void* b, size_t n) { apply_f<T>(c, a, b, n, [](T x, T y) { return static_cast<T>(x ^ y); }); };
        default: break;
      }
    }
    throw std::invalid_argument(std::string(reduce_op_name(op)) + " is not supported by gloo on this dtype");
  }
}

// The address Gloo listens on and advertises: the one shoal's TCP transport advertises (SHOAL_HOST,
// else the local address of the connection to the TCP store, else 127.0.0.1), so that both run
// over the same interface, across hosts too.
std::string gloo_host(shoal::Store& store) {
  if (const char* h = std::getenv("SHOAL_HOST"); h && *h) return h;
  if (auto* t = dynamic_cast<shoal::TcpStore*>(&store)) return t->local_address();
  return "127.0.0.1";
}

class GlooRunner final : public Runner {
 public:
  GlooRunner(std::shared_ptr<shoal::Store> store, int rank, int size, std::chrono::milliseconds timeout)
      : timeout_(timeout) {
    gloo::transport::tcp::attr attr;
    attr.hostname = gloo_host(*store);
    dev_ = gloo::transport::tcp::CreateDevice(attr);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
    ctx->setTimeout(timeout);
    StoreAdapter adapter(std::move(store), timeout);
    ctx->connectFullMesh(adapter, dev_);
    ctx_ = ctx;
  }

  const char* name() const override { return "gloo"; }
  std::string device() const { return dev_->str(); }

  void run(const Spec& s, Buffers& b) override {
    dispatch_dtype(s.dt, [&]<class T>() { run_typed<T>(s, b); });
  }

  void barrier() override {
    gloo::BarrierOptions o(ctx_);
    o.setTimeout(timeout_);
    gloo::barrier(o);
  }

 private:
  template <class T>
  void run_typed(const Spec& s, Buffers& b) {
    T* in = reinterpret_cast<T*>(b.in.data());
    T* out = reinterpret_cast<T*>(b.out.data());
    const size_t c = s.block;
    const size_t p = static_cast<size_t>(s.p);
    switch (s.op) {
      case Op::allreduce: {
        gloo::AllreduceOptions o(ctx_);  // algorithm left UNSPECIFIED = ring, as PyTorch leaves it
        if (!s.in_place) o.setInput(in, c);  // in place the output is the input, as ProcessGroupGloo sets it
        o.setOutput(out, c);
        o.setReduceFunction(reduce_fn<T>(s.rop));
        o.setTimeout(timeout_);
        gloo::allreduce(o);
        break;
      }
      case Op::broadcast: {
        gloo::BroadcastOptions o(ctx_);  // in place, as ProcessGroupGloo::broadcast
        o.setOutput(in, c);
        o.setRoot(0);
        o.setTimeout(timeout_);
        gloo::broadcast(o);
        break;
      }
      case Op::reduce: {
        gloo::ReduceOptions o(ctx_);
        o.setInput(in, c);
        o.setOutput(out, c);
        o.setRoot(0);
        o.setReduceFunction(reduce_fn<T>(s.rop));
        o.setTimeout(timeout_);
        gloo::reduce(o);
        break;
      }
      case Op::allgather: {
        gloo::AllgatherOptions o(ctx_);
        o.setInput(in, c);
        o.setOutput(out, c * p);
        o.setTimeout(timeout_);
        gloo::allgather(o);
        break;
      }
      case Op::reduce_scatter: {
        const size_t bytes = c * p * sizeof(T);
        if (b.tmp.size() != bytes) b.tmp = Buffer(bytes);
        T* tmp = reinterpret_cast<T*>(b.tmp.data());
        std::memcpy(tmp, in, bytes);  // inputTensors[i].clone()
        gloo::AllreduceOptions o(ctx_);
        o.setOutput(tmp, c * p);
        o.setReduceFunction(reduce_fn<T>(s.rop));
        o.setTimeout(timeout_);
        gloo::allreduce(o);
        std::memcpy(out, tmp + static_cast<size_t>(s.rank) * c, c * sizeof(T));  // chunk(rank)
        break;
      }
      case Op::gather: {
        gloo::GatherOptions o(ctx_);
        o.setInput(in, c);
        if (s.rank == 0) o.setOutput(out, c * p);
        o.setRoot(0);
        o.setTimeout(timeout_);
        gloo::gather(o);
        break;
      }
      case Op::scatter: {
        gloo::ScatterOptions o(ctx_);
        if (s.rank == 0) {
          std::vector<T*> ptrs(p);
          for (size_t r = 0; r < p; ++r) ptrs[r] = in + r * c;
          o.setInputs(ptrs, c);
        }
        o.setOutput(out, c);
        o.setRoot(0);
        o.setTimeout(timeout_);
        gloo::scatter(o);
        break;
      }
      case Op::alltoall: {
        gloo::AlltoallOptions o(ctx_);
        o.setInput(in, c * p);
        o.setOutput(out, c * p);
        o.setTimeout(timeout_);
        gloo::alltoall(o);
        break;
      }
      case Op::alltoallv: {
        gloo::AlltoallvOptions o(ctx_);
        const std::vector<int64_t> counts(p, static_cast<int64_t>(c));
        o.setInput(in, counts);
        o.setOutput(out, counts);
        o.setTimeout(timeout_);
        gloo::alltoallv(o);
        break;
      }
      case Op::sendrecv: {
        if (s.rank == 0) {
          auto ub = ctx_->createUnboundBuffer(in, c * sizeof(T));
          ub->send(1, kSendRecvSlot);
          if (!ub->waitSend(timeout_)) throw std::runtime_error("gloo send aborted");
        } else if (s.rank == 1) {
          auto ub = ctx_->createUnboundBuffer(out, c * sizeof(T));
          ub->recv(0, kSendRecvSlot);
          if (!ub->waitRecv(timeout_)) throw std::runtime_error("gloo recv aborted");
        }
        break;
      }
      case Op::barrier:
        barrier();
        break;
    }
  }

  std::chrono::milliseconds timeout_;
  std::shared_ptr<gloo::transport::Device> dev_;
  std::shared_ptr<gloo::Context> ctx_;
};

}  // namespace

bool have_gloo() { return true; }

std::unique_ptr<Runner> make_gloo_runner(std::shared_ptr<Store> store, int rank, int size,
                                         std::chrono::milliseconds timeout, std::string* why) {
  (void)why;
  return std::make_unique<GlooRunner>(std::move(store), rank, size, timeout);
}

std::string gloo_description(Op op, const Runner* gloo) {
  std::string dev = gloo ? static_cast<const GlooRunner*>(gloo)->device() : std::string("?");
  std::string v = std::to_string(GLOO_VERSION_MAJOR) + "." + std::to_string(GLOO_VERSION_MINOR) + "." +
                  std::to_string(GLOO_VERSION_PATCH);
  std::string algo;
  switch (op) {
    case Op::allreduce: algo = "gloo::allreduce, AllreduceOptions default algorithm (ring), as ProcessGroupGloo"; break;
    case Op::broadcast: algo = "gloo::broadcast (in place), root 0"; break;
    case Op::reduce: algo = "gloo::reduce, root 0"; break;
    case Op::allgather: algo = "gloo::allgather"; break;
    case Op::reduce_scatter:
      algo = "clone + gloo::allreduce (ring) of the whole input + copy of the own block, as ProcessGroupGloo";
      break;
    case Op::gather: algo = "gloo::gather, root 0"; break;
    case Op::scatter: algo = "gloo::scatter, root 0"; break;
    case Op::alltoall: algo = "gloo::alltoall"; break;
    case Op::alltoallv: algo = "gloo::alltoallv, equal counts"; break;
    case Op::sendrecv: algo = "UnboundBuffer send/recv, rank 0 -> rank 1"; break;
    case Op::barrier: algo = "gloo::barrier"; break;
  }
  return "gloo " + v + ", transport tcp, device " + dev + "; " + algo;
}

}  // namespace shoal::bench

#else  // no Gloo

namespace shoal::bench {

bool have_gloo() { return false; }

std::unique_ptr<Runner> make_gloo_runner(std::shared_ptr<Store>, int, int, std::chrono::milliseconds,
                                         std::string* why) {
  if (why) *why = "shoal-bench was built without Gloo (libgloo-dev not found by CMake)";
  return nullptr;
}

std::string gloo_description(Op, const Runner*) { return "gloo: not built in"; }

}  // namespace shoal::bench

#endif
