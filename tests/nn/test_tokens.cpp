// Token layers (nn/shape.hpp, nn/embedding.hpp, nn/attention.hpp): every layer's backward
// against central differences in float64; patchify against a hand-written loop; dropout's
// mask, scaling, seed and checkpointed call count; a ViT encoder block gradient-checked in
// float64 and, under bf16_mixed and fp16_mixed, compared against it; the same bits on 1 and
// 2 threads; wrong shapes refused with the layer's path; the copy plans the device runs for
// patchify, select_token, class_token and attention's heads against the host layers.
#include <precis/precis.hpp>

#include <precis/nn/attention.hpp>
#include <precis/nn/embedding.hpp>
#include <precis/nn/shape.hpp>

#include <doctest/doctest.h>

#include "../kernels/kernel_checks.hpp"
#include "gradcheck.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <map>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

using namespace precis;
using precis_test::check_gradients;
using precis_test::f64;
using precis_test::random_tensor;

namespace {

const cpu_context ctx{1};

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

// A pre-norm ViT encoder block.
auto vit_block(std::size_t d, std::size_t heads) {
  return nn::seq(nn::residual(nn::seq(nn::layer_norm(d), nn::attention(d, heads))),
                 nn::residual(nn::seq(nn::layer_norm(d), nn::linear(d, 4 * d), nn::gelu(),
                                      nn::linear(4 * d, d))));
}

// A whole (tiny) ViT: [N, C, H, W] images to [N, classes] logits.
auto tiny_vit(std::size_t channels, std::size_t patch, std::size_t tokens, std::size_t d,
              std::size_t heads, std::size_t classes) {
  return nn::seq(nn::patchify(patch), nn::linear(channels * patch * patch, d), nn::class_token(d),
                 nn::position_embedding(tokens + 1, d), vit_block(d, heads), nn::layer_norm(d),
                 nn::select_token(0), nn::linear(d, classes));
}

// Copies the master weights of `from` into `to` by path; then gives `from` the values `to`
// computes with (its working copies), so that a reference sees the same rounded weights.
template <class Ref, class Model>
void share_weights(Ref& from, Model& to) {
  std::map<std::string, std::vector<double>> values;
  from.for_each_parameter([&](const std::string& path, auto& p) {
    values[path].assign(p.master().begin(), p.master().end());
  });
  std::size_t copied = 0;
  to.for_each_parameter([&](const std::string& path, auto& p) {
    INFO(path);
    REQUIRE(values.count(path) == 1);
    const auto& v = values[path];
    REQUIRE(v.size() == p.size());
    using M = std::remove_cvref_t<decltype(*p.master().data())>;
    for (std::size_t i = 0; i < v.size(); ++i) p.master().data()[i] = static_cast<M>(v[i]);
    p.refresh();
    for (std::size_t i = 0; i < v.size(); ++i)
      values[path][i] = precis_test::to_double(p.value().data()[i]);
    ++copied;
  });
  CHECK(copied == values.size());
  from.for_each_parameter([&](const std::string& path, auto& p) {
    std::copy(values[path].begin(), values[path].end(), p.master().begin());
    p.refresh();
  });
}

// x rounded to T, and the rounded values in float64.
template <class T, std::size_t N>
std::pair<host_tensor<T, N>, host_tensor<double, N>> rounded_pair(const host_tensor<double, N>& x) {
  host_tensor<T, N> t(x.shape());
  for (std::size_t i = 0; i < x.size(); ++i) t.data()[i] = precis_test::from_double<T>(x.data()[i]);
  return {t, precis_test::to_double(t)};
}

}  // namespace

