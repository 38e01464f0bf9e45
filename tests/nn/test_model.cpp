// nn blueprints and models: every layer's and block's backward against central differences
// in float64, the types nn::build resolves from policy maps (static_asserts), the casts it
// inserts, paths, describe's table, the join semantics (added in float, rounded once), bad
// input refused before anything runs, the same bits on 1 and 2 threads, and what a captured
// CUDA graph's validity and key depend on (reallocations counted, the tensors a batch holds).
#include <precis/precis.hpp>

#include <doctest/doctest.h>

#include "gradcheck.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

using namespace precis;
using precis_test::check_gradients;
using precis_test::f64;
using precis_test::random_tensor;

namespace {

const cpu_context ctx{1};

struct fc1 : layer<op::matmul> {
  static constexpr std::string_view name = "fc1";
};
struct fc2 : layer<op::matmul, max_abs<200000>> {
  static constexpr std::string_view name = "fc2";
};
struct norm : layer<op::layer_norm> {
  static constexpr std::string_view name = "norm";
};
struct act : layer<op::elementwise> {
  static constexpr std::string_view name = "act";
};

// Gives every gamma and beta of a model values away from 1 and 0, so their gradients matter.
template <class Model>
void perturb_norms(Model& m) {
  m.for_each_parameter([](const std::string& path, auto& p) {
    if (path.ends_with("gamma") || path.ends_with("beta")) {
      std::uniform_real_distribution<double> d(0.5, 1.5);
      for (auto& v : p.master()) v = d(precis_test::rng());
      p.refresh();
    }
  });
}

}  // namespace

TEST_CASE("linear: backward matches central differences on rank 2 and rank 3 inputs") {
  auto m2 = nn::build<double, 2>(f64{}, nn::linear(5, 3), {.seed = 7});
  check_gradients(m2, random_tensor<2>({4, 5}));
  auto m3 = nn::build<double, 3>(f64{}, nn::linear(5, 3), {.seed = 7});
  check_gradients(m3, random_tensor<3>({2, 3, 5}));
  auto nb = nn::build<double, 3>(f64{}, nn::linear(4, 2, nn::no_bias), {.seed = 7});
  check_gradients(nb, random_tensor<3>({2, 2, 4}));
  CHECK(nb.parameter_names() == std::vector<std::string>{"weight"});
}

TEST_CASE("relu, gelu, sigmoid and tanh: backward matches central differences") {
  auto g = nn::build<double, 3>(f64{}, nn::gelu());
  check_gradients(g, random_tensor<3>({2, 3, 4}, -3.0, 3.0));
  auto s = nn::build<double, 2>(f64{}, nn::sigmoid());
  check_gradients(s, random_tensor<2>({3, 6}, -4.0, 4.0));
  auto t = nn::build<double, 4>(f64{}, nn::tanh());
  check_gradients(t, random_tensor<4>({2, 2, 2, 3}, -2.0, 2.0));
  auto r = nn::build<double, 2>(f64{}, nn::relu());
  // Away from the kink at 0, where the derivative is undefined.
  auto x = random_tensor<2>({3, 6}, 0.05, 2.0);
  for (std::size_t i = 0; i < x.size(); i += 2) x.data()[i] = -x.data()[i];
  check_gradients(r, x);
}

// The layers must reach the kernels' float SIMD forms. They name their functors through an
// alias template, which g++ matched to the kernels' specialisations and clang++ did not
// (clang's layers then ran the scalar loop: other bits, slower). The SIMD and scalar forms
// differ in the last bit for some inputs, so equal bits over 4096 values mean the same path.
template <class P, class Spec, class Fwd, class Bwd>
void check_layer_runs_kernel(Spec spec, Fwd kernel, Bwd kernel_backward) {
  host_tensor<float, 2> x(std::array<std::size_t, 2>{64, 64}), dy(x.shape());
  std::uniform_real_distribution<float> d(-9.0f, 9.0f);
  for (auto& v : x) v = d(precis_test::rng());
  for (auto& v : dy) v = d(precis_test::rng());
  auto m = nn::build<float, 2>(P{}, spec, {.seed = 1});
  host_tensor<float, 2> y(x.shape()), dx(x.shape());
  kernel(ctx, x, y);
  kernel_backward(ctx, dy, x, dx);
  for (int pass = 0; pass < 2; ++pass) {
    CHECK(precis_test::same_bits(m.forward(ctx, x, nn::mode::train), y));
    const auto& mdx = m.backward(ctx, dy);
    CHECK(precis_test::same_bits(mdx, dx));
  }
  // A training pass on x, then an eval-mode pass on x2 and backward: the gradient at x2
  // (a float GELU keeps f'(x) from training passes only).
  host_tensor<float, 2> x2(x.shape()), y2(x.shape()), dx2(x.shape());
  for (auto& v : x2) v = d(precis_test::rng());
  kernel(ctx, x2, y2);
  kernel_backward(ctx, dy, x2, dx2);
  const auto& mdx = m.backward(ctx, dy);  // the gradient buffer a caller may hold on to
  m.forward(ctx, x, nn::mode::train);
  CHECK(precis_test::same_bits(mdx, dx));  // still the last backward's gradient
  CHECK(precis_test::same_bits(m.forward(ctx, x2, nn::mode::eval), y2));
  CHECK(precis_test::same_bits(m.backward(ctx, dy), dx2));
}

TEST_CASE(
    "gelu and sigmoid layers give their kernels' bits (the SIMD forms), forward and backward") {
  using F = presets::fp32;
  check_layer_runs_kernel<F>(
      nn::gelu(), [](auto&... a) { gelu<F>(a...); }, [](auto&... a) { gelu_backward<F>(a...); });
  check_layer_runs_kernel<F>(
      nn::sigmoid(), [](auto&... a) { sigmoid<F>(a...); },
      [](auto&... a) { sigmoid_backward<F>(a...); });
  // And the kernels' SIMD forms are what ran: the scalar loop differs somewhere.
  host_tensor<float, 2> x(std::array<std::size_t, 2>{64, 64}), y(x.shape());
  std::uniform_real_distribution<float> d(-9.0f, 9.0f);
  for (auto& v : x) v = d(precis_test::rng());
  sigmoid<F>(ctx, x, y);
  std::size_t differ = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float scalar = 1.0f / (1.0f + std::exp(-x.data()[i]));
    differ +=
        std::bit_cast<std::uint32_t>(scalar) != std::bit_cast<std::uint32_t>(y.data()[i]) ? 1U : 0U;
  }
  CHECK(differ > 0);
}

