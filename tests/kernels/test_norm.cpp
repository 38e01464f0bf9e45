// Layer norm and batch norm against float64 references on the same rounded inputs
// (bounds: kernel_checks.hpp); the float64 gradients against central differences; running
// statistics; bad arguments; thread determinism.
#include <precis/kernels/norm.hpp>

#include "kernel_checks.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <random>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using namespace precis_test;
using precis::bfloat16;
using precis::cpu_context;
using precis::float16;
using precis::host_tensor;

using vec = host_tensor<double, 1>;
using mat = host_tensor<double, 2>;
using t4 = host_tensor<double, 4>;

constexpr double eps = 1e-5;

// ---- layer norm over the rows of x [R, D] ----
struct ln_out {
  mat y;
  vec mean, rstd;
};
ln_out ln_ref(const mat& x, const vec& g, const vec& b) {
  const std::size_t R = x.shape()[0], D = x.shape()[1];
  ln_out o{x, vec::from_shape({R}), vec::from_shape({R})};
  for (std::size_t r = 0; r < R; ++r) {
    double m = 0, v = 0;
    for (std::size_t j = 0; j < D; ++j) m += x(r, j);
    m /= double(D);
    for (std::size_t j = 0; j < D; ++j) v += (x(r, j) - m) * (x(r, j) - m);
    const double rs = 1 / std::sqrt(v / double(D) + eps);
    for (std::size_t j = 0; j < D; ++j) o.y(r, j) = (x(r, j) - m) * rs * g(j) + b(j);
    o.mean(r) = m;
    o.rstd(r) = rs;
  }
  return o;
}
struct grads {
  mat dx;
  vec dg, db;
};
grads ln_grad(const mat& dy, const mat& x, const vec& g, const vec& mean, const vec& rstd) {
  const std::size_t R = x.shape()[0], D = x.shape()[1];
  grads o{x, vec::from_shape({D}), vec::from_shape({D})};
  o.dg.fill(0);
  o.db.fill(0);
  for (std::size_t r = 0; r < R; ++r) {
    double a = 0, b = 0;
    for (std::size_t j = 0; j < D; ++j) {
      const double xh = (x(r, j) - mean(r)) * rstd(r);
      a += dy(r, j) * g(j);
      b += dy(r, j) * g(j) * xh;
      o.dg(j) += dy(r, j) * xh;
      o.db(j) += dy(r, j);
    }
    for (std::size_t j = 0; j < D; ++j) {
      const double xh = (x(r, j) - mean(r)) * rstd(r);
      o.dx(r, j) = rstd(r) * (dy(r, j) * g(j) - a / double(D) - xh * b / double(D));
    }
  }
  return o;
}

// ---- batch norm over x [N, C, H, W] ----
struct bn_out {
  t4 y;
  vec mean, var;  // biased
};
bn_out bn_ref(const t4& x, const vec& g, const vec& b) {
  const auto s = x.shape();
  const double count = double(s[0] * s[2] * s[3]);
  bn_out o{x, vec::from_shape({s[1]}), vec::from_shape({s[1]})};
  for (std::size_t c = 0; c < s[1]; ++c) {
    double m = 0, v = 0;
    for (std::size_t n = 0; n < s[0]; ++n)
      for (std::size_t h = 0; h < s[2]; ++h)
        for (std::size_t w = 0; w < s[3]; ++w) m += x(n, c, h, w);
    m /= count;
    for (std::size_t n = 0; n < s[0]; ++n)
      for (std::size_t h = 0; h < s[2]; ++h)
        for (std::size_t w = 0; w < s[3]; ++w) v += (x(n, c, h, w) - m) * (x(n, c, h, w) - m);
    v /= count;
    const double rs = 1 / std::sqrt(v + eps);
    for (std::size_t n = 0; n < s[0]; ++n)
      for (std::size_t h = 0; h < s[2]; ++h)
        for (std::size_t w = 0; w < s[3]; ++w) o.y(n, c, h, w) = (x(n, c, h, w) - m) * rs * g(c) + b(c);
    o.mean(c) = m;
    o.var(c) = v;
  }
  return o;
}
struct bn_grads {
  t4 dx;
  vec dg, db;
};
bn_grads bn_grad(const t4& dy, const t4& x, const vec& g, const vec& mean, const vec& rstd) {
  const auto s = x.shape();
  const double count = double(s[0] * s[2] * s[3]);
  bn_grads o{x, vec::from_shape({s[1]}), vec::from_shape({s[1]})};
  for (std::size_t c = 0; c < s[1]; ++c) {
    double sdy = 0, sdyx = 0;
    for (std::size_t n = 0; n < s[0]; ++n)
      for (std::size_t h = 0; h < s[2]; ++h)
        for (std::size_t w = 0; w < s[3]; ++w) {
          sdy += dy(n, c, h, w);
          sdyx += dy(n, c, h, w) * (x(n, c, h, w) - mean(c)) * rstd(c);
        }
    for (std::size_t n = 0; n < s[0]; ++n)
      for (std::size_t h = 0; h < s[2]; ++h)
        for (std::size_t w = 0; w < s[3]; ++w) {
          const double xh = (x(n, c, h, w) - mean(c)) * rstd(c);
          o.dx(n, c, h, w) = g(c) * rstd(c) * (dy(n, c, h, w) - sdy / count - xh * sdyx / count);
        }
    o.dg(c) = sdyx;
    o.db(c) = sdy;
  }
  return o;
}

