// softmax, log_softmax, logsumexp and their gradients against float64 references on the
// same rounded inputs (bounds: kernel_checks.hpp); the float64 gradients against central
// differences; large logits; errors; thread determinism.
#include <precis/kernels/loss.hpp>
#include <precis/kernels/softmax.hpp>

#include "kernel_checks.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

namespace {

using namespace precis_test;
using precis::bfloat16;
using precis::cpu_context;
using precis::float16;
using precis::host_tensor;

using mat = host_tensor<double, 2>;
using vec = host_tensor<double, 1>;

vec lse_ref(const mat& x) {
  auto out = vec::from_shape({x.shape()[0]});
  for (std::size_t r = 0; r < x.shape()[0]; ++r) {
    double m = -std::numeric_limits<double>::infinity();
    for (std::size_t j = 0; j < x.shape()[1]; ++j) m = std::max(m, x(r, j));
    double s = 0;
    for (std::size_t j = 0; j < x.shape()[1]; ++j) s += std::exp(x(r, j) - m);
    out(r) = m + std::log(s);
  }
  return out;
}
mat log_softmax_ref(const mat& x) {
  const auto l = lse_ref(x);
  mat y = x;
  for (std::size_t r = 0; r < x.shape()[0]; ++r) {
    for (std::size_t j = 0; j < x.shape()[1]; ++j) y(r, j) = x(r, j) - l(r);
  }
  return y;
}
mat softmax_ref(const mat& x) {
  mat y = log_softmax_ref(x);
  for (auto& v : y) v = std::exp(v);
  return y;
}
// Analytic gradients, from the forward outputs as the kernels take them.
mat softmax_grad(const mat& dy, const mat& y) {
  mat dx = y;
  for (std::size_t r = 0; r < y.shape()[0]; ++r) {
    double dot = 0;
    for (std::size_t j = 0; j < y.shape()[1]; ++j) dot += dy(r, j) * y(r, j);
    for (std::size_t j = 0; j < y.shape()[1]; ++j) dx(r, j) = y(r, j) * (dy(r, j) - dot);
  }
  return dx;
}
mat log_softmax_grad(const mat& dy, const mat& y) {
  mat dx = y;
  for (std::size_t r = 0; r < y.shape()[0]; ++r) {
    double s = 0;
    for (std::size_t j = 0; j < y.shape()[1]; ++j) s += dy(r, j);
    for (std::size_t j = 0; j < y.shape()[1]; ++j) dx(r, j) = dy(r, j) - std::exp(y(r, j)) * s;
  }
  return dx;
}
mat logsumexp_grad(const vec& dy, const mat& x, const vec& l) {
  mat dx = x;
  for (std::size_t r = 0; r < x.shape()[0]; ++r) {
    for (std::size_t j = 0; j < x.shape()[1]; ++j) dx(r, j) = dy(r) * std::exp(x(r, j) - l(r));
  }
  return dx;
}

}  // namespace

TEST_CASE("float64 softmax gradients match central differences") {
  const auto x = random_tensor<double, 2>({3, 7}, -3, 3);
  const auto w = random_tensor<double, 2>({3, 7});
  const auto wv = random_tensor<double, 1>({3});
  CHECK(rel_error(fd_gradient([&](const mat& v) { return dot(w, softmax_ref(v)); }, x),
                  softmax_grad(w, softmax_ref(x))) < fd_bound);
  CHECK(rel_error(fd_gradient([&](const mat& v) { return dot(w, log_softmax_ref(v)); }, x),
                  log_softmax_grad(w, log_softmax_ref(x))) < fd_bound);
  CHECK(rel_error(fd_gradient([&](const mat& v) { return dot(wv, lse_ref(v)); }, x),
                  logsumexp_grad(wv, x, lse_ref(x))) < fd_bound);
}

