// The public Communicator: validates arguments on the caller's thread (bad input is an
// InvalidArgument there and then), queues the op, and runs ops in submission order on one
// progress thread. Point-to-point ops are posted and complete in the background, so a send and
// a receive issued back to back by two ranks cannot deadlock each other.
#include "shoal/communicator.h"

#include <pthread.h>

#include <algorithm>
#include <array>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <iterator>
#include <future>
#include <list>
#include <mutex>
#include <thread>

#include "algo/algorithms.h"
#include "algo/registry.h"
#include "algo/context.h"
#include "engine/engine.h"
#include "base/hash.h"
#include "base/log.h"
#include "base/params.h"
#include "core/rendezvous.h"
#include "core/ring.h"
#include "base/scratch.h"
#include "shoal/error.h"
#include "transport/shm_group_impl.h"

namespace shoal {
namespace {

// The errors of the argument checks every call makes, built out of line so that the checks
// themselves inline into the call (a small op's whole cost is a few hundred instructions).
[[noreturn, gnu::cold, gnu::noinline]] void bad_rank(int r, int size, const char* what, const char* role) {
  throw InvalidArgument(std::string(what) + ": invalid " + role + " rank " + std::to_string(r) + " (group size " +
                        std::to_string(size) + ")");
}
[[noreturn, gnu::cold, gnu::noinline]] void null_buffer(size_t count, const char* what, const char* name) {
  throw InvalidArgument(std::string(what) + ": " + name + " is null but count is " + std::to_string(count));
}
[[noreturn, gnu::cold, gnu::noinline]] void count_too_large(size_t count, const char* what) {
  throw InvalidArgument(std::string(what) + ": count " + std::to_string(count) + " is too large");
}
[[noreturn, gnu::cold, gnu::noinline]] void bad_reduce_op(DType dt, ReduceOp op, const char* what) {
  if (static_cast<unsigned>(op) > static_cast<unsigned>(ReduceOp::bxor))
    throw InvalidArgument(std::string(what) + ": unknown reduce op " + std::to_string(static_cast<int>(op)));
  throw InvalidArgument(std::string(what) + ": reduce op " + reduce_op_name(op) + " is not defined for dtype " + dtype_name(dt));
}

// How long an aborting rank waits for its reason to reach the store before it closes its links.
constexpr std::chrono::milliseconds kAbortPublishWait{500};
constexpr size_t kMaxPublished = 4096;  // bytes of an abort reason published to the store

// Collectives reach the progress thread lazily (Impl::submit says why). While ops were submitted
// within kActiveFor, the idle progress thread looks at the queue every tick, and takes a
// collective it has seen first in the queue, unclaimed, for kClaimGrace; after kActiveFor without
// a submit it sleeps until woken. (Only the progress thread reads the clock for this. While the
// communicator is eager, a submit and the first wait read the caller's usage: Impl::submit.) A
// tick starts at kTick and doubles, up to kMaxTick, until the thread takes an op, as while callers
// wait for their ops at once (an op it sees queued is usually claimed by its caller within
// kClaimGrace): each tick wakes the thread on a core that a rank's op needs (BENCHMARKS.md, "The
// progress thread's ticks").
constexpr std::chrono::microseconds kTick{1000};
constexpr std::chrono::microseconds kMaxTick{8000};
constexpr std::chrono::microseconds kClaimGrace{200};
constexpr std::chrono::milliseconds kActiveFor{100};
// How long a waiter progresses its p2p op itself while other ops are queued (run_claimed).
constexpr std::chrono::microseconds kInlineP2PFor{1000};

// A call in a CallRecord's words (base/call.h), and in words for errors and SHOAL_LOG=debug.
constexpr uint64_t kSendKind = 100, kRecvKind = 101;  // kinds past OpKind's: p2p
uint64_t call_what(uint64_t kind, DType dt, ReduceOp op, Algo algo, int root_or_peer) {
  return kind | uint64_t(dt) << 8 | uint64_t(op) << 16 | uint64_t(algo) << 24 | uint64_t(uint32_t(root_or_peer)) << 32;
}
std::string describe_call(const CallRecord& c) {
  if (c.seq == 0) return "no op yet";
  const uint64_t kind = c.what & 0xff;
  const auto dt = static_cast<DType>((c.what >> 8) & 0xff);
  const auto op = static_cast<ReduceOp>((c.what >> 16) & 0xff);
  const auto algo = static_cast<Algo>((c.what >> 24) & 0xff);
  const int root = static_cast<int32_t>(c.what >> 32);
  auto name_of = [](auto f, auto v) -> std::string {  // a peer's record is read, not trusted
    try {
      return f(v);
    } catch (...) {
      return "?";
    }
  };
  const std::string count = "count " + std::to_string(c.count) + ", " + name_of(dtype_name, dt);
  if (kind == kSendKind || kind == kRecvKind)
    return std::string(kind == kSendKind ? "send to rank " : "recv from ") +
           (root == Communicator::kAnySource ? std::string("any source") : (kind == kRecvKind ? "rank " : "") + std::to_string(root)) +
           " (" + count + ", tag " + std::to_string(c.tag) + ")";
  if (kind > static_cast<uint64_t>(OpKind::barrier)) return "an unknown op";
  const auto k = static_cast<OpKind>(kind);
  std::string s = std::string(op_kind_name(k)) + " #" + std::to_string(c.seq) + " (";
  if (k != OpKind::barrier) {
    s += count;
    if (k == OpKind::allreduce || k == OpKind::reduce || k == OpKind::reduce_scatter) s += ", " + name_of(reduce_op_name, op);
    if (k == OpKind::broadcast || k == OpKind::reduce || k == OpKind::gather || k == OpKind::scatter)
      s += ", root " + std::to_string(root);
    s += ", ";
  }
  return s + "algorithm " + name_of(algo_name, algo) + ")";
}

std::string message_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an op failed";
  }
}

// What each of `peers` published under key `what`<peer> when it aborted ("" where it did not
// within kAbortPublishWait, all looked up at once). A peer publishes before it closes its links,
// so an abort reason is there by the time we see the connection drop, and `lag` covers a store
// that lags; a peer's call is published once this rank's abort fails it in turn, so that lookup
// waits longer. Bounded as the publication is: a client's get waits for the server's reply well
// past its own timeout (kReplyGrace), so with the store's host unreachable the get alone took
// 10 s; it goes on in the background.
std::vector<std::string> published_by(const std::shared_ptr<Store>& store, const char* what,
                                      const std::vector<int>& peers, Millis lag) {
  std::vector<std::future<std::string>> values;
  for (int peer : peers) {
    auto got = std::make_shared<std::promise<std::string>>();
    values.push_back(got->get_future());
    std::thread([store, key = what + std::to_string(peer), got, lag] {
      std::string v;
      try {
        v = store->get_string(key, lag);
      } catch (...) {  // not published in time, or the store is gone
      }
      got->set_value(v);
    }).detach();
  }
  const auto deadline = Clock::now() + kAbortPublishWait;
  std::vector<std::string> out;
  for (auto& v : values) out.push_back(v.wait_until(deadline) == std::future_status::ready ? v.get() : "");
  return out;
}