template <std::size_t N, class Source>
host_tensor<double, N> reshaped_like(const Source& m, const std::array<std::size_t, N>& shape) {
  auto t = host_tensor<double, N>::from_shape(shape);
  std::copy(m.begin(), m.end(), t.begin());
  return t;
}

}  // namespace

TEST_CASE("float64 layer norm and batch norm gradients match central differences") {
  const auto x = random_tensor<double, 2>({3, 8}, -2, 2);
  const auto g = random_tensor<double, 1>({8}, 0.5, 1.5);
  const auto b = random_tensor<double, 1>({8});
  const auto w = random_tensor<double, 2>({3, 8});
  const auto f = ln_ref(x, g, b);
  const auto an = ln_grad(w, x, g, f.mean, f.rstd);
  CHECK(rel_error(fd_gradient([&](const mat& v) { return dot(w, ln_ref(v, g, b).y); }, x), an.dx) < fd_bound);
  CHECK(rel_error(fd_gradient([&](const vec& v) { return dot(w, ln_ref(x, v, b).y); }, g), an.dg) < fd_bound);
  CHECK(rel_error(fd_gradient([&](const vec& v) { return dot(w, ln_ref(x, g, v).y); }, b), an.db) < fd_bound);

  const auto x4 = random_tensor<double, 4>({2, 3, 2, 3}, -2, 2);
  const auto g4 = random_tensor<double, 1>({3}, 0.5, 1.5);
  const auto b4 = random_tensor<double, 1>({3});
  const auto w4 = random_tensor<double, 4>({2, 3, 2, 3});
  const auto f4 = bn_ref(x4, g4, b4);
  auto rstd = f4.var;
  for (auto& v : rstd) v = 1 / std::sqrt(v + eps);
  const auto an4 = bn_grad(w4, x4, g4, f4.mean, rstd);
  CHECK(rel_error(fd_gradient([&](const t4& v) { return dot(w4, bn_ref(v, g4, b4).y); }, x4), an4.dx) < fd_bound);
  CHECK(rel_error(fd_gradient([&](const vec& v) { return dot(w4, bn_ref(x4, v, b4).y); }, g4), an4.dg) < fd_bound);
  CHECK(rel_error(fd_gradient([&](const vec& v) { return dot(w4, bn_ref(x4, g4, v).y); }, b4), an4.db) < fd_bound);
}

TEST_CASE_TEMPLATE("layer norm matches float64, forward and backward", C, fp32_config, bf16_config,
                   fp16_config) {
  using T = typename C::T;
  using P = typename C::P;
  const cpu_context ctx{1};
  // Rank 3, rows of 48; an offset mean (3) that a one-pass variance would suffer from.
  const auto x = random_tensor<T, 3>({2, 5, 48}, 1, 5);
  const auto g = random_tensor<T, 1>({48}, 0.5, 1.5);
  const auto b = random_tensor<T, 1>({48});
  const auto dy = random_tensor<T, 3>({2, 5, 48});
  const auto xd = to_double(x), dyd = to_double(dy);
  auto xm = mat::from_shape({10, 48}), dym = xm;
  std::copy(xd.begin(), xd.end(), xm.begin());
  std::copy(dyd.begin(), dyd.end(), dym.begin());
  const auto ref = ln_ref(xm, to_double(g), to_double(b));

  auto y = poisoned<T, 3>(x.shape());
  auto mean = poisoned<float, 2>(std::array<std::size_t, 2>{2, 5}), rstd = mean;
  precis::layer_norm<P>(ctx, x, g, b, y, mean, rstd, eps);
  CHECK(rel_error(y, reshaped_like<3>(ref.y, {2, 5, 48})) < bound<T>());
  CHECK(rel_error(mean, reshaped_like<2>(ref.mean, {2, 5})) < bound<float>());
  CHECK(rel_error(rstd, reshaped_like<2>(ref.rstd, {2, 5})) < bound<float>());

  // The backward pass from the kernel's saved statistics (the same inputs for both).
  auto ms = vec::from_shape({10}), rs = ms;
  for (std::size_t i = 0; i < 10; ++i) {
    ms(i) = double(mean.data()[i]);
    rs(i) = double(rstd.data()[i]);
  }
  const auto an = ln_grad(dym, xm, to_double(g), ms, rs);
  auto dx = poisoned<T, 3>(x.shape());
  auto dg = poisoned<T, 1>(g.shape()), db = dg;
  precis::layer_norm_backward<P>(ctx, dy, x, g, mean, rstd, dx, dg, db);
  CHECK(rel_error(dx, reshaped_like<3>(an.dx, {2, 5, 48})) < bound<T>());
  CHECK(rel_error(dg, an.dg) < bound<T>());
  CHECK(rel_error(db, an.db) < bound<T>());
}

