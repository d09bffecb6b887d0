// BackendShoal: a c10d::Backend (what torch.distributed calls for every op of a process group)
// over one shoal::Communicator. WorkShoal: the c10d::Work it returns.
//
// Every op validates its tensors on the caller's thread, stages what shoal cannot use in place
// (non-contiguous tensors, tensors on an accelerator: copied to contiguous host memory, pinned
// for accelerators) and submits one or more shoal ops, which shoal runs in submission order. A
// collective whose caller waits at once (torch's asyncOp false, as dist.all_reduce sets it)
// runs as a blocking call on the caller's thread, and the Work returned is complete. Otherwise
// the ops run on the thread that waits for them or on the communicator's progress thread; when
// the last one completes, the copy-back into the caller's tensors runs (on that thread, before
// the next op), the Work is marked complete, and the Work's Future, if someone asked for it, is
// completed on this backend's completion thread, so that future callbacks (DDP comm hooks, user
// `then`s) never run on shoal's progress thread.
#pragma once
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "shoal/communicator.h"

namespace shoal_torch {

// One thread per backend that completes Futures (and so runs their callbacks).
class Completer {
 public:
  Completer() = default;
  ~Completer();
  Completer(const Completer&) = delete;
  Completer& operator=(const Completer&) = delete;
  void post(std::function<void()> fn);

 private:
  // Shared with the thread: a callback may release the Completer's last owner, and the thread
  // then drains the queue after the Completer is gone.
  struct Queue {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::function<void()>> fns;
    bool stop = false;
  };
  static void loop(const std::shared_ptr<Queue>& q);
  std::shared_ptr<Queue> q_ = std::make_shared<Queue>();
  std::thread thread_;
};

struct Builder;
// One shoal op of a torch op, submitted with the options given.
using OpFn = std::function<shoal::WorkPtr(shoal::Communicator&, const shoal::CallOptions&)>;

// What an error of an op names: "allreduce on rank 1 of process group '0' (4 ranks)". Built only
// for an error: formatting it for every op cost more than a small op itself.
struct OpContext {
  c10d::OpType type;
  int rank, size;
  std::string group;  // how errors name the group: "process group 'x'" or "Ray collective group 'x'"
  std::string str() const;
};

class WorkShoal : public c10d::Work {
 public:
  WorkShoal(int rank, c10d::OpType type, const char* profiling_title, const std::vector<at::Tensor>& inputs,
            std::vector<at::Tensor> outputs, OpContext context, uint64_t seq, int source_rank,
            std::shared_ptr<Completer> completer);
  ~WorkShoal() override;

  // Waiting without a timeout lets shoal run a queued collective on this thread (cheaper than a
  // hand-off to the progress thread and back for small ops); then as c10d::Work::wait.
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  int sourceRank() const override;
  uint64_t getSequencenumber() const override { return seq_; }

  // Internal: what runs when all the shoal ops of this work have completed.
  struct Plan {
    std::vector<at::Tensor> keep;                 // staging buffers alive until done
    std::vector<std::function<void()>> finalize;  // copy-backs, on success, in order
  };
  void start(Plan plan, const std::vector<shoal::WorkPtr>& parts);
  // Completes the work whose ops ran as blocking calls: the copy-backs of `plan` unless `err`.
  void finish(Plan plan, std::exception_ptr err);
  // A receive from any source learns its sender from the shoal Work once it completes.
  void set_any_source(std::shared_ptr<shoal::WorkPtr> recv) { any_source_ = std::move(recv); }

 private:
  void part_done(std::exception_ptr err);
  void complete(std::exception_ptr err);

  std::vector<at::Tensor> outputs_;
  std::vector<c10::Device> devices_;  // accelerator devices of the outputs (for the Future)
  OpContext context_;
  uint64_t seq_;
  int source_rank_;
  std::shared_ptr<shoal::WorkPtr> any_source_;
  std::shared_ptr<Completer> completer_;