TEST_CASE("layer_norm over the last axis of a rank-3 tensor: backward matches central differences") {
  auto m = nn::build<double, 3>(f64{}, nn::layer_norm(6));
  perturb_norms(m);
  check_gradients(m, random_tensor<3>({2, 3, 6}));
}

TEST_CASE("batch_norm over the channels of [N, C] and [N, C, H, W]; eval uses running statistics") {
  auto m2 = nn::build<double, 2>(f64{}, nn::batch_norm(3, 0.5));
  perturb_norms(m2);
  check_gradients(m2, random_tensor<2>({5, 3}));
  auto m4 = nn::build<double, 4>(f64{}, nn::batch_norm(3));
  perturb_norms(m4);
  check_gradients(m4, random_tensor<4>({2, 3, 2, 3}));

  // Running statistics follow PyTorch's rule: after one training pass from (0, 1) with
  // momentum m, mean = m * batch mean and var = (1 - m) + m * unbiased batch variance.
  auto fresh = nn::build<double, 4>(f64{}, nn::batch_norm(2, 0.5));
  const auto x = random_tensor<4>({2, 2, 2, 2});
  fresh.forward(ctx, x, nn::mode::train);
  const auto& bn = fresh.root();
  for (std::size_t c = 0; c < 2; ++c) {
    double mu = 0, var = 0;
    for (std::size_t n = 0; n < 2; ++n)
      for (std::size_t i = 0; i < 4; ++i) mu += x.data()[(n * 2 + c) * 4 + i] / 8;
    for (std::size_t n = 0; n < 2; ++n)
      for (std::size_t i = 0; i < 4; ++i) {
        const double d = x.data()[(n * 2 + c) * 4 + i] - mu;
        var += d * d / 7;
      }
    CHECK(bn.running_mean()(c) == doctest::Approx(0.5 * mu).epsilon(1e-12));
    CHECK(bn.running_var()(c) == doctest::Approx(0.5 + 0.5 * var).epsilon(1e-12));
  }
  const auto& y = fresh.forward(ctx, x, nn::mode::eval);
  const double expect = (x.data()[0] - bn.running_mean()(0)) / std::sqrt(bn.running_var()(0) + 1e-5);
  CHECK(y.data()[0] == doctest::Approx(expect).epsilon(1e-12));
}

