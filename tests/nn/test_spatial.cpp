// Spatial layers (nn/conv.hpp, nn/pooling.hpp): every layer's backward against central
// differences in float64 (where the convolutions run their direct loops), the float
// kernels' path against the float64 path, a ResNet basic block in float64, bfloat16 and
// float16, the same bits on 1 and 2 threads, and bad shapes refused before anything runs,
// naming the layer's path and both shapes.
#include <precis/precis.hpp>
// The headers under test (nn/nn.hpp includes them too).
#include <precis/nn/conv.hpp>
#include <precis/nn/pooling.hpp>

#include <doctest/doctest.h>

#include "gradcheck.hpp"
#include "kernels/kernel_checks.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

using namespace precis;
using precis_test::check_gradients;
using precis_test::f64;

namespace {

using shape4 = std::array<std::size_t, 4>;
const cpu_context ctx{1};

struct conv1 : layer<op::conv> {
  static constexpr std::string_view name = "conv1";
};
struct conv2 : layer<op::conv> {
  static constexpr std::string_view name = "conv2";
};
struct proj : layer<op::conv> {
  static constexpr std::string_view name = "proj";
};
struct stem : layer<op::conv> {
  static constexpr std::string_view name = "stem";
};
struct head_conv : layer<op::conv> {
  static constexpr std::string_view name = "head_conv";
};

/// A float64 tensor uniform in [-1, 1) (gradcheck.hpp's).
host_tensor<double, 4> random_image(const shape4& s) { return precis_test::random_tensor<4>(s); }

// Gives every gamma and beta of a model values away from 1 and 0, so their gradients matter.
template <class Model>
void perturb_norms(Model& m) {
  m.for_each_parameter([](const std::string& path, auto& p) {
    if (path.ends_with("gamma") || path.ends_with("beta")) {
      std::uniform_real_distribution<double> d(0.5, 1.5);
      for (auto& v : p.master())
        v = static_cast<std::remove_cvref_t<decltype(v)>>(d(precis_test::rng()));
      p.refresh();
    }
  });
}

/// The working copies (what the kernels read) of a model's parameters, by path, in float64.
template <class Model>
std::map<std::string, std::vector<double>> values_by_path(const Model& m) {
  std::map<std::string, std::vector<double>> out;
  m.for_each_parameter([&](const std::string& path, const auto& p) {
    auto& v = out[path];
    for (const auto& e : p.value()) v.push_back(precis_test::to_double(e));
  });
  return out;
}

/// The gradients of a model's parameters, by path, in float64.
template <class Model>
std::map<std::string, std::vector<double>> grads_by_path(const Model& m) {
  std::map<std::string, std::vector<double>> out;
  m.for_each_parameter([&](const std::string& path, const auto& p) {
    auto& v = out[path];
    for (const auto& e : p.grad()) v.push_back(double(e));
  });
  return out;
}

/// Sets each master weight of `m` to the value at its path (the same blueprint's paths).
template <class Model>
void set_masters(Model& m, const std::map<std::string, std::vector<double>>& values) {
  m.for_each_parameter([&](const std::string& path, auto& p) {
    const auto it = values.find(path);
    REQUIRE(it != values.end());
    REQUIRE(it->second.size() == p.size());
    using M = typename std::remove_cvref_t<decltype(p)>::master_type;
    for (std::size_t i = 0; i < p.size(); ++i) p.master().data()[i] = static_cast<M>(it->second[i]);
    p.refresh();
  });
}

/// max |got - ref| / max |ref| over two vectors.
double rel_error(const std::vector<double>& got, const std::vector<double>& ref) {
  REQUIRE(got.size() == ref.size());
  double err = 0, norm = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    err = std::max(err, std::abs(got[i] - ref[i]));
    norm = std::max(norm, std::abs(ref[i]));
  }
  return norm == 0 ? err : err / norm;
}