// Once per process, at the first group: the SHOAL_* settings in effect (info), and variables that
// look like a misspelt one (warn: a typo otherwise goes unnoticed).
void log_settings_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (const std::string& t : params::probable_typos())
      SHOAL_LOG(warn, "%s is set but is not a shoal setting (`shoal-run --settings` lists them)", t.c_str());
    if (log_level() < LogLevel::info) return;
    std::string set;
    for (const std::string& s : params::set_in_environment()) set += " " + s;
    SHOAL_LOG(info, "settings:%s", set.empty() ? " all defaults" : set.c_str());
  });
}

// SHOAL_ALGO: one algorithm for every op that has it ("bde"), or one per op, named as the ops are
// ("allreduce:bde,broadcast:ring"; the ops not named choose their own). Either applies where the
// algorithm can run (direct: shared memory; hier: several hosts), the automatic choice elsewhere.
struct EnvAlgos {
  Algo all = Algo::automatic;
  std::array<Algo, static_cast<size_t>(OpKind::barrier) + 1> per_op{};  // Algo::automatic (0) by default
  Algo for_op(OpKind k) const { return per_op[static_cast<size_t>(k)] != Algo::automatic ? per_op[static_cast<size_t>(k)] : all; }
};

EnvAlgos env_algos() {
  EnvAlgos e;
  const auto s = params::text("SHOAL_ALGO");
  if (!s) return e;
  auto fail = [&](const std::string& why) { throw InvalidArgument("SHOAL_ALGO='" + *s + "': " + why); };
  auto algo = [&](const std::string& name) {
    try {
      return parse_algo(name);
    } catch (const InvalidArgument& x) {
      fail(x.what());
    }
    return Algo::automatic;
  };
  if (s->find(':') == std::string::npos) {
    e.all = algo(*s);
    return e;
  }
  std::string ops;
  for (size_t k = 0; k <= static_cast<size_t>(OpKind::barrier); ++k)
    ops += (k ? ", " : "") + std::string(op_kind_name(static_cast<OpKind>(k)));
  for (size_t start = 0; start <= s->size();) {
    size_t end = s->find(',', start);
    if (end == std::string::npos) end = s->size();
    const std::string item = s->substr(start, end - start);
    start = end + 1;
    if (item.empty()) continue;
    const size_t colon = item.find(':');
    if (colon == std::string::npos) fail("'" + item + "' is not op:algorithm (e.g. allreduce:bde)");
    const std::string op = item.substr(0, colon);
    size_t k = 0;
    while (k <= static_cast<size_t>(OpKind::barrier) && op != op_kind_name(static_cast<OpKind>(k))) ++k;
    if (k > static_cast<size_t>(OpKind::barrier)) fail("unknown op '" + op + "' (" + ops + ")");
    const Algo a = algo(item.substr(colon + 1));
    if (a != Algo::automatic && !has_algo(static_cast<OpKind>(k), a))
      fail(op + " has no algorithm '" + algo_name(a) + "' (it has: " + algos_of(static_cast<OpKind>(k)) + ")");
    e.per_op[k] = a;
  }
  return e;
}

}  // namespace

struct Communicator::Impl final : WorkDriver {
  Options opts;
  int rank, size;
  std::shared_ptr<Store> store;
  std::unique_ptr<Engine> engine;
  Topology topo;
  std::unique_ptr<ShmGroupImpl> shm;
  Scratch scratch;
  EnvAlgos env_algo;  // SHOAL_ALGO
  uint64_t coll_seq = 0;  // collectives run: part of every signature; by the thread that owns the engine

  struct Op {
    const char* what = "op";
    OpDesc desc;       // a collective: run to completion by run_op
    Request p2p{};     // a p2p op (is_p2p): posted, it completes in sweep_p2p
    CallRecord call;   // ... and how it is described (the engine's current call once posted)
    bool is_p2p = false;
    WorkPtr work;
    uint64_t id = 0;  // submission number
    bool collective() const { return !is_p2p; }
  };
  struct P2P {
    Request req;
    WorkPtr work;
    Clock::time_point deadline;
    CallRecord call;  // for the errors of its waits
  };
  std::mutex mu;
  std::condition_variable cv;
  Ring<Op> queue;
  std::atomic<int> queued{0};
  bool stop = false;
  bool running = false;       // an op is executing (on the progress thread, or inline after a claim under mu)
  // The fast path of a blocking call, which claims an idle engine without taking mu: a lock and an
  // unlock before the op and again after it were four locked instructions, each of which waits
  // until the stores the op made reach the peers' caches (BENCHMARKS.md, "Locked instructions on
  // the path of a small op"). kOpen: the engine is free, nothing is queued or
  // in flight and the communicator is not stopping (the gate is opened only then, under mu); a
  // blocking caller takes it with one compare-and-swap (kOpen -> kFast) and gives it back with
  // another (kFast -> kOpen). Any other thread that needs the state behind mu closes the gate first
  // (close_gate): kOpen -> kClosed, or marks a fast owner kDirty, whose give-back then goes through
  // mu. Under mu the engine is owned while `running` or kFast (engine_owned).
  static constexpr uint32_t kOpen = 0, kFast = 1, kDirty = 2, kClosed = 4;
  std::atomic<uint32_t> gate{kOpen};
  bool engine_owned() const { return running || (gate.load(std::memory_order_acquire) & kFast); }  // under mu
  void close_gate() {  // under mu
    uint32_t g = gate.load(std::memory_order_acquire);
    while (g != kClosed && !(g & kDirty) && !gate.compare_exchange_weak(g, g == kOpen ? kClosed : g | kDirty)) {
    }
  }
  void reopen_gate() {  // under mu: when nothing is left for the slow path
    if (!running && !stop && queue.empty() && npending.load() == 0 && !engine->aborted() &&
        gate.load(std::memory_order_relaxed) == kClosed)
      gate.store(kOpen, std::memory_order_release);
  }
  bool eager = false;         // callers here do not wait at once: wake the progress thread at submit
  WorkPtr last_taken;         // the op the progress thread took last (none after a kick)
  uint64_t take_now = 0;      // the progress thread takes the ops up to this id at once
  bool deep_sleep = false;    // the progress thread waits untimed: a submit must wake it
  uint64_t submitted = 0;     // ops ever submitted
  std::atomic<int> npending{0};  // size of `pending`, readable without the progress thread
  bool links_closed = false;  // progress thread only, after an abort
  std::list<P2P> pending;  // progress thread only
  std::list<P2P> spare;    // a node for a blocking p2p call's request, moved into `pending` (no allocation)
  std::thread thread;

