// The measured cost curves of the ops with two ways on one host (cost.h), and the choice between them.
#include "algo/cost.h"
#include "base/hash.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <charconv>
#include <fstream>
#include <iterator>
#include <locale>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <vector>

#include "base/cpus.h"
#include "base/params.h"
#include "shoal/error.h"

namespace shoal::algo {
namespace {

// The output of `scripts/tune_algos.py --direct` on a 2-core AMD EPYC (the command is its first
// line; BENCHMARKS.md, "One shot or two shot" and "alltoall: the scratch slots or the rings"), with
// the switches.
const char* const kBuiltIn =
#include "algo/cost_points.inc"
    ;
// The same tune's output on a 2-core Intel Xeon, for the ops it has points of: the ways' costs
// differ by CPU (BENCHMARKS.md, "The built-in costs of an Intel Xeon").
const char* const kBuiltInIntel =
#include "algo/cost_points_intel.inc"
    ;

// The ops with two ways, by Choice.
constexpr const char* kChoiceNames[] = {"allreduce", "reduce", "alltoall", "alltoallv", "broadcast", "allgather", "scatter", "gather"};
constexpr Choice kChoices[] = {Choice::allreduce, Choice::reduce,    Choice::alltoall,
                               Choice::alltoallv, Choice::broadcast, Choice::allgather, Choice::scatter, Choice::gather};

// The settings that force a way, by Ways::forced_ index, and the values that force way 0 and a
// third way (Ways::forced_ 2); any other value but `auto` forces way 1.
struct Forcing {
  const char* setting;
  const char* way0;
  const char* way2 = nullptr;  // a third way, where the op has one
};
constexpr Forcing kForcings[] = {
    {"SHOAL_DIRECT_REDUCE", "one_shot", "single_copy"},
    {"SHOAL_DIRECT_ALLTOALL", "scratch"},
    {"SHOAL_DIRECT_BROADCAST", "scratch"},
    {"SHOAL_DIRECT_ALLGATHER", "scratch"},
    {"SHOAL_DIRECT_SCATTER", "scratch"},
    {"SHOAL_DIRECT_GATHER", "scratch"}};
static_assert(std::size(kForcings) == kForcedWays);
// The ops a tuning file may name, for its errors: "'allreduce', ... or 'gather'".
std::string choice_list() {
  std::string s;
  for (size_t i = 0; i < std::size(kChoiceNames); ++i)
    s += (i == 0 ? "'" : i + 1 == std::size(kChoiceNames) ? " or '" : ", '") + std::string(kChoiceNames[i]) + "'";
  return s;
}

int forcing_of(Choice op) {
  switch (op) {
    case Choice::allreduce:
    case Choice::reduce: return 0;
    case Choice::alltoall:
    case Choice::alltoallv: return 1;
    case Choice::broadcast: return 2;
    case Choice::allgather: return 3;
    case Choice::scatter: return 4;
    case Choice::gather: return 5;
  }
  return 0;
}
// The switches, by Switch.
constexpr const char* kSwitchNames[] = {
    "allreduce.mst_below", "allreduce.bde_up_to", "allreduce.bde_up_to_odd_p",
    "broadcast.mst_below", "broadcast.one_host.mst_below", "broadcast.chain_from",
    "reduce.mst_below", "allgather.rd_below", "reduce_scatter.halving_below", "reduce_scatter.halving_below_odd_p",
    "gather.mst_below", "scatter.mst_below",
    "hier.allreduce.split_from", "hier.broadcast.chain_from", "hier.allgather.ring_from"};
static_assert(std::size(kSwitchNames) == kSwitches);

// The lines for one group size in one order, whatever the file's: the switches' digest compares
// them.
void sort_at_ranks(Tuning& t) {
  std::sort(t.at_ranks.begin(), t.at_ranks.end(), [](const Tuning::AtRanks& a, const Tuning::AtRanks& b) {
    return std::make_pair(a.s, a.ranks) < std::make_pair(b.s, b.ranks);
  });
}

// `t` over `under`: under's points for the ops t has none of, and under's lines of the switches t
// does not set. A switch t names, with @ or without, is t's at every group size it names, and
// under's line without @ at the others.
Tuning over(Tuning t, const Tuning& under) {
  for (Choice op : kChoices)
    if (std::none_of(t.points.begin(), t.points.end(), [&](const CostPoint& q) { return q.op == op; }))
      for (const CostPoint& q : under.points)
        if (q.op == op) t.points.push_back(q);
  for (size_t i = 0; i < kSwitches; ++i) {
    if (!t.has_all[i]) t.switches[i] = under.switches[i], t.has_all[i] = true;
    if (t.has[i]) continue;
    t.has[i] = true;
    for (const Tuning::AtRanks& a : under.at_ranks)
      if (static_cast<size_t>(a.s) == i) t.at_ranks.push_back(a);
  }
  sort_at_ranks(t);
  return t;
}

// SHOAL_TUNING's tuning over the built-in one of `cpu`, its points in point_key's order.
Tuning load(const std::optional<std::string>& path, BuiltInCpu cpu) {
  Tuning t = parse_tuning(kBuiltIn, "the built-in tuning");
  for (size_t i = 0; i < kSwitches; ++i)
    if (!t.has_all[i]) throw Error(std::string("the built-in tuning has no switch ") + kSwitchNames[i]);
  if (cpu == BuiltInCpu::intel) t = over(parse_tuning(kBuiltInIntel, "the built-in tuning for Intel"), t);
  if (path) {
    std::ifstream f(*path);
    if (!f) throw InvalidArgument("SHOAL_TUNING='" + *path + "': cannot read the file");
    std::stringstream s;
    s << f.rdbuf();
    t = over(parse_tuning(s.str(), "SHOAL_TUNING='" + *path + "'"), t);
  }
  std::sort(t.points.begin(), t.points.end(),
            [](const CostPoint& a, const CostPoint& b) { return point_key(a) < point_key(b); });
  return t;
}

// The value at n of the straight lines through (xs[i], ys[i]), xs ascending: below the first
// point its value, above the last the last segment extended.
double on_segments(const std::vector<size_t>& xs, const std::vector<double>& ys, size_t n) {
  if (xs.size() == 1 || n <= xs[0]) return ys[0];
  size_t i = 1;
  while (i + 1 < xs.size() && xs[i] < n) ++i;
  const double f = (static_cast<double>(n) - xs[i - 1]) / static_cast<double>(xs[i] - xs[i - 1]);
  return ys[i - 1] + (ys[i] - ys[i - 1]) * f;
}

double at_ranks(const std::vector<CostPoint>& points, Choice op, int ranks, size_t n, int way, bool second) {
  std::vector<const CostPoint*> pts;
  for (const auto& q : points)
    if (q.op == op && q.ranks == ranks) pts.push_back(&q);
  std::sort(pts.begin(), pts.end(), [](auto* a, auto* b) { return a->bytes < b->bytes; });
  std::vector<size_t> xs;
  std::vector<double> ys;
  for (const auto* q : pts) xs.push_back(q->bytes), ys.push_back(second ? q->us2[way] : q->us[way]);
  return on_segments(xs, ys, n);
}

// Both ways' costs, from both pairs of times, for one op and group size at every measured message
// size, ascending: the choice per op is then a short search, with no allocation.
struct Curves {
  int ranks = 0;  // 0: not computed
  std::vector<size_t> bytes;
  std::vector<double> us[2][2];  // by pair (us, us2), then way