/// The blueprint built under presets::fp32 (the conv kernels) and under float64 (the direct
/// loops) from the same float weights and inputs: outputs, input gradients and parameter
/// gradients agree within kernel_checks.hpp's float bound.
template <class Spec>
void check_float_path_matches_double(const Spec& blueprint, const shape4& in) {
  auto f = nn::build<float, 4>(presets::fp32{}, blueprint, {.seed = 5});
  auto d = nn::build<double, 4>(f64{}, blueprint, {.seed = 6});
  set_masters(d, values_by_path(f));
  const auto x = precis_test::random_tensor<float, 4>(in);
  const auto& yf = f.forward(ctx, x);
  const auto xd = precis_test::to_double(x);  // alive until backward
  const auto& yd = d.forward(ctx, xd);
  CHECK(precis_test::rel_error(yf, yd) <= precis_test::bound<float>());
  const auto dy = precis_test::random_tensor<float, 4>(precis::nn::shape_of<4>(yf));
  f.zero_grad();
  d.zero_grad();
  const auto& dxf = f.backward(ctx, dy);
  const auto& dxd = d.backward(ctx, precis_test::to_double(dy));
  CHECK(precis_test::rel_error(dxf, dxd) <= precis_test::bound<float>());
  const auto gf = grads_by_path(f), gd = grads_by_path(d);
  for (const auto& entry : gd) {  // no structured binding: clang 14's INFO cannot capture one
    const std::string& path = entry.first;
    INFO("parameter " << path);
    CHECK(rel_error(gf.at(path), entry.second) <= precis_test::bound<float>());
  }
}

/// A ResNet basic block with a projection shortcut: conv3x3 (stride) - BN - relu - conv3x3 -
/// BN, plus conv1x1 (stride) - BN, then relu; convolutions without bias, as in ResNet.
auto basic_block(std::size_t in, std::size_t out, std::size_t stride) {
  const conv2d_params down{.stride = {stride, stride}, .padding = {1, 1}};
  const conv2d_params same{.padding = {1, 1}};
  return nn::seq(
      nn::residual(
          nn::seq(nn::conv2d<conv1>(in, out, 3, down, nn::no_bias), nn::batch_norm(out), nn::relu(),
                  nn::conv2d<conv2>(out, out, 3, same, nn::no_bias), nn::batch_norm(out)),
          nn::seq(nn::conv2d<proj>(in, out, 1, {.stride = {stride, stride}}, nn::no_bias),
                  nn::batch_norm(out))),
      nn::relu());
}

/// max |y - y64| / max |y64| of the basic block built for element type T under `Policy`
/// against the same block in float64 with the same (rounded) weights and inputs, in
/// training mode.
template <class T, class Policy>
double basic_block_error() {
  auto low = nn::build<T, 4>(Policy{}, basic_block(4, 8, 2), {.seed = 3});
  perturb_norms(low);
  auto ref = nn::build<double, 4>(f64{}, basic_block(4, 8, 2), {.seed = 4});
  // The working copies, not the float masters: the reference then measures the arithmetic,
  // not the rounding of the weights.
  set_masters(ref, values_by_path(low));
  const auto x = precis_test::random_tensor<T, 4>({2, 4, 8, 8});
  const auto& y = low.forward(ctx, x);
  const auto x64 = precis_test::to_double(x);
  const auto& y64 = ref.forward(ctx, x64);
  REQUIRE(y.shape() == y64.shape());
  return precis_test::rel_error(y, y64);
}

}  // namespace

TEST_CASE(
    "conv2d: backward matches central differences with stride, padding, dilation, groups "
    "and no bias") {
  auto plain = nn::build<double, 4>(f64{}, nn::conv2d(3, 4, 3), {.seed = 3});
  CHECK(plain.output_shape({2, 3, 6, 5}) == shape4{2, 4, 4, 3});
  check_gradients(plain, random_image({2, 3, 6, 5}));
  CHECK(plain.parameter_names() == std::vector<std::string>{"weight", "bias"});

  // PyTorch's sizes: rows (7 + 2 - (3 - 1) - 1) / 2 + 1 = 4, columns 6 - 2 (2 - 1) - 1 + 1 = 4.
  const conv2d_params p{.stride = {2, 1}, .padding = {1, 0}, .dilation = {1, 2}, .groups = 2};
  auto strided = nn::build<double, 4>(f64{}, nn::conv2d(4, 6, {3, 2}, p), {.seed = 3});
  CHECK(strided.output_shape({2, 4, 7, 6}) == shape4{2, 6, 4, 4});
  CHECK(strided.root().weight().master().shape() == shape4{6, 2, 3, 2});
  check_gradients(strided, random_image({2, 4, 7, 6}));

  const conv2d_params dw{.padding = {2, 2}, .dilation = {2, 2}, .groups = 3};
  auto depthwise = nn::build<double, 4>(f64{}, nn::conv2d(3, 3, 3, dw, nn::no_bias), {.seed = 3});
  CHECK(depthwise.output_shape({2, 3, 5, 5}) == shape4{2, 3, 5, 5});
  CHECK(depthwise.parameter_names() == std::vector<std::string>{"weight"});
  check_gradients(depthwise, random_image({2, 3, 5, 5}));
}

