// Losses and their gradients against float64 references on the same rounded inputs
// (bounds: kernel_checks.hpp; a loss value is a float mean of positive terms, bound 1e-5
// relative); the float64 gradients against central differences; bad arguments; thread
// determinism.
#include <precis/kernels/loss.hpp>

#include "kernel_checks.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>

namespace {

using namespace precis_test;
using precis::bfloat16;
using precis::cpu_context;
using precis::float16;
using precis::host_tensor;

using mat = host_tensor<double, 2>;
using labels = host_tensor<std::int64_t, 1>;

constexpr double dloss = 4.0;  // as a loss scale would be
constexpr double beta = 0.7;
constexpr double eps = 1.0;

double ce_ref(const mat& x, const labels& t) {
  double total = 0;
  for (std::size_t r = 0; r < x.shape()[0]; ++r) {
    double m = -std::numeric_limits<double>::infinity(), s = 0;
    for (std::size_t j = 0; j < x.shape()[1]; ++j) m = std::max(m, x(r, j));
    for (std::size_t j = 0; j < x.shape()[1]; ++j) s += std::exp(x(r, j) - m);
    total += m + std::log(s) - x(r, std::size_t(t(r)));
  }
  return total / double(x.shape()[0]);
}
mat ce_grad(const mat& x, const labels& t, double g) {
  mat d = x;
  const double b = double(x.shape()[0]);
  for (std::size_t r = 0; r < x.shape()[0]; ++r) {
    double m = -std::numeric_limits<double>::infinity(), s = 0;
    for (std::size_t j = 0; j < x.shape()[1]; ++j) m = std::max(m, x(r, j));
    for (std::size_t j = 0; j < x.shape()[1]; ++j) s += std::exp(x(r, j) - m);
    for (std::size_t j = 0; j < x.shape()[1]; ++j) {
      d(r, j) = g * (std::exp(x(r, j) - m) / s - (std::int64_t(j) == t(r) ? 1.0 : 0.0)) / b;
    }
  }
  return d;
}

// Pointwise losses: term(p, t) and its derivative in p, the loss the mean of the terms.
struct bce {
  static double term(double x, double t) { return std::max(x, 0.0) - x * t + std::log1p(std::exp(-std::abs(x))); }
  static double grad(double x, double t) { return 1 / (1 + std::exp(-x)) - t; }
};
struct l1 {
  static double term(double p, double t) { return std::abs(p - t); }
  static double grad(double p, double t) { return p > t ? 1.0 : (p < t ? -1.0 : 0.0); }
};
struct smooth_l1 {
  static double term(double p, double t) {
    const double d = p - t;
    return std::abs(d) < beta ? 0.5 * d * d / beta : std::abs(d) - 0.5 * beta;
  }
  static double grad(double p, double t) {
    const double d = p - t;
    return std::abs(d) < beta ? d / beta : (d > 0 ? 1.0 : -1.0);
  }
};

template <class L>
double mean_ref(const mat& p, const mat& t) {
  double s = 0;
  for (std::size_t i = 0; i < p.size(); ++i) s += L::term(p.data()[i], t.data()[i]);
  return s / double(p.size());
}
template <class L>
mat mean_grad(const mat& p, const mat& t, double g) {
  mat d = p;
  for (std::size_t i = 0; i < p.size(); ++i) d.data()[i] = g * L::grad(p.data()[i], t.data()[i]) / double(p.size());
  return d;
}

double dice_ref(const mat& p, const mat& t) {
  double i = 0, sp = 0, st = 0;
  for (std::size_t k = 0; k < p.size(); ++k) {
    i += p.data()[k] * t.data()[k];
    sp += p.data()[k];
    st += t.data()[k];
  }
  return 1 - (2 * i + eps) / (sp + st + eps);
}
mat dice_grad(const mat& p, const mat& t, double g) {
  double i = 0, sp = 0, st = 0;
  for (std::size_t k = 0; k < p.size(); ++k) {
    i += p.data()[k] * t.data()[k];
    sp += p.data()[k];
    st += t.data()[k];
  }
  const double num = 2 * i + eps, den = sp + st + eps;
  mat d = p;
  for (std::size_t k = 0; k < p.size(); ++k) d.data()[k] = -g * (2 * t.data()[k] * den - num) / (den * den);
  return d;
}

labels random_labels(std::size_t n, std::int64_t classes) {
  auto t = labels::from_shape({n});
  std::uniform_int_distribution<std::int64_t> u(0, classes - 1);
  for (auto& v : t) v = u(rng());
  return t;
}

// Moves differences away from the kinks of L1 (0) and smooth-L1 (+-beta), where central
// differences are not the derivative.
void avoid_kinks(mat& p, const mat& t) {
  for (std::size_t i = 0; i < p.size(); ++i) {
    const double d = std::abs(p.data()[i] - t.data()[i]);
    if (d < 1e-3 || std::abs(d - beta) < 1e-3) p.data()[i] += 0.01;
  }
}

}  // namespace

