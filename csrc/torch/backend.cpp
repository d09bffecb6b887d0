#include "backend.h"

#include <Python.h>

#include <ATen/TensorIterator.h>
#include <ATen/core/ivalue.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <sstream>

#include "shoal/error.h"
#include "store_adapter.h"

namespace shoal_torch {
namespace {

#define SHOAL_SRC \
  c10::SourceLocation { __func__, __FILE__, static_cast<uint32_t>(__LINE__) }

// ---- dtypes and reduce ops ----

std::optional<shoal::DType> map_dtype(at::ScalarType t) {
  switch (t) {
    case at::kHalf: return shoal::DType::f16;
    case at::kBFloat16: return shoal::DType::bf16;
    case at::kFloat: return shoal::DType::f32;
    case at::kDouble: return shoal::DType::f64;
    case at::kChar: return shoal::DType::i8;
    case at::kByte: return shoal::DType::u8;
    case at::kInt: return shoal::DType::i32;
    case at::kLong: return shoal::DType::i64;
    case at::kBool: return shoal::DType::boolean;
    default: return std::nullopt;
  }
}

// Ops that only move bytes work on every dtype: one torch element is `scale` shoal elements.
struct Move {
  shoal::DType dt;
  size_t scale;
};
Move move_type(const at::Tensor& t) {
  if (auto d = map_dtype(t.scalar_type())) return {*d, 1};
  return {shoal::DType::u8, static_cast<size_t>(t.element_size())};
}

shoal::DType reduce_dtype(const at::Tensor& t, const char* what) {
  auto d = map_dtype(t.scalar_type());
  TORCH_CHECK(d.has_value(), "shoal: ", what, " does not support dtype ", t.scalar_type(),
              " (reductions support float16, bfloat16, float32, float64, int8, uint8, int32, int64 and bool)");
  return *d;
}

shoal::ReduceOp reduce_op(const c10d::ReduceOp& op, shoal::DType dt, const at::Tensor& t, const char* what) {
  shoal::ReduceOp r;
  switch (op.op_) {
    case c10d::ReduceOp::SUM: r = shoal::ReduceOp::sum; break;
    case c10d::ReduceOp::AVG: r = shoal::ReduceOp::avg; break;
    case c10d::ReduceOp::PRODUCT: r = shoal::ReduceOp::prod; break;
    case c10d::ReduceOp::MIN: r = shoal::ReduceOp::min; break;
    case c10d::ReduceOp::MAX: r = shoal::ReduceOp::max; break;
    case c10d::ReduceOp::BAND: r = shoal::ReduceOp::band; break;
    case c10d::ReduceOp::BOR: r = shoal::ReduceOp::bor; break;
    case c10d::ReduceOp::BXOR: r = shoal::ReduceOp::bxor; break;
    case c10d::ReduceOp::PREMUL_SUM:
      TORCH_CHECK(false, "shoal: ", what,
                  " does not support ReduceOp.PREMUL_SUM (an NCCL-only op): scale the tensor, then use ReduceOp.SUM");
    default:
      TORCH_CHECK(false, "shoal: ", what, ": unknown ReduceOp ", static_cast<int>(op.op_));
  }
  TORCH_CHECK(shoal::reduce_op_supported(dt, r), "shoal: ", what, ": ReduceOp.", shoal::reduce_op_name(r),
              " is not defined for dtype ", t.scalar_type());
  return r;
}

// Whether this thread holds the GIL. From Python 3.12 the current thread state is this thread's;
// before, it is one for the process: that of whichever thread holds the GIL, so it must be this
// thread's own (PyGILState_GetThisThreadState). Releasing the GIL for another thread lets that
// thread run Python without its state: it crashes (test_thread_calls_while_another_runs_python).
// PyGILState_Check is no help: it answers yes for any thread once a subinterpreter exists. A
// thread of a subinterpreter is told no (torch does not support subinterpreters).
bool holds_gil() {
  if (!Py_IsInitialized()) return false;
#if PY_VERSION_HEX >= 0x030D0000
  return PyThreadState_GetUnchecked() != nullptr;
#elif PY_VERSION_HEX >= 0x030C0000
  return _PyThreadState_UncheckedGet() != nullptr;
#else
  PyThreadState* current = _PyThreadState_UncheckedGet();
  return current != nullptr && current == PyGILState_GetThisThreadState();
#endif
}

// ---- tensor checks ----

void check_tensor(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.defined(), "shoal: ", what, ": undefined tensor");
  TORCH_CHECK(t.layout() == at::kStrided, "shoal: ", what, " supports only dense tensors, got layout ", t.layout());
}

const at::Tensor& single(const std::vector<at::Tensor>& v, const char* what) {
  TORCH_CHECK(v.size() == 1, "shoal: ", what, " takes exactly one tensor per process, got ", v.size());
  check_tensor(v[0], what);
  return v[0];
}

void check_like(const at::Tensor& t, const at::Tensor& ref, const char* what) {
  check_tensor(t, what);
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), "shoal: ", what, ": tensors must all have the same dtype, got ",
              t.scalar_type(), " and ", ref.scalar_type());
  TORCH_CHECK(t.device().type() == ref.device().type(), "shoal: ", what,
              ": tensors must all be on the same kind of device, got ", t.device(), " and ", ref.device());
}

bool overlaps(const at::Tensor& a, const at::Tensor& b) {
  auto pa = static_cast<const char*>(a.data_ptr()), pb = static_cast<const char*>(b.data_ptr());
  size_t na = a.nbytes(), nb = b.nbytes();
  return na > 0 && nb > 0 && pa < pb + nb && pb < pa + na;
}

size_t elems(const at::Tensor& t, const Move& m) { return static_cast<size_t>(t.numel()) * m.scale; }

// OpType::REDUCE_SCATTER_TENSOR_COALESCED is newer than some torch builds (2.11 has none), which
// a GPU machine may have: COALESCED there.
template <class T = c10d::OpType>
constexpr T reduce_scatter_tensor_coalesced_type() {
  if constexpr (requires { T::REDUCE_SCATTER_TENSOR_COALESCED; }) return T::REDUCE_SCATTER_TENSOR_COALESCED;
  else return T::COALESCED;
}

}  // namespace

// ---- staging ----

// Collects what one torch op needs: the shoal ops to submit, the buffers to keep alive, the
// copy-backs to run when they complete.
struct Builder {
  WorkShoal::Plan plan;
  std::vector<OpFn> ops;