TEST_CASE(
    "conv_transpose2d: backward matches central differences with output_padding, groups "
    "and no bias") {
  // (5 - 1) 2 - 2 + (3 - 1) + 1 + 1 = 10 rows, (4 - 1) 2 - 2 + 3 + 1 = 8 columns.
  const conv2d_params up{.stride = {2, 2}, .padding = {1, 1}, .output_padding = {1, 1}};
  auto m = nn::build<double, 4>(f64{}, nn::conv_transpose2d(3, 4, 3, up), {.seed = 3});
  CHECK(m.output_shape({2, 3, 5, 4}) == shape4{2, 4, 10, 8});
  CHECK(m.root().weight().master().shape() == shape4{3, 4, 3, 3});
  check_gradients(m, random_image({2, 3, 5, 4}));

  // (3 - 1) 2 + (2 - 1) + 1 = 6 rows, (4 - 1) + 2 (3 - 1) + 1 = 8 columns.
  const conv2d_params grouped{.stride = {2, 1}, .dilation = {1, 2}, .groups = 2};
  auto g = nn::build<double, 4>(f64{}, nn::conv_transpose2d(4, 2, {2, 3}, grouped, nn::no_bias),
                                {.seed = 3});
  CHECK(g.output_shape({2, 4, 3, 4}) == shape4{2, 2, 6, 8});
  CHECK(g.root().weight().master().shape() == shape4{4, 1, 2, 3});
  check_gradients(g, random_image({2, 4, 3, 4}));
}

TEST_CASE(
    "convolutions: the float kernels' path agrees with the float64 direct loops, forward "
    "and backward") {
  check_float_path_matches_double(nn::conv2d(3, 4, 3, {.padding = {1, 1}}), {2, 3, 6, 5});
  check_float_path_matches_double(
      nn::conv2d(4, 6, {3, 2},
                 {.stride = {2, 1}, .padding = {1, 0}, .dilation = {1, 2}, .groups = 2}),
      {2, 4, 7, 6});
  check_float_path_matches_double(
      nn::conv2d(3, 3, 3, {.padding = {2, 2}, .dilation = {2, 2}, .groups = 3}, nn::no_bias),
      {2, 3, 5, 5});
  check_float_path_matches_double(
      nn::conv_transpose2d(3, 4, 3,
                           {.stride = {2, 2}, .padding = {1, 1}, .output_padding = {1, 1}}),
      {2, 3, 5, 4});
  check_float_path_matches_double(
      nn::conv_transpose2d(4, 2, {2, 3}, {.stride = {2, 1}, .dilation = {1, 2}, .groups = 2},
                           nn::no_bias),
      {2, 4, 3, 4});
}