  void loop();
  void run_one(Op& op);
  // Runs a collective on the thread that owns the engine. A failure other than a bad argument
  // aborts the group (every queued op fails with it); the error is returned.
  std::exception_ptr run_collective(const char* what, OpDesc& d);
  void sweep_p2p();
  bool match_any_source();  // posts pending any-source receives whose message has arrived
  void fail_all(std::exception_ptr e);
  // An op failed other than by a bad argument: the group is aborted (no-op if it already is, with
  // its own reason), its links closed, and every op queued or in flight fails with `e`.
  void fail_group(const std::exception_ptr& e) {
    engine->abort(message_of(e));  // no-op if it is aborted already, with its own reason
    if (shm) shm->quiesce_writes();  // no peer's write lands in a buffer the caller gets back
    engine->close_links();
    fail_all(e);
  }
  // Queues the op without waking the progress thread: its caller usually waits at once, and then
  // runs it on its own thread (the Work's helper, run_claimed), with no thread woken at all. A wake-up costs a futex system call and
  // puts the progress thread on a core that a peer rank needs; handing a small op over and back
  // cost 5-10x the op itself (BENCHMARKS.md, "Small messages: the hand-off to the progress
  // thread"). An op nobody waits for is taken by the ticking progress thread (kTick,
  // kClaimGrace) or woken for by run_async()/test()/a bounded wait (kick); once that happens the
  // communicator wakes the thread at every submit (eager) until a caller waits at once again:
  // for an op still queued, or for the op the thread took last, neither blocking nor using
  // kClaimGrace of CPU time after its submit.
  // While p2p ops are in flight the progress thread progresses them and takes every new op.
  WorkPtr submit(Op op);
  // A caller waits for `w`: runs the ops queued up to and including it on this thread (and
  // progresses a p2p `w` to completion), unless an op is running or p2p ops are in flight (then
  // the progress thread does).
  void run_claimed(const Work* w);
  void help(const Work* w) override { run_claimed(w); }
  void kick() override;  // the progress thread takes the queued ops now, and later ones while eager
  // The progress thread takes the ops queued now at once; with `and_later` (kick) it is woken for
  // each later op too (eager).
  void hand_queued_ops(bool and_later);
  bool queued_op(const Work* w) const {  // under mu
    for (size_t i = 0; i < queue.size(); ++i)
      if (queue[i].work.get() == w) return true;
    return false;
  }
  // Under mu, by the thread that owns the engine: gives it back, waking the progress thread if
  // anything is left for it.
  void release_engine();
  // For a blocking call: claims the engine for this thread if no op is queued, running or in
  // flight: through the gate, or else under mu (none if it cannot).
  enum class Claim { none, fast, slow };
  Claim claim_idle_engine() {
    uint32_t g = kOpen;
    if (gate.compare_exchange_strong(g, kFast, std::memory_order_acquire, std::memory_order_relaxed)) return Claim::fast;
    std::lock_guard<std::mutex> lk(mu);
    if (engine_owned() || stop || !queue.empty() || npending.load() != 0) return Claim::none;
    running = true;
    eager = false;  // this caller waits at once
    return Claim::slow;
  }
  // Gives the engine back; `handed_p2p` counts a p2p request left in `pending` for the progress
  // thread to complete (run_p2p_now), which takes the way through mu.
  void give_back_engine(Claim c, bool handed_p2p = false) {
    if (c == Claim::fast && !handed_p2p && !engine->aborted()) {
      uint32_t g = kFast;
      if (gate.compare_exchange_strong(g, kOpen, std::memory_order_release, std::memory_order_relaxed)) return;
    }
    std::lock_guard<std::mutex> lk(mu);
    if (c == Claim::fast) gate.store(kClosed, std::memory_order_relaxed);  // another thread came meanwhile
    if (handed_p2p) npending.fetch_add(1);
    release_engine();
  }
  // The call this thread runs now: the engine's record of it, and SHOAL_LOG=debug's line.
  void enter_call(const CallRecord& c) {
    engine->set_call(c);
    SHOAL_LOG(debug, "%s", describe_call(c).c_str());
  }
  // Progresses the p2p ops in flight (matching any-source receives) until until() holds or none
  // is left. The caller owns the engine (`running`). Throws what the engine's wait throws.
  void progress_p2p(const std::function<bool()>& until);
  WorkPtr p2p(Request::Dir dir, void* buf, size_t count, DType dt, int peer, uint64_t tag, bool blocking);
  // Posts `r` and progresses it to completion on this thread if the engine is free and nothing is
  // queued or in flight; false if not.
  // A request handed over to the progress thread (others queued ops meanwhile) returns its Work
  // in `handed_over`, complete.
  bool run_p2p_now(const Request& r, const CallRecord& call, WorkPtr* handed_over);
  void check_open() const {
    if (engine->aborted()) throw PeerError("group '" + opts.group_name + "' is aborted: " + engine->abort_reason());
  }
  void check_rank(int r, const char* what, const char* role) const {
    if (r < 0 || r >= size) [[unlikely]] bad_rank(r, size, what, role);
  }
  static void check_buf(const void* p, size_t count, const char* what, const char* name) {
    if (!p && count > 0) [[unlikely]] null_buffer(count, what, name);
  }
  static size_t bytes_of(size_t count, DType dt, const char* what) {
    size_t es = dtype_size(dt), limit;
    if (__builtin_mul_overflow(count, es * 4, &limit)) [[unlikely]] count_too_large(count, what);
    return count * es;
  }
  Algo pick(OpKind kind, Algo requested, size_t bytes) const {
    if (const Algo forced = env_algo.for_op(kind); requested == Algo::automatic && forced != Algo::automatic) {
      try {
        return choose_algo(kind, forced, bytes, size, topo.topo, topo.ways);
      } catch (const InvalidArgument&) {  // SHOAL_ALGO names an algorithm this op does not have
      }
    }
    return choose_algo(kind, requested, bytes, size, topo.topo, topo.ways);
  }
  static uint64_t signature(const OpDesc& d, size_t count, uint64_t extra) {
    return hash_mix(hash_mix(d.call, count), extra);  // sequence() adds the op's number
  }
  // By the thread that owns the engine, as the op starts: ops run in the order they were
  // submitted, so the ranks agree on the nth collective, whichever threads submit them. Its number
  // goes in its signature; returns it.
  uint64_t sequence(OpDesc& d) {
    const uint64_t seq = ++coll_seq;
    d.sig = hash_mix(d.sig, seq);
    return seq;
  }
  // Queues `d` as a collective, signed with `count` (what the ranks must agree on) and `extra`;
  // it runs with its own Ctx (run_one). A blocking call runs it at once on this thread when the
  // engine is free and nothing is queued (run_now), or waits for it.
  WorkPtr collective(OpDesc&& d, size_t count, uint64_t extra, bool blocking) {
    check_open();
    const char* what = op_kind_name(d.kind);
    d.sig = signature(d, count, extra);
    if (blocking && run_now(what, d)) return completed(d.kind);
    Op o;
    o.what = what;
    o.desc = std::move(d);
    WorkPtr w = submit(std::move(o));
    if (blocking) w->wait();
    return w;
  }
  // Runs `d` on this thread if the engine is free and no op is queued; false if it is not.
  bool run_now(const char* what, OpDesc& d);
  // A completed Work for blocking calls that ran at once, one per kind of op (shared: a completed
  // Work does not change).
  static WorkPtr completed(OpKind kind);
  // A Work finished without error (a recv's with its source), for the process's lifetime: blocking
  // calls that completed at once return it, shared, as unowned(): a pointer without a reference
  // count, whose copies and destruction cost no atomic operation (each one a locked instruction,
  // which waits for the op's last stores to reach the peer's cache).
  static Work* finished_work(const char* name, int source = -1) {
    auto* w = new Work(name);
    if (source >= 0) w->set_source(source);
    w->finish(nullptr);
    return w;
  }
  static WorkPtr unowned(Work* w) { return WorkPtr(WorkPtr(), w); }
  static WorkPtr completed_send();  // the same for a blocking send
  // ... and for a blocking receive from `peer` (its source()), made on first use.
  WorkPtr completed_recv(int peer);
  // The descriptor of a collective: its algorithm picked for `bytes`.
  OpDesc desc(OpKind kind, DType dt, ReduceOp op, Algo requested, size_t bytes, const void* in, void* out, size_t count,
              int root = -1) const {
    const Algo algo = pick(kind, requested, bytes);
    // The call word from the arguments, in one store: a load of the byte-wide fields, as one word,
    // would wait until they left the store buffer, behind the last op's stores to lines a peer
    // reads.
    return OpDesc{.kind = kind,
                  .algo = algo,
                  .dt = dt,
                  .op = op,
                  .root = root,
                  .in = in,
                  .out = out,
                  .count = count,
                  .counts = {},
                  .counts2 = {},
                  .call = call_what(static_cast<uint64_t>(kind), dt, op, algo, root)};
  }
  void post_p2p(Op& op);
  // allgather(v) once its counts are checked: `own` elements in, `total` out (counts empty: equal
  // blocks), signed with the counts' hash `h`.
  WorkPtr allgather_op(const void* in, void* out, size_t own, const std::vector<size_t>& counts, size_t total,
                       uint64_t h, DType dt, CallOptions o) {
    const size_t bytes = bytes_of(total, dt, "allgather");
    check_buf(in, own, "allgather", "input");
    check_buf(out, total, "allgather", "output");
    OpDesc d = desc(OpKind::allgatherv, dt, ReduceOp::sum, o.algo, bytes, in, out, own);
    d.counts = counts;
    return collective(std::move(d), total, h, o.blocking);
  }
};