  std::mutex part_mu_;
  std::vector<shoal::WorkPtr> parts_;  // until they complete
  int remaining_ = 0;
  std::exception_ptr first_error_;
  Plan plan_;

  c10::intrusive_ptr<c10::ivalue::Future> future_;  // guarded by mutex_ (the base class's)
};

class BackendShoal : public c10d::Backend {
 public:
  struct Options : c10d::Backend::Options {
    explicit Options(std::chrono::milliseconds timeout = kBackendDefaultTimeout)
        : c10d::Backend::Options("shoal", timeout) {}
    std::string transport;  // "", "auto", "shm", "tcp" ("" = SHOAL_TRANSPORT or auto)
    int tcp_streams = 0;    // 0 = SHOAL_TCP_STREAMS or the default
    std::string front = "torch";  // the API the group serves, "torch" or "ray": how errors name it
  };

  // Collective over the group: rendezvous through `store` (already prefixed by torch).
  BackendShoal(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, c10::intrusive_ptr<Options> options);
  ~BackendShoal() override;

  const std::string getBackendName() const override { return "shoal"; }
  c10::intrusive_ptr<c10d::Backend::Options> getBackendOptions() override { return options_; }
  c10::intrusive_ptr<Options> getOptions() { return options_; }
  // "shm", "tcp" or "self" for each peer, as the handshake decided.
  std::vector<std::string> transports() const;
  // Aborts the group so that every peer's op fails at once naming `why` (an argument this rank
  // refused, where its peers would otherwise wait for it until the timeout).
  void abort_because(const std::string& why);
  // All-reduce of a contiguous CPU tensor in place, on the calling thread, returning when done:
  // no Work, no future, none of torch.distributed's Python (shoal.torch.all_reduce_, as
  // DeepSpeed's inference_all_reduce_ for CPU tensor-parallel inference). One op of the group's
  // sequence, as dist.all_reduce. Returns false, doing nothing, for a tensor that is not a
  // contiguous dense CPU tensor of a real dtype (the caller goes through dist.all_reduce).
  bool allreduce_inline(at::Tensor& t, const c10d::ReduceOp& op);

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts = c10d::AllreduceCoalescedOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts = c10d::ReduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& output_lists, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts = c10d::GatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts = c10d::ScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits, std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks = false) override;

  void setSequenceNumberForGroup() override;
  uint64_t getSequenceNumberForGroup() override;

  void abort() override;
  void shutdown() override;

 private:
  // When the shoal ops of a torch op start.
  enum class Start {
    queued,      // point to point: when the caller waits, or when the progress thread finds them
    background,  // torch's asyncOp: the caller waits later, if at all; the progress thread starts them now
    here,        // asyncOp false: the caller waits at once; they run on its thread before the call returns
  };
  // Submits the shoal ops `b` collected (atomically with respect to other threads' ops on this
  // backend) and returns the Work that completes when they all have; with Start::here, one op
  // runs as a blocking call and the Work returned is complete.
  c10::intrusive_ptr<c10d::Work> launch(c10d::OpType type, const char* title, const std::vector<at::Tensor>& inputs,
                                        std::vector<at::Tensor> outputs, Builder& b, Start start, int source_rank = -1);
  // A collective's: as torch's asyncOp says.
  c10::intrusive_ptr<c10d::Work> launch(c10d::OpType type, const char* title, const std::vector<at::Tensor>& inputs,
                                        std::vector<at::Tensor> outputs, Builder& b, bool async_op) {
    return launch(type, title, inputs, std::move(outputs), b, async_op ? Start::background : Start::here);
  }
  // Runs `op` as a blocking call on this thread and returns its error.
  std::exception_ptr run_blocking(const OpFn& op);

  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<Options> options_;
  std::string group_;
  std::shared_ptr<Completer> completer_;
  std::mutex submit_mu_;
  std::shared_ptr<shoal::Communicator> comm_;  // null after shutdown()
  std::atomic<uint64_t> seq_{0};
  uint64_t monitored_barrier_seq_ = 0;
};

}  // namespace shoal_torch