TEST_CASE("convolutions start uniform in +-1/sqrt(fan_in); weight decay applies to weights only") {
  auto m = nn::build<float, 4>(
      presets::fp32{},
      nn::seq(nn::conv2d(4, 8, 3, {.groups = 2}), nn::conv_transpose2d(8, 6, 2, {.groups = 2})),
      {.seed = 1});
  // fan_in = weight.shape[1] * kh * kw: 2 * 3 * 3 = 18 for the convolution's
  // [8, 2, 3, 3] and 3 * 2 * 2 = 12 for the transposed one's [8, 3, 2, 2] (PyTorch's rule).
  const std::map<std::string, double> bound{{"0.weight", 1 / std::sqrt(18.0)},
                                            {"0.bias", 1 / std::sqrt(18.0)},
                                            {"1.weight", 1 / std::sqrt(12.0)},
                                            {"1.bias", 1 / std::sqrt(12.0)}};
  m.for_each_parameter([&](const std::string& path, const auto& p) {
    INFO(path);
    float largest = 0;
    for (float v : p.master()) largest = std::max(largest, std::fabs(v));
    CHECK(largest <= bound.at(path));
    CHECK(largest > 0.5 * bound.at(path));
  });
  CHECK(m.parameter_names() ==
        std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias"});
  CHECK(m.decay_mask() == std::vector<bool>{true, false, true, false});
  const std::string table = nn::describe(m);
  INFO(table);
  CHECK(table.find("4->8 3x3 g2") != std::string::npos);
  CHECK(table.find("8->6 2x2 g2") != std::string::npos);
}

TEST_CASE(
    "max_pool2d, avg_pool2d, global_avg_pool and upsampling: backward matches central "
    "differences") {
  const pool2d_params overlapping{.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}};
  auto mp = nn::build<double, 4>(f64{}, nn::max_pool2d(overlapping));
  CHECK(mp.output_shape({2, 3, 7, 7}) == shape4{2, 3, 4, 4});
  check_gradients(mp, precis_test::tie_free_tensor<4>({2, 3, 7, 7}));
  CHECK(nn::describe(mp).find("max_pool2d  3x3 s2x2 p1x1") != std::string::npos);
  // Default 2x2, stride 2: the last column of a width-5 image feeds nothing.
  auto mp2 = nn::build<double, 4>(f64{}, nn::max_pool2d());
  CHECK(mp2.output_shape({2, 3, 6, 5}) == shape4{2, 3, 3, 2});
  check_gradients(mp2, precis_test::tie_free_tensor<4>({2, 3, 6, 5}));

  auto ap = nn::build<double, 4>(f64{}, nn::avg_pool2d(overlapping));
  check_gradients(ap, random_image({2, 3, 7, 6}));
  auto ap_inside = nn::build<double, 4>(
      f64{},
      nn::avg_pool2d(
          {.kernel = {3, 2}, .stride = {1, 2}, .padding = {1, 1}, .count_include_pad = false}));
  CHECK(ap_inside.output_shape({2, 3, 5, 5}) == shape4{2, 3, 5, 3});
  check_gradients(ap_inside, random_image({2, 3, 5, 5}));

  auto gap = nn::build<double, 4>(f64{}, nn::global_avg_pool());
  static_assert(decltype(gap)::output_rank == 2);
  CHECK(gap.output_shape({2, 3, 5, 4}) == std::array<std::size_t, 2>{2, 3});
  check_gradients(gap, random_image({2, 3, 5, 4}));

  auto nearest = nn::build<double, 4>(f64{}, nn::upsample_nearest(2));
  CHECK(nearest.output_shape({2, 3, 3, 4}) == shape4{2, 3, 6, 8});
  check_gradients(nearest, random_image({2, 3, 3, 4}));
  auto bilinear = nn::build<double, 4>(f64{}, nn::upsample_bilinear(3));
  CHECK(bilinear.output_shape({2, 3, 3, 4}) == shape4{2, 3, 9, 12});
  check_gradients(bilinear, random_image({2, 3, 3, 4}));
  auto corners = nn::build<double, 4>(f64{}, nn::upsample_bilinear(2, true));
  check_gradients(corners, random_image({2, 3, 3, 4}));
}

TEST_CASE(
    "max_pool2d keeps its maxima's indices in a training pass; its backward pass gives the "
    "kernel's gradient from x after either mode") {
  using bf = presets::bf16_mixed;
  const pool2d_params p{.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}};
  auto m = nn::build<bfloat16, 4>(bf{}, nn::max_pool2d(p));
  const auto x = precis_test::random_tensor<bfloat16, 4>({2, 8, 13, 11});
  const auto x2 = precis_test::random_tensor<bfloat16, 4>({2, 8, 13, 11});
  const auto dy = precis_test::random_tensor<bfloat16, 4>({2, 8, 7, 6});
  auto dx_ref = host_tensor<bfloat16, 4>::from_shape(x.shape());
  max_pool2d_backward<bf>(ctx, x, dy, dx_ref, p);
  m.forward(ctx, x, nn::mode::eval);
  CHECK(precis_test::same_bits(m.backward(ctx, dy), dx_ref));
  const std::size_t eval_bytes = m.activation_bytes();  // y and dx
  m.forward(ctx, x, nn::mode::train);
  // And 4 bytes of index per output.
  CHECK(m.activation_bytes() == eval_bytes + 2 * 8 * 7 * 6 * 4);
  CHECK(precis_test::same_bits(m.backward(ctx, dy), dx_ref));
  // An evaluation pass on other values after a training pass: the kept indices are stale,
  // and the backward pass finds the maxima of x2.
  auto dx2_ref = dx_ref;
  max_pool2d_backward<bf>(ctx, x2, dy, dx2_ref, p);
  m.forward(ctx, x2, nn::mode::eval);
  CHECK(precis_test::same_bits(m.backward(ctx, dy), dx2_ref));
  CHECK(!precis_test::same_bits(dx2_ref, dx_ref));
}