  // The way whose time over the faster way's is least in the worse pair (with one pair: the
  // faster way; ties go to way 0).
  int cheaper(size_t n) const {
    double worst[2] = {0, 0};
    for (const auto& pair : us) {
      // A last segment extended past the largest size may fall below zero: no time is.
      const double t[2] = {std::max(0.0, on_segments(bytes, pair[0], n)), std::max(0.0, on_segments(bytes, pair[1], n))};
      for (int way : {0, 1}) worst[way] = std::max(worst[way], t[way] / std::max(std::min(t[0], t[1]), 1e-9));
    }
    return worst[0] <= worst[1] ? 0 : 1;
  }
};

Curves curves_for(const std::vector<CostPoint>& points, Choice op, int p) {
  Curves c;
  c.ranks = p;
  for (const auto& q : points)
    if (q.op == op) c.bytes.push_back(q.bytes);
  std::sort(c.bytes.begin(), c.bytes.end());
  c.bytes.erase(std::unique(c.bytes.begin(), c.bytes.end()), c.bytes.end());
  for (size_t n : c.bytes)
    for (int second : {0, 1})
      for (int way : {0, 1}) c.us[second][way].push_back(way_us(points, op, p, n, way, second));
  return c;
}

[[noreturn]] void no_costs(Choice op) { throw Error(std::string("no measured costs for the direct ") + choice_name(op)); }

}  // namespace

const char* choice_name(Choice c) { return kChoiceNames[static_cast<int>(c)]; }

std::string agreed_settings() {
  std::string s = "SHOAL_TUNING, SHOAL_TUNING_BUILTIN";
  for (const Forcing& f : kForcings) s += std::string(", ") + f.setting;
  return s;
}
const char* switch_name(Switch s) { return kSwitchNames[static_cast<size_t>(s)]; }

BuiltInCpu built_in_cpu() {
  const auto set = params::choice("SHOAL_TUNING_BUILTIN");
  if (set && *set != "auto") return *set == "intel" ? BuiltInCpu::intel : BuiltInCpu::amd;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_is("intel")) return BuiltInCpu::intel;
#endif
  return BuiltInCpu::amd;
}