TEST_CASE_TEMPLATE("softmax family matches float64, forward and backward", C, fp32_config, bf16_config,
                   fp16_config) {
  using T = typename C::T;
  using P = typename C::P;
  const cpu_context ctx{1};
  const auto x = random_tensor<T, 2>({9, 37}, -6, 6);
  const auto dy = random_tensor<T, 2>({9, 37});
  const auto dl = random_tensor<T, 1>({9});
  const auto xd = to_double(x), dyd = to_double(dy);
  const auto dld = to_double(dl);

  auto y = poisoned<T, 2>(x.shape());
  precis::softmax<P>(ctx, x, y);
  CHECK(rel_error(y, softmax_ref(xd)) < bound<T>());
  auto dx = poisoned<T, 2>(x.shape());
  precis::softmax_backward<P>(ctx, dy, y, dx);
  CHECK(rel_error(dx, softmax_grad(dyd, to_double(y))) < bound<T>());

  poison(y);
  precis::log_softmax<P>(ctx, x, y);
  CHECK(rel_error(y, log_softmax_ref(xd)) < bound<T>());
  poison(dx);
  precis::log_softmax_backward<P>(ctx, dy, y, dx);
  CHECK(rel_error(dx, log_softmax_grad(dyd, to_double(y))) < bound<T>());

  auto l = poisoned<T, 1>(std::array<std::size_t, 1>{9});
  precis::logsumexp<P>(ctx, x, l);
  CHECK(rel_error(l, lse_ref(xd)) < bound<T>());
  poison(dx);
  precis::logsumexp_backward<P>(ctx, dl, x, l, dx);
  CHECK(rel_error(dx, logsumexp_grad(dld, xd, to_double(l))) < bound<T>());

  // Float outputs from narrow inputs carry only the float math's error.
  auto yf = poisoned<float, 2>(x.shape());
  precis::softmax<P>(ctx, x, yf);
  CHECK(rel_error(yf, softmax_ref(xd)) < bound<float>());
  auto lf = poisoned<float, 1>(std::array<std::size_t, 1>{9});
  precis::logsumexp<P>(ctx, x, lf);
  CHECK(rel_error(lf, lse_ref(xd)) < bound<float>());
}

TEST_CASE_TEMPLATE("large logits stay finite (max subtracted)", C, fp32_config, fp16_config) {
  using T = typename C::T;
  using P = typename C::P;
  const cpu_context ctx{1};
  for (const double centre : {1000.0, -1000.0}) {
    INFO("logits around " << centre);
    auto x = random_tensor<T, 2>({4, 16}, -3, 3);
    for (auto& v : x) v = from_double<T>(to_double(v) + centre);
    const auto xd = to_double(x);
    auto y = poisoned<float, 2>(x.shape());
    precis::softmax<P>(ctx, x, y);
    CHECK(rel_error(y, softmax_ref(xd)) < bound<float>());
    for (std::size_t r = 0; r < 4; ++r) {
      double s = 0;
      for (std::size_t j = 0; j < 16; ++j) s += double(y(r, j));
      CHECK(std::abs(s - 1) < 1e-5);
    }
    precis::log_softmax<P>(ctx, x, y);
    CHECK(rel_error(y, log_softmax_ref(xd)) < bound<float>());
    auto l = poisoned<float, 1>(std::array<std::size_t, 1>{4});
    precis::logsumexp<P>(ctx, x, l);
    CHECK(rel_error(l, lse_ref(xd)) < bound<float>());
  }
}