TEST_CASE("float64 loss gradients match central differences") {
  const auto x = random_tensor<double, 2>({4, 6}, -3, 3);
  const auto t = random_labels(4, 6);
  CHECK(rel_error(fd_gradient([&](const mat& v) { return ce_ref(v, t); }, x), ce_grad(x, t, 1)) < fd_bound);
  auto p = random_tensor<double, 2>({5, 7}, -2, 2);
  const auto target = random_tensor<double, 2>({5, 7}, 0, 1);
  avoid_kinks(p, target);
  CHECK(rel_error(fd_gradient([&](const mat& v) { return mean_ref<bce>(v, target); }, p),
                  mean_grad<bce>(p, target, 1)) < fd_bound);
  CHECK(rel_error(fd_gradient([&](const mat& v) { return mean_ref<l1>(v, target); }, p),
                  mean_grad<l1>(p, target, 1)) < fd_bound);
  CHECK(rel_error(fd_gradient([&](const mat& v) { return mean_ref<smooth_l1>(v, target); }, p),
                  mean_grad<smooth_l1>(p, target, 1)) < fd_bound);
  const auto prob = random_tensor<double, 2>({5, 7}, 0, 1);
  CHECK(rel_error(fd_gradient([&](const mat& v) { return dice_ref(v, target); }, prob),
                  dice_grad(prob, target, 1)) < fd_bound);
}

TEST_CASE_TEMPLATE("cross-entropy matches float64, forward and backward", C, fp32_config, bf16_config,
                   fp16_config) {
  using T = typename C::T;
  using P = typename C::P;
  const cpu_context ctx{1};
  const auto x = random_tensor<T, 2>({16, 10}, -5, 5);
  const auto t = random_labels(16, 10);
  const auto xd = to_double(x);
  const double ref = ce_ref(xd, t);
  const float loss = precis::cross_entropy<P>(ctx, x, t);
  CHECK(scalar_error(loss, ref, ref) < scalar_bound);
  auto dx = poisoned<T, 2>(x.shape());
  precis::cross_entropy_backward<P>(ctx, x, t, dx, dloss);
  CHECK(rel_error(dx, ce_grad(xd, t, dloss)) < bound<T>());
  // Logits of 1000 stay finite.
  auto big = x;
  for (auto& v : big) v = from_double<T>(to_double(v) + 1000);
  const double big_ref = ce_ref(to_double(big), t);
  CHECK(scalar_error(precis::cross_entropy<P>(ctx, big, t), big_ref, big_ref) < scalar_bound);
}

template <class L, class C, class Fwd, class Bwd>
void check_pointwise(Fwd fwd, Bwd bwd, double lo, double hi) {
  using T = typename C::T;
  const auto p = random_tensor<T, 3>({3, 11, 9}, lo, hi);
  const auto t = random_tensor<T, 3>({3, 11, 9}, 0, 1);
  const auto pd = to_double(p), td = to_double(t);
  auto pm = host_tensor<double, 2>::from_shape({1, pd.size()}), tm = pm;
  std::copy(pd.begin(), pd.end(), pm.begin());
  std::copy(td.begin(), td.end(), tm.begin());
  const double ref = mean_ref<L>(pm, tm);
  CHECK(scalar_error(fwd(p, t), ref, ref) < scalar_bound);
  auto dp = poisoned<T, 3>(p.shape());
  bwd(p, t, dp);
  const auto g = mean_grad<L>(pm, tm, dloss);
  auto gref = pd;
  std::copy(g.begin(), g.end(), gref.begin());
  CHECK(rel_error(dp, gref) < bound<T>());
}

TEST_CASE_TEMPLATE("pointwise losses match float64, forward and backward", C, fp32_config, bf16_config,
                   fp16_config) {
  using T = typename C::T;
  using P = typename C::P;
  using X = host_tensor<T, 3>;
  const cpu_context ctx{1};
  check_pointwise<bce, C>([&](const X& p, const X& t) { return precis::bce_with_logits<P>(ctx, p, t); },
                          [&](const X& p, const X& t, X& d) {
                            precis::bce_with_logits_backward<P>(ctx, p, t, d, dloss);
                          },
                          -6, 6);
  check_pointwise<l1, C>([&](const X& p, const X& t) { return precis::l1_loss<P>(ctx, p, t); },
                         [&](const X& p, const X& t, X& d) { precis::l1_loss_backward<P>(ctx, p, t, d, dloss); },
                         -2, 2);
  check_pointwise<smooth_l1, C>(
      [&](const X& p, const X& t) { return precis::smooth_l1_loss<P>(ctx, p, t, beta); },
      [&](const X& p, const X& t, X& d) { precis::smooth_l1_loss_backward<P>(ctx, p, t, d, beta, dloss); },
      -2, 2);
}