// The float path writes narrow outputs from registers (bfloat16) or through blocks
// (float16): each must be the float result rounded once, by precis::convert's rounding,
// with and without a partial last vector; float rows are read and written in place, so y
// may be x.
TEST_CASE_TEMPLATE(
    "layer norm: a narrow output is the float output rounded once; float rows "
    "in place",
    X, float, bfloat16, float16) {
  using P = precis::presets::bf16_mixed;
  const cpu_context ctx{1};
  for (const std::size_t cols : {1U, 15U, 16U, 37U, 300U}) {
    INFO("cols " << cols);
    auto x = random_tensor<X, 2>({4, cols}, -3, 5);
    x(2, cols / 2) = X(std::numeric_limits<float>::quiet_NaN());
    const auto g = random_tensor<X, 1>({cols}, 0.5, 1.5);
    const auto b = random_tensor<X, 1>({cols});
    auto mean = poisoned<float, 1>(std::array<std::size_t, 1>{4}), rstd = mean;
    auto yf = poisoned<float, 2>(x.shape());
    precis::layer_norm<P>(ctx, x, g, b, yf, mean, rstd);
    CHECK(std::isnan(yf(2, 0)));
    CHECK(!std::isnan(yf(1, 0)));
    auto yb = poisoned<bfloat16, 2>(x.shape());
    precis::layer_norm<P>(ctx, x, g, b, yb, mean, rstd);
    CHECK(same_bits(yb, rounded<bfloat16>(yf)));
    auto yh = poisoned<float16, 2>(x.shape());
    precis::layer_norm<P>(ctx, x, g, b, yh, mean, rstd);
    CHECK(same_bits(yh, rounded<float16>(yf)));
    auto xf = host_tensor<float, 2>::from_shape({4, cols});
    for (std::size_t i = 0; i < x.size(); ++i) xf.data()[i] = float(to_double(x.data()[i]));
    precis::layer_norm<P>(ctx, xf, g, b, xf, mean, rstd);
    CHECK(same_bits(xf, yf));
  }
}

TEST_CASE_TEMPLATE("batch norm matches float64: training, running statistics, inference, backward", C,
                   fp32_config, bf16_config, fp16_config) {
  using T = typename C::T;
  using P = typename C::P;
  const cpu_context ctx{1};
  const auto x = random_tensor<T, 4>({3, 4, 5, 5}, -1, 3);
  const auto g = random_tensor<T, 1>({4}, 0.5, 1.5);
  const auto b = random_tensor<T, 1>({4});
  const auto dy = random_tensor<T, 4>({3, 4, 5, 5});
  const auto xd = to_double(x);
  const auto gd = to_double(g), bd = to_double(b);
  const auto ref = bn_ref(xd, gd, bd);

  auto rm = random_tensor<float, 1>({4}), rv = random_tensor<float, 1>({4}, 0.5, 2);
  const auto rm0 = to_double(rm), rv0 = to_double(rv);
  auto y = poisoned<T, 4>(x.shape());
  auto sm = poisoned<float, 1>(std::array<std::size_t, 1>{4}), sr = sm;
  const double momentum = 0.1;
  precis::batch_norm_train<P>(ctx, x, g, b, rm, rv, y, sm, sr, momentum, eps);
  CHECK(rel_error(y, ref.y) < bound<T>());
  CHECK(rel_error(sm, ref.mean) < bound<float>());
  auto rstd_ref = ref.var, rm_ref = ref.mean, rv_ref = ref.var;
  const double count = 3 * 25;
  for (std::size_t c = 0; c < 4; ++c) {
    rstd_ref(c) = 1 / std::sqrt(ref.var(c) + eps);
    rm_ref(c) = (1 - momentum) * rm0(c) + momentum * ref.mean(c);
    rv_ref(c) = (1 - momentum) * rv0(c) + momentum * ref.var(c) * count / (count - 1);  // unbiased
  }
  CHECK(rel_error(sr, rstd_ref) < bound<float>());
  CHECK(rel_error(rm, rm_ref) < bound<float>());
  CHECK(rel_error(rv, rv_ref) < bound<float>());

  // Inference with the updated running statistics.
  auto yi = poisoned<T, 4>(x.shape());
  precis::batch_norm_infer<P>(ctx, x, g, b, rm, rv, yi, eps);
  auto yi_ref = xd;
  for (std::size_t n = 0; n < 3; ++n)
    for (std::size_t c = 0; c < 4; ++c)
      for (std::size_t h = 0; h < 5; ++h)
        for (std::size_t w = 0; w < 5; ++w)
          yi_ref(n, c, h, w) = (xd(n, c, h, w) - double(rm(c))) / std::sqrt(double(rv(c)) + eps) * gd(c) + bd(c);
  CHECK(rel_error(yi, yi_ref) < bound<T>());

  auto dx = poisoned<T, 4>(x.shape());
  auto dg = poisoned<T, 1>(g.shape()), db = dg;
  precis::batch_norm_backward<P>(ctx, dy, x, g, sm, sr, dx, dg, db);
  const auto an = bn_grad(to_double(dy), xd, gd, to_double(sm), to_double(sr));
  CHECK(rel_error(dx, an.dx) < bound<T>());
  CHECK(rel_error(dg, an.dg) < bound<T>());
  CHECK(rel_error(db, an.db) < bound<T>());
}

