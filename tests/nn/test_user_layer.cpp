// A layer written outside the library with nn's public pieces only (layer_scale.hpp, which
// docs/writing-layers.md quotes): a learned per-feature scale (LayerScale). The tests check
// that nn::build gives it its policy from the map and casts around it, that its gradients are
// the central differences', that its outputs are the policy's one rounding of x * gamma, that
// it trains under nn::trainer and the monitor reads it, that checkpoints keep its parameter
// with no code of its own, that nn::repeat lends its backward buffers with the same bits
// as keeping them, and what nn::saved says without a forward pass.
#include <precis/precis.hpp>

#include <doctest/doctest.h>

#include "gradcheck.hpp"
#include "layer_scale.hpp"
#include "model_helpers.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

using namespace precis;
using precis_test::masters_of;

namespace {

const cpu_context ctx{1};

struct ls : layer<op::elementwise> {
  static constexpr std::string_view name = "ls";
};

auto blueprint() { return nn::seq(nn::linear(8, 16), user::layer_scale<ls>(16, 0.5), nn::gelu(), nn::linear(16, 4)); }

}  // namespace

TEST_CASE("a user layer: its input and parameter gradients match central differences") {
  auto m = nn::build<double, 2>(precis_test::f64{}, blueprint(), {.seed = 3});
  // Scales away from their common initial value, so that each one's gradient differs.
  m.for_each_parameter([](const std::string& path, auto& p) {
    if (path == "ls.gamma") {
      std::uniform_real_distribution<double> d(0.5, 1.5);
      for (auto& v : p.master()) v = d(precis_test::rng());
      p.refresh();
    }
  });
  precis_test::check_gradients(m, precis_test::random_tensor<2>({5, 8}));
  auto rank3 = nn::build<double, 3>(precis_test::f64{}, blueprint(), {.seed = 3});
  precis_test::check_gradients(rank3, precis_test::random_tensor<3>({2, 3, 8}));
}

TEST_CASE("a user layer runs under the policy the map gives its tag: one rounding of x * gamma, casts around it") {
  // Under bf16_mixed alone: bfloat16 in and out, products in float, one rounding each.
  auto m = nn::build<bfloat16, 2>(presets::bf16_mixed{}, user::layer_scale<ls>(4, 0.3), {.seed = 1});
  m.for_each_parameter([](const std::string&, auto& p) {
    std::uniform_real_distribution<float> d(-2.0f, 2.0f);
    for (auto& v : p.master()) v = d(precis_test::rng());
    p.refresh();
  });
  const auto gamma = masters_of(m);
  REQUIRE(gamma.size() == 4);
  host_tensor<bfloat16, 2> x(std::array<std::size_t, 2>{3, 4}), dy(std::array<std::size_t, 2>{3, 4});
  std::uniform_real_distribution<float> d(-3.0f, 3.0f);
  for (auto& v : x) v = bfloat16(d(precis_test::rng()));
  for (auto& v : dy) v = bfloat16(d(precis_test::rng()));
  const auto& y = m.forward(ctx, x);
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(y)>, host_tensor<bfloat16, 2>>);
  m.zero_grad();
  const auto& dx = m.backward(ctx, dy);
  std::vector<double> dgamma(4, 0.0);
  for (std::size_t i = 0; i < 3; ++i) {
    for (std::size_t j = 0; j < 4; ++j) {
      const float g = float(bfloat16(gamma[j]));  // the working copy: the master rounded once
      CHECK(y(i, j).bits() == bfloat16(float(x(i, j)) * g).bits());
      CHECK(dx(i, j).bits() == bfloat16(float(dy(i, j)) * g).bits());
      dgamma[j] += double(float(dy(i, j))) * double(float(x(i, j)));
    }
  }
  // gamma's gradient: the batch sum in float, rounded once to bfloat16 (the gradient type),
  // then added to the float gradient.
  m.for_each_parameter([&](const std::string&, const auto& p) {
    for (std::size_t j = 0; j < 4; ++j) {
      INFO("feature " << j);
      CHECK(double(p.grad()(j)) == doctest::Approx(dgamma[j]).epsilon(1.0 / 128));
      CHECK(p.grad()(j) == float(bfloat16(p.grad()(j))));
    }
  });

  // The map sends the layer to float: nn::build casts to float before it and back after it,
  // and describe names it with its kind, shape and policy.
  constexpr auto map = make_policy_map(presets::bf16_mixed{}, for_layer<ls>(presets::fp32{}));
  auto mixed = nn::build<bfloat16, 2>(map, blueprint(), {.seed = 1});
  const std::string table = nn::describe(mixed);
  INFO(table);
  CHECK(table.find("layer_scale") != std::string::npos);
  CHECK(table.find("bfloat16->float") != std::string::npos);
  CHECK(table.find("float->bfloat16") != std::string::npos);
  host_tensor<bfloat16, 2> x8(std::array<std::size_t, 2>{2, 8});
  x8.fill(bfloat16(0.5f));
  CHECK(nn::shape_of<2>(mixed.forward(ctx, x8)) == nn::shape_t<2>{2, 4});
  // A batch of the wrong width names the layer before anything runs.
  auto alone = nn::build<float, 2>(presets::fp32{}, user::layer_scale<ls>(4), {.seed = 1});
  host_tensor<float, 2> wrong(std::array<std::size_t, 2>{2, 5});
  CHECK_THROWS_WITH_AS(alone.forward(ctx, wrong), doctest::Contains("layer ls (layer_scale) expects an input of shape [..., 4]"),
                       error);
}