TEST_CASE("rows spanning more than 86 below their maximum: subnormal and zero terms") {
  // Softmax runs a shorter exp where every x - max >= -86 (vmath::exp_normal) and the full
  // one elsewhere: rows on both sides of that line, terms down to subnormal and to zero.
  const cpu_context ctx{1};
  for (const double spread : {85.9, 86.1, 95.0, 105.0, 200.0}) {
    INFO("values in [-" << spread << ", 2]");
    auto x = random_tensor<float, 2>({6, 40}, -spread, 2);
    for (std::size_t r = 0; r < 6; ++r) x(r, r) = float(-spread);  // the far end, in every row
    const auto xd = to_double(x);
    auto y = poisoned<float, 2>(x.shape());
    precis::softmax<precis::presets::fp32>(ctx, x, y);
    CHECK(rel_error(y, softmax_ref(xd)) < bound<float>());
    // Each probability on its own, tiny ones included, against exp of the float x - max
    // (the kernel's argument; its rounding moves a result by up to |x - max| 2^-24 of
    // itself, whatever the exp): within 8 float ulps, or 2^-148 where subnormal. The
    // budget: exp's 1 ulp, the reciprocal of the sum and the product with it 1.5, the sum's
    // own relative error (its terms' exp errors, 1 ulp, and up to 6 roundings of positive
    // partial sums, 3 ulps): 6.5 ulps at worst (a random row reached 4.8).
    for (std::size_t r = 0; r < 6; ++r) {
      float m = x(r, 0);
      for (std::size_t j = 1; j < 40; ++j) m = std::max(m, x(r, j));
      double sum = 0;
      for (std::size_t j = 0; j < 40; ++j) sum += std::exp(double(x(r, j) - m));
      for (std::size_t j = 0; j < 40; ++j) {
        const double want = std::exp(double(x(r, j) - m)) / sum;
        INFO("x = " << x(r, j) << ", max = " << m);
        CHECK(std::abs(double(y(r, j)) - want) <= std::max(8 * 0x1p-24 * want, 0x1p-148));
      }
    }
    precis::log_softmax<precis::presets::fp32>(ctx, x, y);
    CHECK(rel_error(y, log_softmax_ref(xd)) < bound<float>());
    // logsumexp and cross-entropy take the same shorter exp where a row allows it.
    auto l = poisoned<float, 1>(std::array<std::size_t, 1>{6});
    precis::logsumexp<precis::presets::fp32>(ctx, x, l);
    CHECK(rel_error(l, lse_ref(xd)) < bound<float>());
    host_tensor<int, 1> t = {0, 5, 17, 39, 3, 2};  // row r's far end is column r
    const auto lse = lse_ref(xd);
    double want = 0;
    for (std::size_t r = 0; r < 6; ++r) want += (lse(r) - xd(r, std::size_t(t(r)))) / 6;
    const float got = precis::cross_entropy<precis::presets::fp32>(ctx, x, t);
    CHECK(std::abs(double(got) - want) <= 1e-5 * std::abs(want));
    auto d = poisoned<float, 2>(x.shape());
    precis::cross_entropy_backward<precis::presets::fp32>(ctx, x, t, d);
    const auto p = softmax_ref(xd);
    double worst = 0;
    for (std::size_t r = 0; r < 6; ++r) {
      for (std::size_t j = 0; j < 40; ++j) {
        const double g = (p(r, j) - (int(j) == t(r) ? 1.0 : 0.0)) / 6;
        worst = std::max(worst, std::abs(double(d(r, j)) - g));
      }
    }
    CHECK(worst < 1e-6);
  }
}

TEST_CASE("logsumexp of an infinite maximum is that maximum; softmax of NaN is NaN") {
  const cpu_context ctx{1};
  const float inf = std::numeric_limits<float>::infinity();
  host_tensor<float, 2> x = {{-inf, -inf}, {1.0f, inf}, {std::numeric_limits<float>::quiet_NaN(), 1.0f}};
  auto l = poisoned<float, 1>(std::array<std::size_t, 1>{3});
  precis::logsumexp<precis::presets::fp32>(ctx, x, l);
  CHECK(l(0) == -inf);
  CHECK(l(1) == inf);
  CHECK(std::isnan(l(2)));
  auto y = poisoned<float, 2>(x.shape());
  precis::softmax<precis::presets::fp32>(ctx, x, y);
  CHECK(std::isnan(y(2, 1)));
}