TEST_CASE("a small encoder-decoder of every spatial layer: backward matches central differences") {
  auto m = nn::build<double, 4>(
      f64{},
      nn::seq(nn::conv2d(3, 4, 3, {.padding = {1, 1}}), nn::tanh(), nn::avg_pool2d(),
              nn::conv_transpose2d(4, 4, 2, {.stride = {2, 2}}), nn::upsample_bilinear(2),
              nn::conv2d(4, 3, 3, {.stride = {2, 2}, .padding = {1, 1}}), nn::upsample_nearest(2),
              nn::global_avg_pool(), nn::linear(3, 2)),
      {.seed = 3});
  CHECK(m.output_shape({2, 3, 6, 6}) == std::array<std::size_t, 2>{2, 2});
  check_gradients(m, random_image({2, 3, 6, 6}));
}

TEST_CASE(
    "a ResNet basic block with a projection shortcut: paths, and backward in float64 "
    "(batch norm in training mode) against central differences") {
  auto m = nn::build<double, 4>(f64{}, basic_block(3, 4, 2), {.seed = 3});
  const std::vector<std::string> expected{
      "0.conv1.weight",         "0.1.gamma",          "0.1.beta",
      "0.conv2.weight",         "0.4.gamma",          "0.4.beta",
      "0.shortcut.proj.weight", "0.shortcut.1.gamma", "0.shortcut.1.beta"};
  CHECK(m.parameter_names() == expected);
  CHECK(m.decay_mask() ==
        std::vector<bool>{true, false, false, true, false, false, true, false, false});
  CHECK(m.output_shape({2, 3, 6, 6}) == shape4{2, 4, 3, 3});
  perturb_norms(m);
  check_gradients(m, random_image({2, 3, 6, 6}));
}

TEST_CASE(
    "the basic block in bfloat16 and float16 follows the float64 block within the "
    "kernels' bounds") {
  // kernel_checks.hpp's bounds are for one kernel: one rounding of its output. The block
  // chains seven (conv, norm, conv, norm; shortcut conv, norm; the join), and each layer
  // carries the errors before it along, batch norm at their size relative to the channel's
  // spread. Over 150 random draws the error reached 0.7 of the single-kernel bound in
  // bfloat16 (0.4 in float16); twice the bound keeps the check tight without failing on an
  // unlucky draw.
  const double bf16 = basic_block_error<bfloat16, presets::bf16_mixed>();
  const double fp16 = basic_block_error<float16, presets::fp16_mixed>();
  MESSAGE("basic block, max error / max |y|: bfloat16 " << bf16 << ", float16 " << fp16);
  CHECK(bf16 <= 2 * precis_test::bound<bfloat16>());
  CHECK(fp16 <= 2 * precis_test::bound<float16>());
}

TEST_CASE("spatial layers and the basic block give the same bits on 1 and 2 threads") {
  using bf = presets::bf16_mixed;
  // Enough planes (4 x 64 of 16 x 16) that the pooling kernels and the direct loops split
  // the work between the two threads.
  const auto x = precis_test::random_tensor<bfloat16, 4>({4, 64, 16, 16});
  precis_test::check_thread_independent(
      nn::build<bfloat16, 4>(bf{}, basic_block(64, 16, 2), {.seed = 1}), x);
  precis_test::check_thread_independent(
      nn::build<bfloat16, 4>(
          bf{}, nn::conv_transpose2d(64, 8, 3, {.stride = {2, 2}, .padding = {1, 1}}), {.seed = 1}),
      x);
  precis_test::check_thread_independent(
      nn::build<bfloat16, 4>(
          bf{}, nn::max_pool2d({.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}})),
      x);
  precis_test::check_thread_independent(nn::build<bfloat16, 4>(bf{}, nn::avg_pool2d()), x);
  precis_test::check_thread_independent(nn::build<bfloat16, 4>(bf{}, nn::upsample_bilinear(2)), x);
  precis_test::check_thread_independent(nn::build<bfloat16, 4>(bf{}, nn::upsample_nearest(2)), x);
  precis_test::check_thread_independent(nn::build<bfloat16, 4>(bf{}, nn::global_avg_pool()), x);
  // The float64 direct loops.
  const auto x64 = precis_test::random_tensor<double, 4>({4, 64, 16, 16});
  precis_test::check_thread_independent(
      nn::build<double, 4>(f64{}, basic_block(64, 8, 2), {.seed = 1}), x64);
  precis_test::check_thread_independent(
      nn::build<double, 4>(f64{}, nn::conv_transpose2d(64, 4, 3, {.stride = {2, 2}}), {.seed = 1}),
      x64);
}