TEST_CASE("batch norm on [N, C] tensors") {
  using P = precis::presets::fp32;
  const cpu_context ctx{1};
  const auto x = random_tensor<float, 2>({16, 3}, -2, 2);
  auto g = host_tensor<float, 1>::from_shape({3}), b = g;
  g.fill(1.0f);
  b.fill(0.0f);
  auto rm = g, rv = g;
  rm.fill(0.0f);
  auto y = poisoned<float, 2>(x.shape());
  auto sm = poisoned<float, 1>(std::array<std::size_t, 1>{3}), sr = sm;
  precis::batch_norm_train<P>(ctx, x, g, b, rm, rv, y, sm, sr);
  const auto x4 = reshaped_like<4>(to_double(x), {16, 3, 1, 1});
  auto gd = to_double(g), bd = to_double(b);
  CHECK(rel_error(y, reshaped_like<2>(bn_ref(x4, gd, bd).y, {16, 3})) < bound<float>());
}

TEST_CASE("norm argument errors name the shapes and write nothing") {
  using P = precis::presets::fp32;
  const cpu_context ctx{1};
  const auto x = random_tensor<float, 2>({3, 8});
  const auto g = random_tensor<float, 1>({8});
  const auto g7 = random_tensor<float, 1>({7});
  auto y = poisoned<float, 2>(x.shape());
  auto m = poisoned<float, 1>(std::array<std::size_t, 1>{3}), r = m;
  auto m4 = poisoned<float, 1>(std::array<std::size_t, 1>{4});
  check_error([&] { precis::layer_norm<P>(ctx, x, g7, g, y, m, r); }, "gamma", "[7]", "[8]");
  check_error([&] { precis::layer_norm<P>(ctx, x, g, g, y, m4, r); }, "mean", "[4]", "[3]");
  check_error([&] { precis::layer_norm<P>(ctx, x, g, g, y, m, r, -1.0); }, "eps");
  for (float v : y) CHECK(std::isnan(v));
  for (float v : m) CHECK(std::isnan(v));

  const auto x4 = random_tensor<float, 4>({2, 8, 3, 3});
  auto y4 = poisoned<float, 4>(x4.shape());
  auto c8 = poisoned<float, 1>(std::array<std::size_t, 1>{8}), rm = c8, rv = c8, sm = c8, sr = c8;
  check_error([&] { precis::batch_norm_train<P>(ctx, x4, g7, g, rm, rv, y4, sm, sr); }, "gamma", "[7]", "[8]");
  check_error([&] { precis::batch_norm_train<P>(ctx, x4, g, g, rm, rv, y4, sm, sr, 1.5); }, "momentum");
  check_error([&] { precis::batch_norm_infer<P>(ctx, x4, g, g, rm, m4, y4); }, "running_var", "[4]", "[8]");
  const auto one = random_tensor<float, 2>({1, 8});
  auto y1 = poisoned<float, 2>(one.shape());
  check_error([&] { precis::batch_norm_train<P>(ctx, one, g, g, rm, rv, y1, sm, sr); }, "[1, 8]",
              "more than one value per channel");
  for (float v : y4) CHECK(std::isnan(v));
  for (float v : rm) CHECK(std::isnan(v));
}