TEST_CASE("softmax_cross_entropy: backward matches central differences of the loss") {
  nn::softmax_cross_entropy<f64> loss;
  auto logits = random_tensor<2>({4, 5}, -3, 3);
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

namespace {

// A pre-norm MLP block with a residual, as a blueprint function.
auto mlp_block(std::size_t d) {
  return nn::residual(nn::seq(nn::layer_norm<norm>(d), nn::linear<fc1>(d, 2 * d), nn::gelu<act>(),
                              nn::linear<fc2>(2 * d, d)));
}

// Features are on axis `last` (1 for [batch, d], 2 for [batch, tokens, d]).
auto composite(std::size_t d, std::size_t last = 1) {
  return nn::seq(nn::named("blocks", nn::repeat<2>(mlp_block(d))),
                 nn::concat(last, nn::linear(d, 2), nn::seq(nn::tanh(), nn::linear(d, 3))),
                 nn::residual(nn::linear(5, 5), nn::linear(5, 5, nn::no_bias)),
                 nn::add(nn::sigmoid(), nn::identity()));
}

}  // namespace

TEST_CASE("composed blocks (repeat, residual, projection shortcut, concat, add): backward matches central "
          "differences") {
  auto m = nn::build<double, 2>(f64{}, composite(4), {.seed = 3});
  perturb_norms(m);
  check_gradients(m, random_tensor<2>({3, 4}));
  // The same blocks on rank-3 tokens.
  auto t = nn::build<double, 3>(f64{}, nn::seq(mlp_block(4), mlp_block(4)), {.seed = 4});
  perturb_norms(t);
  check_gradients(t, random_tensor<3>({2, 3, 4}));
}

TEST_CASE("paths name layers by tag, name and position; every repeated block has its own values") {
  auto m = nn::build<float, 2>(presets::fp32{}, composite(4), {.seed = 3});
  const std::vector<std::string> expected{
      "blocks.0.norm.gamma", "blocks.0.norm.beta", "blocks.0.fc1.weight", "blocks.0.fc1.bias",
      "blocks.0.fc2.weight", "blocks.0.fc2.bias",  "blocks.1.norm.gamma", "blocks.1.norm.beta",
      "blocks.1.fc1.weight", "blocks.1.fc1.bias",  "blocks.1.fc2.weight", "blocks.1.fc2.bias",
      "1.0.weight",          "1.0.bias",           "1.1.1.weight",        "1.1.1.bias",
      "2.weight",            "2.bias",             "2.shortcut.weight"};
  CHECK(m.parameter_names() == expected);
  // Weight decay: weights of linear layers only.
  const auto decay = m.decay_mask();
  REQUIRE(decay.size() == expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) CHECK(decay[i] == expected[i].ends_with("weight"));
  // Values come from the seed and the path: the two blocks differ, a rebuild repeats them.
  auto& blocks = m.root().child<0>().inner();
  CHECK(blocks.first().child<0>().child<1>().weight().master() != blocks[1].child<0>().child<1>().weight().master());
  auto again = nn::build<float, 2>(presets::fp32{}, composite(4), {.seed = 3});
  CHECK(again.masters().size() == m.masters().size());
  for (std::size_t i = 0; i < m.masters().size(); ++i) {
    CHECK(std::equal(m.masters()[i].begin(), m.masters()[i].end(), again.masters()[i].begin()));
  }
  // Linear layers start uniform in +-1/sqrt(fan_in), as PyTorch's.
  for (float v : blocks.first().child<0>().child<1>().weight().master()) CHECK(std::fabs(v) <= 0.5f);
}

TEST_CASE("nn::build resolves every layer from the map: default, op overrides, layer overrides, waivers") {
  auto bp = nn::seq(nn::layer_norm<norm>(8), nn::linear<fc1>(8, 8), nn::gelu<act>(), nn::linear<fc2>(8, 8));
  using bf = presets::bf16_mixed;
  using f32 = presets::fp32;

  // Default only: bf16 storage everywhere; the norm computes in float by rule.
  using m1 = nn::model_t<bfloat16, 2, decltype(make_policy_map(bf{})), decltype(bp)>;
  using r1 = m1::root_type;
  static_assert(std::is_same_v<r1, nn::sequence<nn::layer_norm_layer<norm, policy<bfloat16, float, float, float, bfloat16, recipe::none, products::hardware>, 2, cpu_context>,
                                                nn::linear_layer<fc1, bf, 2, cpu_context>,
                                                nn::activation_layer<act, bf, nn::detail::gelu_kernel, 2, cpu_context>,
                                                nn::linear_layer<fc2, bf, 2, cpu_context>>>);

  // An op override: every matrix product in float; casts appear where storage changes.
  constexpr auto ops = make_policy_map(bf{}, for_op<op::matmul>(f32{}));
  using r2 = nn::model_t<bfloat16, 2, decltype(ops), decltype(bp)>::root_type;
  using cast_up = nn::cast_layer<bfloat16, float, bfloat16, float, 2, cpu_context>;
  using cast_down = nn::cast_layer<float, bfloat16, float, bfloat16, 2, cpu_context>;
  static_assert(std::is_same_v<r2, nn::sequence<nn::layer_norm_layer<norm, policy<bfloat16, float, float, float, bfloat16, recipe::none, products::hardware>, 2, cpu_context>,
                                                nn::cast_in<cast_up, nn::linear_layer<fc1, f32, 2, cpu_context>>,
                                                nn::cast_in<cast_down, nn::activation_layer<act, bf, nn::detail::gelu_kernel, 2, cpu_context>>,
                                                nn::cast_in<cast_up, nn::linear_layer<fc2, f32, 2, cpu_context>>>>);

  // A layer override beats the op override; a waiver stays in the type.
  using risky = unsafe<policy<float16, float16, float16, float>, rule::fp32_operation, rule::unscaled_gradients>;
  constexpr auto layers = make_policy_map(f32{}, for_op<op::elementwise>(bf{}), for_layer<act>(f32{}),
                                          for_layer<norm>(risky{}));
  using r3 = nn::model_t<float, 2, decltype(layers), decltype(bp)>::root_type;
  using norm3 = std::remove_cvref_t<decltype(std::declval<r3&>().template child<0>().inner())>;
  static_assert(std::is_same_v<norm3::policy_type, risky>);
  static_assert(std::is_same_v<norm3::policy_type::accumulate_type, float16>);
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(std::declval<r3&>().template child<2>())>,
                               nn::activation_layer<act, f32, nn::detail::gelu_kernel, 2, cpu_context>>);
  static_assert(!std::is_same_v<r1, r2> && !std::is_same_v<r2, r3>);

  // All three compile into one program and run.
  auto a = nn::build<bfloat16, 2>(make_policy_map(bf{}), bp);
  auto b = nn::build<bfloat16, 2>(ops, bp);
  auto c = nn::build<float, 2>(layers, bp);
  host_tensor<bfloat16, 2> xb(std::array<std::size_t, 2>{2, 8});
  xb.fill(bfloat16(0.25f));
  host_tensor<float, 2> xf(std::array<std::size_t, 2>{2, 8});
  xf.fill(0.25f);
  CHECK(a.forward(ctx, xb).shape() == b.forward(ctx, xb).shape());
  CHECK(c.forward(ctx, xf).size() == 16);
}

TEST_CASE("a cast build inserts rounds once each way and shows in describe") {
  constexpr auto map = make_policy_map(presets::bf16_mixed{}, for_layer<fc2>(presets::fp32{}));
  auto m = nn::build<bfloat16, 2>(map, nn::seq(nn::linear<fc1>(4, 8), nn::gelu<act>(), nn::linear<fc2>(8, 2)),
                                  {.seed = 1});
  using out = std::remove_cvref_t<decltype(m.forward(ctx, std::declval<host_tensor<bfloat16, 2>&>()))>;
  static_assert(std::is_same_v<out, host_tensor<float, 2>>);
  host_tensor<bfloat16, 2> x(std::array<std::size_t, 2>{3, 4});
  x.fill(bfloat16(0.5f));
  const auto& y = m.forward(ctx, x);
  host_tensor<float, 2> dy(y.shape());
  dy.fill(1.0f / 3.0f);
  const auto& dx = m.backward(ctx, dy);
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(dx)>, host_tensor<bfloat16, 2>>);
  const std::string table = nn::describe(m);
  INFO(table);
  CHECK(table.find("inserted cast") != std::string::npos);
  CHECK(table.find("bfloat16->float") != std::string::npos);
  CHECK(table.find("float->bfloat16") != std::string::npos);

  // A residual whose body ends in float: the shortcut is cast up to join it, and the join's
  // float gradient reaches the bfloat16 input through the cast back, rounded once.
  auto r = nn::build<bfloat16, 2>(map, nn::residual(nn::linear<fc2>(4, 4, nn::no_bias)), {.seed = 3});
  const auto& ry = r.forward(ctx, x);
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(ry)>, host_tensor<float, 2>>);
  host_tensor<float, 2> xf(x.shape());
  std::copy(x.begin(), x.end(), xf.begin());  // bfloat16 -> float is exact
  const auto body = r.root().child<0>().inner().forward(ctx, xf);
  for (std::size_t i = 0; i < ry.size(); ++i) CHECK(ry.data()[i] == body.data()[i] + float(x.data()[i]));
  host_tensor<float, 2> rdy(ry.shape());
  rdy.fill(1.0f / 3.0f);
  const auto& rdx = r.backward(ctx, rdy);
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(rdx)>, host_tensor<bfloat16, 2>>);
  const auto& w = r.root().child<0>().inner().weight().master();
  for (std::size_t row = 0; row < 3; ++row) {
    for (std::size_t k = 0; k < 4; ++k) {
      // d/dx of x W^T + x: column sums of W times dy, plus dy; the body's float gradient is
      // rounded to bfloat16 by its cast, then added to the shortcut's in float, rounded once.
      float through_body = 0.0f;
      for (std::size_t o = 0; o < 4; ++o) through_body += rdy(row, o) * w(o, k);
      const float body_bf16 = float(bfloat16(through_body));
      const float shortcut_bf16 = float(bfloat16(rdy(row, k)));
      CHECK(rdx(row, k).bits() == bfloat16(body_bf16 + shortcut_bf16).bits());
    }
  }
}