  // A tensor whose bytes are its values, on the CPU: shoal reads and writes it in place. A
  // conjugate or negative view's bytes are not its values, and a zero tensor or a Python subclass
  // may have no storage of its own: each is staged, through ATen's copy. (torch.distributed never
  // hands a backend such a view, it refuses them; a call on the backend itself does: the Ray
  // group, shoal.torch.all_reduce_, callers of ProcessGroup._get_backend.) The key tests come
  // first: a Python subclass may answer device() and is_contiguous() in Python.
  static bool direct(const at::Tensor& t) {
    static const c10::DispatchKeySet staged{c10::DispatchKey::Conjugate, c10::DispatchKey::Negative,
                                            c10::DispatchKey::ZeroTensor, c10::DispatchKey::Python};
    return !t.key_set().has_any(staged) && t.has_storage() && t.device().is_cpu() && t.is_contiguous();
  }
  static at::Tensor host_like(const at::Tensor& t) {
    auto o = t.options().device(at::kCPU);
    if (!t.device().is_cpu()) o = o.pinned_memory(true);
    return at::empty(t.sizes(), o);
  }
  at::Tensor keep(at::Tensor t) {
    plan.keep.push_back(t);
    return t;
  }
  // `t` as shoal may read it while it writes `out`: itself, or where the two overlap (in place: a
  // chunk of the output), a copy.
  at::Tensor apart_from(const at::Tensor& t, const at::Tensor& out) { return overlaps(t, out) ? keep(t.clone()) : t; }
  // A tensor shoal reads.
  at::Tensor in(const at::Tensor& t) {
    if (direct(t)) return keep(t);
    at::Tensor b = host_like(t);
    b.copy_(t);
    return keep(b);
  }
  // A tensor shoal writes (and reads first when `copy_in`): copied back into `t` on success.
  at::Tensor out(const at::Tensor& t, bool copy_in = false) {
    if (direct(t)) return keep(t);
    TORCH_CHECK(!t._is_zerotensor(), "shoal: a zero tensor cannot receive a collective's result (it is immutable)");
    after_current_stream(t);
    at::Tensor b = host_like(t);
    if (copy_in) b.copy_(t);
    then([t, b]() mutable { t.copy_(b); });
    return keep(b);
  }
  // A result on an accelerator is copied back when the op completes, on another thread and stream.
  // Work the caller queued on its current stream before the op, which may still read or write
  // `t` (a kernel filling it, another reading it), must be done first: as a GPU backend's op is
  // ordered after the current stream. Waits for that stream once per device and op. (A staged
  // input needs no wait: its copy to the host is made on that stream, which the copy waits for.)
  void after_current_stream(const at::Tensor& t) {
    const c10::Device d = t.device();
    if (d.is_cpu() || std::find(synced_.begin(), synced_.end(), d) != synced_.end()) return;
    c10::impl::VirtualGuardImpl(d.type()).getStream(d).synchronize();
    synced_.push_back(d);
  }
  // A flat contiguous host buffer of `n` elements of `like`'s dtype.
  at::Tensor scratch(int64_t n, const at::Tensor& like) {
    auto o = like.options().device(at::kCPU).memory_format(at::MemoryFormat::Contiguous);
    if (!like.device().is_cpu()) o = o.pinned_memory(true);
    return keep(at::empty({n}, o));
  }
  void then(std::function<void()> f) { plan.finalize.push_back(std::move(f)); }
  void op(OpFn f) { ops.push_back(std::move(f)); }

 private:
  std::vector<c10::Device> synced_;
};

namespace {

// `t` was written through its pointer: its version moves, as with copy_ (autograd's check).
void mark_written(const at::Tensor& t) {
  if (!t.is_inference()) t.unsafeGetTensorImpl()->bump_version();
}
// Where a list op's tensor `t` and its block of `flat` are copied as bytes: one the Builder uses
// directly, of `flat`'s dtype, and small enough that ATen would copy it on one thread too. An ATen
// copy costs about a microsecond of dispatch (narrow, view, copy_) per tensor of the list
// (BENCHMARKS.md, "A list op's copies").
bool bytewise(const at::Tensor& t, const at::Tensor& flat) {
  return Builder::direct(t) && t.scalar_type() == flat.scalar_type() && t.numel() < at::internal::GRAIN_SIZE;
}
uint8_t* bytes_at(const at::Tensor& flat, int64_t off) {
  return static_cast<uint8_t*>(flat.data_ptr()) + off * flat.element_size();
}

// `ts` as one flat tensor of `total` elements where they lie back to back in one storage, as the
// chunks of one buffer do (`list(flat.chunk(p))`, ZeRO's partitions of its flat buffer): the op
// then reads or writes them in place, with no copy. Undefined otherwise.
at::Tensor back_to_back(const std::vector<at::Tensor>& ts, int64_t total) {
  const at::Tensor* first = nullptr;
  const uint8_t* next = nullptr;
  int64_t sum = 0;
  for (const auto& t : ts) {
    sum += t.numel();
    if (t.numel() == 0) continue;  // takes no room; its pointer may be anything
    if (!Builder::direct(t) || (first && (t.scalar_type() != first->scalar_type() || !t.storage().is_alias_of(first->storage()))))
      return {};
    const auto* p = static_cast<const uint8_t*>(t.const_data_ptr());
    if (next && p != next) return {};
    if (!first) first = &t;
    next = p + t.nbytes();
  }
  if (!first || sum != total) return {};
  at::NoGradGuard no_grad;
  return first->as_strided({total}, {1});
}

// Copies `ts` into consecutive blocks of `flat`.
void copy_into(at::Tensor& flat, const std::vector<at::Tensor>& ts) {
  int64_t off = 0;
  for (const auto& t : ts) {
    if (!bytewise(t, flat)) flat.narrow(0, off, t.numel()).view(t.sizes()).copy_(t);
    else if (t.numel() > 0) std::memcpy(bytes_at(flat, off), t.const_data_ptr(), t.nbytes());
    off += t.numel();
  }
}
// The flat buffer of `total` elements an op reads the tensors `ts` from, in that order: theirs
// where they lie back to back and do not overlap `apart` (what the op writes), else a scratch
// buffer they are copied into now.
at::Tensor packed(Builder& b, const std::vector<at::Tensor>& ts, int64_t total, const at::Tensor& like,
                  const at::Tensor& apart = at::Tensor()) {
  at::Tensor flat = back_to_back(ts, total);
  if (flat.defined() && !(apart.defined() && overlaps(flat, apart))) return b.keep(flat);
  flat = b.scratch(total, like);
  copy_into(flat, ts);
  return flat;
}
// The flat buffer of `total` elements an op writes the tensors `ts` through, in that order (and
// reads them from first, if `read_first`): theirs where they lie back to back, else a scratch
// buffer copied into them when the op has completed. Either way their versions move, as with
// copy_ (autograd's check).
at::Tensor unpacked_later(Builder& b, const std::vector<at::Tensor>& ts, int64_t total, const at::Tensor& like,
                          bool read_first = false) {
  for (const auto& t : ts) b.after_current_stream(t);
  at::Tensor flat = back_to_back(ts, total);
  if (flat.defined()) {
    b.then([ts]() mutable {
      for (auto& t : ts) mark_written(t);
    });
    return b.keep(flat);
  }
  flat = b.scratch(total, like);
  if (read_first) copy_into(flat, ts);
  b.then([flat, ts]() mutable {
    int64_t off = 0;
    for (auto& t : ts) {
      if (!bytewise(t, flat)) {
        t.copy_(flat.narrow(0, off, t.numel()).view(t.sizes()));
      } else if (t.numel() > 0) {
        std::memcpy(t.data_ptr(), bytes_at(flat, off), t.nbytes());
        mark_written(t);
      }
      off += t.numel();
    }
  });
  return flat;
}

std::exception_ptr torch_error(const std::string& context, std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const c10::Error&) {
    return e;
  } catch (const shoal::InvalidArgument& x) {
    return std::make_exception_ptr(c10::Error(SHOAL_SRC, "shoal: " + context + ": " + x.what()));
  } catch (const shoal::Timeout& x) {
    // " Timed out " as gloo says it: tools match on it.
    return std::make_exception_ptr(c10::DistBackendError(SHOAL_SRC, "shoal: " + context + ": Timed out (" + x.what() + ")"));
  } catch (const std::exception& x) {
    return std::make_exception_ptr(c10::DistBackendError(SHOAL_SRC, "shoal: " + context + " failed: " + x.what()));
  } catch (...) {
    return std::make_exception_ptr(c10::DistBackendError(SHOAL_SRC, "shoal: " + context + " failed"));
  }
}