std::shared_ptr<const Tuning> tuning(BuiltInCpu cpu) {
  // Read again only when SHOAL_TUNING names another file or SHOAL_TUNING_BUILTIN another CPU
  // (tests set them per group).
  static std::mutex mu;
  static std::optional<std::string> loaded_path;
  static BuiltInCpu loaded_cpu;
  static std::shared_ptr<const Tuning> loaded;
  const auto path = params::text("SHOAL_TUNING");
  std::lock_guard<std::mutex> lock(mu);
  if (!loaded || path != loaded_path || cpu != loaded_cpu) {
    loaded = std::make_shared<const Tuning>(load(path, cpu));
    loaded_path = path;
    loaded_cpu = cpu;
  }
  return loaded;
}

double way_us(const std::vector<CostPoint>& points, Choice op, int p, size_t n, int way, bool second) {
  int below = 0, above = 0;  // the nearest measured group sizes ≤ p and ≥ p
  for (const auto& q : points) {
    if (q.op != op) continue;
    if (q.ranks <= p && q.ranks > below) below = q.ranks;
    if (q.ranks >= p && (above == 0 || q.ranks < above)) above = q.ranks;
  }
  if (!below && !above) no_costs(op);
  if (below && above) {
    const double lo = at_ranks(points, op, below, n, way, second);
    if (above == below) return lo;
    const double hi = at_ranks(points, op, above, n, way, second);
    return lo + (hi - lo) * (p - below) / (above - below);
  }
  const int r = below ? below : above;
  const bool one_shot = (op == Choice::allreduce || op == Choice::reduce) && way == 0;
  const double scale = one_shot ? (double(p) + 2) * p / ((double(r) + 2) * r) : double(p) / r;
  return at_ranks(points, op, r, n, way, second) * scale;
}