namespace {

template <class P>
struct run {
  using S = typename P::storage_type;
  decltype(nn::build<S, 2>(P{}, blueprint())) model;
  nn::softmax_cross_entropy<P> loss;
  adamw opt;
  scaler_for<P> scaler;
  explicit run(std::uint64_t seed)
      : model(nn::build<S, 2>(P{}, blueprint(), {.seed = seed})), opt(model.masters(), {.lr = 0.05f}) {}
};

struct batch {
  host_tensor<bfloat16, 2> x{std::array<std::size_t, 2>{32, 8}};
  host_tensor<std::int32_t, 1> t{std::array<std::size_t, 1>{32}};
  batch() {
    std::mt19937_64 g(5);
    std::normal_distribution<float> n(0.0f, 1.0f);
    for (std::size_t r = 0; r < 32; ++r) {
      t(r) = std::int32_t(r % 4);
      for (std::size_t k = 0; k < 8; ++k) x(r, k) = bfloat16(n(g) + (k % 4 == r % 4 ? 2.0f : 0.0f));
    }
  }
};

}  // namespace

TEST_CASE("a user layer trains under nn::trainer, and checkpoints keep its parameter with no code of its own") {
  const batch b;
  run<presets::bf16_mixed> a(7);
  nn::trainer tr(a.model, a.loss, a.opt, a.scaler);
  const double before = nn::evaluate(ctx, a.model, a.loss, b.x, b.t).loss;
  const auto first = masters_of(a.model);
  for (int i = 0; i < 5; ++i) REQUIRE_FALSE(tr.step(ctx, b.x, b.t).skipped);
  CHECK(nn::evaluate(ctx, a.model, a.loss, b.x, b.t).loss < before - 0.05);
  bool gamma_moved = false;
  a.model.for_each_parameter([&](const std::string& path, const auto& p) {
    if (path != "ls.gamma") return;
    for (float v : p.master()) gamma_moved |= v != 0.5f;
  });
  CHECK(gamma_moved);
  CHECK(masters_of(a.model) != first);

  // precis::diagnostics reads it as it reads nn's layers: its own row, by path and tag.
  diagnostics::monitor mon;
  REQUIRE_FALSE(tr.step(ctx, b.x, b.t, mon).skipped);
  bool seen = false;
  for (const auto& r : mon.layers()) {
    if (r.path != "ls") continue;
    seen = true;
    CHECK(r.storage == "bfloat16");
    CHECK(r.output.values == 32 * 16);
    CHECK(r.output.amax > 0.0);
    CHECK(r.input_grad.values == 32 * 16);
  }
  CHECK(seen);

  const auto dir = std::filesystem::temp_directory_path() / ("precis_user_layer_" + std::to_string(precis_test::rng()()));
  std::filesystem::create_directories(dir);
  const auto file = dir / "ckpt.bin";
  save_checkpoint(file, a.model, a.opt, a.scaler);
  run<presets::bf16_mixed> resumed(99);  // other weights; gamma back at its initial 0.5
  load_checkpoint(file, resumed.model, resumed.opt, resumed.scaler);
  CHECK(masters_of(resumed.model) == masters_of(a.model));
  nn::trainer tr2(resumed.model, resumed.loss, resumed.opt, resumed.scaler);
  const auto ra = tr.step(ctx, b.x, b.t), rb = tr2.step(ctx, b.x, b.t);
  CHECK(std::memcmp(&ra.loss, &rb.loss, sizeof(double)) == 0);
  CHECK(masters_of(resumed.model) == masters_of(a.model));
  std::filesystem::remove_all(dir);
}