Communicator::Communicator(std::shared_ptr<Store> store, int rank, int size, Options opts) : impl_(new Impl) {
  auto& m = *impl_;
  if (size < 1) throw InvalidArgument("Communicator: size must be >= 1, got " + std::to_string(size));
  if (rank < 0 || rank >= size)
    throw InvalidArgument("Communicator: rank " + std::to_string(rank) + " is out of range for size " + std::to_string(size));
  if (!store) throw InvalidArgument("Communicator: store is null");
  set_log_rank(rank);
  log_settings_once();
  m.opts = opts;
  m.rank = rank;
  m.size = size;
  m.store = store;
  m.env_algo = env_algos();
  // Each construction of a group with this name is a new instance with fresh keys.
  int64_t n = store->add("shoal/" + opts.group_name + "/instances", 1);
  auto prefixed = std::make_shared<PrefixStore>("shoal/" + opts.group_name + "/" + std::to_string((n - 1) / size), store);
  m.engine = std::make_unique<Engine>(rank, size, opts.group_name);
  m.engine->begin_op("rendezvous", Clock::now() + opts.timeout);
  m.topo = rendezvous(*prefixed, *m.engine, opts, store->local_address());
  // An aborting rank publishes why, and the call it was in (for a peer on another host that
  // found the mismatch: Engine::fail_mismatch).
  m.engine->describe_call = describe_call;
  Engine* engine = m.engine.get();
  // Set when this rank's abort could not reach the store in time: the lookups of its peers'
  // calls are skipped then (each would wait its full bound for nothing).
  auto store_lost = std::make_shared<std::atomic<bool>>(false);
  m.engine->publish_abort = [prefixed, rank, engine, store_lost](const std::string& full) {
    // Capped: a reason quotes the reason of the peer that failed first, which quotes its own.
    const std::string why = full.size() > kMaxPublished ? full.substr(0, kMaxPublished) + " [...]" : full;
    // Bounded: when the store cannot be reached (its host's link is down, or it died), the
    // abort must not wait for the store's timeout before failing this rank's ops. The set goes
    // on in the background (it owns what it uses); peers that look for the reason in time get it.
    auto done = std::make_shared<std::promise<void>>();
    auto published = done->get_future();
    std::thread([prefixed, rank, why, call = describe_call(engine->call()), done] {
      try {
        prefixed->set_string("abort/" + std::to_string(rank), why);
        prefixed->set_string("call/" + std::to_string(rank), call);
      } catch (...) {  // the store may be gone with the peer that hosted it
      }
      done->set_value();
    }).detach();
    if (published.wait_for(kAbortPublishWait) != std::future_status::ready) store_lost->store(true);
  };
  m.engine->peer_abort_reason = [prefixed](int peer) {
    return published_by(prefixed, "abort/", {peer}, Millis(200))[0];
  };
  m.engine->peer_calls = [prefixed, store_lost](const std::vector<int>& peers) {
    if (store_lost->load()) return std::vector<std::string>(peers.size());
    return published_by(prefixed, "call/", peers, std::chrono::duration_cast<Millis>(kAbortPublishWait));
  };
  if (m.topo.shm_all) {
    m.shm = std::make_unique<ShmGroupImpl>(*m.engine, m.engine->rank, m.topo.segs, m.topo.single_copy, m.topo.machine_cpus,
                                           m.opts.timeout);
    m.shm->prefault(shm_first_ops_areas(*m.shm, m.topo.ways.l2()));
  }
  m.thread = std::thread([this] { impl_->loop(); });
  pthread_setname_np(m.thread.native_handle(), "shoal-progress");  // for top -H, perf and gdb
}

