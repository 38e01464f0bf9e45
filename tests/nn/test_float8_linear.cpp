// float8 inside nn::linear's products (presets::fp8_hybrid): the scaled cast and amax
// against their definitions, the forward and backward products against float64 sums of the
// quantised values, the delayed recipes' scales from the recorded amax, evaluation leaving
// the recipes alone, training that lowers the loss, and checkpoints that carry the recipes.
#include <precis/precis.hpp>

#include <doctest/doctest.h>

#include "model_helpers.hpp"
#include "random.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <vector>

using namespace precis;

namespace {

const cpu_context ctx1{1};
const cpu_context ctx2{2};

template <class T, std::size_t N>
host_tensor<T, N> random_tensor(std::array<std::size_t, N> shape, float sd) {
  host_tensor<T, N> t(shape);
  std::normal_distribution<float> n(0.0f, sd);
  for (auto& v : t) v = T(n(precis_test::rng()));
  return t;
}

/// The float8 value of v * scale as a recipe casts it (its definition: float product, then
/// nearest-even with saturation), as a double.
template <class F>
double quantised(float v, float scale) {
  return double(float(convert<F, rounding::nearest_even, overflow::saturate>(v * scale)));
}

/// |a - b| within one unit in the last place of bfloat16 at b (2^-7 relative for normal b),
/// plus an absolute floor for values near zero.
bool within_bf16_ulp(double a, double b, double floor = 1e-6) {
  return std::abs(a - b) <= std::abs(b) * 0x1p-7 + floor;
}

}  // namespace

TEST_CASE("scaled_cast: each element is saturate(v * scale), the amax is the largest |v|") {
  auto x = random_tensor<bfloat16, 2>({37, 301}, 3.0f);
  x(3, 5) = bfloat16(-1000.0f);  // beyond 448 / scale: saturates
  const float scale = 0.75f;
  host_tensor<float8_e4m3, 2> q1(x.shape()), q2(x.shape());
  const float a1 = scaled_cast(ctx1, x, scale, q1);
  const float a2 = scaled_cast(ctx2, x, scale, q2);
  float expect = 0.0f;
  bool same = true;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float v = float(x.data()[i]);
    expect = std::max(expect, std::abs(v));
    const auto want = convert<float8_e4m3, rounding::nearest_even, overflow::saturate>(v * scale);
    same = same && q1.data()[i].bits() == want.bits() && q2.data()[i].bits() == want.bits();
  }
  CHECK(same);
  CHECK(a1 == expect);
  CHECK(a2 == expect);
  CHECK(float(q1(3, 5)) == -448.0f);
  CHECK(amax_of(ctx2, x) == expect);

  // A NaN makes the amax NaN (a recipe then keeps its scale); an empty tensor has amax 0.
  x(20, 100) = bfloat16(std::numeric_limits<float>::quiet_NaN());
  CHECK(std::isnan(scaled_cast(ctx2, x, scale, q1)));
  CHECK(std::isnan(float(q1(20, 100))));
  host_tensor<float, 1> empty(std::array<std::size_t, 1>{0});
  CHECK(amax_of(ctx1, empty) == 0.0f);

  host_tensor<float8_e5m2, 2> wrong(std::array<std::size_t, 2>{37, 300});
  CHECK_THROWS_AS(scaled_cast(ctx1, x, scale, wrong), error);
}