c10::intrusive_ptr<c10::ivalue::Future> make_future(const std::vector<c10::Device>& devices) {
  return c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()), devices);
}

}  // namespace

// ---------------------------------------------------------------- Completer

Completer::~Completer() {
  {
    std::lock_guard<std::mutex> lk(q_->mu);
    q_->stop = true;
  }
  q_->cv.notify_all();
  if (!thread_.joinable()) return;
  if (thread_.get_id() == std::this_thread::get_id()) {
    thread_.detach();  // the last owner released in a callback: the thread drains what is left
    return;
  }
  // What is left may be Python callbacks, which take the GIL: never hold it while waiting for them
  // (the last owner may be a Work that Python drops).
  PyThreadState* gil = holds_gil() ? PyEval_SaveThread() : nullptr;
  thread_.join();
  if (gil) PyEval_RestoreThread(gil);
}

void Completer::post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lk(q_->mu);
    q_->fns.push_back(std::move(fn));
    if (!thread_.joinable()) thread_ = std::thread([q = q_] { loop(q); });
  }
  q_->cv.notify_one();
}

void Completer::loop(const std::shared_ptr<Queue>& q) {
  std::unique_lock<std::mutex> lk(q->mu);
  for (;;) {
    q->cv.wait(lk, [&] { return q->stop || !q->fns.empty(); });
    if (q->fns.empty()) return;  // stopped and drained
    auto fn = std::move(q->fns.front());
    q->fns.pop_front();
    lk.unlock();
    try {
      fn();
    } catch (...) {
      // A Future callback threw: the Future records it; nothing else to do here.
    }
    fn = nullptr;
    lk.lock();
  }
}

// ---------------------------------------------------------------- WorkShoal

std::string OpContext::str() const {
  std::ostringstream s;
  s << c10d::opTypeToString(type) << " on rank " << rank << " of " << group << " (" << size << " ranks)";
  return s.str();
}

WorkShoal::WorkShoal(int rank, c10d::OpType type, const char* profiling_title, const std::vector<at::Tensor>& inputs,
                     std::vector<at::Tensor> outputs, OpContext context, uint64_t seq, int source_rank,
                     std::shared_ptr<Completer> completer)
    : c10d::Work(rank, type, profiling_title, std::optional<std::vector<at::Tensor>>(inputs)),
      outputs_(std::move(outputs)),
      context_(std::move(context)),
      seq_(seq),
      source_rank_(source_rank),
      completer_(std::move(completer)) {
  for (const auto& t : outputs_)
    if (t.defined() && !t.device().is_cpu() &&
        std::find(devices_.begin(), devices_.end(), t.device()) == devices_.end())
      devices_.push_back(t.device());
}

WorkShoal::~WorkShoal() = default;

int WorkShoal::sourceRank() const {
  if (any_source_) {
    TORCH_CHECK(*any_source_ && (*any_source_)->source() >= 0,
                "shoal: sourceRank() of a receive from any source is known once it completes");
    return (*any_source_)->source();
  }
  TORCH_CHECK(source_rank_ >= 0, "shoal: sourceRank() is only defined for recv");
  return source_rank_;
}

void WorkShoal::start(Plan plan, const std::vector<shoal::WorkPtr>& parts) {
  {
    std::lock_guard<std::mutex> lk(part_mu_);
    plan_ = std::move(plan);
    parts_ = parts;
    remaining_ = static_cast<int>(parts.size()) + 1;  // +1: released below, after every callback is set
  }
  auto self = c10::intrusive_ptr<WorkShoal>::reclaim_copy(this);
  for (const auto& p : parts) {
    shoal::Work* raw = p.get();
    p->on_complete([self, raw] { self->part_done(raw->error()); });
  }
  part_done(nullptr);
}

void WorkShoal::finish(Plan plan, std::exception_ptr err) {
  {
    std::lock_guard<std::mutex> lk(part_mu_);
    plan_ = std::move(plan);
    remaining_ = 1;
  }
  part_done(err);
}

void WorkShoal::part_done(std::exception_ptr err) {
  std::exception_ptr e;
  {
    std::lock_guard<std::mutex> lk(part_mu_);
    if (err && !first_error_) first_error_ = err;
    if (--remaining_ > 0) return;
    e = first_error_;
    parts_.clear();  // the shoal Works hold this callback until now; no cycle is left
  }
  // Last part: copy back on success, release the staging buffers, complete.
  try {
    if (!e) {
      at::NoGradGuard no_grad;
      for (auto& f : plan_.finalize) f();
    }
  } catch (...) {
    e = std::current_exception();
  }
  try {
    plan_ = Plan{};
  } catch (...) {
  }
  complete(e ? torch_error(context_.str(), e) : nullptr);
}