TEST_CASE("bad shapes are refused before anything runs, naming the layer's path and both shapes") {
  auto m = nn::build<float, 4>(
      presets::fp32{},
      nn::seq(nn::conv2d<stem>(3, 8, 3, {.stride = {2, 2}}), nn::relu(),
              nn::named("head", nn::seq(nn::conv2d<head_conv>(8, 4, 3), nn::global_avg_pool()))),
      {.seed = 1});
  const auto x = precis_test::random_tensor<float, 4>({2, 3, 9, 9});
  const host_tensor<float, 2> y = m.forward(ctx, x);
  CHECK(y.shape() == std::array<std::size_t, 2>{2, 4});

  const auto channels = precis_test::random_tensor<float, 4>({2, 4, 9, 9});
  CHECK_THROWS_WITH_AS(m.forward(ctx, channels),
                       doctest::Contains("layer stem (conv2d) expects an input of shape "
                                         "[N > 0, 3, H >= 3, W >= 3], got [2, 4, 9, 9]"),
                       error);
  // The stem takes 5x5 (giving 2x2); the head's 3x3 kernel does not fit that.
  const auto small = precis_test::random_tensor<float, 4>({2, 3, 5, 5});
  CHECK_THROWS_WITH_AS(m.forward(ctx, small),
                       doctest::Contains("layer head.head_conv (conv2d) expects an input of shape "
                                         "[N > 0, 8, H >= 3, W >= 3], got [2, 8, 2, 2]"),
                       error);
  host_tensor<float, 4> empty(shape4{0, 3, 9, 9});
  CHECK_THROWS_WITH_AS(m.forward(ctx, empty), doctest::Contains("layer stem (conv2d)"), error);
  // Nothing ran: the stem still holds the good input, so backward belongs to the good pass.
  host_tensor<float, 2> dy(y.shape());
  dy.fill(1.0f);
  CHECK(m.backward(ctx, dy).shape() == x.shape());

  auto pools = nn::build<float, 4>(
      presets::fp32{}, nn::seq(nn::named("up", nn::conv_transpose2d(2, 2, 3, {.padding = {2, 2}})),
                               nn::named("pool", nn::max_pool2d({.kernel = {4, 4}}))));
  // (H - 1) + 3 - 2 * 2 rows: none below H = 3.
  CHECK_THROWS_WITH_AS(pools.forward(ctx, precis_test::random_tensor<float, 4>({1, 2, 1, 3})),
                       doctest::Contains("layer up (conv_transpose2d) expects an input of shape "
                                         "[N > 0, 2, H >= 3, W >= 3], got [1, 2, 1, 3]"),
                       error);
  CHECK_THROWS_WITH_AS(pools.forward(ctx, precis_test::random_tensor<float, 4>({1, 2, 4, 4})),
                       doctest::Contains("layer pool (max_pool2d) expects an input of shape "
                                         "[N > 0, C > 0, H >= 4, W >= 4], got [1, 2, 2, 2]"),
                       error);
  auto gap = nn::build<float, 4>(presets::fp32{}, nn::seq(nn::named("gap", nn::global_avg_pool())));
  CHECK_THROWS_WITH_AS(gap.forward(ctx, host_tensor<float, 4>(shape4{2, 3, 0, 4})),
                       doctest::Contains("layer gap (global_avg_pool)"), error);
}

