// The DBNet example's blueprint: at width 64 its backbone has ResNet-18's parameters
// (torchvision's resnet18 without its classifier: 11,689,512 - 513,000 = 11,176,512); the
// neck and heads have the counts worked out below; the model maps [N, 3, H, W] to P logits
// and T in (0, 1), both [N, 1, H, W], under fp32 and bf16_mixed; gradients reach the stem;
// describe names the heads and the tags.
#include "../../examples/dbnet/model.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <tuple>

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

TEST_CASE("sizes are checked") {
  CHECK_THROWS_AS((dbnet::config{.width = 8, .inner = 30}.validate()), error);
  CHECK_NOTHROW((dbnet::config{.width = 8, .inner = 32}.validate()));
}