Communicator::~Communicator() {
  auto& m = *impl_;
  {
    std::lock_guard<std::mutex> lk(m.mu);
    m.stop = true;
    m.close_gate();
  }
  m.cv.notify_all();
  m.engine->wake();
  if (m.thread.joinable()) m.thread.join();
  // Peers still waiting on this rank learn it is gone (shm: state word; tcp: the sockets close).
  if (m.topo.segs[m.rank].valid()) {
    auto* c = m.topo.segs[m.rank].control();
    if (c->state_of() == PeerState::alive) c->leave(PeerState::destroyed, "the communicator was destroyed");  // an abort's reason stays
  }
}

int Communicator::rank() const { return impl_->rank; }
int Communicator::size() const { return impl_->size; }
const Options& Communicator::options() const { return impl_->opts; }
std::string Communicator::transport_to(int peer) const {
  impl_->check_rank(peer, "transport_to", "peer");
  return impl_->topo.transport[peer];
}

bool Communicator::single_copy() const { return impl_->topo.single_copy; }

Algo Communicator::algo_for(const std::string& op, size_t bytes, CallOptions o) const {
  for (int k = 0; k <= static_cast<int>(OpKind::barrier); ++k)
    if (op == op_kind_name(static_cast<OpKind>(k))) return impl_->pick(static_cast<OpKind>(k), o.algo, bytes);
  throw InvalidArgument("algo_for: unknown op '" + op + "'");
}

WorkPtr Communicator::Impl::submit(Op op) {
  WorkPtr work = std::make_shared<Work>(op.what, this);
  op.work = work;
  bool wake, timed;
  {
    std::unique_lock<std::mutex> lk(mu);
    if (stop) throw Error("communicator is being destroyed");
    close_gate();
    op.id = ++submitted;
    queue.push_back(std::move(op));
    queued.fetch_add(1);
    // While eager, a Work notes what its caller does before it waits (Work::time_wait; the
    // thread's usage is read only then). The op the progress thread took last was waited for by
    // the thread that submitted it, which neither blocked nor used kClaimGrace of CPU time in
    // between: its caller waits at once, and was only a step behind the thread that the submit
    // woke, or off its CPU (ranks that share cores). Left eager, that thread would take op after
    // op from callers that wait for them (BENCHMARKS.md, "A late caller left every op to the
    // progress thread"). A caller that computes or blocks (I/O, a sleep) between its submit and
    // its wait stays eager: its ops start at once.
    if (eager) {
      const auto cpu = last_taken ? last_taken->cpu_before_wait() : std::chrono::nanoseconds(-1);
      if (cpu.count() >= 0 && cpu < kClaimGrace) eager = false, last_taken.reset();
    }
    timed = eager;
    if (eager) take_now = submitted;  // woken for: taken at once, even if a later submit ends eager
    // With point-to-point ops in flight the progress thread waits in the engine, and only it
    // can run the op (run_claimed declines).
    wake = eager || deep_sleep || npending.load() != 0;
  }
  if (timed) work->time_wait();  // outside mu: a system call; the Work is this thread's still
  if (wake) {
    cv.notify_one();
    engine->wake();
  }
  return work;
}

void Communicator::Impl::kick() { hand_queued_ops(true); }

void Communicator::Impl::hand_queued_ops(bool and_later) {
  {
    std::lock_guard<std::mutex> lk(mu);
    if (queue.empty()) return;
    take_now = submitted;  // these at once, even if a submit ends eager before the thread takes them
    if (and_later) eager = true, last_taken.reset();
  }
  cv.notify_one();
  engine->wake();
}

void Communicator::Impl::run_claimed(const Work* w) {
  // This thread claims the engine and takes the first op in one critical section (the common
  // case: `w` alone in the queue, a small collective whose fixed costs matter).
  bool found = false;
  Op op;
  {
    std::lock_guard<std::mutex> lk(mu);
    if (!engine_owned() && !stop && npending.load() == 0 && queued_op(w)) {
      running = true;
      op = queue.pop_front();
      queued.fetch_sub(1);
      if (op.work.get() == w) found = true, eager = false;  // this caller waits at once
    }
  }
  if (!op.work) {  // another thread runs ops, or p2p ops are in flight: the progress thread's
    hand_queued_ops(false);  // this caller waits at once: the later ops are still their callers'
    return;
  }
  // This thread owns the engine now: it runs the collectives and posts the p2p ops queued up to
  // and including `w`, in order, and the p2p ops right after it (a send waited for before the
  // receive posted after it must not keep that receive from its peer); then it progresses the
  // p2p ops until `w` completes.
  for (;;) {
    run_one(op);
    op.work.reset();
    std::lock_guard<std::mutex> lk(mu);
    if (queue.empty() || stop || (found && queue.front().collective())) {
      // Only collectives ran (nothing pending): nothing to progress or finish, no clock to read.
      if (pending.empty()) return release_engine();
      break;
    }
    op = queue.pop_front();
    queued.fetch_sub(1);
    if (op.work.get() == w) found = true, eager = false;
  }
  {
    auto in_flight = [&] {
      for (auto& p : pending)
        if (p.work.get() == w) return true;
      return false;
    };
    try {
      // Every p2p op that completes meanwhile is finished at once (another thread may wait for it,
      // and its peer for what that thread does next). A collective still queued behind `w` may be
      // what `w` needs (its peer posts the matching op after it): after kInlineP2PFor the progress
      // thread, which runs the queue, takes over; and at once when the communicator is destroyed.
      const auto give_up = Clock::now() + kInlineP2PFor;
      auto hand_over = [&] {
        if (queued.load() > 0 && Clock::now() > give_up) return true;
        std::lock_guard<std::mutex> lk(mu);
        return stop;
      };
      auto any_complete = [&] {
        for (auto& p : pending)
          if (p.req.complete) return true;
        return false;
      };
      while (found && in_flight() && !hand_over()) {
        progress_p2p([&] { return any_complete() || hand_over(); });
        sweep_p2p();
      }
      sweep_p2p();
    } catch (...) {
      fail_all(std::current_exception());
    }
  }
  give_back_engine(Claim::slow);
}

void Communicator::Impl::release_engine() {
  // Under the lock: once `running` is false the destructor may free this.
  running = false;
  if (npending.load() != 0 || !queue.empty() || stop || engine->aborted()) {
    cv.notify_all();  // the progress thread takes over what is left
    engine->wake();
  }
  reopen_gate();
}

void Communicator::Impl::fail_all(std::exception_ptr e) {
  // `pending` belongs to the thread that owns the engine (`running`), or to the progress thread
  // at its end; clear() of an empty list still writes its header, so an empty one is left alone.
  if (!pending.empty()) {
    for (auto& p : pending)
      if (p.work) p.work->finish(e);  // none: a blocking call's, which fails on its own thread
    pending.clear();
  }
  npending.store(0);
  Ring<Op> q;
  {
    std::lock_guard<std::mutex> lk(mu);
    q.swap(queue);
    queued.store(0);
  }
  while (!q.empty()) q.pop_front().work->finish(e);
}