TEST_CASE("flatten, reshape and permute move values and their gradients back") {
  auto f = nn::build<double, 4>(f64{}, nn::flatten());
  const auto x4 = random_tensor<4>({2, 3, 2, 2});
  const auto& y = f.forward(ctx, x4);
  CHECK(y.shape() == std::array<std::size_t, 2>{2, 12});
  CHECK(std::equal(x4.begin(), x4.end(), y.begin()));
  check_gradients(f, x4);

  // The item shape leaves the batch axis out: [2, 12] -> [2, 3, 4].
  auto r = nn::build<double, 2>(f64{}, nn::reshape<2>({3, 4}));
  CHECK(r.output_shape({5, 12}) == std::array<std::size_t, 3>{5, 3, 4});
  check_gradients(r, random_tensor<2>({2, 12}));
  CHECK_THROWS_WITH_AS(
      r.output_shape({2, 10}),
      doctest::Contains("(reshape) expects an input of shape [N, ...] with 12 values per item"),
      error);

  auto p = nn::build<double, 3>(f64{}, nn::permute<3>({2, 0, 1}));
  const auto x3 = random_tensor<3>({2, 3, 4});
  const auto& z = p.forward(ctx, x3);
  REQUIRE(z.shape() == std::array<std::size_t, 3>{4, 2, 3});
  for (std::size_t a = 0; a < 2; ++a)
    for (std::size_t b = 0; b < 3; ++b)
      for (std::size_t c = 0; c < 4; ++c) CHECK(z(c, a, b) == x3(a, b, c));
  check_gradients(p, x3);
  const auto repeated_axis = [] { return nn::build<double, 3>(f64{}, nn::permute<3>({0, 2, 2})); };
  CHECK_THROWS_WITH_AS(repeated_axis(), doctest::Contains("not a permutation"), error);
}

TEST_CASE(
    "patchify matches a hand-written loop (PyTorch's unfold order) and passes gradients back") {
  const std::size_t n = 2, c = 3, h = 4, w = 6, p = 2;
  const auto x = random_tensor<4>({n, c, h, w});
  auto m = nn::build<double, 4>(f64{}, nn::patchify(p));
  const auto& y = m.forward(ctx, x);
  REQUIRE(y.shape() == std::array<std::size_t, 3>{n, (h / p) * (w / p), c * p * p});
  // x.unfold(2, p, p).unfold(3, p, p) -> [n, c, h/p, w/p, p, p]; permute(0, 2, 3, 1, 4, 5);
  // reshape(n, (h/p)(w/p), c*p*p).
  for (std::size_t b = 0; b < n; ++b)
    for (std::size_t pr = 0; pr < h / p; ++pr)
      for (std::size_t pc = 0; pc < w / p; ++pc)
        for (std::size_t ch = 0; ch < c; ++ch)
          for (std::size_t i = 0; i < p; ++i)
            for (std::size_t j = 0; j < p; ++j) {
              CHECK(y(b, pr * (w / p) + pc, (ch * p + i) * p + j) ==
                    x(b, ch, pr * p + i, pc * p + j));
            }
  check_gradients(m, x);
  CHECK_THROWS_WITH_AS(
      m.output_shape({1, 3, 5, 6}),
      doctest::Contains("(patchify) expects an input of shape [N, C, H, W] with H and W multiples "
                        "of 2 and no empty axis, got [1, 3, 5, 6]"),
      error);
}

TEST_CASE("select_token takes one token; its gradient goes there and zeros elsewhere") {
  auto m = nn::build<double, 3>(f64{}, nn::select_token(2));
  const auto x = random_tensor<3>({2, 4, 3});
  const auto& y = m.forward(ctx, x);
  for (std::size_t b = 0; b < 2; ++b)
    for (std::size_t d = 0; d < 3; ++d) CHECK(y(b, d) == x(b, 2, d));
  host_tensor<double, 2> dy(y.shape());
  dy.fill(1.5);
  const auto& dx = m.backward(ctx, dy);
  for (std::size_t b = 0; b < 2; ++b)
    for (std::size_t t = 0; t < 4; ++t)
      for (std::size_t d = 0; d < 3; ++d) CHECK(dx(b, t, d) == (t == 2 ? 1.5 : 0.0));
  check_gradients(m, x);
}