TEST_CASE("fp8_hybrid linear: products of the quantised values, scaled back, rounded once to bfloat16") {
  using P = presets::fp8_hybrid;
  auto model = nn::build<bfloat16, 2>(P{}, nn::linear(48, 32), {.seed = 5});
  auto& layer = model.root();
  static_assert(std::is_same_v<typename std::remove_cvref_t<decltype(layer)>::input_type, bfloat16>);
  const std::size_t rows = 24, in = 48, out = 32;

  auto x = random_tensor<bfloat16, 2>({rows, in}, 2.0f);
  // The first pass casts with the recipes' initial scale 1 and records the amax; the
  // second casts with 448 / amax (delayed scaling: the history's maximum).
  (void)model.forward(ctx2, x, nn::mode::train);
  const auto& f = layer.float8_products();
  CHECK(f.input_scale == 1.0f);
  const float ax = amax_of(ctx1, x), aw = amax_of(ctx1, layer.weight().value());
  CHECK(f.input.scale() == 448.0f / ax);
  CHECK(f.weight.scale() == 448.0f / aw);

  auto x2 = random_tensor<bfloat16, 2>({rows, in}, 4.0f);  // larger: some values saturate
  const auto y = model.forward(ctx2, x2, nn::mode::train);
  const float sx = f.input_scale, sw = f.weight_scale;
  CHECK(sx == 448.0f / ax);
  CHECK(sw == 448.0f / aw);
  const float ax2 = amax_of(ctx1, x2);
  CHECK(f.input.scale() == 448.0f / std::max(ax, ax2));

  const auto& w = layer.weight().value();
  const auto& b = layer.bias().value();
  bool ok = true;
  for (std::size_t i = 0; i < rows; ++i) {
    for (std::size_t j = 0; j < out; ++j) {
      double sum = 0;
      for (std::size_t k = 0; k < in; ++k) {
        sum += quantised<float8_e4m3>(float(x2(i, k)), sx) * quantised<float8_e4m3>(float(w(j, k)), sw);
      }
      const double ref = double(bfloat16(float(sum / (double(sx) * double(sw)) + double(float(b(j))))));
      if (!within_bf16_ulp(double(float(y(i, j))), ref)) {
        ok = false;
        INFO("y(" << i << ", " << j << ") = " << float(y(i, j)) << ", reference " << ref);
        CHECK(false);
      }
    }
  }
  CHECK(ok);

  // Backward: dy is cast to float8_e5m2 with its own recipe (initial scale 1 here).
  auto dy = random_tensor<bfloat16, 2>({rows, out}, 0.01f);
  model.zero_grad();
  const auto dx = model.backward(ctx2, dy);
  const float sg = 1.0f;
  CHECK(f.grad_output.scale() == 57344.0f / amax_of(ctx1, dy));
  // The products are exact; their float sums round at each addition, which a sum that
  // cancels (|sum| far below the sum of |terms|) shows as a large relative error: the
  // floor is n float ulps of the sum of |terms|.
  bool dx_ok = true, dw_ok = true, db_ok = true;
  for (std::size_t i = 0; i < rows; ++i) {
    for (std::size_t k = 0; k < in; ++k) {
      double sum = 0, magnitude = 0;
      for (std::size_t j = 0; j < out; ++j) {
        const double t = quantised<float8_e5m2>(float(dy(i, j)), sg) * quantised<float8_e4m3>(float(w(j, k)), sw);
        sum += t;
        magnitude += std::abs(t);
      }
      const double scale = double(sg) * double(sw);
      dx_ok = dx_ok && within_bf16_ulp(double(float(dx(i, k))), sum / scale,
                                       1e-9 + double(out) * 0x1p-24 * magnitude / scale);
    }
  }
  const auto& dw = layer.weight().grad();
  for (std::size_t j = 0; j < out; ++j) {
    for (std::size_t k = 0; k < in; ++k) {
      double sum = 0, magnitude = 0;
      for (std::size_t i = 0; i < rows; ++i) {
        const double t = quantised<float8_e5m2>(float(dy(i, j)), sg) * quantised<float8_e4m3>(float(x2(i, k)), sx);
        sum += t;
        magnitude += std::abs(t);
      }
      const double scale = double(sg) * double(sx);
      dw_ok = dw_ok && within_bf16_ulp(double(dw(j, k)), sum / scale,
                                       1e-9 + double(rows) * 0x1p-24 * magnitude / scale);
    }
    double db = 0;
    for (std::size_t i = 0; i < rows; ++i) db += double(float(dy(i, j)));
    db_ok = db_ok && within_bf16_ulp(double(layer.bias().grad()(j)), db, 1e-9);
  }
  CHECK(dx_ok);
  CHECK(dw_ok);
  CHECK(db_ok);
}

TEST_CASE("fp8_hybrid linear: an evaluation pass does not change the recipes") {
  auto model = nn::build<bfloat16, 2>(presets::fp8_hybrid{}, nn::linear(16, 16), {.seed = 2});
  const auto x = random_tensor<bfloat16, 2>({8, 16}, 1.0f);
  (void)model.forward(ctx1, x, nn::mode::train);
  const auto& f = model.root().float8_products();
  const auto history = f.input.amax_history();
  const float scale = f.input.scale();
  (void)model.forward(ctx1, random_tensor<bfloat16, 2>({8, 16}, 100.0f), nn::mode::eval);
  CHECK(f.input.amax_history() == history);
  CHECK(f.input.scale() == scale);
  CHECK(f.input_scale == scale);  // the evaluation cast used the trained scale
}