bool Communicator::Impl::match_any_source() {
  bool matched = false;
  for (auto& p : pending) {
    if (p.req.peer != kAnySource) continue;
    for (int k = 1; k < size; ++k) {
      const int r = (rank + k) % size;
      FrameHeader h;
      Link* l = engine->link(r);
      if (l && l->peek(&h) && h.sig == p.req.sig) {  // same tag and dtype: this message is ours
        p.req.peer = r;
        p.work->set_source(r);
        engine->post(&p.req);
        matched = true;
        break;
      }
    }
  }
  return matched;
}

void Communicator::Impl::sweep_p2p() {
  match_any_source();
  for (auto it = pending.begin(); it != pending.end();) {
    if (it->req.complete) {
      it->work->finish(nullptr);
      it = pending.erase(it);
      npending.fetch_sub(1);
    } else {
      ++it;
    }
  }
}

void Communicator::Impl::run_one(Op& op) {
  if (op.collective()) {
    op.work->finish(run_collective(op.what, op.desc));
    return;
  }
  try {
    if (engine->aborted()) engine->throw_aborted();
    engine->begin_op(op.what, opts.timeout);
    post_p2p(op);  // it completes in sweep_p2p
  } catch (const InvalidArgument&) {
    op.work->finish(std::current_exception());  // this op only; the group is fine
  } catch (...) {
    auto e = std::current_exception();
    op.work->finish(e);
    fail_group(e);
  }
}

std::exception_ptr Communicator::Impl::run_collective(const char* what, OpDesc& d) {
  try {
    const uint64_t seq = sequence(d);
    if (engine->aborted()) engine->throw_aborted();
    // From the words one by one: a load of fields just stored, as one wider word, would wait
    // until they left the store buffer (desc()).
    enter_call(CallRecord{seq, d.call, d.count, 0});
    engine->begin_op(what, opts.timeout);
    const ReduceOp kernel_op = d.op == ReduceOp::avg ? ReduceOp::sum : d.op;  // avg: run_op scales
    Ctx ctx(*engine, shm.get(), scratch, rank, size, d.dt, kernel_op, what, d.sig, topo.topo, &topo.hosts, topo.ways);
    run_op(ctx, d);
    return nullptr;
  } catch (const InvalidArgument&) {
    return std::current_exception();  // this op only; the group is fine
  } catch (...) {
    auto e = std::current_exception();
    fail_group(e);
    return e;
  }
}

bool Communicator::Impl::run_now(const char* what, OpDesc& d) {
  const Claim c = claim_idle_engine();
  if (c == Claim::none) return false;
  std::exception_ptr e = run_collective(what, d);
  give_back_engine(c);
  if (e) std::rethrow_exception(e);
  return true;
}

WorkPtr Communicator::Impl::completed(OpKind kind) {
  static const auto works = [] {
    std::array<Work*, static_cast<size_t>(OpKind::barrier) + 1> w;
    for (size_t k = 0; k < w.size(); ++k) w[k] = finished_work(op_kind_name(static_cast<OpKind>(k)));
    return w;
  }();
  return unowned(works[static_cast<size_t>(kind)]);
}

void Communicator::Impl::loop() {
  uint64_t front_seen = 0;       // the op first in the queue when last looked, and since when
  Clock::time_point front_since;
  uint64_t submitted_seen = 0;   // `submitted` when it last changed, and when that was
  Clock::time_point active_at = Clock::now();
  auto tick = kTick;
  for (;;) {
    Op op;
    {
      std::unique_lock<std::mutex> lk(mu);
      // An inline op (running on a caller's thread) owns the engine until it ends. A queued op
      // belongs to its caller for kClaimGrace unless the communicator is eager.
      while (npending.load() == 0 || engine_owned()) {
        const bool owned = engine_owned();
        if ((stop && !owned) || (engine->aborted() && !links_closed && !owned)) break;
        const auto now = Clock::now();
        if (submitted != submitted_seen) submitted_seen = submitted, active_at = now;
        if (!queue.empty() && !owned) {
          const Op& front = queue.front();
          if (eager || front.id <= take_now) break;
          if (front.id != front_seen) front_seen = front.id, front_since = now;
          if (now - front_since >= kClaimGrace) break;
          cv.wait_until(lk, front_since + kClaimGrace);
        } else if (now - active_at < kActiveFor) {
          cv.wait_for(lk, tick);
          tick = std::min(2 * tick, kMaxTick);
        } else {
          deep_sleep = true;
          cv.wait(lk);
          deep_sleep = false;
        }
      }
      if (queue.empty() && stop) break;
      if (engine->aborted() && !links_closed) {  // abort() from another thread while idle
        links_closed = true;
        lk.unlock();
        engine->close_links();
        continue;
      }
      if (!queue.empty() && !engine_owned()) {
        op = queue.pop_front();
        queued.fetch_sub(1);
        running = true;
        // Taken after kClaimGrace: its caller did not wait for it at once (or p2p ops are in
        // flight). Ops taken at once (take_now: a kick, or a waiter that found the engine owned)
        // leave eager as it is.
        if (op.id > take_now) eager = true;
        last_taken = op.work;
        tick = kTick;
      }
    }
    if (op.work) {
      run_one(op);
      sweep_p2p();
      std::lock_guard<std::mutex> lk(mu);
      running = false;
      reopen_gate();
      continue;
    }
    // Only point-to-point ops in flight: progress them until one completes or a new op comes.
    {
      std::lock_guard<std::mutex> lk(mu);
      if (engine_owned() || npending.load() == 0) continue;  // a waiter took them over (run_claimed)
      running = true;
    }
    try {
      progress_p2p([&] {
        for (auto& p : pending)
          if (p.req.complete) return true;
        if (queued.load() > 0) return true;
        std::lock_guard<std::mutex> lk(mu);
        return stop;
      });
      sweep_p2p();
    } catch (...) {
      fail_all(std::current_exception());
    }
    std::lock_guard<std::mutex> lk(mu);
    running = false;
    reopen_gate();
  }
  fail_all(std::make_exception_ptr(Error("communicator destroyed with the op still pending")));
}

void Communicator::Impl::progress_p2p(const std::function<bool()>& until) {
  // Only the peers of incomplete requests are waited for: a peer whose requests have completed
  // may leave at once. When one completes the list is made again.
  auto incomplete = [this] {
    size_t n = 0;
    for (auto& p : pending) n += !p.req.complete;
    return n;
  };
  for (size_t left; !until() && (left = incomplete()) != 0;) {
    const P2P* first = nullptr;
    std::vector<int> peers;
    for (auto& p : pending) {
      if (p.req.complete) continue;
      if (!first || p.deadline < first->deadline) first = &p;
      for (int r = 0; r < size; ++r)
        if (r != rank && (p.req.peer == r || p.req.peer == kAnySource)) peers.push_back(r);
    }
    engine->begin_op(first->req.what, first->deadline);
    engine->set_call(first->call);
    auto news = [&] { return match_any_source() || until() || incomplete() != left; };
    engine->wait_for(news, peers);
  }
}