TEST_CASE("norms are bit-identical for 1 and 2 threads") {
  using P = precis::presets::bf16_mixed;
  const auto x = random_tensor<bfloat16, 2>({300, 768});
  const auto g = random_tensor<bfloat16, 1>({768}), b = random_tensor<bfloat16, 1>({768});
  auto y1 = poisoned<bfloat16, 2>(x.shape()), y2 = y1;
  auto m1 = poisoned<float, 1>(std::array<std::size_t, 1>{300}), r1 = m1, m2 = m1, r2 = m1;
  precis::layer_norm<P>(cpu_context{1}, x, g, b, y1, m1, r1);
  precis::layer_norm<P>(cpu_context{2}, x, g, b, y2, m2, r2);
  CHECK(same_bits(y1, y2));
  CHECK(same_bits(r1, r2));
  auto dx1 = y1, dx2 = y1;
  auto dg1 = poisoned<float, 1>(g.shape()), dg2 = dg1, db1 = dg1, db2 = dg1;
  precis::layer_norm_backward<P>(cpu_context{1}, x, x, g, m1, r1, dx1, dg1, db1);
  precis::layer_norm_backward<P>(cpu_context{2}, x, x, g, m1, r1, dx2, dg2, db2);
  CHECK(same_bits(dx1, dx2));
  CHECK(same_bits(dg1, dg2));
  CHECK(same_bits(db1, db2));

  const auto x4 = random_tensor<bfloat16, 4>({8, 64, 16, 16});
  const auto g4 = random_tensor<bfloat16, 1>({64});
  auto a = poisoned<bfloat16, 4>(x4.shape()), c = a;
  auto rm1 = poisoned<float, 1>(std::array<std::size_t, 1>{64});
  rm1.fill(0.0f);
  auto rv1 = rm1, rm2 = rm1, rv2 = rm1, s1 = rm1, t1 = rm1, s2 = rm1, t2 = rm1;
  precis::batch_norm_train<P>(cpu_context{1}, x4, g4, g4, rm1, rv1, a, s1, t1);
  precis::batch_norm_train<P>(cpu_context{2}, x4, g4, g4, rm2, rv2, c, s2, t2);
  CHECK(same_bits(a, c));
  CHECK(same_bits(rv1, rv2));
  auto e1 = poisoned<float, 1>(std::array<std::size_t, 1>{64}), e2 = e1, f1 = e1, f2 = e1;
  precis::batch_norm_backward<P>(cpu_context{1}, x4, x4, g4, s1, t1, a, e1, f1);
  precis::batch_norm_backward<P>(cpu_context{2}, x4, x4, g4, s1, t1, c, e2, f2);
  CHECK(same_bits(a, c));
  CHECK(same_bits(e1, e2));
}

TEST_CASE("layer norm over long rows is as accurate as PyTorch's float32") {
  // PyTorch 2.15's float32 layer_norm error (max |y - ref| / max |ref| against float64;
  // rows of N(0, 4^2), gamma and beta N(0, 1); bench/row_accuracy.py), by row length.
  const std::pair<std::size_t, double> torch_fp32[] = {
      {1024, 9.29e-08}, {4096, 1.04e-07}, {16384, 1.07e-07}, {50257, 1.30e-07}};
  using P = precis::presets::fp32;
  const precis::cpu_context ctx{2};
  std::normal_distribution<float> d(0.0F, 1.0F);
  for (const auto& entry : torch_fp32) {
    const std::size_t n = entry.first;  // named variables: clang 14's INFO cannot capture bindings
    const double torch_error = entry.second;
    INFO("columns: " << n);
    auto x = precis::host_tensor<float, 2>::from_shape({16, n});
    auto gamma = precis::host_tensor<float, 1>::from_shape({n});
    auto beta = gamma;
    for (auto& v : x) v = 4.0F * d(precis_test::rng());
    for (auto& v : gamma) v = d(precis_test::rng());
    for (auto& v : beta) v = d(precis_test::rng());
    auto ref = precis::host_tensor<double, 2>::from_shape({16, n});
    for (std::size_t r = 0; r < 16; ++r) {
      double mu = 0, var = 0;
      for (std::size_t j = 0; j < n; ++j) mu += double(x(r, j));
      mu /= double(n);
      for (std::size_t j = 0; j < n; ++j) var += (double(x(r, j)) - mu) * (double(x(r, j)) - mu);
      const double rs = 1 / std::sqrt(var / double(n) + 1e-5);
      for (std::size_t j = 0; j < n; ++j) {
        ref(r, j) = (double(x(r, j)) - mu) * rs * double(gamma(j)) + double(beta(j));
      }
    }
    auto y = precis::host_tensor<float, 2>::from_shape({16, n});
    auto mean = precis::host_tensor<float, 1>::from_shape({16});
    auto rstd = mean;
    precis::layer_norm<P>(ctx, x, gamma, beta, y, mean, rstd);
    const double e = precis_test::rel_error(y, ref);
    MESSAGE("n = " << n << ": layer norm " << e << " (torch " << torch_error << ")");
    // Two float ulps of the largest output is the floor of the float arithmetic here.
    CHECK(e <= std::max(torch_error, std::ldexp(1.0, -22)));
  }
}

