// The DBNet example's blueprint: at width 64 its backbone has ResNet-18's parameters
// (torchvision's resnet18 without its classifier: 11,689,512 - 513,000 = 11,176,512); the
// neck and heads have the counts worked out below; the model maps [N, 3, H, W] to P logits
// and T in (0, 1), both [N, 1, H, W], under fp32 and bf16_mixed; gradients reach the stem;
// describe names the heads and the tags.
#include "../../examples/dbnet/model.hpp"

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

using namespace precis;

namespace {

const cpu_context ctx{2};

template <class T>
host_tensor<T, 4> image_batch(std::size_t n, std::size_t side) {
  host_tensor<T, 4> x({n, 3, side, side});
  for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = T(float(std::sin(0.37 * double(i))));
  return x;
}

}  // namespace

TEST_CASE("the backbone at width 64 has ResNet-18's parameters") {
  auto b = nn::build<float, 4>(presets::fp32{}, dbnet::backbone({.width = 64}), {.seed = 1});
  CHECK(b.parameter_count() == 11'176'512);
}

TEST_CASE("neck and heads: parameter counts worked out by hand") {
  // width 8, inner 32 (smoothed levels and hidden head layers of 8 channels):
  //   laterals 1x1: (8 + 16 + 32 + 64) * 32 = 3840; smoothing 3x3: 4 * 32 * 8 * 9 = 9216;
  //   a head: 3x3 conv 32 * 8 * 9 = 2304, BN 16, 2x2 transposed 8 * 8 * 4 + 8 = 264, BN 16,
  //   2x2 transposed to 1: 8 * 4 + 1 = 33; two heads: 2 * 2633 = 5266.
  const dbnet::config c{.width = 8, .inner = 32};
  auto whole = nn::build<float, 4>(presets::fp32{}, dbnet::blueprint(c), {.seed = 1});
  auto backbone = nn::build<float, 4>(presets::fp32{}, dbnet::backbone(c), {.seed = 1});
  CHECK(whole.parameter_count() - backbone.parameter_count() == 3840 + 9216 + 5266);
}

TEST_CASE("images to P logits and T in (0, 1) at full resolution; gradients reach the stem") {
  const dbnet::config c{.width = 8, .inner = 32};
  auto run = [&]<class P>(P) {
    using S = nn::activation_type_t<P>;
    auto m = nn::build<S, 4>(P{}, dbnet::blueprint(c), {.seed = 3});
    const auto x = image_batch<S>(2, 64);
    m.zero_grad();
    const auto out = m.forward(ctx, x);
    const auto& p = *std::get<0>(out);
    const auto& t = *std::get<1>(out);
    CHECK(p.shape() == std::array<std::size_t, 4>{2, 1, 64, 64});
    CHECK(t.shape() == std::array<std::size_t, 4>{2, 1, 64, 64});
    for (std::size_t i = 0; i < t.size(); ++i) {
      const float v = float(t.data()[i]);
      CHECK((v > 0.0F && v < 1.0F));
      CHECK(std::isfinite(float(p.data()[i])));
    }
    host_tensor<S, 4> dp(p.shape()), dt(t.shape());
    dp.fill(S(0.01F));
    dt.fill(S(-0.01F));
    m.backward(ctx, std::tuple{&dp, &dt});
    double stem = 0;
    m.for_each_parameter([&](const std::string& path, const auto& prm) {
      if (path.find("stem") == std::string::npos) return;
      for (std::size_t i = 0; i < prm.size(); ++i) stem += std::abs(double(prm.grad().data()[i]));
    });
    CHECK(stem > 0.0);
    return nn::describe(m);
  };
  (void)run(presets::fp32{});
  const std::string table = run(presets::bf16_mixed{});
  CHECK(table.find("thresh") != std::string::npos);
  CHECK(table.find("prob") != std::string::npos);
  CHECK(table.find("lateral") != std::string::npos);
  CHECK(table.find("head_up") != std::string::npos);
}

TEST_CASE("built channels-last, the DBNet gives the NCHW model's maps and gradients bit for bit") {
  // Every node of the blueprint takes [N, H, W, C] images (taps, each, top_down, the
  // channel-axis concatenation, the heads' transposed convolutions with their biases); the
  // maps have one channel, so [N, H, W, 1] holds the values of [N, 1, H, W] in order.
  const dbnet::config c{.width = 8, .inner = 32};
  using S = bfloat16;
  auto a = nn::build<S, 4>(presets::bf16_mixed{}, dbnet::blueprint(c), {.seed = 5});
  auto b = nn::build<S, 4>(presets::bf16_mixed{}, dbnet::blueprint(c), {.seed = 5, .layout = image_layout::nhwc});
  const auto x = image_batch<S>(2, 64);
  host_tensor<S, 4> xl({2, 64, 64, 3});
  for (std::size_t n = 0; n < 2; ++n)
    for (std::size_t ch = 0; ch < 3; ++ch)
      for (std::size_t q = 0; q < 64 * 64; ++q) xl.data()[(n * 4096 + q) * 3 + ch] = x.data()[(n * 3 + ch) * 4096 + q];
  const auto ya = a.forward(ctx, x);
  const auto yb = b.forward(ctx, xl);
  const auto same_values = [](const auto& u, const auto& v) {
    if (u.size() != v.size()) return false;
    for (std::size_t i = 0; i < u.size(); ++i) {
      if (u.data()[i].bits() != v.data()[i].bits()) return false;
    }
    return true;
  };
  CHECK(std::get<0>(yb)->shape() == std::array<std::size_t, 4>{2, 64, 64, 1});
  CHECK(same_values(*std::get<0>(ya), *std::get<0>(yb)));
  CHECK(same_values(*std::get<1>(ya), *std::get<1>(yb)));
  host_tensor<S, 4> dp({2, 1, 64, 64}), dt({2, 1, 64, 64}), dpl({2, 64, 64, 1}), dtl({2, 64, 64, 1});
  for (std::size_t i = 0; i < dp.size(); ++i) {
    dp.data()[i] = dpl.data()[i] = S(float(std::cos(0.11 * double(i))) * 0.01F);
    dt.data()[i] = dtl.data()[i] = S(float(std::sin(0.07 * double(i))) * 0.01F);
  }
  a.zero_grad();
  b.zero_grad();
  a.backward(ctx, std::tuple{&dp, &dt});
  b.backward(ctx, std::tuple{&dpl, &dtl});
  std::size_t compared = 0, differing = 0;
  std::vector<std::vector<float>> grads;
  a.for_each_parameter([&](const std::string&, const auto& prm) {
    grads.emplace_back(prm.grad().data(), prm.grad().data() + prm.size());
  });
  b.for_each_parameter([&](const std::string&, const auto& prm) {
    const auto& want = grads.at(compared++);
    for (std::size_t i = 0; i < prm.size(); ++i) {
      differing += std::bit_cast<std::uint32_t>(float(prm.grad().data()[i])) != std::bit_cast<std::uint32_t>(want[i]);
    }
  });
  CHECK(compared == grads.size());
  CHECK(differing == 0);
}

TEST_CASE("sizes are checked") {
  CHECK_THROWS_AS((dbnet::config{.width = 8, .inner = 30}.validate()), error);
  CHECK_NOTHROW((dbnet::config{.width = 8, .inner = 32}.validate()));
}