void WorkShoal::complete(std::exception_ptr err) {
  std::function<void()> end_cb;
  {
    std::lock_guard<std::mutex> lk(mutex_);
    end_cb = std::move(recordFunctionEndCallback_);
    recordFunctionEndCallback_ = nullptr;
  }
  // Before anyone is woken: a waiter may stop the profiler as soon as wait() returns.
  if (end_cb) {
    try {
      end_cb();
    } catch (...) {
    }
  }
  c10::intrusive_ptr<c10::ivalue::Future> fut;
  {
    std::lock_guard<std::mutex> lk(mutex_);
    completed_ = true;
    exception_ = err;
    fut = future_;
  }
  cv_.notify_all();
  if (fut) {
    completer_->post([fut, err, outputs = outputs_]() {
      if (err) fut->setError(err);
      else fut->markCompleted(c10::IValue(outputs));
    });
  }
}

bool WorkShoal::wait(std::chrono::milliseconds timeout) {
  std::vector<shoal::WorkPtr> parts;
  {
    std::lock_guard<std::mutex> lk(part_mu_);
    parts = parts_;
  }
  for (auto& p : parts) {
    if (timeout != kNoTimeout) {
      // A bounded wait does not run the ops on this thread (it could not stop at its deadline):
      // the progress thread starts them now, rather than when it next looks at its queue (up
      // to kMaxTick, communicator.cpp).
      p->run_async();
      continue;
    }
    try {
      p->wait();
    } catch (...) {
      // Reported through the completion callback, as the Work's exception.
    }
  }
  return c10d::Work::wait(timeout);
}

c10::intrusive_ptr<c10::ivalue::Future> WorkShoal::getFuture() {
  // Whoever takes the future consumes the result through it (DDP's comm hooks), not by a wait on
  // this Work: start the ops in the background now rather than when the progress thread finds them.
  {
    std::lock_guard<std::mutex> lk(part_mu_);
    for (const auto& p : parts_) p->run_async();
  }
  c10::intrusive_ptr<c10::ivalue::Future> fut;
  bool mark_now = false;
  std::exception_ptr err;
  {
    std::lock_guard<std::mutex> lk(mutex_);
    if (!future_) {
      future_ = make_future(devices_);
      mark_now = completed_;
      err = exception_;
    }
    fut = future_;
  }
  if (mark_now) {
    if (err) fut->setError(err);
    else fut->markCompleted(c10::IValue(outputs_));
  }
  return fut;
}

// ---------------------------------------------------------------- BackendShoal

BackendShoal::BackendShoal(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                           c10::intrusive_ptr<Options> options)
    : c10d::Backend(rank, size),
      store_(store),
      options_(options ? std::move(options) : c10::make_intrusive<Options>()),
      completer_(std::make_shared<Completer>()) {
  TORCH_CHECK(store_, "shoal: the process group needs a store");
  shoal::Options o = shoal::Options::from_env({});
  o.timeout = options_->timeout;  // init_process_group(timeout=...) is every op's deadline
  if (!options_->transport.empty()) {
    const auto& t = options_->transport;
    TORCH_CHECK(t == "auto" || t == "shm" || t == "tcp", "shoal: Options.transport must be 'auto', 'shm' or 'tcp', got '",
                t, "'");
    o.transport = t == "shm" ? shoal::TransportKind::shm
                  : t == "tcp" ? shoal::TransportKind::tcp
                               : shoal::TransportKind::automatic;
  }
  if (options_->tcp_streams > 0) o.tcp_streams = options_->tcp_streams;
  const std::string name = options_->group_name.empty() ? std::string("torch") : options_->group_name;
  group_ = (options_->front == "ray" ? "Ray collective group '" : "process group '") + name + "'";
  o.group_name = options_->front + ":" + name;
  try {
    comm_ = std::make_shared<shoal::Communicator>(std::make_shared<C10dStoreAdapter>(store_), rank, size, o);
  } catch (const std::exception& e) {
    TORCH_CHECK_WITH(DistBackendError, false, "shoal: creating the ", group_, " (rank ", rank, " of ",
                     size, ") failed: ", e.what());
  }
  init();
}

BackendShoal::~BackendShoal() {
  try {
    shutdown();
  } catch (...) {
  }
}

std::vector<std::string> BackendShoal::transports() const {
  std::vector<std::string> out;
  if (!comm_) return out;
  for (int r = 0; r < size_; ++r) out.push_back(comm_->transport_to(r));
  return out;
}

c10::intrusive_ptr<c10d::Work> BackendShoal::launch(c10d::OpType type, const char* title,
                                                    const std::vector<at::Tensor>& inputs,
                                                    std::vector<at::Tensor> outputs, Builder& b, Start start,
                                                    int source_rank) {
  OpContext ctx{type, rank_, size_, group_};
  auto work = c10::make_intrusive<WorkShoal>(rank_, type, title, inputs, std::move(outputs), ctx, ++seq_, source_rank,
                                             completer_);
  if (start == Start::here && b.ops.size() == 1) {
    // The caller waits at once: the op runs here, with no shoal Work, queue or callbacks
    // (BENCHMARKS.md, "A collective waited for at once runs in the call"). Several ops would be
    // submitted together instead, so that no other thread's op runs between them.
    std::exception_ptr err = run_blocking(b.ops[0]);
    work->finish(std::move(b.plan), err);
    if (err) std::rethrow_exception(torch_error(ctx.str(), err));
    return work;
  }
  std::vector<shoal::WorkPtr> parts;
  std::exception_ptr err;
  {
    std::lock_guard<std::mutex> lk(submit_mu_);
    if (!comm_) {
      err = std::make_exception_ptr(
          c10::DistBackendError(SHOAL_SRC, "shoal: " + ctx.str() + ": the process group was shut down or destroyed"));
    } else {
      try {
        for (auto& f : b.ops) parts.push_back(f(*comm_, shoal::CallOptions{}));
      } catch (...) {
        err = torch_error(ctx.str(), std::current_exception());
      }
    }
  }
  work->start(std::move(b.plan), parts);  // keeps the buffers of ops already submitted alive
  if (err) std::rethrow_exception(err);
  if (start == Start::background)
    for (const auto& p : parts) p->run_async();
  return work;
}