// The device runs these layers' copies as copy plans (one strided-copy launch each); the
// same plans run here through detail::run_copy_plan, which uses the device kernel's offset
// function, and must give the host layers' bits.
TEST_CASE("the device layers' copy plans move what the host layers move") {
  SUBCASE("patchify, forward and backward") {
    const std::array<std::size_t, 4> in{2, 3, 8, 12};
    const std::size_t p = 4;
    const auto x = random_tensor<4>(in);
    auto m = nn::build<double, 4>(f64{}, nn::patchify(p));
    const auto& y = m.forward(ctx, x);
    host_tensor<double, 3> y2(y.shape());
    detail::run_copy_plan(nn::detail::patchify_plan(in, p, false), x.data(), y2.data());
    CHECK(y2 == y);
    const auto dy = random_tensor<3>({2, 6, 48});
    const auto& dx = m.backward(ctx, dy);
    host_tensor<double, 4> dx2(dx.shape());
    detail::run_copy_plan(nn::detail::patchify_plan(in, p, true), dy.data(), dx2.data());
    CHECK(dx2 == dx);
  }
  SUBCASE("select_token, forward and backward") {
    const std::size_t n = 3, t = 5, d = 4, index = 2;
    auto m = nn::build<double, 3>(f64{}, nn::select_token(index));
    const auto x = random_tensor<3>({n, t, d});
    const auto& y = m.forward(ctx, x);
    host_tensor<double, 2> y2(y.shape());
    detail::run_copy_plan(nn::detail::select_token_plan(n, t, d, false), x.data() + index * d, y2.data());
    CHECK(y2 == y);
    const auto dy = random_tensor<2>({n, d});
    const auto& dx = m.backward(ctx, dy);
    host_tensor<double, 3> dx2(dx.shape());
    dx2.fill(0.0);
    detail::run_copy_plan(nn::detail::select_token_plan(n, t, d, true), dy.data(), dx2.data() + index * d);
    CHECK(dx2 == dx);
  }
  SUBCASE("class_token, forward and backward") {
    const std::size_t n = 3, t = 4, d = 5;
    auto m = nn::build<double, 3>(f64{}, nn::class_token(d));
    const auto x = random_tensor<3>({n, t, d});
    const auto& y = m.forward(ctx, x);
    host_tensor<double, 3> y2(y.shape());
    y2.fill(std::nan(""));
    m.for_each_parameter([&](const std::string&, auto& token) {
      detail::run_copy_plan(nn::detail::class_token_first(n, t, d), token.value().data(), y2.data());
    });
    detail::run_copy_plan(nn::detail::class_token_rest(n, t, d), x.data(), y2.data() + d);
    CHECK(y2 == y);
    const auto dy = random_tensor<3>({n, t + 1, d});
    const auto& dx = m.backward(ctx, dy);
    host_tensor<double, 3> dx2(dx.shape());
    detail::run_copy_plan(nn::detail::class_token_backward(n, t, d), dy.data() + d, dx2.data());
    CHECK(dx2 == dx);
  }
  SUBCASE("permute, forward and backward") {
    const std::array<std::size_t, 4> in{2, 3, 4, 5}, order{0, 2, 3, 1};
    auto m = nn::build<double, 4>(f64{}, nn::permute<4>(order));
    const auto x = random_tensor<4>(in);
    const auto& y = m.forward(ctx, x);
    host_tensor<double, 4> y2(y.shape());
    detail::run_copy_plan(nn::detail::permute_plan(in, order, false), x.data(), y2.data());
    CHECK(y2 == y);
    const auto dy = random_tensor<4>({2, 4, 5, 3});
    const auto& dx = m.backward(ctx, dy);
    host_tensor<double, 4> dx2(dx.shape());
    detail::run_copy_plan(nn::detail::permute_plan(in, order, true), dy.data(), dx2.data());
    CHECK(dx2 == dx);
  }
  SUBCASE("attention's heads, split and merged") {
    const nn::detail::heads_geometry g{2, 5, 12, 3};
    const auto rows = random_tensor<3>({g.n, g.t, 3 * g.d});
    host_tensor<double, 3> q(g.per_head()), k(g.per_head()), v(g.per_head());
    nn::detail::split_heads(ctx, g, rows.data(), q.data(), k.data(), v.data());
    std::size_t column = 0;
    for (const auto* heads : {&q, &k, &v}) {
      host_tensor<double, 3> h2(g.per_head());
      detail::run_copy_plan(nn::detail::heads_plan(g, 3, false), rows.data() + column, h2.data());
      CHECK(h2 == *heads);
      column += g.d;
    }
    host_tensor<double, 3> merged(rows.shape()), merged2(rows.shape());
    nn::detail::merge_heads(ctx, g, merged.data(), q.data(), k.data(), v.data());
    column = 0;
    for (const auto* heads : {&q, &k, &v}) {
      detail::run_copy_plan(nn::detail::heads_plan(g, 3, true), heads->data(), merged2.data() + column);
      column += g.d;
    }
    CHECK(merged2 == merged);
    CHECK(merged == rows);
  }
}