TEST_CASE_TEMPLATE("dice loss matches float64, forward and backward", C, fp32_config, bf16_config,
                   fp16_config) {
  using T = typename C::T;
  using P = typename C::P;
  const cpu_context ctx{1};
  const auto p = random_tensor<T, 3>({2, 16, 16}, 0, 1);
  auto t = random_tensor<T, 3>({2, 16, 16}, 0, 1);
  for (auto& v : t) v = from_double<T>(to_double(v) > 0.7 ? 1.0 : 0.0);  // a binary map
  const auto pd = to_double(p), td = to_double(t);
  auto pm = host_tensor<double, 2>::from_shape({1, pd.size()}), tm = pm;
  std::copy(pd.begin(), pd.end(), pm.begin());
  std::copy(td.begin(), td.end(), tm.begin());
  CHECK(scalar_error(precis::dice_loss<P>(ctx, p, t, eps), dice_ref(pm, tm), 1.0) < scalar_bound);
  auto dp = poisoned<T, 3>(p.shape());
  precis::dice_loss_backward<P>(ctx, p, t, dp, eps, dloss);
  const auto g = dice_grad(pm, tm, dloss);
  auto gref = pd;
  std::copy(g.begin(), g.end(), gref.begin());
  CHECK(rel_error(dp, gref) < bound<T>());
  // Two empty maps: 0, not NaN, thanks to eps.
  auto zeros = host_tensor<float, 1>::from_shape({8});
  zeros.fill(0.0f);
  CHECK(precis::dice_loss<precis::presets::fp32>(ctx, zeros, zeros) == 0.0f);
}

TEST_CASE("loss argument errors") {
  const cpu_context ctx{1};
  using P = precis::presets::fp32;
  const auto x = random_tensor<float, 2>({3, 4});
  auto t = random_labels(3, 4);
  t(1) = 4;
  check_error([&] { (void)precis::cross_entropy<P>(ctx, x, t); }, "precis::cross_entropy", "targets[1]", "is 4", "[0, 4)");
  t(1) = -1;
  auto dx = poisoned<float, 2>(x.shape());
  check_error([&] { precis::cross_entropy_backward<P>(ctx, x, t, dx); }, "targets[1]", "-1");
  for (float v : dx) CHECK(std::isnan(v));
  const auto t2 = random_labels(2, 4);
  check_error([&] { (void)precis::cross_entropy<P>(ctx, x, t2); }, "targets", "[2]", "[3]");
  const auto y = random_tensor<float, 2>({4, 3});
  check_error([&] { (void)precis::bce_with_logits<P>(ctx, x, y); }, "precis::bce_with_logits", "[3, 4]", "[4, 3]");
  check_error([&] { (void)precis::l1_loss<P>(ctx, x, y); }, "precis::l1_loss", "[3, 4]", "[4, 3]");
  check_error([&] { (void)precis::smooth_l1_loss<P>(ctx, x, x, -1.0); }, "beta", "-1");
  check_error([&] { precis::smooth_l1_loss_backward<P>(ctx, x, x, dx, -1.0); }, "beta");
  check_error([&] { (void)precis::dice_loss<P>(ctx, x, x, -0.5); }, "eps");
  check_error([&] { (void)precis::dice_loss<P>(ctx, x, x, std::numeric_limits<double>::quiet_NaN()); }, "eps");
  auto wrong = poisoned<float, 2>(std::array<std::size_t, 2>{4, 3});
  check_error([&] { precis::l1_loss_backward<P>(ctx, x, x, wrong); }, "dpred", "[4, 3]", "[3, 4]");
  for (float v : wrong) CHECK(std::isnan(v));
  const auto empty = host_tensor<float, 2>::from_shape({0, 4});
  check_error([&] { (void)precis::l1_loss<P>(ctx, empty, empty); }, "empty");
  check_error([&] { (void)precis::cross_entropy<P>(ctx, empty, labels::from_shape({0})); }, "empty");
}

TEST_CASE("losses are bit-identical for 1 and 2 threads") {
  using P = precis::presets::bf16_mixed;
  const auto x = random_tensor<bfloat16, 2>({400, 1000}, -5, 5);
  const auto t = random_tensor<bfloat16, 2>({400, 1000}, 0, 1);
  CHECK(precis::bce_with_logits<P>(cpu_context{1}, x, t) == precis::bce_with_logits<P>(cpu_context{2}, x, t));
  CHECK(precis::smooth_l1_loss<P>(cpu_context{1}, x, t) == precis::smooth_l1_loss<P>(cpu_context{2}, x, t));
  auto a = poisoned<bfloat16, 2>(x.shape()), b = a;
  precis::bce_with_logits_backward<P>(cpu_context{1}, x, t, a);
  precis::bce_with_logits_backward<P>(cpu_context{2}, x, t, b);
  CHECK(same_bits(a, b));
  const auto labels_ = random_labels(400, 1000);
  CHECK(precis::cross_entropy<P>(cpu_context{1}, x, labels_) == precis::cross_entropy<P>(cpu_context{2}, x, labels_));
  precis::cross_entropy_backward<P>(cpu_context{1}, x, labels_, a);
  precis::cross_entropy_backward<P>(cpu_context{2}, x, labels_, b);
  CHECK(same_bits(a, b));
}