namespace {

/// [N, C, H, W] -> [N, H, W, C], element by element.
template <class T>
host_tensor<T, 4> channels_last(const host_tensor<T, 4>& t) {
  const auto s = t.shape();
  auto out = host_tensor<T, 4>::from_shape({s[0], s[2], s[3], s[1]});
  for (std::size_t n = 0; n < s[0]; ++n)
    for (std::size_t c = 0; c < s[1]; ++c)
      for (std::size_t h = 0; h < s[2]; ++h)
        for (std::size_t w = 0; w < s[3]; ++w) out(n, h, w, c) = t(n, c, h, w);
  return out;
}

}  // namespace

TEST_CASE_TEMPLATE("batch norm on channels-last images gives NCHW's bits, over several channel blocks", C,
                   fp32_config, bf16_config, fp16_config) {
  using T = typename C::T;
  using P = typename C::P;
  // 70 channels: several cache lines of channels (16 floats, 32 16-bit values) and a partial
  // one; 6 channels: less than one. 270 pixels: several tiles of pixels and a partial one.
  // 2 threads split the channels.
  for (const std::size_t ch : {std::size_t(70), std::size_t(6)}) {
    INFO(ch << " channels");
    const auto x = random_tensor<T, 4>({3, ch, 9, 10}, -1, 3);
    const auto dy = random_tensor<T, 4>(x.shape());
    const auto g = random_tensor<T, 1>({ch}, 0.5, 1.5), b = random_tensor<T, 1>({ch});
    const auto xl = channels_last(x), dyl = channels_last(dy);
    for (const unsigned threads : {1U, 2U}) {
      const cpu_context ctx{threads};
      auto rm = random_tensor<float, 1>({ch}), rv = random_tensor<float, 1>({ch}, 0.5, 2);
      auto rml = rm, rvl = rv;
      auto y = poisoned<T, 4>(x.shape());
      auto yl = poisoned<T, 4>(xl.shape());
      auto sm = poisoned<float, 1>(std::array<std::size_t, 1>{ch}), sr = sm, sml = sm, srl = sm;
      precis::batch_norm_train<P>(ctx, x, g, b, rm, rv, y, sm, sr, 0.1, eps);
      precis::batch_norm_train<P>(ctx, xl, g, b, rml, rvl, yl, sml, srl, 0.1, eps, precis::image_layout::nhwc);
      CHECK(same_bits(channels_last(y), yl));
      CHECK(same_bits(sm, sml));
      CHECK(same_bits(sr, srl));
      CHECK(same_bits(rm, rml));
      CHECK(same_bits(rv, rvl));

      auto yi = poisoned<T, 4>(x.shape());
      auto yil = poisoned<T, 4>(xl.shape());
      precis::batch_norm_infer<P>(ctx, x, g, b, rm, rv, yi, eps);
      precis::batch_norm_infer<P>(ctx, xl, g, b, rm, rv, yil, eps, precis::image_layout::nhwc);
      CHECK(same_bits(channels_last(yi), yil));

      auto dx = poisoned<T, 4>(x.shape());
      auto dxl = poisoned<T, 4>(xl.shape());
      auto dg = poisoned<T, 1>(g.shape()), db = dg, dgl = dg, dbl = dg;
      precis::batch_norm_backward<P>(ctx, dy, x, g, sm, sr, dx, dg, db);
      precis::batch_norm_backward<P>(ctx, dyl, xl, g, sm, sr, dxl, dgl, dbl, precis::image_layout::nhwc);
      CHECK(same_bits(channels_last(dx), dxl));
      CHECK(same_bits(dg, dgl));
      CHECK(same_bits(db, dbl));
    }
    // The channels are the last axis: gamma of the NCHW channel count is refused, naming it.
    auto yl = poisoned<T, 4>(xl.shape());
    auto rm = random_tensor<float, 1>({ch}), rv = rm, sm = rm, sr = rm;
    const auto g5 = random_tensor<T, 1>({ch + 1});
    CHECK_THROWS_WITH_AS(precis::batch_norm_train<P>(cpu_context{1}, xl, g5, g5, rm, rv, yl, sm, sr, 0.1, eps,
                                                     precis::image_layout::nhwc),
                         doctest::Contains("gamma"), precis::error);
  }
}