TEST_CASE("softmax shape mismatches throw naming both shapes, writing nothing") {
  const cpu_context ctx{1};
  using P = precis::presets::fp32;
  const auto x = random_tensor<float, 2>({3, 4});
  auto y = poisoned<float, 2>(std::array<std::size_t, 2>{4, 3});
  check_error([&] { precis::softmax<P>(ctx, x, y); }, "precis::softmax", "[4, 3]", "[3, 4]");
  auto l = poisoned<float, 1>(std::array<std::size_t, 1>{4});
  check_error([&] { precis::logsumexp<P>(ctx, x, l); }, "precis::logsumexp", "[4]", "[3]");
  auto dx = poisoned<float, 2>(x.shape());
  check_error([&] { precis::softmax_backward<P>(ctx, y, x, dx); }, "softmax_backward", "[4, 3]", "[3, 4]");
  check_error([&] { precis::logsumexp_backward<P>(ctx, l, x, l, dx); }, "logsumexp_backward", "[4]", "[3]");
  for (float v : y) CHECK(std::isnan(v));
  for (float v : dx) CHECK(std::isnan(v));
}

// The float path writes narrow outputs from registers (bfloat16) or through blocks
// (float16): each must be the float result rounded once, by precis::convert's rounding,
// at row lengths with and without a partial last vector, NaN rows included; float rows
// are read and written in place, so y may be x.
TEST_CASE_TEMPLATE(
    "softmax and log-softmax: a narrow output is the float output rounded once; "
    "float rows in place",
    X, float, bfloat16, float16) {
  using P = precis::presets::bf16_mixed;
  const cpu_context ctx{1};
  for (const std::size_t cols : {1U, 15U, 16U, 37U, 300U}) {
    INFO("cols " << cols);
    auto x = random_tensor<X, 2>({5, cols}, -6, 6);
    x(3, cols / 2) = X(std::numeric_limits<float>::quiet_NaN());
    for (const bool log : {false, true}) {
      INFO((log ? "log_softmax" : "softmax"));
      const auto run = [&](const auto& in, auto& out) {
        if (log) {
          precis::log_softmax<P>(ctx, in, out);
        } else {
          precis::softmax<P>(ctx, in, out);
        }
      };
      auto yf = poisoned<float, 2>(x.shape());
      run(x, yf);
      CHECK(std::isnan(yf(3, 0)));
      CHECK(!std::isnan(yf(2, 0)));
      auto yb = poisoned<bfloat16, 2>(x.shape());
      run(x, yb);
      CHECK(same_bits(yb, rounded<bfloat16>(yf)));
      auto yh = poisoned<float16, 2>(x.shape());
      run(x, yh);
      CHECK(same_bits(yh, rounded<float16>(yf)));
      auto xf = host_tensor<float, 2>::from_shape({5, cols});
      for (std::size_t i = 0; i < x.size(); ++i) xf.data()[i] = float(to_double(x.data()[i]));
      auto ref = poisoned<float, 2>(x.shape());
      run(xf, ref);
      run(xf, xf);
      CHECK(same_bits(xf, ref));
    }
  }
}

TEST_CASE("softmax family is bit-identical for 1 and 2 threads") {
  using P = precis::presets::bf16_mixed;
  const auto x = random_tensor<bfloat16, 2>({300, 1000}, -8, 8);
  auto a = poisoned<bfloat16, 2>(x.shape()), b = a;
  precis::softmax<P>(cpu_context{1}, x, a);
  precis::softmax<P>(cpu_context{2}, x, b);
  CHECK(same_bits(a, b));
  auto da = poisoned<float, 2>(x.shape()), db = da;
  precis::softmax_backward<P>(cpu_context{1}, x, a, da);
  precis::softmax_backward<P>(cpu_context{2}, x, a, db);
  CHECK(same_bits(da, db));
  precis::log_softmax<P>(cpu_context{1}, x, a);
  precis::log_softmax<P>(cpu_context{2}, x, b);
  CHECK(same_bits(a, b));
}