TEST_CASE("describe prints one row per layer with its path, resolved policy and the entry that decided it") {
  using risky = unsafe<policy<float16, float16, float16, float>, rule::fp32_operation, rule::unscaled_gradients>;
  constexpr auto map =
      make_policy_map(presets::bf16_mixed{}, for_op<op::elementwise>(presets::fp32{}), for_layer<norm>(risky{}));
  auto m = nn::build<bfloat16, 2>(map, nn::named("mlp", mlp_block(4)), {.seed = 1});
  const std::string t = nn::describe(m);
  INFO(t);
  // The norm runs under the waived float16 policy, the activation under the op override
  // (float), the products under the default; a cast sits before each change of type.
  const std::string expected =
      "path      kind        shape              layer  op           storage   compute   accumulate  master "
      " gradient           fp8   from     waived                             notes                         "
      "               params  bytes\n"
      "mlp.norm  cast        bfloat16->float16  -      -            float16   -         -           -      "
      " float16->bfloat16  -     build    -                                  inserted cast                 "
      "               0       -\n"
      "mlp.norm  layer_norm  4                  norm   layer_norm   float16   float16   float16     float  "
      " float16            none  layer    fp32_operation,unscaled_gradients  -                             "
      "               8       80 B\n"
      "mlp.fc1   cast        float16->bfloat16  -      -            bfloat16  -         -           -      "
      " bfloat16->float16  -     build    -                                  inserted cast                 "
      "               0       -\n"
      "mlp.fc1   linear      4->8               fc1    matmul       bfloat16  bfloat16  float       float  "
      " bfloat16           none  default  -                                  hardware products             "
      "               40      400 B\n"
      "mlp.act   cast        bfloat16->float    -      -            float     -         -           -      "
      " float->bfloat16    -     build    -                                  inserted cast                 "
      "               0       -\n"
      "mlp.act   gelu        -                  act    elementwise  float     float     float       float  "
      " float              none  op       -                                  -                             "
      "               0       -\n"
      "mlp.fc2   cast        float->bfloat16    -      -            bfloat16  -         -           -      "
      " bfloat16->float    -     build    -                                  inserted cast                 "
      "               0       -\n"
      "mlp.fc2   linear      8->4               fc2    matmul       bfloat16  bfloat16  float       float  "
      " bfloat16           none  default  -                                  hardware products; activations"
      " up to 200000  36      360 B\n"
      "total                                                                                               "
      "                                                                                                    "
      "               84      840 B\n"
      "hardware products run on: precis exact kernel (precis::onednn not linked)\n";
  CHECK(t == expected);
  CHECK(m.parameter_count() == 84);
}

TEST_CASE("describe names the engine of float hardware products apart from the bfloat16 one") {
  const std::string line =
      "hardware products with float or float16 inputs run on: " + cpu_float_products_engine() +
      "\n";
  // float inputs, and float16 ones (converted to float for oneDNN's float kernels).
  for (const std::string& t :
       {nn::describe(nn::build<float, 2>(presets::fp32_hardware{}, nn::linear(4, 2), {.seed = 1})),
        nn::describe(
            nn::build<float16, 2>(presets::fp16_hardware{}, nn::linear(4, 2), {.seed = 1}))}) {
    CHECK(t.find("hardware products") != std::string::npos);
    REQUIRE(t.size() >= line.size());
    CHECK(t.substr(t.size() - line.size()) == line);
    CHECK(t.find("hardware products run on:") == std::string::npos);  // no bfloat16 products here
  }
}

TEST_CASE("joins add in float and round once; the input gradient is the sum of both paths, rounded once") {
  // y = linear(x) + x with bfloat16 storage: one rounding of the float sum.
  auto m = nn::build<bfloat16, 2>(presets::bf16_mixed{}, nn::residual(nn::linear(3, 3, nn::no_bias)), {.seed = 2});
  host_tensor<bfloat16, 2> x(std::array<std::size_t, 2>{2, 3});
  for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = bfloat16(0.1f * float(i + 1) + 1.0f / 3.0f);
  const auto body = m.root().child<0>().forward(ctx, x);
  const auto& y = m.forward(ctx, x);
  for (std::size_t i = 0; i < y.size(); ++i) {
    CHECK(y.data()[i].bits() == bfloat16(float(body.data()[i]) + float(x.data()[i])).bits());
  }
  host_tensor<bfloat16, 2> dy(y.shape());
  for (std::size_t i = 0; i < dy.size(); ++i) dy.data()[i] = bfloat16(0.7f - 0.05f * float(i));
  const auto& dx = m.backward(ctx, dy);
  const auto dbody = m.root().child<0>().backward(ctx, dy);
  for (std::size_t i = 0; i < dx.size(); ++i) {
    CHECK(dx.data()[i].bits() == bfloat16(float(dbody.data()[i]) + float(dy.data()[i])).bits());
  }
}