TEST_CASE("scale multiplies values and gradients by its factor") {
  auto m = nn::build<double, 3>(f64{}, nn::scale(-0.375));
  check_gradients(m, random_tensor<3>({2, 3, 4}));
  // Under bfloat16: the product in float, rounded once.
  auto b = nn::build<bfloat16, 2>(presets::bf16_mixed{}, nn::scale(1.0 / 3.0));
  host_tensor<bfloat16, 2> x(std::array<std::size_t, 2>{2, 3});
  for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = bfloat16(0.7f * float(i) - 1.1f);
  const auto& y = b.forward(ctx, x);
  for (std::size_t i = 0; i < x.size(); ++i) {
    CHECK(y.data()[i].bits() == bfloat16(float(x.data()[i]) * float(1.0 / 3.0)).bits());
  }
}

TEST_CASE("dropout: p = 0 is the identity; p > 0 masks and scales values and gradients alike") {
  auto id = nn::build<double, 3>(f64{}, nn::dropout(0.0), {.seed = 4});
  const auto x = random_tensor<3>({4, 8, 16}, 0.5, 1.5);  // no zeros: a kept value is never 0
  CHECK(precis_test::same_bits(id.forward(ctx, x), x));
  check_gradients(id, random_tensor<3>({2, 3, 4}));

  const double p = 0.25, keep = 1.0 / (1.0 - p);
  auto m = nn::build<double, 3>(f64{}, nn::dropout(p), {.seed = 4});
  auto& layer = m.root();
  CHECK(layer.seed() == nn::detail::seed_for(4, ""));
  const host_tensor<double, 3> y = m.forward(ctx, x);
  const auto dy = random_tensor<3>({4, 8, 16});
  const auto& dx = m.backward(ctx, dy);
  std::size_t kept = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    // The mask is the counter hash of (seed, call 0, element).
    const bool k = nn::detail::unit_random(layer.seed(), 0, i) >= p;
    kept += k;
    CHECK(y.data()[i] == (k ? x.data()[i] * keep : 0.0));
    CHECK(dx.data()[i] == (k ? dy.data()[i] * keep : 0.0));
  }
  CHECK(double(kept) / double(x.size()) == doctest::Approx(1.0 - p).epsilon(0.1));
  CHECK(layer.calls() == 1);

  // Each call draws a new mask; a layer with the same seed draws the same sequence.
  const host_tensor<double, 3> y2 = m.forward(ctx, x);
  CHECK(!precis_test::same_bits(y, y2));
  auto again = nn::build<double, 3>(f64{}, nn::dropout(p), {.seed = 4});
  CHECK(precis_test::same_bits(again.forward(ctx, x), y));
  CHECK(precis_test::same_bits(again.forward(ctx, x), y2));
  auto other = nn::build<double, 3>(f64{}, nn::dropout(p), {.seed = 5});
  CHECK(!precis_test::same_bits(other.forward(ctx, x), y));

  // Evaluation: the input itself, and no step in the sequence.
  CHECK(&m.forward(ctx, x, nn::mode::eval) == &x);
  CHECK(&m.backward(ctx, dy) == &dy);
  CHECK(layer.calls() == 2);

  // A checkpoint holds seed and call count: a model loaded from it continues the sequence.
  const std::string state = save_state(m);
  CHECK(state_field<std::uint64_t>(m, "calls") == 2);
  CHECK(state_field<std::uint64_t>(m, "seed") == layer.seed());
  const host_tensor<double, 3> y3 = m.forward(ctx, x);
  auto resumed = nn::build<double, 3>(f64{}, nn::dropout(p), {.seed = 99});
  load_state(resumed, state);
  CHECK(resumed.root().calls() == 2);
  CHECK(precis_test::same_bits(resumed.forward(ctx, x), y3));

  // Under float16 (as training runs it): the scaled values rounded once.
  auto h = nn::build<float16, 2>(presets::fp16_mixed{}, nn::dropout(0.5), {.seed = 1});
  host_tensor<float16, 2> xh(std::array<std::size_t, 2>{4, 8});
  for (std::size_t i = 0; i < xh.size(); ++i) xh.data()[i] = float16(0.1f * float(i) + 0.05f);
  const auto& yh = h.forward(ctx, xh);
  for (std::size_t i = 0; i < xh.size(); ++i) {
    const bool k = nn::detail::unit_random(h.root().seed(), 0, i) >= 0.5;
    CHECK(yh.data()[i].bits() == (k ? float16(float(xh.data()[i]) * 2.0f) : float16(0.0f)).bits());
  }

  const auto all_dropped = [] { return nn::build<double, 2>(f64{}, nn::dropout(1.0)); };
  CHECK_THROWS_WITH_AS(all_dropped(), doctest::Contains("p must be in [0, 1)"), error);
}