TEST_CASE("a batch norm refuses one value per channel in training before any buffer changes") {
  auto m = nn::build<float, 4>(presets::fp32{}, nn::seq(nn::batch_norm(6), nn::relu()), {.seed = 3});
  const auto x = precis_test::random_tensor<float, 4>({4, 6, 5, 7});
  const auto dy = precis_test::random_tensor<float, 4>({4, 6, 5, 7});
  (void)m.forward(ctx, x);
  const host_tensor<float, 4> dx = m.backward(ctx, dy);
  (void)m.forward(ctx, x);
  // One value per channel passes the shape checks: the batch norm refuses it when it runs.
  const auto one = precis_test::random_tensor<float, 4>({1, 6, 1, 1});
  CHECK_THROWS_WITH_AS(m.root().forward(ctx, one, nn::mode::train),
                       doctest::Contains("(batch_norm) expects more than one value per channel in training mode, "
                                         "got an input of shape [1, 6, 1, 1]"),
                       error);
  // The refusal left the layers as the good pass left them: backward gives that pass's bits.
  const host_tensor<float, 4> again = m.backward(ctx, dy);
  CHECK(std::equal(dx.begin(), dx.end(), again.begin(), [](float a, float b) {
    return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
  }));
  // Evaluation takes the running statistics: one value per channel is a batch like any other.
  CHECK(m.root().forward(ctx, one, nn::mode::eval).shape() == one.shape());
}

TEST_CASE(
    "a model refuses a batch that a deeper batch norm cannot train on before any layer runs") {
  // The pooling leaves one pixel a channel: two images train the batch norm, one does not.
  auto m =
      nn::build<float, 4>(presets::fp32{},
                          nn::seq(nn::conv2d(3, 6, 3, {.padding = {1, 1}}), nn::relu(),
                                  nn::named("down", nn::seq(nn::avg_pool2d({.kernel = {4, 4}}),
                                                            nn::named("norm", nn::batch_norm(6)))),
                                  nn::flatten(), nn::linear(6, 2)),
                          {.seed = 5});
  const auto x = precis_test::random_tensor<float, 4>({2, 3, 4, 4});
  const auto dy = precis_test::random_tensor<float, 2>({2, 2});
  const auto same_bits = [](const auto& a, const auto& b) {
    return a.shape() == b.shape() &&
           std::equal(a.begin(), a.end(), b.begin(), [](float u, float v) {
             return std::bit_cast<std::uint32_t>(u) == std::bit_cast<std::uint32_t>(v);
           });
  };
  const host_tensor<float, 2> y = m.forward(ctx, x);
  const host_tensor<float, 4> dx = m.backward(ctx, dy);
  (void)m.forward(ctx, x);
  const auto one = precis_test::random_tensor<float, 4>({1, 3, 4, 4});
  CHECK_THROWS_WITH_AS(
      m.output_shape({1, 3, 4, 4}, nn::mode::train),
      doctest::Contains("layer down.norm (batch_norm) expects more than one value per channel"),
      error);
  CHECK_THROWS_WITH_AS(m.forward(ctx, one), doctest::Contains("layer down.norm (batch_norm)"),
                       error);
  // Nothing ran: every layer still holds the good pass, so backward gives its bits (the
  // convolution would otherwise have kept the one image as its input).
  CHECK(same_bits(host_tensor<float, 4>(m.backward(ctx, dy)), dx));
  CHECK(same_bits(host_tensor<float, 2>(m.forward(ctx, x)), y));
  // The plain shape query and evaluation take it.
  CHECK(m.output_shape({1, 3, 4, 4}) == std::array<std::size_t, 2>{1, 2});
  CHECK(m.forward(ctx, one, nn::mode::eval).shape()[0] == 1);
}