// ---- point to point ----

WorkPtr Communicator::Impl::p2p(Request::Dir dir, void* buf, size_t count, DType dt, int peer, uint64_t tag,
                                bool blocking) {
  const bool send = dir == Request::Dir::send;
  const char* what = send ? "send" : "recv";
  size_t bytes = bytes_of(count, dt, what);
  const bool any = !send && peer == kAnySource;
  if (!any) check_rank(peer, what, send ? "destination" : "source");
  if (peer == rank)
    throw InvalidArgument(std::string(what) + ": " + (send ? "destination" : "source") + " is this rank (" +
                          std::to_string(peer) + ")");
  check_buf(buf, count, what, "buffer");
  check_open();
  // Posted in the background (pending), so a send and a receive issued back to back by two
  // ranks cannot deadlock each other; the tag and dtype are part of the frame's signature.
  uint64_t sig = hash_mix(hash_mix(0x5032505ull, tag), static_cast<uint64_t>(dt));
  Op o;
  o.what = what;
  o.is_p2p = true;
  o.p2p = Request{dir, peer, static_cast<uint8_t*>(buf), bytes, sig, what};
  o.call = CallRecord{1, call_what(send ? kSendKind : kRecvKind, dt, ReduceOp::sum, Algo::automatic, peer), count, tag};
  if (blocking && !any) {
    WorkPtr w;
    if (run_p2p_now(o.p2p, o.call, &w)) return w ? w : send ? completed_send() : completed_recv(peer);
  }
  WorkPtr w = submit(std::move(o));
  if (blocking) w->wait();
  return w;
}

bool Communicator::Impl::run_p2p_now(const Request& r, const CallRecord& call, WorkPtr* handed_over) {
  const Claim c = claim_idle_engine();
  if (c == Claim::none) return false;
  // The request lives in `pending` (a stable address, as a queued p2p op's), without a Work
  // unless it is handed over; it is the only one there. It counts in `npending` only then: until
  // then this thread owns the engine, and other threads leave the request alone.
  if (spare.empty()) spare.emplace_back();
  pending.splice(pending.end(), spare, spare.begin());
  P2P& p = pending.back();
  p = P2P{r, nullptr, Clock::time_point::max(), call};
  std::exception_ptr e;
  try {
    enter_call(call);
    if (engine->aborted()) engine->throw_aborted();
    engine->begin_op(r.what, opts.timeout);
    engine->post(&p.req);
    if (!p.req.complete) engine->poll();  // a small message often moves at once: no clock, no wait loop
    if (!p.req.complete) {
      // As run_claimed: an op another thread queues meanwhile may be what the peer waits for
      // first; after kInlineP2PFor the progress thread takes over, and this caller waits.
      const auto now = Clock::now();
      p.deadline = now + opts.timeout;
      const auto give_up = now + kInlineP2PFor;
      progress_p2p([&] {
        if (p.req.complete || (queued.load() > 0 && Clock::now() > give_up)) return true;
        std::lock_guard<std::mutex> lk(mu);
        return stop;
      });
    }
  } catch (...) {  // the peer failed, or the deadline passed: the engine is aborted
    e = std::current_exception();
    fail_group(e);  // drops `p`
  }
  if (!e && !p.req.complete) {  // handed over: the progress thread completes it
    auto w = std::make_shared<Work>(r.what);
    if (r.dir == Request::Dir::recv) w->set_source(r.peer);
    p.work = w;
    give_back_engine(c, true);
    w->wait();
    *handed_over = w;
    return true;
  }
  if (!e) spare.splice(spare.end(), pending, std::prev(pending.end()));
  give_back_engine(c);
  if (e) std::rethrow_exception(e);
  return true;
}

WorkPtr Communicator::Impl::completed_recv(int peer) {
  // One per source rank, for the process's lifetime (shared by its communicators).
  static constexpr int kRanks = 4096;
  static std::atomic<Work*> works[kRanks];
  if (peer >= kRanks) return WorkPtr(finished_work("recv", peer));  // owned by the caller
  Work* w = works[peer].load(std::memory_order_acquire);
  if (!w) {
    Work* made = finished_work("recv", peer);
    if (works[peer].compare_exchange_strong(w, made, std::memory_order_acq_rel)) w = made;
    else delete made;  // another thread's is there (w)
  }
  return unowned(w);
}

WorkPtr Communicator::Impl::completed_send() {
  static Work* const w = finished_work("send");
  return unowned(w);
}

void Communicator::Impl::post_p2p(Op& op) {
  const Request& r = op.p2p;
  enter_call(op.call);
  pending.push_back(P2P{r, op.work, Clock::now() + opts.timeout, op.call});
  npending.fetch_add(1);
  if (r.peer == kAnySource) return;  // posted to a link once its message is seen (match_any_source)
  if (r.dir == Request::Dir::recv) op.work->set_source(r.peer);
  engine->post(&pending.back().req);
}

WorkPtr Communicator::send(const void* buf, size_t count, DType dt, int peer, uint64_t tag, CallOptions o) {
  return impl_->p2p(Request::Dir::send, const_cast<void*>(buf), count, dt, peer, tag, o.blocking);
}

WorkPtr Communicator::recv(void* buf, size_t count, DType dt, int peer, uint64_t tag, CallOptions o) {
  return impl_->p2p(Request::Dir::recv, buf, count, dt, peer, tag, o.blocking);
}

// ---- collectives ----

namespace {
// The signature's part for allgather(v)'s counts. Equal counts hash alike from either call, so the
// ranks may mix the two, in one mix whatever the group's size.
uint64_t equal_counts_hash(size_t count) { return hash_mix(0x616c6c676174686full, count); }

void check_reduce(DType dt, ReduceOp op, const char* what) {
  dtype_size(dt);  // throws for an unknown dtype
  if (!reduce_op_supported(dt, op)) [[unlikely]] bad_reduce_op(dt, op, what);
}
}  // namespace

WorkPtr Communicator::allreduce(const void* in, void* out, size_t count, DType dt, ReduceOp op, CallOptions o) {
  auto& m = *impl_;
  check_reduce(dt, op, "allreduce");
  size_t bytes = Impl::bytes_of(count, dt, "allreduce");
  Impl::check_buf(in, count, "allreduce", "input");
  Impl::check_buf(out, count, "allreduce", "output");
  return m.collective(m.desc(OpKind::allreduce, dt, op, o.algo, bytes, in, out, count), count, 0, o.blocking);
}