TEST_CASE("mixed precision: parameter gradients are rounded to the gradient type, summed in float") {
  auto m = nn::build<float16, 2>(presets::fp16_mixed{}, nn::linear(3, 2), {.seed = 5});
  host_tensor<float16, 2> x(std::array<std::size_t, 2>{2, 3});
  host_tensor<float16, 2> dy(std::array<std::size_t, 2>{2, 2});
  for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = float16(0.1f * float(i + 1));
  for (std::size_t i = 0; i < dy.size(); ++i) dy.data()[i] = float16(1.0f / 3.0f + float(i));
  m.zero_grad();
  for (int pass = 0; pass < 2; ++pass) {
    m.forward(ctx, x);
    m.backward(ctx, dy);
  }
  auto& l = m.root();
  for (std::size_t o = 0; o < 2; ++o) {
    for (std::size_t k = 0; k < 3; ++k) {
      const float exact = float(dy(0, o)) * float(x(0, k)) + float(dy(1, o)) * float(x(1, k));
      const float once = float(float16(exact));  // rounded once to the gradient type
      CHECK(l.weight().grad()(o, k) == once + once);
    }
    CHECK(l.bias().grad()(o) == 2.0f * float(float16(float(dy(0, o)) + float(dy(1, o)))));
  }
  // zero_grad(ctx), a device step's form, zeroes every gradient as zero_grad() does.
  m.zero_grad(ctx);
  for (const auto g : m.gradients()) {
    for (float v : g) CHECK(v == 0.0f);
  }
  // The working copy is the master rounded to float16, refreshed on demand.
  l.weight().master()(0, 0) = 0.1f;
  CHECK(float(l.weight().value()(0, 0)) != float(float16(0.1f)));
  m.refresh();
  CHECK(l.weight().value()(0, 0) == float16(0.1f));
}

TEST_CASE("parameters keep their storage when assigned; a different shape is refused") {
  auto a = nn::build<float, 2>(presets::bf16_mixed{}, nn::linear(3, 4), {.seed = 1});
  auto b = nn::build<float, 2>(presets::bf16_mixed{}, nn::linear(3, 4), {.seed = 2});
  auto c = nn::build<float, 2>(presets::bf16_mixed{}, nn::linear(4, 4), {.seed = 3});
  auto& wa = a.root().inner().weight();
  const float* where = wa.master().data();
  wa = b.root().inner().weight();
  CHECK(wa.master().data() == where);
  CHECK(wa.master() == b.root().inner().weight().master());
  CHECK(wa.value() == b.root().inner().weight().value());
  CHECK_THROWS_AS(wa = c.root().inner().weight(), error);
}

TEST_CASE("a parameter's version changes whenever its working copy may, and is never reused") {
  // What kernels may key weights derived from value() on (conv2d_params::weights_version).
  auto a = nn::build<float, 2>(presets::bf16_mixed{}, nn::linear(3, 4), {.seed = 1});
  auto b = nn::build<float, 2>(presets::bf16_mixed{}, nn::linear(3, 4), {.seed = 2});
  auto& wa = a.root().inner().weight();
  auto& wb = b.root().inner().weight();
  const std::uint64_t v0 = wa.version();
  CHECK(v0 != 0);
  CHECK(wb.version() != v0);
  CHECK(wa.version() == v0);  // reading changes nothing
  wa.master()(0, 0) = 0.25f;  // the master alone: the working copy is unchanged until refresh
  CHECK(wa.version() == v0);
  a.refresh();
  const std::uint64_t v1 = wa.version();
  CHECK(v1 != v0);
  CHECK(v1 != wb.version());
  wa = wb;  // an assignment copies the working copy's values
  CHECK(wa.version() != v1);
  CHECK(wa.version() != wb.version());
  const auto copy = wa;  // another address: the same version names other storage
  CHECK(copy.value().data() != wa.value().data());
  wa.refresh();
  CHECK(wa.version() != copy.version());
  // Float storage is the master weights themselves, written in place: no version.
  auto f = nn::build<float, 2>(presets::fp32{}, nn::linear(3, 4), {.seed = 1});
  CHECK(f.root().weight().version() == 0);
  f.refresh();
  CHECK(f.root().weight().version() == 0);
}

TEST_CASE("bad input is refused before anything runs, naming the layer's path and both shapes") {
  auto m = nn::build<float, 3>(presets::fp32{}, nn::named("encoder", nn::repeat<2>(mlp_block(4))), {.seed = 1});
  host_tensor<float, 3> x(std::array<std::size_t, 3>{2, 3, 4});
  x.fill(0.5f);
  const host_tensor<float, 3> y = m.forward(ctx, x);
  host_tensor<float, 3> wrong(std::array<std::size_t, 3>{2, 3, 5});
  CHECK_THROWS_WITH_AS(m.forward(ctx, wrong),
                       doctest::Contains("layer encoder.0.norm (layer_norm) expects an input of shape [..., 4], got "
                                         "[2, 3, 5]"),
                       error);
  // Nothing ran: the outputs of the last good pass are still there, and backward still
  // belongs to it.
  host_tensor<float, 3> dy(y.shape());
  dy.fill(1.0f);
  CHECK(m.backward(ctx, dy).shape() == x.shape());
  host_tensor<float, 3> bad_dy(std::array<std::size_t, 3>{2, 3, 3});
  CHECK_THROWS_WITH_AS(m.backward(ctx, bad_dy), doctest::Contains("dy has shape [2, 3, 3]"), error);

  auto fresh = nn::build<float, 2>(presets::fp32{}, nn::linear(3, 4));
  host_tensor<float, 2> d2(std::array<std::size_t, 2>{2, 4});
  CHECK_THROWS_AS(fresh.backward(ctx, d2), error);
  const auto empty_linear = [] { return nn::build<float, 2>(presets::fp32{}, nn::linear(0, 4)); };
  CHECK_THROWS_WITH_AS(empty_linear(), doctest::Contains("in > 0"), error);
  const auto twice = [] {
    return nn::build<float, 2>(presets::fp32{}, nn::seq(nn::linear<fc1>(4, 4), nn::linear<fc1>(4, 4)));
  };
  CHECK_THROWS_WITH_AS(twice(), doctest::Contains("two layers have the path \"fc1\""), error);
  const auto dotted = [] { return nn::build<float, 2>(presets::fp32{}, nn::named("a.b", nn::relu())); };
  CHECK_THROWS_AS(dotted(), error);
  auto bad_concat = nn::build<float, 3>(presets::fp32{}, nn::concat(1, nn::linear(4, 2), nn::linear(4, 3)));
  CHECK_THROWS_WITH_AS(bad_concat.forward(ctx, x), doctest::Contains("differ outside the concatenation axis"), error);
  const auto far_axis = [] { return nn::build<float, 2>(presets::fp32{}, nn::concat(2, nn::relu(), nn::relu())); };
  CHECK_THROWS_WITH_AS(far_axis(), doctest::Contains("axis 2 is out of range"), error);
}