std::exception_ptr BackendShoal::run_blocking(const OpFn& op) {
  // Outside submit_mu_ (abort() takes it while the op runs); the reference keeps the
  // communicator alive through a shutdown() meanwhile.
  std::shared_ptr<shoal::Communicator> comm;
  {
    std::lock_guard<std::mutex> lk(submit_mu_);
    comm = comm_;
  }
  if (!comm) return std::make_exception_ptr(shoal::Error("the process group was shut down or destroyed"));
  // Without the GIL, should a caller hold it: the op may wait for ops before it on the progress
  // thread, which can drop the last reference to a tensor a Python object owns.
  PyThreadState* gil = holds_gil() ? PyEval_SaveThread() : nullptr;
  std::exception_ptr err;
  try {
    shoal::CallOptions o;
    o.blocking = true;
    op(*comm, o);
  } catch (...) {
    err = std::current_exception();
  }
  comm.reset();  // the last reference after a shutdown() meanwhile: destroyed without the GIL
  if (gil) PyEval_RestoreThread(gil);
  return err;
}

bool BackendShoal::allreduce_inline(at::Tensor& t, const c10d::ReduceOp& rop) {
  if (t.layout() != c10::kStrided || !Builder::direct(t) || t.is_complex()) return false;
  const shoal::DType dt = reduce_dtype(t, "all_reduce_");
  const shoal::ReduceOp op = reduce_op(rop, dt, t, "all_reduce_");
  ++seq_;
  void* p = t.data_ptr();
  const size_t n = static_cast<size_t>(t.numel());
  std::exception_ptr err = run_blocking([&](auto& c, auto o) { return c.allreduce(p, p, n, dt, op, o); });
  if (err) std::rethrow_exception(torch_error(OpContext{c10d::OpType::ALLREDUCE, rank_, size_, group_}.str(), err));
  return true;
}

// ---- collectives ----

c10::intrusive_ptr<c10d::Work> BackendShoal::broadcast(std::vector<at::Tensor>& tensors,
                                                       const c10d::BroadcastOptions& opts) {
  const at::Tensor& t = single(tensors, "broadcast");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_, "shoal: broadcast: invalid root rank ", opts.rootRank);
  TORCH_CHECK(opts.rootTensor == 0, "shoal: broadcast: rootTensor must be 0");
  const int root = static_cast<int>(opts.rootRank);
  Builder b;
  at::Tensor buf = rank_ == root ? b.in(t) : b.out(t);
  Move m = move_type(t);
  size_t n = elems(t, m);
  b.op([=](auto& c, auto o) { return c.broadcast(buf.data_ptr(), n, m.dt, root, o); });
  return launch(c10d::OpType::BROADCAST, "shoal:broadcast", tensors, tensors, b, opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> BackendShoal::allreduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::AllreduceOptions& opts) {
  const at::Tensor& t = single(tensors, "allreduce");
  TORCH_CHECK(!opts.sparseIndices.has_value(), "shoal: allreduce does not support sparse tensors");
  shoal::DType dt = reduce_dtype(t, "allreduce");
  shoal::ReduceOp op = reduce_op(opts.reduceOp, dt, t, "allreduce");
  Builder b;
  at::Tensor buf = b.out(t, /*copy_in=*/true);
  size_t n = t.numel();
  b.op([=](auto& c, auto o) { return c.allreduce(buf.data_ptr(), buf.data_ptr(), n, dt, op, o); });
  return launch(c10d::OpType::ALLREDUCE, "shoal:all_reduce", tensors, tensors, b, opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> BackendShoal::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                 const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "shoal: allreduce_coalesced needs at least one tensor");
  for (const auto& t : tensors) check_like(t, tensors[0], "allreduce_coalesced");
  shoal::DType dt = reduce_dtype(tensors[0], "allreduce_coalesced");
  shoal::ReduceOp op = reduce_op(opts.reduceOp, dt, tensors[0], "allreduce_coalesced");
  // One allreduce over the tensors packed back to back.
  int64_t total = 0;
  for (const auto& t : tensors) total += t.numel();
  Builder b;
  at::Tensor flat = unpacked_later(b, tensors, total, tensors[0], /*read_first=*/true);
  b.op([=](auto& c, auto o) {
    return c.allreduce(flat.data_ptr(), flat.data_ptr(), static_cast<size_t>(total), dt, op, o);
  });
  return launch(c10d::OpType::ALLREDUCE_COALESCED, "shoal:allreduce_coalesced", tensors, tensors, b, opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> BackendShoal::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  const at::Tensor& t = single(tensors, "reduce");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_, "shoal: reduce: invalid root rank ", opts.rootRank);
  TORCH_CHECK(opts.rootTensor == 0, "shoal: reduce: rootTensor must be 0");
  const int root = static_cast<int>(opts.rootRank);
  shoal::DType dt = reduce_dtype(t, "reduce");
  shoal::ReduceOp op = reduce_op(opts.reduceOp, dt, t, "reduce");
  Builder b;
  const bool me = rank_ == root;
  at::Tensor buf = me ? b.out(t, /*copy_in=*/true) : b.in(t);
  size_t n = t.numel();
  b.op([=](auto& c, auto o) {
    return c.reduce(buf.data_ptr(), me ? buf.data_ptr() : nullptr, n, dt, op, root, o);
  });
  return launch(c10d::OpType::REDUCE, "shoal:reduce", tensors, tensors, b, opts.asyncOp);
}