TEST_CASE("nn::repeat lends a user layer's backward buffers: the same bits as keeping them, in less memory") {
  // The layer names its input gradient and gamma's gradient product, in that order.
  auto alone = nn::build<float, 2>(presets::fp32{}, user::layer_scale(8), {.seed = 1});
  CHECK(nn::gradient_buffers(alone.root()).size() == 2);
  const auto block = [] {
    return nn::residual(nn::seq(nn::linear(8, 8), user::layer_scale(8, 0.5), nn::gelu()));
  };
  const auto make = [&] { return nn::build<float, 2>(presets::fp32{}, nn::repeat<5>(block()), {.seed = 11}); };
  auto lend = make(), keep = make();
  keep.keep_gradient_buffers(true);
  REQUIRE_FALSE(lend.keeps_gradient_buffers());
  host_tensor<float, 2> x(std::array<std::size_t, 2>{6, 8}), dy(std::array<std::size_t, 2>{6, 8});
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  for (auto& v : x) v = d(precis_test::rng());
  for (auto& v : dy) v = d(precis_test::rng());
  for (int pass = 0; pass < 3; ++pass) {
    INFO("pass " << pass);
    lend.zero_grad();
    keep.zero_grad();
    (void)lend.forward(ctx, x);
    (void)keep.forward(ctx, x);
    const auto& dl = lend.backward(ctx, dy);
    const auto& dk = keep.backward(ctx, dy);
    CHECK(precis_test::same_bits(dl, dk));
    std::vector<float> gl, gk;
    lend.for_each_parameter([&](const std::string&, const auto& p) { gl.insert(gl.end(), p.grad().begin(), p.grad().end()); });
    keep.for_each_parameter([&](const std::string&, const auto& p) { gk.insert(gk.end(), p.grad().begin(), p.grad().end()); });
    CHECK(std::memcmp(gl.data(), gk.data(), gl.size() * sizeof(float)) == 0);
  }
  CHECK(lend.activation_bytes() < keep.activation_bytes());
}

TEST_CASE("nn::saved gives the input back, and names the layer's kind without a forward pass or after a copy") {
  const auto x = host_tensor<float, 1>::from_shape({3});
  nn::saved<host_tensor<float, 1>> s;
  CHECK(s.peek() == nullptr);
  CHECK_THROWS_WITH_AS(s.get("layer_scale"),
                       "precis::nn: backward() of layer_scale called without a forward() since the layer was made "
                       "or copied",
                       error);
  s.set(x);
  CHECK(&s.get("layer_scale") == &x);
  const auto copy = s;  // a copied layer has seen no input
  CHECK(copy.peek() == nullptr);
  CHECK_THROWS_WITH_AS(copy.get("layer_scale"), doctest::Contains("backward() of layer_scale"), error);
  auto assigned = nn::saved<host_tensor<float, 1>>{};
  assigned.set(x);
  assigned = s;
  CHECK(assigned.peek() == nullptr);
}
