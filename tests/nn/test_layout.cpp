// Channels-last models (nn/layout.hpp): a blueprint built with image_layout::nhwc gives, for
// the same input moved to [N, H, W, C], the NCHW model's outputs, input gradients and
// parameter gradients moved to NHWC, bit for bit, under exact and mixed policies and in both
// modes; and every spatial layer's shape errors speak the layout.
#include <precis/precis.hpp>
#include <precis/nn/layout.hpp>

#include <doctest/doctest.h>

#include "kernels/kernel_checks.hpp"

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

using namespace precis;

namespace {

using shape4 = std::array<std::size_t, 4>;

struct head : layer<op::conv> {
  static constexpr std::string_view name = "head";
};

/// [N, C, H, W] -> [N, H, W, C] (back = false) or [N, H, W, C] -> [N, C, H, W] (back =
/// true), element by element: the test's own move, independent of the library's.
template <class T>
host_tensor<T, 4> moved(const host_tensor<T, 4>& t, bool back) {
  const auto s = t.shape();
  const std::size_t n = s[0], c = back ? s[3] : s[1], h = back ? s[1] : s[2], w = back ? s[2] : s[3];
  host_tensor<T, 4> out(back ? shape4{n, c, h, w} : shape4{n, h, w, c});
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t k = 0; k < c; ++k)
      for (std::size_t y = 0; y < h; ++y)
        for (std::size_t x = 0; x < w; ++x) {
          const std::size_t nchw = ((i * c + k) * h + y) * w + x, nhwc = ((i * h + y) * w + x) * c + k;
          if (back) {
            out.data()[nchw] = t.data()[nhwc];
          } else {
            out.data()[nhwc] = t.data()[nchw];
          }
        }
  return out;
}

/// The bits of each element.
template <class T>
std::vector<std::uint64_t> bits(const T* p, std::size_t n) {
  std::vector<std::uint64_t> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint64_t b = 0;
    std::memcpy(&b, p + i, sizeof(T));
    out[i] = b;
  }
  return out;
}
template <class Tensor>
std::vector<std::uint64_t> bits(const Tensor& t) {
  return bits(t.data(), t.size());
}

/// Every spatial layer and both concatenations: conv with bias, batch norm, max pooling,
/// nn::concat of a 1x1 conv and an average-pool + nearest-upsampling branch, a strided
/// transposed conv with bias, nn::fork into two convolutions joined by nn::concat_all, and
/// bilinear upsampling.
auto every_spatial_layer() {
  return nn::seq(nn::conv2d(3, 8, 3, {.padding = {1, 1}}), nn::batch_norm(8), nn::relu(),
                 nn::max_pool2d({.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}}),
                 nn::concat(nn::channel_axis, nn::conv2d<head>(8, 4, 1),
                            nn::seq(nn::avg_pool2d({.kernel = {2, 2}}), nn::upsample_nearest(2))),
                 nn::conv_transpose2d(12, 6, 2, {.stride = {2, 2}}), nn::batch_norm(6),
                 nn::fork(nn::conv2d(6, 2, 1), nn::conv2d(6, 3, 3, {.padding = {1, 1}}, nn::no_bias)),
                 nn::concat_all(nn::channel_axis), nn::upsample_bilinear(2));
}

/// Runs `blueprint` built NCHW and NHWC from one seed on one input (moved for the NHWC
/// model): forward in training mode, backward from one output gradient, then forward in
/// evaluation mode; everything agrees bit for bit once moved.
template <class T, class Policy, class Spec>
void check_layouts_agree(const Spec& blueprint, const shape4& in, const cpu_context& ctx) {
  auto a = nn::build<T, 4>(Policy{}, blueprint, {.seed = 7});
  auto b = nn::build<T, 4>(Policy{}, blueprint, {.seed = 7, .layout = image_layout::nhwc});
  CHECK(a.layout() == image_layout::nchw);
  CHECK(b.layout() == image_layout::nhwc);
  CHECK(nn::describe(b).find("3->8 3x3 p1 nhwc") != std::string::npos);
  CHECK(nn::describe(a).find("nhwc") == std::string::npos);
  const auto x = precis_test::random_tensor<T, 4>(in);
  const auto xb = moved(x, false);

  const auto& ya = a.forward(ctx, x);
  const auto& yb = b.forward(ctx, xb);
  REQUIRE(yb.shape() == moved(ya, false).shape());
  CHECK(bits(moved(yb, true)) == bits(ya));

  using G = typename decltype(a)::output_grad_type;
  const auto dy = precis_test::random_tensor<G, 4>(ya.shape());
  a.zero_grad();
  b.zero_grad();
  const auto& dxa = a.backward(ctx, dy);
  const auto& dxb = b.backward(ctx, moved(dy, false));
  CHECK(bits(moved(dxb, true)) == bits(dxa));
  std::map<std::string, std::vector<std::uint64_t>> ga;
  a.for_each_parameter([&](const std::string& path, const auto& p) { ga[path] = bits(p.grad().data(), p.size()); });
  std::size_t compared = 0;
  b.for_each_parameter([&](const std::string& path, const auto& p) {
    INFO("parameter " << path);
    CHECK(bits(p.grad().data(), p.size()) == ga.at(path));
    ++compared;
  });
  CHECK(compared == ga.size());

  // Evaluation mode: batch norms on the running statistics the training pass updated.
  const auto& ea = a.forward(ctx, x, nn::mode::eval);
  const auto& eb = b.forward(ctx, xb, nn::mode::eval);
  CHECK(bits(moved(eb, true)) == bits(ea));
}

}  // namespace

