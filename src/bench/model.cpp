// shoal-bench --model: the α-β-γ model of the algorithm that ran (its cost function in
// src/algo/registry.cpp) fitted to the run's times, and each size's time over the fitted model's.
// The terms of one algorithm may not tell every parameter apart (an allreduce moves twice the bytes
// it reduces, whatever its size): the fit then keeps the parameters that explain the times best
// and leaves the others at 0, and the line says so.
#include <cmath>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>

#include "algo/model.h"
#include "algo/registry.h"
#include "bench/bench.h"

namespace shoal::bench {
namespace {

std::optional<OpKind> kind_of(Op op) {
  switch (op) {
    case Op::allreduce: return OpKind::allreduce;
    case Op::broadcast: return OpKind::broadcast;
    case Op::reduce: return OpKind::reduce;
    case Op::allgather: return OpKind::allgatherv;
    case Op::reduce_scatter: return OpKind::reduce_scatter;
    case Op::gather: return OpKind::gather;
    case Op::scatter: return OpKind::scatter;
    case Op::alltoall:
    case Op::alltoallv: return OpKind::alltoallv;
    case Op::barrier: return OpKind::barrier;
    case Op::sendrecv: return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace

void check_model_args(const Config& cfg) {
  const auto k = kind_of(cfg.op);
  if (!k || cfg.algo == Algo::automatic || cfg.algo == Algo::hier)
    throw std::invalid_argument("--model needs --algo naming one algorithm of the op (not auto; hier's model needs "
                                "the hosts, which the bench does not know), and a collective (not sendrecv)");
  if (!has_algo(*k, cfg.algo))
    throw std::invalid_argument(std::string("--model: ") + op_name(cfg.op) + " has no algorithm '" + cfg.algo_str +
                                "' (it has: " + algos_of(*k) + ")");
  if (cfg.ranks < 2) throw std::invalid_argument("--model needs -n 2 or more: one rank sends nothing");
  if (cfg.algo == Algo::direct && cfg.transport == "tcp")
    throw std::invalid_argument("--model: direct needs shared memory, not --transport tcp");
}

std::optional<ModelFit> fit_run(const Config& cfg, int p, const std::vector<std::pair<size_t, double>>& times) {
  using namespace algo;
  const auto k = kind_of(cfg.op);
  if (!cfg.model || !k) return std::nullopt;
  ModelFit r;
  std::vector<Terms> terms;
  std::vector<double> secs;
  for (const auto& [bytes, us] : times) {
    if (!(us > 0) || !std::isfinite(us)) continue;
    terms.push_back(cost_of(*k, cfg.algo, Shape{p, 1}, static_cast<double>(bytes)));
    secs.push_back(us * 1e-6);
    r.sizes.push_back(bytes);
    r.shoal_us.push_back(us);
  }
  if (r.sizes.size() < 2) return r;  // nothing fitted: fitted stays false
  r.fit = fit_model(terms, secs);
  r.fitted = true;
  for (const Terms& t : terms) r.model_us.push_back(seconds(t, r.fit.model) * 1e6);
  return r;
}

void print_model(const Config& cfg, const ModelFit& m) {
  std::printf("#\n# model: %s %s, alpha-beta-gamma (src/algo/registry.cpp), fitted to the %zu sizes above",
              op_name(cfg.op), cfg.algo_str.c_str(), m.sizes.size());
  if (!m.fitted) {
    std::printf(": needs two sizes or more\n");
    std::fflush(stdout);
    return;
  }
  const algo::Model& f = m.fit.model;
  std::printf("\n# model: alpha = %.3g us (a message; a barrier for direct), beta = %.3g ns/B (a byte moved), "
              "gamma = %.3g ns/B (a byte reduced); rms relative error %.0f%%\n",
              f.alpha * 1e6, f.beta * 1e9, f.gamma * 1e9, m.fit.rms_relative_error * 100);
  std::printf("# model: (a parameter at 0 is one the run's times did not need, or could not tell apart from another)\n");
  if (cfg.algo == Algo::direct)
    std::printf("# model: (direct: the model is the path through the scratch; where measured costs choose one shot, "
                "single copy or, for alltoall, the pairwise exchange, those sizes ran another path)\n");
  std::printf("# %12s %12s %12s %12s\n", "size (B)", "shoal (us)", "model (us)", "shoal/model");
  for (size_t i = 0; i < m.sizes.size(); ++i)
    std::printf("# %12zu %12.2f %12.2f %12.2f\n", m.sizes[i], m.shoal_us[i], m.model_us[i],
                m.model_us[i] > 0 ? m.shoal_us[i] / m.model_us[i] : NAN);
  std::fflush(stdout);
}

}  // namespace shoal::bench