Ways Ways::current() {
  Ways w;
  w.cpu_ = built_in_cpu();
  w.tuning_ = tuning(w.cpu_);
  w.l2_ = l2_bytes();
  for (size_t i = 0; i < std::size(kForcings); ++i) {
    const auto forced = params::choice(kForcings[i].setting);
    if (forced && *forced != "auto")
      w.forced_[i] = *forced == kForcings[i].way0 ? 0 : kForcings[i].way2 && *forced == kForcings[i].way2 ? 2 : 1;
  }
  w.stores_ = std::make_shared<StoresChoice>(stores_setting());
  w.places_ = SlotPlaces(slot_places_setting());
  return w;
}

int Ways::cheaper(Choice op, size_t n, int p) const {
  const int i = static_cast<int>(op);
  const int forced = forced_[forcing_of(op)];
  if (forced == 0 || forced == 1) return forced;  // a third way (2) leaves the others to the costs
  // Per thread, the points last used and the curves of each op at the group size last asked for;
  // holding the points keeps their address from being reused by others.
  thread_local std::shared_ptr<const Tuning> held;
  thread_local Curves curves[std::size(kChoices)];  // by Choice
  if (held != tuning_) {
    held = tuning_;
    for (Curves& c : curves) c.ranks = 0;
  }
  Curves& c = curves[i];
  if (c.ranks != p) c = curves_for(held->points, op, p);
  return c.cheaper(n);
}

// The 2-rank allreduce by single copy from this size on the Intel Xeon's built-in costs: in place it
// took 0.84-0.99x Open MPI's time at 4-16 MiB where the two shot took 1.12-1.23x, level at 2 MiB,
// and the prototype was slower than the two shot at 1 MiB (BENCHMARKS.md, "In place against Open MPI").
constexpr size_t kSingleCopyAllreduceBytes = size_t(2) << 20;

bool Ways::allreduce_single_copy(size_t n) const {
  const int forced = forced_[forcing_of(Choice::allreduce)];
  if (forced >= 0) return forced == 2;
  return cpu_ == BuiltInCpu::intel && n >= kSingleCopyAllreduceBytes;
}

uint64_t Ways::digest() const {
  Hash d;
  d.add(points().size());
  for (const auto& q : points())  // in one order: point_key's (load)
    d.add(static_cast<uint64_t>(q.op)).add(static_cast<uint64_t>(q.ranks)).add(q.bytes)
        .add(std::bit_cast<uint64_t>(q.us[0])).add(std::bit_cast<uint64_t>(q.us[1]))
        .add(std::bit_cast<uint64_t>(q.us2[0])).add(std::bit_cast<uint64_t>(q.us2[1]));
  for (int f : forced_) d.add(static_cast<uint64_t>(f + 1));
  d.add(static_cast<uint64_t>(cpu_));
  return d.value();
}

uint64_t Ways::switches_digest() const {
  Hash d;
  for (size_t at : tuning_->switches) d.add(at);
  for (const Tuning::AtRanks& a : tuning_->at_ranks) d.add(static_cast<uint64_t>(a.s)).add(static_cast<uint64_t>(a.ranks)).add(a.bytes);
  return d.value();
}