TEST_CASE("a channels-last model gives the NCHW model's outputs and gradients, moved, bit for bit") {
  const cpu_context one{1}, two{2};
  const shape4 in{2, 3, 12, 8};
  SUBCASE("fp32") { check_layouts_agree<float, presets::fp32>(every_spatial_layer(), in, one); }
  SUBCASE("bf16_exact, two threads") { check_layouts_agree<bfloat16, presets::bf16_exact>(every_spatial_layer(), in, two); }
  SUBCASE("bf16_mixed") { check_layouts_agree<bfloat16, presets::bf16_mixed>(every_spatial_layer(), in, two); }
  SUBCASE("fp16_mixed") { check_layouts_agree<float16, presets::fp16_mixed>(every_spatial_layer(), in, one); }
  SUBCASE("fp32_hardware") { check_layouts_agree<float, presets::fp32_hardware>(every_spatial_layer(), in, two); }
}

TEST_CASE("global average pooling reads channels-last images") {
  const auto blueprint = nn::seq(nn::conv2d(3, 5, 3, {.padding = {1, 1}}), nn::batch_norm(5), nn::global_avg_pool());
  auto a = nn::build<float, 4>(presets::fp32{}, blueprint, {.seed = 3});
  auto b = nn::build<float, 4>(presets::fp32{}, blueprint, {.seed = 3, .layout = image_layout::nhwc});
  const cpu_context ctx{1};
  const auto x = precis_test::random_tensor<float, 4>({3, 3, 6, 7});
  const auto xb = moved(x, false);
  const auto& ya = a.forward(ctx, x);
  const auto& yb = b.forward(ctx, xb);
  REQUIRE(ya.shape() == yb.shape());  // [N, C] in both layouts
  CHECK(bits(ya) == bits(yb));
  const auto dy = precis_test::random_tensor<float, 2>(ya.shape());
  const auto& dxa = a.backward(ctx, dy);
  const auto& dxb = b.backward(ctx, dy);
  CHECK(bits(moved(dxb, true)) == bits(dxa));
}

TEST_CASE("channels-last shape errors name the layer and speak the layout") {
  const cpu_context ctx{1};
  auto b = nn::build<float, 4>(presets::fp32{}, every_spatial_layer(), {.seed = 1, .layout = image_layout::nhwc});
  // An NCHW image given to the channels-last model: the first convolution wants 3 channels last.
  const auto x = precis_test::random_tensor<float, 4>({2, 3, 12, 8});
  CHECK_THROWS_WITH_AS(b.forward(ctx, x), doctest::Contains("[N > 0, H >= 1, W >= 1, 3]"), error);
  CHECK_THROWS_WITH_AS(b.forward(ctx, x), doctest::Contains("[2, 3, 12, 8]"), error);
  // A batch norm of 4 channels in NHWC: the message puts C last.
  auto n = nn::build<float, 4>(presets::fp32{}, nn::batch_norm(4), {.layout = image_layout::nhwc});
  CHECK_THROWS_WITH_AS(n.forward(ctx, precis_test::random_tensor<float, 4>({2, 4, 3, 3})),
                       doctest::Contains("[N, H, W, 4]"), error);
  CHECK_NOTHROW(n.forward(ctx, precis_test::random_tensor<float, 4>({2, 3, 3, 4})));
  auto p = nn::build<float, 4>(presets::fp32{}, nn::max_pool2d({.kernel = {3, 3}}), {.layout = image_layout::nhwc});
  CHECK_THROWS_WITH_AS(p.forward(ctx, precis_test::random_tensor<float, 4>({1, 2, 8, 3})),
                       doctest::Contains("[N > 0, H >= 3, W >= 3, C > 0]"), error);
}

TEST_CASE("nn::channel_axis is axis 1 of NCHW images, and refused for tensors of another rank") {
  const auto flat_channels = [] {
    return nn::build<float, 2>(presets::fp32{}, nn::concat(nn::channel_axis, nn::linear(4, 2), nn::linear(4, 3)));
  };
  CHECK_THROWS_WITH_AS(flat_channels(), doctest::Contains("channel_axis"), error);
  // nn::channel_axis is axis 1 in an NCHW model: the same as concat(1, ...).
  const auto by_axis = nn::concat(1, nn::conv2d(3, 2, 1), nn::conv2d(3, 4, 1));
  const auto by_name = nn::concat(nn::channel_axis, nn::conv2d(3, 2, 1), nn::conv2d(3, 4, 1));
  auto a = nn::build<float, 4>(presets::fp32{}, by_axis, {.seed = 2});
  auto b = nn::build<float, 4>(presets::fp32{}, by_name, {.seed = 2});
  const cpu_context ctx{1};
  const auto x = precis_test::random_tensor<float, 4>({1, 3, 4, 4});
  CHECK(bits(a.forward(ctx, x)) == bits(b.forward(ctx, x)));
}