namespace {

struct blob_batch {
  host_tensor<bfloat16, 2> x;
  host_tensor<std::int32_t, 1> t;
};

blob_batch blobs(std::size_t rows, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  blob_batch b{host_tensor<bfloat16, 2>(std::array<std::size_t, 2>{rows, 32}),
               host_tensor<std::int32_t, 1>(std::array<std::size_t, 1>{rows})};
  for (std::size_t r = 0; r < rows; ++r) {
    const auto c = std::int32_t(r % 4);
    b.t(r) = c;
    for (std::size_t k = 0; k < 32; ++k) b.x(r, k) = bfloat16(n(g) * 0.5f + (k % 4 == std::size_t(c) ? 1.5f : 0.0f));
  }
  return b;
}

// float8 in the hidden layers, the 4-way classifier in bfloat16 (the loss reads it).
struct classifier : layer<op::matmul> {
  static constexpr std::string_view name = "classifier";
};
using fp8_map = decltype(make_policy_map(presets::fp8_hybrid{}, for_layer<classifier>(presets::bf16_mixed{})));

auto fp8_model(std::uint64_t seed) {
  return nn::build<bfloat16, 2>(fp8_map{},
                                nn::seq(nn::linear(32, 64), nn::gelu(), nn::linear(64, 32), nn::gelu(),
                                        nn::linear<classifier>(32, 4)),
                                {.seed = seed});
}

struct fp8_run {
  decltype(fp8_model(0)) model;
  nn::softmax_cross_entropy<presets::bf16_mixed> loss;
  adamw opt;
  dynamic_scaler scaler;
  explicit fp8_run(std::uint64_t seed) : model(fp8_model(seed)), opt(model.masters(), {.lr = 3e-3}) {}
  std::vector<nn::step_record> train(std::size_t from, std::size_t to) {
    nn::trainer tr(model, loss, opt, scaler);
    std::vector<nn::step_record> out;
    for (std::size_t s = from; s < to; ++s) {
      const auto b = blobs(64, 300 + s);
      out.push_back(tr.step(ctx2, b.x, b.t));
    }
    return out;
  }
};

using precis_test::masters_of;

}  // namespace

TEST_CASE("an fp8_hybrid model trains: the loss falls as it does in bfloat16") {
  fp8_run r(7);
  const auto steps = r.train(0, 60);
  const auto test = blobs(512, 99);
  const auto e = nn::evaluate(ctx2, r.model, r.loss, test.x, test.t);
  INFO("first loss " << steps.front().loss << ", last " << steps.back().loss << ", test accuracy " << e.accuracy);
  CHECK(steps.back().loss < 0.25 * steps.front().loss);
  CHECK(e.accuracy > 0.95);
  for (const auto& s : steps) CHECK(std::isfinite(s.loss));
}

TEST_CASE("a checkpoint carries the float8 recipes: a resumed run continues bit-identically") {
  const auto dir = std::filesystem::temp_directory_path() / ("precis_fp8_" + std::to_string(precis_test::rng()()));
  std::filesystem::create_directories(dir);
  const auto file = dir / "ckpt.bin";
  fp8_run straight(11);
  straight.train(0, 8);
  fp8_run first(11);
  first.train(0, 4);
  save_checkpoint(file, first.model, first.opt, first.scaler);
  fp8_run resumed(12);
  load_checkpoint(file, resumed.model, resumed.opt, resumed.scaler);
  const auto& a = first.model.root().child<0>().float8_products();
  const auto& b = resumed.model.root().child<0>().float8_products();
  CHECK(a.input.scale() == b.input.scale());
  CHECK(a.input.amax_history() == b.input.amax_history());
  CHECK(a.weight.amax_history() == b.weight.amax_history());
  CHECK(a.grad_output.amax_history() == b.grad_output.amax_history());
  CHECK(b.input.amax_history().size() == 4);
  resumed.train(4, 8);
  const auto x = masters_of(straight.model), y = masters_of(resumed.model);
  REQUIRE(x.size() == y.size());
  CHECK(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0);
  std::filesystem::remove_all(dir);
}