TEST_CASE("softmax over the last axis: backward matches central differences; float math by rule") {
  auto m = nn::build<double, 3>(f64{}, nn::softmax());
  check_gradients(m, random_tensor<3>({2, 3, 5}, -3.0, 3.0));
  using bf = nn::model_t<bfloat16, 3, presets::bf16_mixed, decltype(nn::softmax())>::root_type;
  static_assert(std::is_same_v<bf::policy_type, policy<bfloat16, float, float, float, bfloat16, recipe::none, products::hardware>>);
  static_assert(std::is_same_v<bf::output_type, bfloat16>);
}

TEST_CASE(
    "class token and position embedding: backward matches central differences; no weight decay") {
  auto c = nn::build<double, 3>(f64{}, nn::class_token(4), {.seed = 2});
  const auto x = random_tensor<3>({3, 2, 4});
  const auto& y = c.forward(ctx, x);
  REQUIRE(y.shape() == std::array<std::size_t, 3>{3, 3, 4});
  for (std::size_t b = 0; b < 3; ++b)
    for (std::size_t d = 0; d < 4; ++d) {
      CHECK(y(b, 0, d) == c.root().token().value()(d));
      CHECK(std::fabs(y(b, 0, d)) <= 0.02);
      CHECK(y(b, 2, d) == x(b, 1, d));
    }
  check_gradients(c, x);
  CHECK(c.parameter_names() == std::vector<std::string>{"token"});
  CHECK(c.decay_mask() == std::vector<bool>{false});

  auto p = nn::build<double, 3>(f64{}, nn::position_embedding(3, 4), {.seed = 2});
  check_gradients(p, random_tensor<3>({2, 3, 4}));
  CHECK(p.parameter_names() == std::vector<std::string>{"table"});
  CHECK(p.decay_mask() == std::vector<bool>{false});
  CHECK_THROWS_WITH_AS(
      p.output_shape({2, 4, 4}),
      doctest::Contains("(position_embedding) expects an input of shape [N, 3, 4], got [2, 4, 4]"),
      error);

  // Mixed precision: the gradient is the batch sum rounded once to the gradient type.
  auto h = nn::build<float16, 3>(presets::fp16_mixed{}, nn::class_token(2), {.seed = 2});
  host_tensor<float16, 3> xh(std::array<std::size_t, 3>{3, 1, 2});
  xh.fill(float16(1.0f));
  h.forward(ctx, xh);
  host_tensor<float16, 3> dyh(std::array<std::size_t, 3>{3, 2, 2});
  for (std::size_t i = 0; i < dyh.size(); ++i) dyh.data()[i] = float16(1.0f / 3.0f + float(i));
  h.zero_grad();
  h.backward(ctx, dyh);
  for (std::size_t d = 0; d < 2; ++d) {
    const float sum = float(dyh(0, 0, d)) + float(dyh(1, 0, d)) + float(dyh(2, 0, d));
    CHECK(h.root().token().grad()(d) == float(float16(sum)));
  }
}