TEST_CASE_TEMPLATE("batch norm with a fused ReLU gives batch norm then relu's bits, forward and backward", C,
                   fp32_config, bf16_config, fp16_config) {
  using T = typename C::T;
  using P = typename C::P;
  const cpu_context ctx{2};
  const std::size_t ch = 5;
  const auto x = random_tensor<T, 4>({3, ch, 6, 7}, -1, 3);
  const auto dz = random_tensor<T, 4>(x.shape());
  auto g = random_tensor<T, 1>({ch}, 0.5, 1.5), b = random_tensor<T, 1>({ch});
  // Channel 0 gives outputs below half the smallest subnormal, negative where x is below
  // the mean: stored as -0 in 16 bits, which relu keeps. A ReLU of the unrounded value
  // would store +0 there.
  g(0) = std::numeric_limits<T>::denorm_min();
  b(0) = precis::round_to<T>(-0.0F);
  for (const auto layout : {precis::image_layout::nchw, precis::image_layout::nhwc}) {
    const bool last = layout == precis::image_layout::nhwc;
    INFO((last ? "channels-last" : "NCHW"));
    const auto xi = last ? channels_last(x) : x;
    const auto dzi = last ? channels_last(dz) : dz;
    auto rm = random_tensor<float, 1>({ch}), rv = random_tensor<float, 1>({ch}, 0.5, 2);
    auto rmf = rm, rvf = rv;
    auto y = poisoned<T, 4>(xi.shape()), z = y, zf = y;
    auto sm = poisoned<float, 1>(std::array<std::size_t, 1>{ch}), sr = sm, smf = sm, srf = sm;
    precis::batch_norm_train<P>(ctx, xi, g, b, rm, rv, y, sm, sr, 0.1, eps, layout);
    precis::relu<P>(ctx, y, z);
    precis::batch_norm_train<P>(ctx, xi, g, b, rmf, rvf, zf, smf, srf, 0.1, eps, layout,
                                precis::fused_activation::relu);
    CHECK(same_bits(z, zf));
    CHECK(same_bits(sm, smf));
    CHECK(same_bits(sr, srf));
    CHECK(same_bits(rm, rmf));
    CHECK(same_bits(rv, rvf));
    if constexpr (!std::is_same_v<T, float>) {
      // The case above is met: some output is -0 after a negative value was rounded.
      CHECK(std::any_of(z.data(), z.data() + z.size(), [](T v) {
        return std::signbit(precis::detail::load<float>(v)) && precis::detail::load<float>(v) == 0.0F;
      }));
    }

    auto zi = poisoned<T, 4>(xi.shape()), zif = zi, yi = zi;
    precis::batch_norm_infer<P>(ctx, xi, g, b, rm, rv, yi, eps, layout);
    precis::relu<P>(ctx, yi, zi);
    precis::batch_norm_infer<P>(ctx, xi, g, b, rm, rv, zif, eps, layout, precis::fused_activation::relu);
    CHECK(same_bits(zi, zif));

    auto dy = poisoned<T, 4>(xi.shape()), dx = dy, dxf = dy;
    auto dg = poisoned<T, 1>(g.shape()), db = dg, dgf = dg, dbf = dg;
    precis::relu_backward<P>(ctx, dzi, y, dy);
    precis::batch_norm_backward<P>(ctx, dy, xi, g, sm, sr, dx, dg, db, layout);
    precis::batch_norm_relu_backward<P>(ctx, dzi, z, xi, g, sm, sr, dxf, dgf, dbf, layout);
    CHECK(same_bits(dx, dxf));
    CHECK(same_bits(dg, dgf));
    CHECK(same_bits(db, dbf));
    // z of another shape is refused before anything is written.
    const auto wrong = poisoned<T, 4>(std::array<std::size_t, 4>{3, ch, 6, 8});
    auto untouched = poisoned<T, 4>(xi.shape());
    CHECK_THROWS_WITH_AS(
        precis::batch_norm_relu_backward<P>(ctx, dzi, wrong, xi, g, sm, sr, untouched, dgf, dbf, layout),
        doctest::Contains("z and x"), precis::error);
    CHECK(same_bits(untouched, poisoned<T, 4>(xi.shape())));
  }
}

// ---- the device's batch norm statistics: shares' two-pass moments joined by combine_moments ----