namespace {

// allgather of `in` into `outs` (one tensor per rank, sizes may differ): one allgatherv into a
// flat buffer, then copied out.
void add_allgather_list(Builder& b, const at::Tensor& in, const std::vector<at::Tensor>& outs, int rank, int size,
                        const char* what) {
  check_tensor(in, what);
  TORCH_CHECK(static_cast<int>(outs.size()) == size, "shoal: ", what, " needs one output tensor per rank (", size,
              "), got ", outs.size());
  Move m = move_type(in);
  std::vector<size_t> counts(size);
  int64_t total = 0;
  for (int r = 0; r < size; ++r) {
    check_like(outs[r], in, what);
    counts[r] = elems(outs[r], m);
    total += outs[r].numel();
  }
  TORCH_CHECK(outs[rank].numel() == in.numel(), "shoal: ", what, ": output tensor ", rank, " has ", outs[rank].numel(),
              " elements but the input has ", in.numel());
  at::Tensor flat = unpacked_later(b, outs, total, in);
  at::Tensor src = b.apart_from(b.in(in), flat);
  b.op([=](auto& c, auto o) { return c.allgatherv(src.data_ptr(), flat.data_ptr(), counts, m.dt, o); });
}

void add_allgather_base(Builder& b, const at::Tensor& output, const at::Tensor& input, int size, const char* what) {
  check_tensor(input, what);
  check_like(output, input, what);
  TORCH_CHECK(output.numel() == input.numel() * size, "shoal: ", what, ": the output has ", output.numel(),
              " elements, expected world size (", size, ") x input (", input.numel(), ")");
  Move m = move_type(input);
  at::Tensor out = b.out(output);
  at::Tensor in = b.apart_from(b.in(input), out);
  size_t n = elems(input, m);
  b.op([=](auto& c, auto o) { return c.allgather(in.data_ptr(), out.data_ptr(), n, m.dt, o); });
}

void add_reduce_scatter_base(Builder& b, const at::Tensor& output, const at::Tensor& input,
                             const c10d::ReduceOp& rop, int size, const char* what) {
  check_tensor(input, what);
  check_like(output, input, what);
  TORCH_CHECK(input.numel() == output.numel() * size, "shoal: ", what, ": the input has ", input.numel(),
              " elements, expected world size (", size, ") x output (", output.numel(), ")");
  shoal::DType dt = reduce_dtype(input, what);
  shoal::ReduceOp op = reduce_op(rop, dt, input, what);
  at::Tensor out = b.out(output);
  at::Tensor in = b.apart_from(b.in(input), out);
  size_t n = output.numel();
  b.op([=](auto& c, auto o) { return c.reduce_scatter(in.data_ptr(), out.data_ptr(), n, dt, op, o); });
}

std::vector<at::Tensor> flatten(const std::vector<std::vector<at::Tensor>>& lists) {
  std::vector<at::Tensor> out;
  for (const auto& l : lists) out.insert(out.end(), l.begin(), l.end());
  return out;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> BackendShoal::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::AllgatherOptions& opts) {
  const at::Tensor& in = single(inputs, "allgather");
  TORCH_CHECK(outputs.size() == 1, "shoal: allgather takes one list of output tensors per process, got ",
              outputs.size());
  Builder b;
  add_allgather_list(b, in, outputs[0], rank_, size_, "allgather");
  return launch(c10d::OpType::ALLGATHER, "shoal:all_gather", inputs, outputs[0], b, opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> BackendShoal::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                             const c10d::AllgatherOptions& opts) {
  Builder b;
  add_allgather_base(b, output, input, size_, "allgather_into_tensor");
  return launch(c10d::OpType::_ALLGATHER_BASE, "shoal:_allgather_base", {input}, {output}, b, opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> BackendShoal::allgather_coalesced(std::vector<std::vector<at::Tensor>>& output_lists,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) {
  // output_lists[r][i] receives rank r's inputs[i].
  TORCH_CHECK(static_cast<int>(output_lists.size()) == size_, "shoal: allgather_coalesced needs one output list per rank (",
              size_, "), got ", output_lists.size());
  Builder b;
  // Each allgather writes its outputs, in place where they are chunks of one buffer, before the
  // next reads its input: an input that overlaps any output is read from a copy made now.
  std::vector<at::Tensor> ins = inputs;
  const std::vector<at::Tensor> all_outs = flatten(output_lists);
  for (auto& in : ins)
    if (std::any_of(all_outs.begin(), all_outs.end(), [&](const at::Tensor& o) { return overlaps(in, o); }))
      in = b.keep(in.clone());
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::vector<at::Tensor> outs;
    for (int r = 0; r < size_; ++r) {
      TORCH_CHECK(output_lists[r].size() == inputs.size(), "shoal: allgather_coalesced: output list ", r, " has ",
                  output_lists[r].size(), " tensors, expected ", inputs.size());
      outs.push_back(output_lists[r][i]);
    }
    add_allgather_list(b, ins[i], outs, rank_, size_, "allgather_coalesced");
  }
  return launch(c10d::OpType::ALLGATHER_COALESCED, "shoal:allgather_coalesced", inputs, all_outs, b, opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> BackendShoal::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                             std::vector<at::Tensor>& inputs,
                                                                             const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(), "shoal: allgather_into_tensor_coalesced: ", outputs.size(),
              " outputs for ", inputs.size(), " inputs");
  Builder b;
  for (size_t i = 0; i < inputs.size(); ++i)
    add_allgather_base(b, outputs[i], inputs[i], size_, "allgather_into_tensor_coalesced");
  return launch(c10d::OpType::COALESCED, "shoal:allgather_into_tensor_coalesced", inputs, outputs, b, opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> BackendShoal::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                    std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  const at::Tensor& t = single(inputs, "gather");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_, "shoal: gather: invalid root rank ", opts.rootRank);
  const int root = static_cast<int>(opts.rootRank);
  Move m = move_type(t);
  size_t n = elems(t, m);
  Builder b;
  at::Tensor in = b.in(t);
  at::Tensor flat;
  std::vector<at::Tensor> outs;
  if (rank_ == root) {
    TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_,
                "shoal: gather: the root needs one list of ", size_, " output tensors");
    outs = outputs[0];
    for (const auto& o : outs) {
      check_like(o, t, "gather");
      TORCH_CHECK(o.numel() == t.numel(), "shoal: gather: every output tensor must have as many elements as the input (",
                  t.numel(), "), got ", o.numel());
    }
    flat = unpacked_later(b, outs, t.numel() * size_, t);
    in = b.apart_from(in, flat);
  }
  b.op([=](auto& c, auto o) { return c.gather(in.data_ptr(), flat.defined() ? flat.data_ptr() : nullptr, n, m.dt, root, o); });
  return launch(c10d::OpType::GATHER, "shoal:gather", inputs, outs, b, opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> BackendShoal::scatter(std::vector<at::Tensor>& outputs,
                                                     std::vector<std::vector<at::Tensor>>& inputs,
                                                     const c10d::ScatterOptions& opts) {
  const at::Tensor& t = single(outputs, "scatter");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_, "shoal: scatter: invalid root rank ", opts.rootRank);
  const int root = static_cast<int>(opts.rootRank);
  Move m = move_type(t);
  size_t n = elems(t, m);
  Builder b;
  at::Tensor out = b.out(t);
  at::Tensor flat;
  std::vector<at::Tensor> ins;
  if (rank_ == root) {
    TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
                "shoal: scatter: the root needs one list of ", size_, " input tensors");
    ins = inputs[0];
    for (const auto& i : ins) {
      check_like(i, t, "scatter");
      TORCH_CHECK(i.numel() == t.numel(), "shoal: scatter: every input tensor must have as many elements as the output (",
                  t.numel(), "), got ", i.numel());
    }
    flat = packed(b, ins, t.numel() * size_, t, out);
  }
  b.op([=](auto& c, auto o) { return c.scatter(flat.defined() ? flat.data_ptr() : nullptr, out.data_ptr(), n, m.dt, root, o); });
  return launch(c10d::OpType::SCATTER, "shoal:scatter", ins, outputs, b, opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> BackendShoal::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                            std::vector<std::vector<at::Tensor>>& inputs,
                                                            const c10d::ReduceScatterOptions& opts) {
  const at::Tensor& t = single(outputs, "reduce_scatter");
  TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
              "shoal: reduce_scatter needs one list of ", size_, " input tensors");
  shoal::DType dt = reduce_dtype(t, "reduce_scatter");
  shoal::ReduceOp op = reduce_op(opts.reduceOp, dt, t, "reduce_scatter");
  for (const auto& i : inputs[0]) {
    check_like(i, t, "reduce_scatter");
    TORCH_CHECK(i.numel() == t.numel(), "shoal: reduce_scatter: every input tensor must have as many elements as the output (",
                t.numel(), "), got ", i.numel(), " (uneven reduce_scatter is not supported)");
  }
  Builder b;
  at::Tensor out = b.out(t);
  at::Tensor flat = packed(b, inputs[0], t.numel() * size_, t, out);
  size_t n = t.numel();
  b.op([=](auto& c, auto o) { return c.reduce_scatter(flat.data_ptr(), out.data_ptr(), n, dt, op, o); });
  return launch(c10d::OpType::REDUCE_SCATTER, "shoal:reduce_scatter", inputs[0], outputs, b, opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> BackendShoal::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                  const c10d::ReduceScatterOptions& opts) {
  Builder b;
  add_reduce_scatter_base(b, output, input, opts.reduceOp, size_, "reduce_scatter_tensor");
  return launch(c10d::OpType::_REDUCE_SCATTER_BASE, "shoal:_reduce_scatter_base", {input}, {output}, b, opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> BackendShoal::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                             std::vector<at::Tensor>& inputs,
                                                                             const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(), "shoal: reduce_scatter_tensor_coalesced: ", outputs.size(),
              " outputs for ", inputs.size(), " inputs");
  Builder b;
  for (size_t i = 0; i < inputs.size(); ++i)
    add_reduce_scatter_base(b, outputs[i], inputs[i], opts.reduceOp, size_, "reduce_scatter_tensor_coalesced");
  return launch(reduce_scatter_tensor_coalesced_type(), "shoal:reduce_scatter_tensor_coalesced", inputs, outputs, b, opts.asyncOp);
}

namespace {
// Elements per rank of an all-to-all buffer split along dim 0 (equal split when `splits` is empty).
std::vector<size_t> split_counts(const at::Tensor& t, const std::vector<int64_t>& splits, int size, const Move& m,
                                 const char* which) {
  const int64_t rows = t.dim() > 0 ? t.size(0) : 1;
  int64_t row_elems = 1;
  for (int64_t d = 1; d < t.dim(); ++d) row_elems *= t.size(d);
  std::vector<size_t> counts(size);
  if (splits.empty()) {
    TORCH_CHECK(rows % size == 0, "shoal: alltoall_base: dim 0 of the ", which, " (", rows,
                ") must divide evenly by the world size (", size, ") when no split sizes are given");
    for (auto& c : counts) c = static_cast<size_t>(rows / size * row_elems) * m.scale;
  } else {
    TORCH_CHECK(static_cast<int>(splits.size()) == size, "shoal: alltoall_base: ", which, " split sizes need one entry per rank (",
                size, "), got ", splits.size());
    int64_t sum = 0;
    for (int r = 0; r < size; ++r) {
      TORCH_CHECK(splits[r] >= 0, "shoal: alltoall_base: negative ", which, " split size");
      sum += splits[r];
      counts[r] = static_cast<size_t>(splits[r] * row_elems) * m.scale;
    }
    TORCH_CHECK(sum == rows, "shoal: alltoall_base: ", which, " split sizes add up to ", sum, " but dim 0 is ", rows);
  }
  return counts;
}
}  // namespace

c10::intrusive_ptr<c10d::Work> BackendShoal::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                           std::vector<int64_t>& output_splits,
                                                           std::vector<int64_t>& input_splits,
                                                           const c10d::AllToAllOptions& opts) {
  check_tensor(input, "alltoall_base");
  check_like(output, input, "alltoall_base");
  Move m = move_type(input);
  auto send_counts = split_counts(input, input_splits, size_, m, "input");
  auto recv_counts = split_counts(output, output_splits, size_, m, "output");
  Builder b;
  at::Tensor out = b.out(output);
  at::Tensor in = b.apart_from(b.in(input), out);
  b.op([=](auto& c, auto o) { return c.alltoallv(in.data_ptr(), send_counts, out.data_ptr(), recv_counts, m.dt, o); });
  return launch(c10d::OpType::ALLTOALL_BASE, "shoal:all_to_all", {input}, {output}, b, opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> BackendShoal::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                      const c10d::AllToAllOptions& opts) {
  TORCH_CHECK(static_cast<int>(inputs.size()) == size_ && static_cast<int>(outputs.size()) == size_,
              "shoal: alltoall needs one input and one output tensor per rank (", size_, ")");
  check_tensor(inputs[0], "alltoall");
  Move m = move_type(inputs[0]);
  std::vector<size_t> send_counts(size_), recv_counts(size_);
  int64_t sent = 0, got = 0;
  for (int r = 0; r < size_; ++r) {
    check_like(inputs[r], inputs[0], "alltoall");
    check_like(outputs[r], inputs[0], "alltoall");
    send_counts[r] = elems(inputs[r], m);
    recv_counts[r] = elems(outputs[r], m);
    sent += inputs[r].numel();
    got += outputs[r].numel();
  }
  Builder b;
  at::Tensor flat_out = unpacked_later(b, outputs, got, inputs[0]);
  at::Tensor flat_in = packed(b, inputs, sent, inputs[0], flat_out);
  b.op([=](auto& c, auto o) {
    return c.alltoallv(flat_in.data_ptr(), send_counts, flat_out.data_ptr(), recv_counts, m.dt, o);
  });
  return launch(c10d::OpType::ALLTOALL, "shoal:all_to_all", inputs, outputs, b, opts.asyncOp);
}

// ---- point to point ----

c10::intrusive_ptr<c10d::Work> BackendShoal::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  const at::Tensor& t = single(tensors, "send");
  TORCH_CHECK(dst >= 0 && dst < size_ && dst != rank_, "shoal: send: invalid destination rank ", dst);
  Move m = move_type(t);
  size_t n = elems(t, m);
  Builder b;
  at::Tensor buf = b.in(t);
  uint64_t tg = static_cast<uint64_t>(static_cast<int64_t>(tag));
  b.op([=](auto& c, auto o) { return c.send(buf.data_ptr(), n, m.dt, dst, tg, o); });
  return launch(c10d::OpType::SEND, "shoal:send", tensors, tensors, b, Start::queued);
}

c10::intrusive_ptr<c10d::Work> BackendShoal::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  const at::Tensor& t = single(tensors, "recv");
  TORCH_CHECK(src >= 0 && src < size_ && src != rank_, "shoal: recv: invalid source rank ", src);
  Move m = move_type(t);
  size_t n = elems(t, m);
  Builder b;
  at::Tensor buf = b.out(t);
  uint64_t tg = static_cast<uint64_t>(static_cast<int64_t>(tag));
  b.op([=](auto& c, auto o) { return c.recv(buf.data_ptr(), n, m.dt, src, tg, o); });
  return launch(c10d::OpType::RECV, "shoal:recv", tensors, tensors, b, Start::queued, src);
}

c10::intrusive_ptr<c10d::Work> BackendShoal::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  const at::Tensor& t = single(tensors, "recv");
  Move m = move_type(t);
  size_t n = elems(t, m);
  Builder b;
  at::Tensor buf = b.out(t);
  uint64_t tg = static_cast<uint64_t>(static_cast<int64_t>(tag));
  auto recv = std::make_shared<shoal::WorkPtr>();
  b.op([=](auto& c, auto o) {
    *recv = c.recv(buf.data_ptr(), n, m.dt, shoal::Communicator::kAnySource, tg, o);
    return *recv;
  });
  auto work = launch(c10d::OpType::RECVANYSOURCE, "shoal:recv_anysource", tensors, tensors, b, Start::queued, -1);
  if (auto* w = dynamic_cast<WorkShoal*>(work.get())) w->set_any_source(recv);
  return work;
}

