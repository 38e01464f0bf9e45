// nn layers: every backward pass against central finite differences in float64 (layers
// under an all-double policy, so the check measures the derivative, not rounding), the
// gradient-type semantics of mixed-precision layers, casts inserted by sequential, and
// parameters that keep their storage.
#include <precis/precis.hpp>

#include <doctest/doctest.h>

#include "random.hpp"

#include <cmath>
#include <random>
#include <string>
#include <type_traits>

using namespace precis;

namespace {

using f64 = policy<double, double, double, double>;
const cpu_context ctx{1};

host_tensor<double, 2> random_matrix(std::size_t rows, std::size_t cols, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> d(lo, hi);
  host_tensor<double, 2> t(std::array<std::size_t, 2>{rows, cols});
  for (auto& v : t) v = d(precis_test::rng());
  return t;
}

// L(x) = sum(w * layer(x)): its gradient with respect to the output is w.
template <class Layer>
double objective(Layer& l, const host_tensor<double, 2>& x, const host_tensor<double, 2>& w) {
  const auto& y = l.forward(ctx, x, nn::mode::train);
  double s = 0.0;
  for (std::size_t i = 0; i < y.size(); ++i) s += y.data()[i] * w.data()[i];
  return s;
}

// Compares the layer's input and parameter gradients with central differences. Steps
// are taken on the float64 values themselves (the master weights are double here).
template <class Layer>
void check_gradients(Layer& l, host_tensor<double, 2> x, std::size_t out_cols, double tol = 1e-6) {
  const auto w = random_matrix(std::size_t(x.shape()[0]), out_cols);
  objective(l, x, w);
  l.for_each_parameter([](std::string_view, auto& p) { p.zero_grad(); });
  const host_tensor<double, 2> dx = l.backward(ctx, w);
  const double h = 1e-6;
  double scale = 1.0;
  for (auto v : dx) scale = std::max(scale, std::fabs(v));
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double keep = x.data()[i];
    x.data()[i] = keep + h;
    const double up = objective(l, x, w);
    x.data()[i] = keep - h;
    const double down = objective(l, x, w);
    x.data()[i] = keep;
    CHECK(dx.data()[i] == doctest::Approx((up - down) / (2 * h)).scale(scale).epsilon(tol));
  }
  l.for_each_parameter([&](std::string_view name, auto& p) {
    const auto grad = p.grad();
    double gscale = 1.0;
    for (auto v : grad) gscale = std::max(gscale, std::fabs(v));
    for (std::size_t i = 0; i < p.size(); ++i) {
      const double keep = p.master().data()[i];
      p.master().data()[i] = keep + h;
      p.refresh();
      const double up = objective(l, x, w);
      p.master().data()[i] = keep - h;
      p.refresh();
      const double down = objective(l, x, w);
      p.master().data()[i] = keep;
      p.refresh();
      INFO("parameter " << name << "[" << i << "]");
      CHECK(grad.data()[i] == doctest::Approx((up - down) / (2 * h)).scale(gscale).epsilon(tol));
    }
  });
}

}  // namespace

TEST_CASE("linear: backward matches central differences") {
  nn::linear<f64> l(5, 3, {7});
  check_gradients(l, random_matrix(4, 5), 3);
}

TEST_CASE("relu, gelu, sigmoid and tanh: backward matches central differences") {
  nn::gelu<f64> g;
  check_gradients(g, random_matrix(3, 6, -3.0, 3.0), 6);
  nn::sigmoid<f64> s;
  check_gradients(s, random_matrix(3, 6, -4.0, 4.0), 6);
  nn::tanh<f64> t;
  check_gradients(t, random_matrix(3, 6, -2.0, 2.0), 6);
  nn::relu<f64> r;
  // Away from the kink at 0, where the derivative is undefined.
  auto x = random_matrix(3, 6, 0.05, 2.0);
  for (std::size_t i = 0; i < x.size(); i += 2) x.data()[i] = -x.data()[i];
  check_gradients(r, x, 6);
}