TEST_CASE("attention: backward matches central differences; parameters by path, decay on weights") {
  auto m = nn::build<double, 3>(f64{}, nn::attention(8, 2), {.seed = 6});
  check_gradients(m, random_tensor<3>({2, 5, 8}));
  CHECK(m.parameter_names() ==
        std::vector<std::string>{"qkv.weight", "qkv.bias", "out.weight", "out.bias"});
  CHECK(m.decay_mask() == std::vector<bool>{true, false, true, false});
  CHECK(m.parameter_count() == 8 * 24 + 24 + 8 * 8 + 8);
  // One head, and a single token (its softmax is 1: y is the projection of v).
  auto one = nn::build<double, 3>(f64{}, nn::attention(4, 1), {.seed = 7});
  check_gradients(one, random_tensor<3>({3, 1, 4}));
  const auto uneven = [] { return nn::build<double, 3>(f64{}, nn::attention(8, 3)); };
  CHECK_THROWS_WITH_AS(uneven(), doctest::Contains("divides it"), error);
}

namespace {
struct qkv_proj : layer<op::matmul> {
  static constexpr std::string_view name = "qkv_proj";
};
struct scores_mm : layer<op::matmul> {};
struct attn_softmax : layer<op::softmax> {};
struct context_mm : layer<op::matmul> {};
struct out_proj : layer<op::matmul> {};
}  // namespace

TEST_CASE(
    "attention pieces under different policies convert between them and stay close to float64") {
  constexpr auto map = make_policy_map(presets::bf16_mixed{}, for_layer<scores_mm>(presets::fp32{}),
                                       for_layer<context_mm>(presets::fp16_mixed{}),
                                       for_layer<out_proj>(presets::fp32{}));
  const auto bp = nn::attention<qkv_proj, scores_mm, attn_softmax, context_mm, out_proj>(8, 2);
  using layer_t = nn::model_t<bfloat16, 3, decltype(map), decltype(bp)>::root_type;
  static_assert(std::is_same_v<layer_t::policy_type, presets::bf16_mixed>);
  static_assert(std::is_same_v<layer_t::scores_policy, presets::fp32>);
  static_assert(std::is_same_v<layer_t::softmax_policy, policy<bfloat16, float, float, float, bfloat16, recipe::none, products::hardware>>);
  static_assert(std::is_same_v<layer_t::context_policy::storage_type, float16>);
  static_assert(std::is_same_v<layer_t::input_type, bfloat16> &&
                std::is_same_v<layer_t::output_type, float>);

  auto m = nn::build<bfloat16, 3>(map, bp, {.seed = 8});
  auto ref = nn::build<double, 3>(f64{}, nn::attention(8, 2), {.seed = 8});
  share_weights(ref, m);
  const auto [x, xd] = rounded_pair<bfloat16>(random_tensor<3>({2, 5, 8}));
  const auto& y = m.forward(ctx, x);
  const auto& yd = ref.forward(ctx, xd);
  // The loosest pieces store bfloat16: a few roundings of it along the way, each within
  // bound<bfloat16>() (kernel_checks.hpp); measured up to 0.75 times that bound.
  CHECK(precis_test::rel_error(y, yd) < 4 * precis_test::bound<bfloat16>());
  host_tensor<float, 3> dy(y.shape());
  host_tensor<double, 3> dyd(y.shape());
  for (std::size_t i = 0; i < dy.size(); ++i)
    dyd.data()[i] = dy.data()[i] = 0.25f * float(i % 7) - 0.7f;
  m.zero_grad();
  ref.zero_grad();
  CHECK(precis_test::rel_error(m.backward(ctx, dy), ref.backward(ctx, dyd)) <
        4 * precis_test::bound<bfloat16>());
  const std::string table = nn::describe(m);
  INFO(table);
  CHECK(table.find("attention") != std::string::npos);
  CHECK(table.find("qkv_proj") != std::string::npos);
}