TEST_CASE("a temporary input evaluates, but a backward pass after it is refused: the input it would read is gone") {
  auto m = nn::build<float, 2>(presets::fp32{}, mlp_block(4), {.seed = 2});
  const auto make_x = [] {
    host_tensor<float, 2> x(std::array<std::size_t, 2>{3, 4});
    for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = 0.25f * float(i % 7) - 0.5f;
    return x;
  };
  const auto x = make_x();
  const host_tensor<float, 2> y = m.forward(ctx, x, nn::mode::eval);
  const host_tensor<float, 2> y_temporary = m.forward(ctx, make_x(), nn::mode::eval);
  CHECK(precis_test::same_bits(y, y_temporary));
  host_tensor<float, 2> dy(y.shape());
  dy.fill(0.5f);
  m.zero_grad();
  CHECK_THROWS_WITH_AS(m.backward(ctx, dy), doctest::Contains("forward() was given a temporary"), error);
  CHECK_THROWS_WITH_AS(m.backward_parameters(ctx, dy), doctest::Contains("forward() was given a temporary"), error);
  // The monitor's view of the layers would read it too.
  CHECK_THROWS_WITH_AS(m.for_each_observed([](const std::string&, auto, const auto*, const auto&, const auto&...) {}),
                       doctest::Contains("forward() was given a temporary"), error);
  m.for_each_parameter([](const std::string& path, const auto& p) {
    INFO(path);
    for (float g : p.grad()) CHECK(g == 0.0f);  // nothing was written
  });
  // A refused forward pass keeps the refusal; a forward pass of a kept input ends it.
  host_tensor<float, 2> wrong(std::array<std::size_t, 2>{3, 5});
  CHECK_THROWS_AS(m.forward(ctx, wrong), error);
  CHECK_THROWS_AS(m.backward(ctx, dy), error);
  (void)m.forward(ctx, x);
  CHECK(m.backward(ctx, dy).shape() == x.shape());
}

namespace {
// random_tensor's values in [-a, a), as T.
template <class T, std::size_t N>
host_tensor<T, N> random_of(const std::array<std::size_t, N>& shape, double a = 1.0) {
  const auto d = random_tensor<N>(shape, -a, a);
  host_tensor<T, N> t(shape);
  for (std::size_t i = 0; i < t.size(); ++i) t.data()[i] = T(float(d.data()[i]));
  return t;
}
}  // namespace

TEST_CASE("nn::copy_state copies the masters, running statistics, dropout's state and float8 recipes; models "
          "whose layers hold other fields are refused before anything changes") {
  const auto blueprint = nn::seq(nn::conv2d(2, 4, 3, {.padding = {1, 1}}, nn::no_bias), nn::batch_norm(4), nn::relu(),
                                 nn::dropout(0.25), nn::flatten(), nn::linear<fc1>(4 * 6 * 6, 5));
  auto a = nn::build<float, 4>(presets::fp32{}, blueprint, {.seed = 3});
  for (int pass = 0; pass < 2; ++pass) (void)a.forward(ctx, random_of<float, 4>({3, 2, 6, 6}));
  auto b = nn::build<float, 4>(presets::fp32{}, blueprint, {.seed = 7});
  nn::copy_state(ctx, a, b);
  const auto x = random_of<float, 4>({3, 2, 6, 6});
  const auto same = [](const auto& p, const auto& q) {
    return p.size() == q.size() && std::equal(p.begin(), p.end(), q.begin(), [](float u, float v) {
             return std::bit_cast<std::uint32_t>(u) == std::bit_cast<std::uint32_t>(v);
           });
  };
  const host_tensor<float, 2> eval_a = a.forward(ctx, x, nn::mode::eval);
  CHECK(same(b.forward(ctx, x, nn::mode::eval), eval_a));  // the running statistics
  const host_tensor<float, 2> train_a = a.forward(ctx, x);
  CHECK(same(b.forward(ctx, x), train_a));  // the dropout's masks: its seed and calls
  // copy_masters alone leaves the running statistics: the evaluation pass differs.
  auto c = nn::build<float, 4>(presets::fp32{}, blueprint, {.seed = 7});
  nn::copy_masters(ctx, a, c);
  CHECK(!same(c.forward(ctx, x, nn::mode::eval), eval_a));

  // Another model's fields (no dropout): refused, its masters untouched.
  auto other = nn::build<float, 4>(presets::fp32{}, nn::seq(nn::conv2d(2, 4, 3, {.padding = {1, 1}}, nn::no_bias),
                                                            nn::batch_norm(4), nn::relu(), nn::flatten(),
                                                            nn::linear<fc1>(4 * 6 * 6, 5)),
                                   {.seed = 11});
  std::vector<float> before;
  for (const auto& m : other.masters()) before.insert(before.end(), m.begin(), m.end());
  CHECK_THROWS_WITH_AS(nn::copy_state(ctx, a, other), doctest::Contains("other state fields"), precis::error);
  std::vector<float> after;
  for (const auto& m : other.masters()) after.insert(after.end(), m.begin(), m.end());
  CHECK(same(after, before));

  // float8 recipes: scale and amax history, and the next training pass's bits.
  auto f = nn::build<bfloat16, 2>(presets::fp8_hybrid{}, nn::linear<fc1>(32, 16), {.seed = 5});
  for (int step = 0; step < 2; ++step) {
    const auto xs = random_of<bfloat16, 2>({16, 32}, double(4 << step));
    (void)f.forward(ctx, xs);
    (void)f.backward(ctx, random_of<bfloat16, 2>({16, 16}, double(1 << step)));
  }
  auto g = nn::build<bfloat16, 2>(presets::fp8_hybrid{}, nn::linear<fc1>(32, 16), {.seed = 6});
  nn::copy_state(ctx, f, g);
  const auto& rf = f.root().float8_products();
  const auto& rg = g.root().float8_products();
  CHECK(rg.input.scale() == rf.input.scale());
  CHECK(rg.weight.scale() == rf.weight.scale());
  CHECK(rg.grad_output.scale() == rf.grad_output.scale());
  CHECK(rg.input.amax_history() == rf.input.amax_history());
  CHECK(rg.grad_output.amax_history() == rf.grad_output.amax_history());
  CHECK(rf.input.scale() != 1.0F);  // the premise: the recipes moved
  const auto xf = random_of<bfloat16, 2>({16, 32}, 64.0);
  const host_tensor<bfloat16, 2> yf = f.forward(ctx, xf);
  const host_tensor<bfloat16, 2> yg = g.forward(ctx, xf);
  CHECK(std::memcmp(yf.data(), yg.data(), yf.size() * sizeof(bfloat16)) == 0);
}