TEST_CASE("layer_norm: backward matches central differences") {
  nn::layer_norm<f64> l(6);
  // Non-trivial gamma and beta.
  for (auto& v : l.gamma().master()) v = 0.5 + std::uniform_real_distribution<double>(0, 1)(precis_test::rng());
  for (auto& v : l.beta().master()) v = std::uniform_real_distribution<double>(-1, 1)(precis_test::rng());
  l.gamma().refresh();
  l.beta().refresh();
  check_gradients(l, random_matrix(4, 6), 6);
}

TEST_CASE("batch_norm: backward matches central differences; eval uses running statistics") {
  nn::batch_norm<f64> b(3, 0.5);
  for (auto& v : b.gamma().master()) v = 0.5 + std::uniform_real_distribution<double>(0, 1)(precis_test::rng());
  b.gamma().refresh();
  const auto x = random_matrix(5, 3);
  check_gradients(b, x, 3);
  // Running statistics follow PyTorch's rule: after one training pass from (0, 1) with
  // momentum m, mean = m * batch mean and var = (1 - m) + m * unbiased batch variance.
  nn::batch_norm<f64> fresh(3, 0.5);
  fresh.forward(ctx, x, nn::mode::train);
  for (std::size_t c = 0; c < 3; ++c) {
    double mu = 0, var = 0;
    for (std::size_t r = 0; r < 5; ++r) mu += x(r, c) / 5;
    for (std::size_t r = 0; r < 5; ++r) var += (x(r, c) - mu) * (x(r, c) - mu) / 4;
    CHECK(fresh.running_mean()(c) == doctest::Approx(0.5 * mu).epsilon(1e-12));
    CHECK(fresh.running_var()(c) == doctest::Approx(0.5 + 0.5 * var).epsilon(1e-12));
  }
  const auto& y = fresh.forward(ctx, x, nn::mode::eval);
  for (std::size_t c = 0; c < 3; ++c) {
    const double expect = (x(0, c) - fresh.running_mean()(c)) / std::sqrt(fresh.running_var()(c) + 1e-5);
    CHECK(y(0, c) == doctest::Approx(expect).epsilon(1e-12));
  }
}

TEST_CASE("softmax_cross_entropy: backward matches central differences of the loss") {
  nn::softmax_cross_entropy<f64> loss;
  auto logits = random_matrix(4, 5, -3, 3);
  host_tensor<std::int32_t, 1> t(std::array<std::size_t, 1>{4});
  for (std::size_t i = 0; i < 4; ++i) t(i) = std::int32_t((i * 3) % 5);
  loss.forward(ctx, logits, t);
  const host_tensor<double, 2> d = loss.backward(ctx, 2.0);  // dloss = 2, as a scale would be
  const double h = 1e-6;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    const double keep = logits.data()[i];
    logits.data()[i] = keep + h;
    const double up = loss.forward(ctx, logits, t);
    logits.data()[i] = keep - h;
    const double down = loss.forward(ctx, logits, t);
    logits.data()[i] = keep;
    CHECK(d.data()[i] == doctest::Approx(2.0 * (up - down) / (2 * h)).scale(1.0).epsilon(1e-7));
  }
}

TEST_CASE("a whole chain: backward matches central differences") {
  auto model = nn::make_sequential(nn::linear<f64>(4, 6, {1}), nn::gelu<f64>{}, nn::layer_norm<f64>(6),
                                   nn::linear<f64>(6, 3, {2}));
  check_gradients(model.layer<0>(), random_matrix(3, 4), 6);  // the first layer alone
  const auto x = random_matrix(3, 4);
  const auto w = random_matrix(3, 3);
  model.zero_grad();
  model.forward(ctx, x);
  const host_tensor<double, 2> dx = model.backward(ctx, w);
  const double h = 1e-6;
  auto f = [&](const host_tensor<double, 2>& in) {
    const auto& y = model.forward(ctx, in);
    double s = 0;
    for (std::size_t i = 0; i < y.size(); ++i) s += y.data()[i] * w.data()[i];
    return s;
  };
  for (std::size_t i = 0; i < x.size(); ++i) {
    auto xp = x, xm = x;
    xp.data()[i] += h;
    xm.data()[i] -= h;
    CHECK(dx.data()[i] == doctest::Approx((f(xp) - f(xm)) / (2 * h)).scale(1.0).epsilon(1e-6));
  }
}

