// softmax, log_softmax, logsumexp and their gradients against float64 references on the
// same rounded inputs (bounds: kernel_checks.hpp); the float64 gradients against central
// differences; large logits; errors; thread determinism.
#include <precis/kernels/softmax.hpp>

#include "kernel_checks.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>

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