TEST_CASE("same bits on 1 and 2 threads for every layer and block") {
  using bf = presets::bf16_mixed;
  host_tensor<bfloat16, 3> x(std::array<std::size_t, 3>{4, 33, 16});
  std::uniform_real_distribution<float> d(-2.0f, 2.0f);
  for (auto& v : x) v = bfloat16(d(precis_test::rng()));
  precis_test::check_thread_independent(nn::build<bfloat16, 3>(bf{}, nn::linear(16, 24), {.seed = 1}), x);
  precis_test::check_thread_independent(nn::build<bfloat16, 3>(bf{}, nn::gelu(), {.seed = 1}), x);
  precis_test::check_thread_independent(nn::build<bfloat16, 3>(bf{}, nn::layer_norm(16), {.seed = 1}), x);
  precis_test::check_thread_independent(nn::build<bfloat16, 3>(bf{}, composite(16, 2), {.seed = 1}), x);
  host_tensor<bfloat16, 4> img(std::array<std::size_t, 4>{2, 16, 6, 5});
  for (auto& v : img) v = bfloat16(d(precis_test::rng()));
  precis_test::check_thread_independent(nn::build<bfloat16, 4>(bf{}, nn::batch_norm(16), {.seed = 1}), img);
}

TEST_CASE("batch_norm's backward needs a training-mode forward; repeat<1> may change the rank") {
  auto m = nn::build<float, 2>(presets::fp32{}, nn::seq(nn::linear(3, 4), nn::batch_norm(4)), {.seed = 1});
  host_tensor<float, 2> x(std::array<std::size_t, 2>{5, 3});
  for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = float(i % 7) - 3.0f;
  host_tensor<float, 2> dy(std::array<std::size_t, 2>{5, 4});
  dy.fill(1.0f);
  m.forward(ctx, x, nn::mode::train);
  m.forward(ctx, x, nn::mode::eval);
  CHECK_THROWS_WITH_AS(m.backward(ctx, dy), doctest::Contains("after an evaluation-mode forward()"), error);
  m.forward(ctx, x, nn::mode::train);
  CHECK(m.backward(ctx, dy).shape() == x.shape());
  // One block that changes the rank: repeat<1> resolves no second block type.
  auto once = nn::build<float, 3>(presets::fp32{}, nn::repeat<1>(nn::seq(nn::linear(4, 4), nn::select_token(0))));
  host_tensor<float, 3> t(std::array<std::size_t, 3>{2, 3, 4});
  t.fill(0.5f);
  CHECK(once.forward(ctx, t).shape() == std::array<std::size_t, 2>{2, 4});
}

TEST_CASE("nn::repeat's blocks lend each other their gradient buffers: the bits of blocks with their own, in "
          "two sets of buffers; a monitored step keeps every block's") {
  // Six blocks: the five after the first lend (attention, layer norms, linear layers, GELU
  // and the residual sums all name their buffers).
  const auto block = nn::seq(nn::residual(nn::seq(nn::layer_norm(16), nn::attention(16, 2))), mlp_block(16));
  const auto blueprint =
      nn::seq(nn::linear(8, 16), nn::named("encoder", nn::repeat<6>(block)), nn::select_token(0), nn::linear(16, 3));
  auto lend = nn::build<float, 3>(presets::fp32{}, blueprint, {.seed = 7});
  auto keep = nn::build<float, 3>(presets::fp32{}, blueprint, {.seed = 7});
  keep.keep_gradient_buffers(true);
  host_tensor<float, 3> x(std::array<std::size_t, 3>{4, 5, 8});
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (auto& v : x) v = d(precis_test::rng());
  host_tensor<std::int32_t, 1> y(std::array<std::size_t, 1>{4});
  for (std::size_t i = 0; i < 4; ++i) y(i) = std::int32_t(i % 3);

  // The input gradient of a whole backward pass, twice (the second pass starts from the
  // buffers the first one moved).
  for (int pass = 0; pass < 2; ++pass) {
    const host_tensor<float, 2> out = lend.forward(ctx, x);
    CHECK(precis_test::same_bits(out, keep.forward(ctx, x)));
    host_tensor<float, 2> dy(out.shape());
    for (auto& v : dy) v = d(precis_test::rng());
    const host_tensor<float, 3> dx = lend.backward(ctx, dy);
    CHECK(precis_test::same_bits(dx, keep.backward(ctx, dy)));
  }
  CHECK(lend.activation_bytes() < keep.activation_bytes());

  nn::softmax_cross_entropy<presets::fp32> loss_l, loss_k;
  adamw opt_l(lend.masters(), {.lr = 1e-2}), opt_k(keep.masters(), {.lr = 1e-2});
  no_scaling scale_l, scale_k;
  nn::trainer train_l(lend, loss_l, opt_l, scale_l), train_k(keep, loss_k, opt_k, scale_k);
  diagnostics::monitor monitor({.every = 1});
  const auto same_parameters = [&] {
    const auto ml = lend.masters(), mk = keep.masters();
    bool same = ml.size() == mk.size();
    for (std::size_t i = 0; same && i < ml.size(); ++i) same = precis_test::same_bits(ml[i], mk[i]);
    return same;
  };
  for (int step = 0; step < 4; ++step) {
    // Step 2 under a monitor: every block keeps its buffers for it to read.
    const nn::step_record rl = step == 2 ? train_l.step(ctx, x, y, monitor) : train_l.step(ctx, x, y);
    const nn::step_record rk = train_k.step(ctx, x, y);
    CHECK(std::bit_cast<std::uint64_t>(rl.loss) == std::bit_cast<std::uint64_t>(rk.loss));
    CHECK(std::bit_cast<std::uint64_t>(rl.grad_norm) == std::bit_cast<std::uint64_t>(rk.grad_norm));
    CHECK(same_parameters());
    if (step == 2) {
      CHECK(lend.activation_bytes() == keep.activation_bytes());
    } else {
      CHECK(lend.activation_bytes() < keep.activation_bytes());
    }
  }
  // A monitored step puts the model's own setting back.
  CHECK(!lend.keeps_gradient_buffers());
  lend.keep_gradient_buffers(true);
  (void)train_l.step(ctx, x, y, monitor);
  CHECK(lend.keeps_gradient_buffers());
  lend.keep_gradient_buffers(false);
  (void)train_l.step(ctx, x, y, monitor);
  CHECK(!lend.keeps_gradient_buffers());
}