TEST_CASE("dropout: mask, scaling and gradient agree; reproducible from (seed, call)") {
  nn::dropout<presets::fp32> d(0.25, 11);
  host_tensor<float, 2> x(std::array<std::size_t, 2>{64, 64});
  for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = 0.5f + float(i % 13);
  const host_tensor<float, 2> y = d.forward(ctx, x);
  host_tensor<float, 2> dy(x.shape());
  dy.fill(1.0f);
  const host_tensor<float, 2> dx = d.backward(ctx, dy);
  const float keep_scale = float(1.0 / (1.0 - 0.25));  // multiplied, as PyTorch does
  std::size_t kept = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const bool keep = y.data()[i] != 0.0f;
    kept += keep;
    CHECK(y.data()[i] == (keep ? x.data()[i] * keep_scale : 0.0f));
    CHECK(dx.data()[i] == (keep ? keep_scale : 0.0f));
  }
  // 4096 Bernoulli(0.75) draws: within 6 standard deviations (sd = 27.7).
  CHECK(std::fabs(double(kept) - 3072.0) < 170.0);
  // A second call draws another mask; a fresh layer with the same seed repeats the first.
  const host_tensor<float, 2> y2 = d.forward(ctx, x);
  CHECK(y2 != y);
  nn::dropout<presets::fp32> again(0.25, 11);
  CHECK(again.forward(ctx, x) == y);
  // Evaluation is the identity.
  CHECK(d.forward(ctx, x, nn::mode::eval) == x);
  CHECK_THROWS_AS(nn::dropout<presets::fp32>(1.0), error);
}

TEST_CASE("mixed precision: parameter gradients are rounded to the gradient type, summed in float") {
  using P = presets::fp16_mixed;
  nn::linear<P> l(3, 2, {5});
  host_tensor<float16, 2> x(std::array<std::size_t, 2>{2, 3});
  host_tensor<float16, 2> dy(std::array<std::size_t, 2>{2, 2});
  for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = float16(0.1f * float(i + 1));
  for (std::size_t i = 0; i < dy.size(); ++i) dy.data()[i] = float16(1.0f / 3.0f + float(i));
  l.forward(ctx, x);
  l.backward(ctx, dy);
  l.forward(ctx, x);
  l.backward(ctx, dy);
  for (std::size_t o = 0; o < 2; ++o) {
    for (std::size_t k = 0; k < 3; ++k) {
      const float exact = float(dy(0, o)) * float(x(0, k)) + float(dy(1, o)) * float(x(1, k));
      const float once = float(float16(exact));  // rounded once to the gradient type
      CHECK(l.weight().grad()(o, k) == once + once);
    }
    CHECK(l.bias().grad()(o) == 2.0f * float(float16(float(dy(0, o)) + float(dy(1, o)))));
  }
  // The working copy is the master rounded to float16, refreshed on demand.
  l.weight().master()(0, 0) = 0.1f;
  CHECK(float(l.weight().value()(0, 0)) != float(float16(0.1f)));
  l.weight().refresh();
  CHECK(l.weight().value()(0, 0) == float16(0.1f));
}

TEST_CASE("sequential inserts a visible cast where neighbouring layers store different types") {
  using bf = presets::bf16_mixed;
  using f32 = presets::fp32;
  using model = nn::sequential<nn::linear<bf>, nn::gelu<bf>, nn::linear<f32>, nn::relu<f32>>;
  static_assert(std::is_same_v<model, nn::chain<nn::linear<bf>, nn::gelu<bf>, nn::cast<bfloat16, float, bfloat16, float>,
                                                nn::linear<f32>, nn::relu<f32>>>);
  static_assert(std::is_same_v<nn::sequential<nn::linear<bf>, nn::gelu<bf>>, nn::chain<nn::linear<bf>, nn::gelu<bf>>>);
  auto m = nn::make_sequential(nn::linear<bf>(4, 8, {1}), nn::gelu<bf>{}, nn::linear<f32>(8, 2, {2}), nn::relu<f32>{});
  static_assert(std::is_same_v<decltype(m), model>);
  host_tensor<bfloat16, 2> x(std::array<std::size_t, 2>{3, 4});
  x.fill(bfloat16(0.5f));
  const auto& y = m.forward(ctx, x);
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(y)>, host_tensor<float, 2>>);
  // The float layer saw the bfloat16 activations converted exactly (bfloat16 -> float is exact).
  host_tensor<float, 2> dy(y.shape());
  dy.fill(1.0f);
  const auto& dx = m.backward(ctx, dy);
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(dx)>, host_tensor<bfloat16, 2>>);
  const std::string table = nn::describe(m);
  CHECK(table.find("inserted cast") != std::string::npos);
  CHECK(table.find("bfloat16->float") != std::string::npos);
  // 4*8+8 + 8*2+2 = 58 parameters.
  CHECK(table.find("58") != std::string::npos);
  CHECK(m.parameter_count() == 58);
  // bf16 layer: 40 values x (4 + 4 + 2) bytes; float layer: 18 x (4 + 4).
  CHECK(m.parameter_bytes() == 40 * 10 + 18 * 8);
}

