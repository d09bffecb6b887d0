// The α-β-γ model's arithmetic and its fit (model.h); the cost functions are the registry's rows.
#include "algo/model.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "algo/direct_common.h"
#include "shoal/error.h"

namespace shoal::algo {

Terms operator+(const Terms& a, const Terms& b) {
  return {a.messages + b.messages, a.bytes + b.bytes, a.reduced + b.reduced, a.local_messages + b.local_messages,
          a.local_bytes + b.local_bytes};
}

double seconds(const Terms& t, const Model& m) {
  return t.messages * m.alpha + t.bytes * m.beta + t.reduced * m.gamma + t.local_messages * m.local_alpha +
         t.local_bytes * m.local_beta;
}

double lg_ceil(int p) {
  int l = 0;
  while ((1 << l) < p) ++l;
  return l;
}

int pof2_floor(int p) {
  int q = 1;
  while (q * 2 <= p) q *= 2;
  return q;
}

double direct_chunks(double bytes, double chunk) { return std::max(1.0, std::ceil(bytes / chunk)); }

size_t direct_slot() { return direct::slot_bytes(direct::scratch_setting()); }

bool direct_small(double bytes) { return direct::small_fits(static_cast<size_t>(bytes)); }

namespace {

constexpr int kParams = 5;

double term(const Terms& t, int j) {
  switch (j) {
    case 0: return t.messages;
    case 1: return t.bytes;
    case 2: return t.reduced;
    case 3: return t.local_messages;
    default: return t.local_bytes;
  }
}

void set(Model& m, int j, double v) {
  double* f[kParams] = {&m.alpha, &m.beta, &m.gamma, &m.local_alpha, &m.local_beta};
  *f[j] = v;
}

// Least squares over the parameters in `use` (rows weighted by 1 / seconds, so that every row's
// relative error counts alike), by the normal equations; false if singular.
bool solve(const std::vector<Terms>& terms, const std::vector<double>& secs, const std::vector<int>& use, Model& out) {
  const size_t k = use.size();
  std::vector<double> a(k * k, 0.0), b(k, 0.0);
  for (size_t i = 0; i < terms.size(); ++i) {
    const double w = 1.0 / secs[i];
    for (size_t r = 0; r < k; ++r) {
      const double xr = term(terms[i], use[r]) * w;
      b[r] += xr * secs[i] * w;
      for (size_t c = 0; c < k; ++c) a[r * k + c] += xr * term(terms[i], use[c]) * w;
    }
  }
  // Each column scaled to a unit diagonal, so that messages (tens) and bytes (millions) weigh
  // alike in the test below; x is scaled back after.
  std::vector<double> d(k);
  for (size_t r = 0; r < k; ++r) {
    if (!(a[r * k + r] > 0)) return false;
    d[r] = 1.0 / std::sqrt(a[r * k + r]);
  }
  for (size_t r = 0; r < k; ++r) {
    b[r] *= d[r];
    for (size_t c = 0; c < k; ++c) a[r * k + c] *= d[r] * d[c];
  }
  // Gaussian elimination with partial pivoting. Terms that move together (the ring allreduce moves
  // twice the bytes it reduces at every size) make the matrix singular up to rounding: a pivot
  // that small says so.
  for (size_t col = 0; col < k; ++col) {
    size_t piv = col;
    for (size_t r = col + 1; r < k; ++r)
      if (std::fabs(a[r * k + col]) > std::fabs(a[piv * k + col])) piv = r;
    if (!(std::fabs(a[piv * k + col]) > 1e-9)) return false;
    if (piv != col) {
      for (size_t c = 0; c < k; ++c) std::swap(a[piv * k + c], a[col * k + c]);
      std::swap(b[piv], b[col]);
    }
    for (size_t r = col + 1; r < k; ++r) {
      const double f = a[r * k + col] / a[col * k + col];
      for (size_t c = col; c < k; ++c) a[r * k + c] -= f * a[col * k + c];
      b[r] -= f * b[col];
    }
  }
  std::vector<double> x(k);
  for (size_t r = k; r-- > 0;) {
    double s = b[r];
    for (size_t c = r + 1; c < k; ++c) s -= a[r * k + c] * x[c];
    x[r] = s / a[r * k + r];
  }
  out = Model{};
  for (size_t r = 0; r < k; ++r) {
    x[r] *= d[r];
    if (!(x[r] >= 0)) return false;  // negative or NaN: not a model
    set(out, use[r], x[r]);
  }
  return true;
}

double rms_relative(const std::vector<Terms>& terms, const std::vector<double>& secs, const Model& m) {
  double s = 0;
  for (size_t i = 0; i < terms.size(); ++i) {
    const double e = (seconds(terms[i], m) - secs[i]) / secs[i];
    s += e * e;
  }
  return terms.empty() ? NAN : std::sqrt(s / static_cast<double>(terms.size()));
}

}  // namespace

Fit fit_model(const std::vector<Terms>& terms, const std::vector<double>& secs) {
  if (terms.size() != secs.size())
    throw InvalidArgument("fit_model: " + std::to_string(terms.size()) + " rows of terms and " +
                          std::to_string(secs.size()) + " times");
  std::vector<Terms> t;
  std::vector<double> s;
  for (size_t i = 0; i < terms.size(); ++i)
    if (secs[i] > 0 && std::isfinite(secs[i])) t.push_back(terms[i]), s.push_back(secs[i]);
  // The parameters whose term is non-zero somewhere; every subset of them is tried (at most 2^5),
  // and the best fit with no negative parameter kept: a non-negative least squares small enough
  // to solve by enumeration.
  std::vector<int> present;
  for (int j = 0; j < kParams; ++j)
    for (const Terms& x : t)
      if (term(x, j) != 0) {
        present.push_back(j);
        break;
      }
  Fit best{Model{}, rms_relative(t, s, Model{}), t.size()};
  for (unsigned mask = 1; mask < (1u << present.size()); ++mask) {
    std::vector<int> use;
    for (size_t j = 0; j < present.size(); ++j)
      if (mask & (1u << j)) use.push_back(present[j]);
    Model m;
    if (!solve(t, s, use, m)) continue;
    const double e = rms_relative(t, s, m);
    if (e < best.rms_relative_error) best = Fit{m, e, t.size()};
  }
  return best;
}

}  // namespace shoal::algo