namespace {

// A device buffer as gradient_buffer sees one: a capacity (device_tensor's), no resize.
struct fake_device_buffer {
  std::size_t held = 0;
  std::size_t capacity() const { return held; }
};

// Targets of two tensors: one struct naming them (visible to a graph's key), one not.
struct named_targets {
  host_tensor<float, 2> a;
  host_tensor<std::int32_t, 1> b;
  auto tensors() const { return std::tie(a, b); }
};
struct unnamed_targets {
  host_tensor<float, 2> a;
};

}  // namespace

TEST_CASE("what invalidates a captured step: a changed keep setting and a freed device buffer count as "
          "reallocations; keeping the setting or freeing nothing does not") {
  const auto count = [] { return nn::detail::device_reallocations.load(); };
  auto m = nn::build<float, 2>(presets::fp32{}, nn::seq(nn::linear(4, 4), nn::relu()), {.seed = 1});
  auto before = count();
  m.keep_gradient_buffers(false);  // as built
  CHECK(count() == before);
  m.keep_gradient_buffers(true);
  CHECK(count() == before + 1);
  m.keep_gradient_buffers(true);
  CHECK(count() == before + 1);
  m.keep_gradient_buffers(false);
  CHECK(count() == before + 2);

  fake_device_buffer held{64}, empty{};
  const auto release_held = nn::detail::gradient_buffer_of(held);
  const auto release_empty = nn::detail::gradient_buffer_of(empty);
  before = count();
  release_empty.release(release_empty.tensor);
  CHECK(count() == before);
  release_held.release(release_held.tensor);
  CHECK(count() == before + 1);
  CHECK(held.capacity() == 0);
  release_held.release(release_held.tensor);  // freed already
  CHECK(count() == before + 1);
  // A host tensor (resizable) frees host memory: no graph holds it.
  host_tensor<float, 1> host(std::array<std::size_t, 1>{8});
  const auto release_host = nn::detail::gradient_buffer_of(host);
  release_host.release(release_host.tensor);
  CHECK(count() == before + 1);
  CHECK(host.size() == 0);
}

TEST_CASE("a captured step's key holds every tensor its inputs and targets hold: each input of several, a "
          "targets struct's tensors(); another buffer or shape gives another key") {
  using nn::detail::graph_key_append;
  using nn::detail::graph_key_visible;
  static_assert(graph_key_visible<host_tensor<float, 2>>());
  static_assert(graph_key_visible<std::tuple<const host_tensor<float, 2>*, const host_tensor<float, 3>*>>());
  static_assert(graph_key_visible<named_targets>());
  static_assert(!graph_key_visible<unnamed_targets>());
  static_assert(!graph_key_visible<std::tuple<host_tensor<float, 2>>>());  // values, not pointers
  static_assert(!graph_key_visible<std::array<float, 4>>());

  host_tensor<float, 2> x(std::array<std::size_t, 2>{2, 3});
  host_tensor<float, 3> z(std::array<std::size_t, 3>{2, 1, 5});
  const auto key_of = [](const auto& v) {
    std::vector<const void*> k;
    graph_key_append(k, v);
    return k;
  };
  const auto word = [](std::size_t e) { return reinterpret_cast<const void*>(static_cast<std::uintptr_t>(e)); };
  CHECK(key_of(x) == std::vector<const void*>{&x, x.data(), word(2), word(3)});
  // Several inputs: each pointee, in order.
  const std::tuple<const host_tensor<float, 2>*, const host_tensor<float, 3>*> both{&x, &z};
  CHECK(key_of(both) ==
        std::vector<const void*>{&x, x.data(), word(2), word(3), &z, z.data(), word(2), word(1), word(5)});
  const auto before = key_of(both);
  z = host_tensor<float, 3>(std::array<std::size_t, 3>{2, 1, 6});  // made again at the same address
  CHECK(key_of(both) != before);
  // A struct of targets: its tensors'.
  named_targets t{host_tensor<float, 2>(std::array<std::size_t, 2>{2, 2}),
                  host_tensor<std::int32_t, 1>(std::array<std::size_t, 1>{2})};
  const auto tk = key_of(t);
  CHECK(tk == std::vector<const void*>{&t.a, t.a.data(), word(2), word(2), &t.b, t.b.data(), word(2)});
  t.b = host_tensor<std::int32_t, 1>(std::array<std::size_t, 1>{3});
  CHECK(key_of(t) != tk);
}