c10::intrusive_ptr<c10d::Work> BackendShoal::barrier(const c10d::BarrierOptions& opts) {
  Builder b;
  b.op([](auto& c, auto o) { return c.barrier(o); });
  return launch(c10d::OpType::BARRIER, "shoal:barrier", {}, {}, b, opts.asyncOp);
}

// Through the store, not the communicator: the point is to name the ranks that do not arrive,
// within a timeout of the caller's choosing, and leave the communicator as it was.
void BackendShoal::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  // The messages are gloo's, word for word: tools and tests match on them.
  using std::chrono::milliseconds;
  const auto timeout = opts.timeout == c10d::kUnsetTimeout ? options_->timeout : opts.timeout;
  const std::string base = "shoal/monitored_barrier/" + std::to_string(monitored_barrier_seq_++) + "/";
  const auto start = std::chrono::steady_clock::now();
  // 0 would mean "no timeout" to a c10d store.
  auto store_wait = [&](const std::string& key, milliseconds t) { store_->wait({key}, std::max(t, milliseconds(1))); };
  if (rank_ != 0) {
    store_->set(base + std::to_string(rank_), std::string("1"));
    try {
      store_wait(base + "ack", timeout);
    } catch (const c10::Error&) {
      TORCH_CHECK_WITH(DistBackendError, false, "Rank ", rank_,
                       " successfully reached monitoredBarrier, but received errors while waiting for send/recv from "
                       "rank 0. Please check rank 0 logs for faulty rank.");
    }
    return;
  }
  std::vector<int> processed, failed;
  for (int r = 1; r < size_; ++r) {
    // As gloo: with wait_all_ranks every rank gets the whole timeout, else what is left of it.
    auto left = wait_all_ranks ? timeout
                               : timeout - std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - start);
    if (!wait_all_ranks && (left.count() < 0 || (timeout.count() == 0))) {
      std::string info = "No ranks successfully processed in monitoredBarrier.";
      if (!processed.empty()) {
        info = "Successfully processed ranks: ";
        for (size_t i = 0; i < processed.size(); ++i) info += (i ? ", " : "") + std::to_string(processed[i]);
      }
      TORCH_CHECK_WITH(DistBackendError, false, "Rank 0 timed out in monitoredBarrier after ", timeout.count(),
                       " ms.\n", info);
    }
    try {
      store_wait(base + std::to_string(r), left);
      processed.push_back(r);
    } catch (const c10::Error&) {
      if (!wait_all_ranks)
        TORCH_CHECK_WITH(DistBackendError, false, "[Rank 0]: Rank ", r, " failed to pass monitoredBarrier in ",
                         timeout.count(), " ms");
      failed.push_back(r);
    }
  }
  if (!failed.empty()) {
    std::string list;
    for (size_t i = 0; i < failed.size(); ++i) list += (i ? ", " : "") + std::to_string(failed[i]);
    TORCH_CHECK_WITH(DistBackendError, false, "[Rank 0]: Ranks ", list, " failed to pass monitoredBarrier in ",
                     timeout.count(), " ms");
  }
  store_->set(base + "ack", std::string("1"));
}

void BackendShoal::setSequenceNumberForGroup() { seq_.store(0); }
uint64_t BackendShoal::getSequenceNumberForGroup() { return seq_.load(); }

void BackendShoal::abort() {
  std::lock_guard<std::mutex> lk(submit_mu_);
  if (comm_) comm_->abort("the process group was aborted (ProcessGroup.abort)");
}

void BackendShoal::abort_because(const std::string& why) {
  std::lock_guard<std::mutex> lk(submit_mu_);
  if (comm_) comm_->abort(why);
}

void BackendShoal::shutdown() {
  std::shared_ptr<shoal::Communicator> c;
  {
    std::lock_guard<std::mutex> lk(submit_mu_);
    c.swap(comm_);
  }
  if (!c) return;
  // Destroying the communicator runs what is queued and joins its progress thread, which may need
  // the GIL (the last reference to a tensor a Python object owns can drop there): never hold the
  // GIL while waiting for it (the Python binding may call this, or the destructor, with it held).
  if (holds_gil()) {
    PyThreadState* state = PyEval_SaveThread();
    c.reset();
    PyEval_RestoreThread(state);
  } else {
    c.reset();
  }
}

}  // namespace shoal_torch