TEST_CASE("impossible layer arguments are refused when the model is built") {
  const auto build = [](auto blueprint) { return nn::build<float, 4>(presets::fp32{}, blueprint); };
  CHECK_THROWS_WITH_AS(build(nn::conv2d(3, 4, 3, {.groups = 2})),
                       doctest::Contains("groups = 2 must divide the input channels (3)"), error);
  CHECK_THROWS_WITH_AS(build(nn::conv2d(3, 4, 3, {.output_padding = {1, 1}})),
                       doctest::Contains("output_padding belongs to nn::conv_transpose2d"), error);
  CHECK_THROWS_WITH_AS(build(nn::conv2d(3, 4, 0)), doctest::Contains("kernel of at least 1x1"),
                       error);
  CHECK_THROWS_WITH_AS(build(nn::conv2d(3, 4, 3, {.stride = {0, 1}})),
                       doctest::Contains("at least 1"), error);
  CHECK_THROWS_WITH_AS(build(nn::conv_transpose2d(3, 4, 3, {.output_padding = {1, 0}})),
                       doctest::Contains("output_padding 1 must be less than the stride (1)"),
                       error);
  CHECK_THROWS_WITH_AS(build(nn::max_pool2d({.kernel = {2, 2}, .padding = {2, 0}})),
                       doctest::Contains("padding at most half the kernel"), error);
  CHECK_THROWS_WITH_AS(build(nn::upsample_nearest(0)), doctest::Contains("scale >= 1"), error);
  CHECK_THROWS_WITH_AS(build(nn::batch_norm(4, 0.1, -1e-5)), doctest::Contains("precis::nn::batch_norm: eps"),
                       error);
  CHECK_THROWS_WITH_AS(build(nn::batch_norm(4, 0.1, std::nan(""))), doctest::Contains("must be finite"), error);
  CHECK_THROWS_WITH_AS(build(nn::layer_norm(4, -1.0)), doctest::Contains("precis::nn::layer_norm: eps"), error);
  // The image layout is the model's (build_options::layout), never one layer's.
  CHECK_THROWS_WITH_AS(build(nn::conv2d(3, 4, 3, {.layout = image_layout::nhwc})),
                       doctest::Contains("the image layout is the model's"), error);
  CHECK_THROWS_WITH_AS(build(nn::conv_transpose2d(3, 4, 2, {.layout = image_layout::nhwc})),
                       doctest::Contains("the image layout is the model's"), error);
}

namespace {

/// Runs backward and then backward_parameters on the same forward pass of m on x, and
/// checks: the same parameter gradients, bit for bit; an empty input gradient for every
/// layer that read x (`readers` of them), a full one for every other layer.
template <class M>
void check_backward_parameters(M& m, const host_tensor<bfloat16, 4>& x, std::size_t readers) {
  const auto out = m.output_shape({x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3]});
  const auto dy = precis_test::random_tensor<bfloat16, out.size()>(out);
  const auto gradients = [&] {
    std::vector<std::vector<float>> g;
    for (const auto s : m.gradients()) g.emplace_back(s.begin(), s.end());
    return g;
  };
  m.zero_grad();
  m.forward(ctx, x);
  m.backward(ctx, dy);
  const auto full = gradients();
  m.zero_grad();
  m.forward(ctx, x);
  m.backward_parameters(ctx, dy);
  CHECK(gradients() == full);
  std::size_t skipped = 0;
  m.for_each_observed(
      [&](const std::string& path, auto, const auto* in, const auto&, const auto&... g) {
        if constexpr (sizeof...(g) > 0) {
          const std::size_t n = (std::size_t(0) + ... + std::size_t(g.size()));
          CAPTURE(path);
          if (static_cast<const void*>(in) == static_cast<const void*>(&x)) {
            CHECK(n == 0);
            ++skipped;
          } else {
            CHECK(n > 0);
          }
        }
      });
  CHECK(skipped == readers);
}

}  // namespace

TEST_CASE(
    "backward_parameters gives backward's parameter gradients bit for bit, leaving out the "
    "input gradient of exactly the layers that read the input") {
  using bf = presets::bf16_mixed;
  const conv2d_params same{.padding = {1, 1}};
  // The input reaches the first layers through nn::taps, nn::named, nn::repeat, a residual
  // block with a projection shortcut (two convolutions read it), and, in the second model,
  // nn::fork.
  auto stages = nn::build<bfloat16, 4>(
      bf{},
      nn::seq(nn::taps(nn::named("stem", nn::repeat<1>(basic_block(3, 4, 2))),
                       nn::seq(nn::relu(), nn::conv2d(4, 4, 3, same))),
              nn::each(nn::global_avg_pool(), nn::global_avg_pool()), nn::add_all(),
              nn::linear(4, 3)),
      {.seed = 4});
  auto forked = nn::build<bfloat16, 4>(
      bf{},
      nn::seq(nn::fork(nn::conv2d(3, 2, 1), nn::seq(nn::conv2d(3, 2, 3, same), nn::tanh())),
              nn::subtract(), nn::conv_transpose2d(2, 2, 2, {.stride = {2, 2}})),
      {.seed = 5});
  check_backward_parameters(stages, precis_test::random_tensor<bfloat16, 4>({2, 3, 6, 6}), 2);
  check_backward_parameters(forked, precis_test::random_tensor<bfloat16, 4>({2, 3, 5, 5}), 2);
}