Tuning parse_tuning(const std::string& text, const std::string& where) {
  Tuning t;
  std::vector<CostPoint>& out = t.points;
  bool any = false;
  std::istringstream in(text);
  std::string line;
  for (int no = 1; std::getline(in, line); ++no) {
    std::istringstream w(line.substr(0, line.find('#')));
    w.imbue(std::locale::classic());  // '.' is the decimal point whatever the process's locale
    std::string kind, op;
    if (!(w >> kind)) continue;  // blank or comment
    auto bad = [&](const std::string& why) {
      throw InvalidArgument(where + ", line " + std::to_string(no) + " ('" + line + "'): " + why);
    };
    any = true;
    if (kind == "switch") {
      std::string name, at, more;
      if (!(w >> name >> at)) bad("expected: switch NAME BYTES");
      if (w >> more) bad("unexpected '" + more + "' after the bytes");
      int ranks = 0;  // 0: any group size
      if (const size_t sign = name.find('@'); sign != std::string::npos) {
        const std::string p = name.substr(sign + 1);
        const auto got = std::from_chars(p.data(), p.data() + p.size(), ranks);
        if (got.ec != std::errc() || got.ptr != p.data() + p.size() || ranks < 1)
          bad("expected a number of ranks after '@', not '" + p + "'");
        name.resize(sign);
      }
      const auto* named = std::find_if(std::begin(kSwitchNames), std::end(kSwitchNames), [&](const char* k) { return name == k; });
      if (named == std::end(kSwitchNames)) {
        std::string names;
        for (const char* k : kSwitchNames) names += std::string(names.empty() ? "" : ", ") + k;
        bad("unknown switch '" + name + "' (the switches: " + names + ")");
      }
      const size_t i = static_cast<size_t>(named - std::begin(kSwitchNames));
      const Switch s = static_cast<Switch>(i);
      size_t bytes = 0;
      const auto got = std::from_chars(at.data(), at.data() + at.size(), bytes);
      if (at == "never") bytes = kNever;
      else if (got.ec != std::errc() || got.ptr != at.data() + at.size()) bad("expected a number of bytes or 'never', not '" + at + "'");
      if (ranks > 0) {
        for (const Tuning::AtRanks& a : t.at_ranks)
          if (a.s == s && a.ranks == ranks) bad("a second line for the switch " + name + " at " + std::to_string(ranks) + " ranks");
        t.at_ranks.push_back(Tuning::AtRanks{s, ranks, bytes});
      } else {
        if (t.has_all[i]) bad("a second line for the switch " + name);
        t.switches[i] = bytes, t.has_all[i] = true;
      }
      t.has[i] = true;
      continue;
    }
    if (kind != "direct") bad("expected 'direct' or 'switch', the kinds of line a tuning file has");
    CostPoint q;
    w >> op;
    const auto* named = std::find_if(std::begin(kChoices), std::end(kChoices), [&](Choice k) { return op == choice_name(k); });
    if (named == std::end(kChoices)) bad("expected the op " + choice_list() + " after 'direct'");
    q.op = *named;
    if (!(w >> q.ranks >> q.bytes >> q.us[0] >> q.us[1])) bad("expected: direct OP RANKS BYTES WAY0_US WAY1_US");
    q.us2[0] = q.us[0], q.us2[1] = q.us[1];
    const std::vector<std::string> rest{std::istream_iterator<std::string>(w), {}};
    if (rest.size() == 2) {  // the second pair
      for (int way : {0, 1}) {  // from_chars: the C locale of the process does not apply
        const char* end = rest[way].data() + rest[way].size();
        const auto got = std::from_chars(rest[way].data(), end, q.us2[way]);
        if (got.ec != std::errc() || got.ptr != end) bad("expected a time, not '" + rest[way] + "'");
      }
    } else if (!rest.empty()) {
      bad("unexpected '" + rest[0] + "' after the six fields (a point has two times, or four)");
    }
    if (q.ranks < 2) bad("ranks must be at least 2");
    if (q.bytes == 0 || q.bytes > (size_t(1) << 40)) bad("bytes must be from 1 to 2^40");
    for (double t : {q.us[0], q.us[1], q.us2[0], q.us2[1]})
      if (!(t >= 0) || std::isinf(t)) bad("times must be numbers, not negative");
    for (const auto& r : out)
      if (r.op == q.op && r.ranks == q.ranks && r.bytes == q.bytes)
        bad("a second line for " + op + " at " + std::to_string(q.ranks) + " ranks and " + std::to_string(q.bytes) + " bytes");
    out.push_back(q);
  }
  if (!any)
    throw InvalidArgument(where + ": no points (lines 'direct OP RANKS BYTES WAY0_US WAY1_US') and no switches ('switch NAME BYTES')");
  sort_at_ranks(t);
  return t;
}

}  // namespace shoal::algo