TEST_CASE("describe shows resolved policies: norms compute in float by rule, waivers show") {
  using bf = presets::bf16_mixed;
  using risky = unsafe<policy<float16, float16, float16, float>, rule::fp32_operation, rule::unscaled_gradients>;
  auto m = nn::make_sequential(nn::layer_norm<bf>(4), nn::cast<bfloat16, float16, bfloat16, float16>{},
                               nn::layer_norm<risky>(4));
  const std::string t = nn::describe(m);
  INFO(t);
  CHECK(t.find("fp32 by rule") != std::string::npos);
  CHECK(t.find("fp32_operation") != std::string::npos);
  CHECK(t.find("unscaled_gradients") != std::string::npos);
}

TEST_CASE("parameters keep their storage when assigned; a different shape is refused") {
  nn::linear<presets::bf16_mixed> a(3, 4, {1}), b(3, 4, {2}), c(4, 4, {3});
  const float* where = a.weight().master().data();
  a = b;
  CHECK(a.weight().master().data() == where);
  CHECK(a.weight().master() == b.weight().master());
  CHECK(a.weight().value() == b.weight().value());
  auto& wa = a.weight();
  CHECK_THROWS_AS(wa = c.weight(), error);
}

TEST_CASE("bad input is refused before anything is written") {
  nn::linear<presets::fp32> l(3, 4);
  host_tensor<float, 2> wrong(std::array<std::size_t, 2>{2, 5});
  CHECK_THROWS_WITH_AS(l.forward(ctx, wrong), doctest::Contains("[batch, 3]"), error);
  host_tensor<float, 2> dy(std::array<std::size_t, 2>{2, 4});
  CHECK_THROWS_WITH_AS(l.backward(ctx, dy), doctest::Contains("backward() called without a forward()"), error);
  CHECK_THROWS_AS(nn::linear<presets::fp32>(0, 4), error);
  CHECK_THROWS_AS(nn::layer_norm<presets::fp32>(0), error);
}

TEST_CASE("a layer's type spells the policy its kernels run under") {
  using bf = presets::bf16_mixed;
  static_assert(std::is_same_v<nn::layer_norm<bf>, nn::basic_layer_norm<policy<bfloat16, float, float, float>>>);
  static_assert(std::is_same_v<nn::linear<bf>, nn::basic_linear<bf>>);
  static_assert(std::is_same_v<nn::softmax_cross_entropy<presets::fp16_mixed>,
                               nn::basic_softmax_cross_entropy<policy<float16, float, float, float>>>);
  // Resolving twice changes nothing, so kernels given a resolved policy run under it.
  using risky = unsafe<policy<float16, float16, float16, float>, rule::fp32_operation, rule::unscaled_gradients>;
  static_assert(std::is_same_v<kernel_policy_t<op::loss, kernel_policy_t<op::loss, risky>>, kernel_policy_t<op::loss, risky>>);
  static_assert(std::is_same_v<kernel_policy_t<op::layer_norm, kernel_policy_t<op::layer_norm, bf>>,
                               kernel_policy_t<op::layer_norm, bf>>);
  static_assert(waives_v<nn::softmax_cross_entropy<risky>::policy_type, rule::fp32_operation>);
  static_assert(std::is_same_v<nn::softmax_cross_entropy<risky>::policy_type::accumulate_type, float16>);
}