namespace {

using precis::detail::combine_moments;
using fmoments = precis::detail::moments<float>;

// A float sum as a device block takes one: each of 256 threads adds up to 16 values in
// turn, then the threads' sums pairwise.
float block_sum(const std::vector<float>& t) {
  std::vector<float> part((t.size() + 15) / 16, 0.0F);
  for (std::size_t i = 0; i < t.size(); ++i) part[i / 16] += t[i];
  while (part.size() > 1) {
    std::vector<float> next((part.size() + 1) / 2);
    for (std::size_t i = 0; i < next.size(); ++i) next[i] = part[2 * i] + (2 * i + 1 < part.size() ? part[2 * i + 1] : 0.0F);
    part = next;
  }
  return part[0];
}

// A share's moments as the device's first pass takes them: the float sum, the mean, then the
// float sum of squared distances to it.
fmoments two_pass(const std::vector<float>& v, std::size_t lo, std::size_t hi) {
  const std::vector<float> share(v.begin() + std::ptrdiff_t(lo), v.begin() + std::ptrdiff_t(hi));
  const float mean = block_sum(share) / float(hi - lo);
  std::vector<float> sq(share.size());
  for (std::size_t i = 0; i < share.size(); ++i) sq[i] = (share[i] - mean) * (share[i] - mean);
  return {float(hi - lo), mean, block_sum(sq)};
}

// The device's second pass: lane l joins shares l, l + 32, .. in order, then a butterfly
// over the lanes, the lower lane's moments first.
fmoments warp_join(const std::vector<fmoments>& shares) {
  std::array<fmoments, 32> lane{};
  for (std::size_t p = 0; p < shares.size(); ++p) lane[p % 32] = combine_moments(lane[p % 32], shares[p]);
  for (std::size_t o = 16; o > 0; o /= 2) {
    for (std::size_t l = 0; l < 32; ++l) {
      if ((l & o) == 0) lane[l] = lane[l | o] = combine_moments(lane[l], lane[l | o]);
    }
  }
  return lane[0];
}

}  // namespace

TEST_CASE("combine_moments joins shares' moments to the exact mean and variance within float rounding") {
  // An empty share changes nothing; two single values give their mean and half their
  // squared distance.
  const fmoments a{3, 1.5F, 2.0F}, none{0, 0, 0};
  CHECK(combine_moments(a, none).mean == a.mean);
  CHECK(combine_moments(none, a).m2 == a.m2);
  const fmoments two = combine_moments(fmoments{1, 2.0F, 0}, fmoments{1, 6.0F, 0});
  CHECK(two.count == 2);
  CHECK(two.mean == 4.0F);
  CHECK(two.m2 == 8.0F);
  std::mt19937 g(11);
  // Means far from zero against their spread: a sum of squares less n mean^2 in float loses
  // every digit there; the shares' two passes and the joins keep them.
  for (const float offset : {0.0F, 3.0F, 1e3F, 3e4F}) {
    for (const std::size_t n : {std::size_t(5), std::size_t(4096), std::size_t(100000), std::size_t(250001)}) {
      std::normal_distribution<float> d(offset, 0.7F);
      std::vector<float> v(n);
      for (auto& x : v) x = d(g);
      long double sum = 0;
      for (const float x : v) sum += x;
      const long double mean = sum / n;
      long double m2 = 0;
      for (const float x : v) m2 += (x - mean) * (x - mean);
      // Shares of 4096 (a plane's segments) and of 64 (channels-last slabs), joined as the
      // device joins them.
      for (const std::size_t share : {std::size_t(4096), std::size_t(64)}) {
        std::vector<fmoments> shares;
        for (std::size_t lo = 0; lo < n; lo += share) shares.push_back(two_pass(v, lo, std::min(n, lo + share)));
        const fmoments m = warp_join(shares);
        CAPTURE(offset);
        CAPTURE(n);
        CAPTURE(share);
        CHECK(m.count == float(n));
        // The sums' and the joins' rounding: a few hundred float ulps of the mean at most.
        CHECK(std::abs(m.mean - double(mean)) <= std::ldexp(std::abs(double(mean)) + 1, -16));
        // Within float rounding of m2, plus what the float means themselves carry: a mean
        // is known to 2^-24 |mean|, r of the spread, which moves m2 by the order of r^2.
        const double r = std::ldexp(std::abs(double(mean)), -24) / std::sqrt(double(m2) / double(n));
        CHECK(std::abs(double(m.m2) - double(m2)) <= double(m2) * (2e-5 + 64 * r * r));
      }
      // The one-pass float formula the joins avoid: no digit left at an offset of 3e4.
      if (offset == 3e4F && n >= 4096) {
        float s = 0, s2 = 0;
        for (const float x : v) {
          s += x;
          s2 += x * x;
        }
        const double naive = double(s2) - double(s) * double(s) / double(n);
        CHECK(std::abs(naive - double(m2)) > 0.5 * double(m2));
      }
    }
  }
}