TEST_CASE("a ViT encoder block: backward matches central differences in float64") {
  auto m = nn::build<double, 3>(f64{}, vit_block(8, 2), {.seed = 11});
  perturb_norms(m);
  check_gradients(m, random_tensor<3>({2, 5, 8}));
  const std::vector<std::string> names{
      "0.0.gamma", "0.0.beta", "0.1.qkv.weight", "0.1.qkv.bias", "0.1.out.weight", "0.1.out.bias",
      "1.0.gamma", "1.0.beta", "1.1.weight",     "1.1.bias",     "1.3.weight",     "1.3.bias"};
  CHECK(m.parameter_names() == names);
}

TEST_CASE(
    "a tiny ViT (patches, class token, positions, block, head): backward matches central "
    "differences") {
  auto m = nn::build<double, 4>(f64{}, tiny_vit(3, 2, 4, 8, 2, 3), {.seed = 12});
  perturb_norms(m);
  check_gradients(m, random_tensor<4>({2, 3, 4, 4}));
  CHECK(m.output_shape({2, 3, 4, 4}) == std::array<std::size_t, 2>{2, 3});
}

TEST_CASE_TEMPLATE(
    "a ViT block under bf16_mixed and fp16_mixed stays within bounds of the float64 block", C,
    precis_test::bf16_config, precis_test::fp16_config) {
  using T = typename C::T;
  using P = typename C::P;
  auto ref = nn::build<double, 3>(f64{}, vit_block(16, 2), {.seed = 21});
  perturb_norms(ref);
  auto m = nn::build<T, 3>(P{}, vit_block(16, 2), {.seed = 21});
  share_weights(ref, m);
  const auto [x, xd] = rounded_pair<T>(random_tensor<3>({2, 9, 16}));
  // Each op's output is within bound<T>() (one rounding plus float math, kernel_checks.hpp)
  // of its float64 value; a block chains about a dozen of them (norm, qkv, scores, softmax,
  // context, out, residual add, norm, fc1, gelu, fc2, add), whose errors add and are partly
  // amplified by the next products, so the block is held to 4 times the one-op bound.
  // Measured over 40 random inputs: outputs and input gradients up to 0.8 times the one-op
  // bound, parameter gradients (batch sums of rounded terms, which cancel) up to 1.9 times.
  const double tol = 4 * precis_test::bound<T>();
  const auto& y = m.forward(ctx, x);
  const auto& yd = ref.forward(ctx, xd);
  const double ey = precis_test::rel_error(y, yd);
  MESSAGE("output error " << ey << " (bound " << tol << ")");
  CHECK(ey < tol);
  const auto [dy, dyd] = rounded_pair<T>(random_tensor<3>({2, 9, 16}));
  m.zero_grad();
  ref.zero_grad();
  const auto& dx = m.backward(ctx, dy);
  const auto& dxd = ref.backward(ctx, dyd);
  const double ex = precis_test::rel_error(dx, dxd);
  MESSAGE("input gradient error " << ex << " (bound " << tol << ")");
  CHECK(ex < tol);
  // Parameter gradients: float sums of gradients rounded once to T.
  std::map<std::string, host_tensor<double, 1>> grads;
  ref.for_each_parameter([&](const std::string& path, auto& p) {
    grads[path] = host_tensor<double, 1>(std::array<std::size_t, 1>{p.size()});
    std::copy(p.grad().begin(), p.grad().end(), grads[path].begin());
  });
  m.for_each_parameter([&](const std::string& path, auto& p) {
    host_tensor<float, 1> g(std::array<std::size_t, 1>{p.size()});
    std::copy(p.grad().begin(), p.grad().end(), g.begin());
    INFO(path);
    CHECK(precis_test::rel_error(g, grads[path]) < tol);
  });
}