namespace {

/// 16 rows of n logits drawn from N(0, 4^2), as float.
precis::host_tensor<float, 2> long_rows(std::size_t n) {
  std::normal_distribution<float> d(0.0F, 4.0F);
  auto x = precis::host_tensor<float, 2>::from_shape({16, n});
  for (auto& v : x) v = d(precis_test::rng());
  return x;
}

/// PyTorch 2.15's float32 errors (max |y - ref| / max |ref| against float64, the same
/// distribution, 16 rows) on the CPU, by row length, measured with
/// bench/row_accuracy.py: softmax, log_softmax, logsumexp, cross-entropy.
struct torch_errors {
  std::size_t n;
  double softmax, log_softmax, logsumexp, cross_entropy;
};
constexpr torch_errors torch_fp32[] = {{1024, 1.90e-07, 5.59e-08, 3.13e-08, 7.36e-09},
                                       {4096, 5.81e-07, 6.54e-08, 4.17e-08, 3.65e-08},
                                       {16384, 2.14e-06, 1.29e-07, 4.59e-08, 7.18e-08},
                                       {50257, 4.26e-06, 2.11e-07, 5.02e-08, 2.49e-07}};

}  // namespace

TEST_CASE("long rows (up to a 50257-token vocabulary) are as accurate as PyTorch's float32") {
  // A single running sum gave softmax errors of 1.7e-5 at 4096 columns and 7.3e-5 at 50257.
  using P = precis::presets::fp32;
  const precis::cpu_context ctx{2};
  for (const torch_errors& t : torch_fp32) {
    INFO("columns: " << t.n);
    const auto x = long_rows(t.n);
    const auto xd = precis_test::to_double(x);
    auto ref_sm = precis::host_tensor<double, 2>::from_shape({16, t.n});
    auto ref_lsm = ref_sm;
    auto ref_lse = precis::host_tensor<double, 1>::from_shape({16});
    for (std::size_t r = 0; r < 16; ++r) {
      double m = -1e300, s = 0;
      for (std::size_t j = 0; j < t.n; ++j) m = std::max(m, xd(r, j));
      for (std::size_t j = 0; j < t.n; ++j) s += std::exp(xd(r, j) - m);
      ref_lse(r) = m + std::log(s);
      for (std::size_t j = 0; j < t.n; ++j) {
        ref_sm(r, j) = std::exp(xd(r, j) - m) / s;
        ref_lsm(r, j) = xd(r, j) - ref_lse(r);
      }
    }
    auto y = precis::host_tensor<float, 2>::from_shape({16, t.n});
    precis::softmax<P>(ctx, x, y);
    const double e_sm = precis_test::rel_error(y, ref_sm);
    precis::log_softmax<P>(ctx, x, y);
    const double e_lsm = precis_test::rel_error(y, ref_lsm);
    auto lse = precis::host_tensor<float, 1>::from_shape({16});
    precis::logsumexp<P>(ctx, x, lse);
    const double e_lse = precis_test::rel_error(lse, ref_lse);
    auto targets = precis::host_tensor<std::int64_t, 1>::from_shape({16});
    double ref_ce = 0;
    for (std::size_t r = 0; r < 16; ++r) {
      targets(r) = std::int64_t((r * 7919) % t.n);
      ref_ce += ref_lse(r) - xd(r, std::size_t(targets(r)));
    }
    ref_ce /= 16;
    const double ce = double(precis::cross_entropy<P>(ctx, x, targets));
    const double e_ce = std::abs(ce - ref_ce) / std::abs(ref_ce);
    MESSAGE("n = " << t.n << ": softmax " << e_sm << " (torch " << t.softmax << "), log_softmax "
                   << e_lsm << " (" << t.log_softmax << "), logsumexp " << e_lse << " ("
                   << t.logsumexp << "), cross-entropy " << e_ce << " (" << t.cross_entropy << ")");
    // Where PyTorch is already at the floor of float arithmetic, the bound is that floor:
    // below it the comparison is noise. One float ulp relative to the largest output
    // (2^-23) for the logarithms; for softmax three (exp's 1 ulp, the sum's rounding, the
    // division's half ulp).
    const double ulp = std::ldexp(1.0, -23);
    CHECK(e_sm <= std::max(t.softmax, 3 * ulp));
    CHECK(e_lsm <= std::max(t.log_softmax, ulp));
    CHECK(e_lse <= std::max(t.logsumexp, ulp));
    // Cross-entropy is a mean of differences lse - logit, each rounded at lse's scale,
    // which can be several times the mean: four ulps.
    CHECK(e_ce <= std::max(t.cross_entropy, 4 * ulp));
  }
}