WorkPtr Communicator::broadcast(void* buf, size_t count, DType dt, int root, CallOptions o) {
  auto& m = *impl_;
  size_t bytes = Impl::bytes_of(count, dt, "broadcast");
  m.check_rank(root, "broadcast", "root");
  Impl::check_buf(buf, count, "broadcast", "buffer");
  return m.collective(m.desc(OpKind::broadcast, dt, ReduceOp::sum, o.algo, bytes, nullptr, buf, count, root), count, 0, o.blocking);
}

WorkPtr Communicator::reduce(const void* in, void* out, size_t count, DType dt, ReduceOp op, int root, CallOptions o) {
  auto& m = *impl_;
  check_reduce(dt, op, "reduce");
  size_t bytes = Impl::bytes_of(count, dt, "reduce");
  m.check_rank(root, "reduce", "root");
  Impl::check_buf(in, count, "reduce", "input");
  if (m.rank == root) Impl::check_buf(out, count, "reduce", "output at the root");
  return m.collective(m.desc(OpKind::reduce, dt, op, o.algo, bytes, in, out, count, root), count, 0, o.blocking);
}

WorkPtr Communicator::allgather(const void* in, void* out, size_t count, DType dt, CallOptions o) {
  auto& m = *impl_;
  if (count > SIZE_MAX / static_cast<size_t>(m.size))
    throw InvalidArgument("allgather: count " + std::to_string(count) + " is too large");
  const size_t total = count * static_cast<size_t>(m.size);
  return m.allgather_op(in, out, count, {}, total, equal_counts_hash(count), dt, o);
}

WorkPtr Communicator::allgatherv(const void* in, void* out, const std::vector<size_t>& counts, DType dt, CallOptions o) {
  auto& m = *impl_;
  if (counts.size() != static_cast<size_t>(m.size))
    throw InvalidArgument("allgather: counts has " + std::to_string(counts.size()) + " entries for a group of " +
                          std::to_string(m.size));
  size_t total = 0;
  bool equal = true;
  for (size_t c : counts) {
    if (__builtin_add_overflow(total, c, &total)) throw InvalidArgument("allgather: the counts' sum is too large");
    equal = equal && c == counts[0];
  }
  uint64_t h = equal_counts_hash(counts[0]);
  if (!equal)
    for (size_t c : counts) h = hash_mix(h, c);
  return m.allgather_op(in, out, counts[m.rank], counts, total, h, dt, o);
}

WorkPtr Communicator::reduce_scatter(const void* in, void* out, size_t count, DType dt, ReduceOp op, CallOptions o) {
  auto& m = *impl_;
  check_reduce(dt, op, "reduce_scatter");
  size_t bytes = Impl::bytes_of(count * m.size, dt, "reduce_scatter");
  Impl::check_buf(in, count, "reduce_scatter", "input");
  Impl::check_buf(out, count, "reduce_scatter", "output");
  return m.collective(m.desc(OpKind::reduce_scatter, dt, op, o.algo, bytes, in, out, count), count, 0, o.blocking);
}

WorkPtr Communicator::gather(const void* in, void* out, size_t count, DType dt, int root, CallOptions o) {
  auto& m = *impl_;
  size_t bytes = Impl::bytes_of(count * m.size, dt, "gather");
  m.check_rank(root, "gather", "root");
  Impl::check_buf(in, count, "gather", "input");
  if (m.rank == root) Impl::check_buf(out, count, "gather", "output at the root");
  return m.collective(m.desc(OpKind::gather, dt, ReduceOp::sum, o.algo, bytes, in, out, count, root), count, 0, o.blocking);
}

WorkPtr Communicator::scatter(const void* in, void* out, size_t count, DType dt, int root, CallOptions o) {
  auto& m = *impl_;
  size_t bytes = Impl::bytes_of(count * m.size, dt, "scatter");
  m.check_rank(root, "scatter", "root");
  if (m.rank == root) Impl::check_buf(in, count, "scatter", "input at the root");
  Impl::check_buf(out, count, "scatter", "output");
  return m.collective(m.desc(OpKind::scatter, dt, ReduceOp::sum, o.algo, bytes, in, out, count, root), count, 0, o.blocking);
}

WorkPtr Communicator::alltoall(const void* in, void* out, size_t count, DType dt, CallOptions o) {
  auto& m = *impl_;
  if (count > SIZE_MAX / static_cast<size_t>(m.size))
    throw InvalidArgument("alltoall: count " + std::to_string(count) + " is too large");
  const size_t total = count * static_cast<size_t>(m.size);
  size_t bytes = Impl::bytes_of(total, dt, "alltoall");
  Impl::check_buf(in, total, "alltoall", "input");
  Impl::check_buf(out, total, "alltoall", "output");
  // `extra` 1 tells this equal-blocks form from alltoallv in the signature.
  return m.collective(m.desc(OpKind::alltoallv, dt, ReduceOp::sum, o.algo, bytes, in, out, count), count, 1, o.blocking);
}

WorkPtr Communicator::alltoallv(const void* in, const std::vector<size_t>& send_counts, void* out,
                                const std::vector<size_t>& recv_counts, DType dt, CallOptions o) {
  auto& m = *impl_;
  if (send_counts.size() != static_cast<size_t>(m.size) || recv_counts.size() != static_cast<size_t>(m.size))
    throw InvalidArgument("alltoall: send_counts and recv_counts need one entry per rank (" + std::to_string(m.size) + ")");
  size_t sent = 0, got = 0;
  for (size_t c : send_counts) sent += c;
  for (size_t c : recv_counts) got += c;
  size_t bytes = Impl::bytes_of(std::max(sent, got), dt, "alltoall");
  Impl::check_buf(in, sent, "alltoall", "input");
  Impl::check_buf(out, got, "alltoall", "output");
  if (send_counts[m.rank] != recv_counts[m.rank])
    throw InvalidArgument("alltoall: this rank sends itself " + std::to_string(send_counts[m.rank]) +
                          " elements but expects " + std::to_string(recv_counts[m.rank]));
  OpDesc d = m.desc(OpKind::alltoallv, dt, ReduceOp::sum, o.algo, bytes, in, out, 0);
  d.counts = send_counts;
  d.counts2 = recv_counts;
  // Counts differ per rank by design, so only the dtype goes into the signature; each message's
  // size is checked by the framing against what the receiver expects.
  return m.collective(std::move(d), 0, 0, o.blocking);
}

WorkPtr Communicator::barrier() { return barrier(CallOptions{}); }

WorkPtr Communicator::barrier(CallOptions o) {
  auto& m = *impl_;
  return m.collective(m.desc(OpKind::barrier, DType::u8, ReduceOp::sum, o.algo, 0, nullptr, nullptr, 0), 0, 0, o.blocking);
}

void Communicator::abort(const std::string& why) {
  impl_->engine->abort(why);
  { std::lock_guard<std::mutex> lk(impl_->mu); }  // the idle progress thread re-checks after this
  impl_->cv.notify_all();
}
bool Communicator::aborted() const { return impl_->engine->aborted(); }

}  // namespace shoal