TEST_CASE("the bfloat16 ViT block gives the same bits on 1 and 2 threads") {
  using bf = presets::bf16_mixed;
  host_tensor<bfloat16, 3> x(std::array<std::size_t, 3>{4, 33, 16});
  std::uniform_real_distribution<float> d(-2.0f, 2.0f);
  for (auto& v : x) v = bfloat16(d(precis_test::rng()));
  precis_test::check_thread_independent(nn::build<bfloat16, 3>(bf{}, vit_block(16, 2), {.seed = 1}),
                                        x);
  precis_test::check_thread_independent(nn::build<bfloat16, 3>(bf{}, nn::dropout(0.3), {.seed = 1}),
                                        x);
  host_tensor<bfloat16, 4> img(std::array<std::size_t, 4>{4, 3, 32, 32});
  for (auto& v : img) v = bfloat16(d(precis_test::rng()));
  precis_test::check_thread_independent(
      nn::build<bfloat16, 4>(bf{}, tiny_vit(3, 4, 64, 16, 2, 5), {.seed = 1}), img);
}

TEST_CASE("a wrong shape into a built model is refused with the layer's path and both shapes") {
  auto m = nn::build<float, 3>(presets::fp32{}, nn::named("encoder", vit_block(8, 2)), {.seed = 1});
  host_tensor<float, 3> wrong(std::array<std::size_t, 3>{2, 5, 6});
  wrong.fill(0.5f);
  CHECK_THROWS_WITH_AS(
      m.forward(ctx, wrong),
      doctest::Contains("layer encoder.0.0 (layer_norm) expects an input of shape [..., 8], got "
                        "[2, 5, 6]"),
      error);
  auto a = nn::build<float, 3>(presets::fp32{}, nn::seq(nn::linear(6, 7), nn::attention(8, 2)),
                               {.seed = 1});
  CHECK_THROWS_WITH_AS(
      a.forward(ctx, wrong),
      doctest::Contains("layer 1 (attention) expects an input of shape [N, T, 8] with no empty "
                        "axis, got [2, 5, 7]"),
      error);
  auto v = nn::build<float, 4>(presets::fp32{}, nn::named("vit", tiny_vit(3, 2, 4, 8, 2, 3)),
                               {.seed = 1});
  host_tensor<float, 4> img(std::array<std::size_t, 4>{2, 3, 6, 4});
  img.fill(0.5f);
  // 6x4 images give 6 patches, not the 4 the position table was made for.
  CHECK_THROWS_WITH_AS(
      v.forward(ctx, img),
      doctest::Contains("layer vit.3 (position_embedding) expects an input of shape [N, 5, 8], got "
                        "[2, 7, 8]"),
      error);
  host_tensor<float, 4> odd(std::array<std::size_t, 4>{2, 3, 5, 4});
  odd.fill(0.5f);
  CHECK_THROWS_WITH_AS(v.forward(ctx, odd), doctest::Contains("layer vit.0 (patchify)"), error);
  auto s = nn::build<float, 3>(presets::fp32{}, nn::seq(nn::relu(), nn::select_token(5)));
  CHECK_THROWS_WITH_AS(
      s.forward(ctx, wrong),
      doctest::Contains(
          "layer 1 (select_token) expects an input of shape [N, T, D] with T > 5, got "
          "[2, 5, 6]"),
      error);
}
