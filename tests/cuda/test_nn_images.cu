// Image models on the device against the same models on the host, built from one
// blueprint with the same masters: one forward and backward pass on the same data, the
// outputs, input gradients and parameter gradients (the biases' among them) within the
// types' bounds. Exits 77 (skipped) where no GPU is present.
//
// NCHW: the multi-tensor nodes (nn::fork, taps, each, top_down, add_all, concat_all,
// subtract), nn::concat, convolutions with a bias, global average pooling and a DBNet at
// width 8.
//
// Channels-last (nn/layout.hpp): every spatial layer and the DBNet built with
// image_layout::nhwc on both sides, on [N, H, W, C] data. The host's channels-last model
// gives the NCHW model's bits (tests/nn/test_layout.cpp), so these compare the device's
// NHWC convolutions (cuDNN's NHWC tensors and filter layout), its column-ordered batch
// norm, its moved pooling and upsampling, and the channel-axis concatenations against the
// NCHW reference.
//
// A batch norm and the ReLU after it, which run as one pass on the device, against the same
// layers run apart on the device: the same bits; with the pair first, backward_parameters()
// against backward(), and a refused batch that leaves the pair's last pass as it was.
// backward_parameters() against backward() through the pyramid and the DBNet as well.
//
// One unit for both layouts: they build the same models (the layout is a run-time option),
// so the device and host instantiations are compiled once.
#include <precis/nn/cuda.hpp>  // first: the device kernels, then nn

#include "../../examples/dbnet/model.hpp"
#include "nn_compare.hpp"

#include <array>
#include <cstring>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using namespace precis_test;
using namespace precis;

const conv2d_params same{.padding = {1, 1}};

// A feature pyramid on images, wired as DBNet's neck: every stage's output (taps), a
// lateral per level (each), the top-down sums, then the levels brought to one size and
// concatenated along the channels.
auto pyramid() {
  return nn::seq(nn::taps(nn::conv2d(3, 4, 3, same, nn::no_bias),
                          nn::seq(nn::relu(), nn::conv2d(4, 6, 3, {.stride = {2, 2}, .padding = {1, 1}}, nn::no_bias)),
                          nn::seq(nn::relu(), nn::conv2d(6, 8, 3, {.stride = {2, 2}, .padding = {1, 1}}, nn::no_bias))),
                 nn::each(nn::conv2d(4, 5, 1, {}, nn::no_bias), nn::conv2d(6, 5, 1, {}, nn::no_bias),
                          nn::conv2d(8, 5, 1, {}, nn::no_bias)),
                 nn::top_down(nn::upsample_nearest(2)),
                 nn::each(nn::conv2d(5, 3, 3, same, nn::no_bias), nn::seq(nn::conv2d(5, 3, 3, same), nn::upsample_nearest(2)),
                          nn::seq(nn::conv2d(5, 3, 3, same), nn::upsample_nearest(4))),
                 nn::concat_all(1));
}

template <class P>
void check_nodes(cuda_context& ctx, const std::string& tag) {
  // Convolutions with a bias: float sums, the bias, one rounding; the per-channel bias
  // gradient over images and pixels (several 4096-pixel segments in the second).
  compare_models<P, 4>(ctx, tag + " conv2d with bias", nn::conv2d(3, 5, 3, same), {2, 3, 9, 11});
  compare_models<P, 4>(ctx, tag + " conv2d with bias, long planes", nn::conv2d(2, 3, 1, {}), {2, 2, 80, 70});
  compare_models<P, 4>(ctx, tag + " conv_transpose2d with bias",
                       nn::conv_transpose2d(4, 1, 2, {.stride = {2, 2}}), {3, 4, 7, 5});
  compare_models<P, 4>(ctx, tag + " pyramid", pyramid(), {2, 3, 16, 12});
  compare_models<P, 4>(ctx, tag + " fork and subtract",
                       nn::seq(nn::fork(nn::conv2d(3, 2, 3, same), nn::seq(nn::conv2d(3, 2, 1, {}), nn::sigmoid())),
                               nn::subtract()),
                       {2, 3, 8, 8});
  compare_models<P, 4>(ctx, tag + " fork of three and add_all",
                       nn::seq(nn::fork(nn::conv2d(3, 4, 3, same), nn::conv2d(3, 4, 1, {}),
                                        nn::seq(nn::conv2d(3, 4, 1, {}), nn::relu())),
                               nn::add_all()),
                       {2, 3, 8, 8});
  compare_models<P, 4>(ctx, tag + " concat",
                       nn::concat(1, nn::conv2d(3, 2, 3, same), nn::identity(), nn::conv2d(3, 5, 1, {})),
                       {2, 3, 6, 7});
  // A classifier's end: global average pooling (the host's bits) into a linear layer.
  compare_models<P, 4>(ctx, tag + " global_avg_pool",
                       nn::seq(nn::conv2d(3, 6, 3, same), nn::global_avg_pool(), nn::linear(6, 4)), {3, 3, 9, 11});
  // Every DBNet layer at width 8 (P - T, so that one tensor leaves the model).
  const dbnet::config c{.width = 8, .inner = 16};
  compare_models<P, 4>(ctx, tag + " dbnet", nn::seq(dbnet::blueprint(c), nn::subtract()), {2, 3, 64, 64}, 16);
}

constexpr image_layout nhwc = image_layout::nhwc;

template <class P>
void check_channels_last(cuda_context& ctx, const std::string& tag) {
  // Convolutions with and without a bias, strided, grouped, transposed; the weight's move
  // to cuDNN's filter layout and the weight gradient's move back.
  compare_models<P, 4>(ctx, tag + " conv2d with bias", nn::conv2d(3, 5, 3, same), {2, 9, 11, 3}, 4, nhwc);
  // 256 channels: the bias gradient's column sums read 16 bytes of channels per row and thread.
  compare_models<P, 4>(ctx, tag + " conv2d with bias, 256 channels", nn::conv2d(3, 256, 1, {}), {2, 5, 6, 3}, 4,
                       nhwc);
  compare_models<P, 4>(ctx, tag + " strided grouped conv2d",
                       nn::conv2d(8, 16, 3, {.stride = {2, 2}, .padding = {1, 1}, .groups = 2}, nn::no_bias),
                       {2, 12, 10, 8}, 4, nhwc);
  compare_models<P, 4>(ctx, tag + " conv_transpose2d with bias", nn::conv_transpose2d(4, 3, 2, {.stride = {2, 2}}),
                       {3, 7, 5, 4}, 4, nhwc);
  // Batch norm over more rows than one slab of the column reduction, and channels that are
  // not a multiple of 32.
  compare_models<P, 4>(ctx, tag + " batch norm",
                       nn::seq(nn::conv2d(3, 40, 3, same, nn::no_bias), nn::batch_norm(40), nn::relu()),
                       {4, 20, 18, 3}, 8, nhwc);
  compare_models<P, 4>(ctx, tag + " pooling and upsampling",
                       nn::seq(nn::conv2d(3, 6, 1, {}), nn::max_pool2d({.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}}),
                               nn::avg_pool2d({.kernel = {2, 2}}), nn::upsample_nearest(2), nn::upsample_bilinear(2)),
                       {2, 16, 12, 3}, 4, nhwc);
  compare_models<P, 4>(ctx, tag + " global_avg_pool",
                       nn::seq(nn::conv2d(3, 6, 3, same), nn::global_avg_pool(), nn::linear(6, 4)), {3, 9, 11, 3}, 4,
                       nhwc);
  compare_models<P, 4>(ctx, tag + " concat along the channels",
                       nn::seq(nn::concat(nn::channel_axis, nn::conv2d(3, 2, 3, same), nn::identity(), nn::conv2d(3, 5, 1, {})),
                               nn::fork(nn::conv2d(10, 2, 1, {}), nn::conv2d(10, 3, 1, {})),
                               nn::concat_all(nn::channel_axis)),
                       {2, 6, 7, 3}, 4, nhwc);
  const dbnet::config c{.width = 8, .inner = 16};
  compare_models<P, 4>(ctx, tag + " dbnet", nn::seq(dbnet::blueprint(c), nn::subtract()), {2, 64, 64, 3}, 16, nhwc);
}

// On the device a batch norm and the ReLU after it run as one pass (batch_norm_layer::
// fuses_with, nn::sequence): the bits of the two layers run apart (an nn::identity between
// them keeps them apart), in training (the output, the input gradient, every parameter
// gradient) and then in evaluation (from the running statistics the training pass updated).
template <class P>
void check_fused_relu(cuda_context& ctx, const std::string& tag, image_layout layout) {
  using S = typename P::storage_type;
  using G = typename P::gradient_type;
  const auto fused_blueprint = nn::seq(nn::conv2d(3, 6, 3, same, nn::no_bias), nn::batch_norm(6), nn::relu());
  const auto apart_blueprint =
      nn::seq(nn::conv2d(3, 6, 3, same, nn::no_bias), nn::batch_norm(6), nn::identity(), nn::relu());
  const nn::build_options o{.seed = 7, .layout = layout};
  auto host = nn::build<S, 4>(P{}, fused_blueprint, o);
  auto fused = nn::build<S, 4, cuda_context>(P{}, fused_blueprint, o);
  auto apart = nn::build<S, 4, cuda_context>(P{}, apart_blueprint, o);
  // The pair fuses on the device and not on the host.
  using root = typename decltype(fused)::root_type;
  using norm = std::remove_reference_t<decltype(std::declval<root&>().template child<1>())>;
  using relu = std::remove_reference_t<decltype(std::declval<root&>().template child<2>())>;
  static_assert(norm::template fuses_with<relu>);
  using host_root = typename decltype(host)::root_type;
  using host_norm = std::remove_reference_t<decltype(std::declval<host_root&>().template child<1>())>;
  using host_relu = std::remove_reference_t<decltype(std::declval<host_root&>().template child<2>())>;
  static_assert(!host_norm::template fuses_with<host_relu>);
  // nn::describe says so on the batch norm's row, on the device only.
  const std::string note = "one pass with the next relu";
  const std::string table = nn::describe(fused);
  const std::size_t at = table.find(note);
  const std::size_t line = table.rfind('\n', at == std::string::npos ? 0 : at);
  expect(at != std::string::npos && table.find("batch_norm", line == std::string::npos ? 0 : line) < at,
         tag + " describe notes the fused pair on the batch norm's row");
  expect(nn::describe(apart).find(note) == std::string::npos && nn::describe(host).find(note) == std::string::npos,
         tag + " describe notes no pair where none fuses");
  nn::copy_masters(ctx, host, fused);
  nn::copy_masters(ctx, host, apart);
  fused.zero_grad(ctx);
  apart.zero_grad(ctx);
  const std::array<std::size_t, 4> xs = layout == image_layout::nhwc ? std::array<std::size_t, 4>{3, 9, 11, 3}
                                                                      : std::array<std::size_t, 4>{3, 3, 9, 11};
  const auto x = to_device(random_tensor<S, 4>(xs));
  const auto dy = to_device(random_tensor<G, 4>(host.output_shape(xs), 0.1F));
  const std::string w = tag + " batch norm with a fused relu";
  expect(same_bits(ctx, fused.forward(ctx, x), to_host(apart.forward(ctx, x), ctx.stream())), w + ": forward");
  expect(same_bits(ctx, fused.backward(ctx, dy), to_host(apart.backward(ctx, dy), ctx.stream())),
         w + ": input gradient");
  std::map<std::string, std::vector<float>> apart_grads;
  apart.for_each_parameter([&](const std::string& path, const auto& p) {
    const auto g = to_host(p.grad(), ctx.stream());
    apart_grads[path] = std::vector<float>(g.data(), g.data() + g.size());
  });
  fused.for_each_parameter([&](const std::string& path, const auto& p) {
    const auto g = to_host(p.grad(), ctx.stream());
    const auto& want = apart_grads.at(path);
    expect(std::memcmp(g.data(), want.data(), want.size() * sizeof(float)) == 0 && g.size() == want.size(),
           w + ": gradient of " + path);
  });
  expect(same_bits(ctx, fused.forward(ctx, x, nn::mode::eval),
                   to_host(apart.forward(ctx, x, nn::mode::eval), ctx.stream())),
         w + ": evaluation");
}

// Every parameter gradient of a device model, by path.
template <class Model>
std::map<std::string, std::vector<float>> parameter_gradients(cuda_context& ctx, Model& model) {
  std::map<std::string, std::vector<float>> all;
  model.for_each_parameter([&](const std::string& path, const auto& p) {
    const auto g = to_host(p.grad(), ctx.stream());
    all[path] = std::vector<float>(g.data(), g.data() + g.size());
  });
  return all;
}

// nn::backward_parameters, what nn::trainer runs (the layers that read the model's input
// compute no input gradient), through the multi-tensor nodes: backward()'s parameter
// gradients, bit for bit.
template <class P, class Blueprint>
void check_parameters_only(cuda_context& ctx, const std::string& tag, const Blueprint& blueprint,
                           const std::array<std::size_t, 4>& xs, image_layout layout = image_layout::nchw) {
  using S = typename P::storage_type;
  using G = typename P::gradient_type;
  auto model = nn::build<S, 4, cuda_context>(P{}, blueprint, {.seed = 7, .layout = layout});
  const auto ys = model.output_shape(xs);
  const auto x = to_device(random_tensor<S, 4>(xs));
  const auto dy = to_device(random_tensor<G, std::tuple_size_v<decltype(ys)>>(ys, 0.1F));
  model.zero_grad(ctx);
  (void)model.forward(ctx, x);
  (void)model.backward(ctx, dy);
  const auto full = parameter_gradients(ctx, model);
  model.zero_grad(ctx);
  (void)model.forward(ctx, x);
  model.backward_parameters(ctx, dy);
  expect(parameter_gradients(ctx, model) == full, tag + ": backward_parameters gives backward's parameter gradients");
}

// A model that starts with the fused pair: nn::backward_parameters (what nn::trainer runs)
// gives backward()'s parameter gradients, and a batch the batch norm refuses, given to the
// root module (past the model's own shape check; another channel count, or one value per
// channel in training), leaves the pair as the last good pass left it: the next backward()
// gives the same bits.
template <class P>
void check_fused_relu_first(cuda_context& ctx, const std::string& tag) {
  using S = typename P::storage_type;
  using G = typename P::gradient_type;
  const nn::build_options o{.seed = 11};
  auto model = nn::build<S, 4, cuda_context>(P{}, nn::seq(nn::batch_norm(6), nn::relu()), o);
  using root = typename decltype(model)::root_type;
  using norm = std::remove_reference_t<decltype(std::declval<root&>().template child<0>())>;
  using relu = std::remove_reference_t<decltype(std::declval<root&>().template child<1>())>;
  static_assert(norm::template fuses_with<relu>);
  const std::string w = tag + " fused batch norm and relu first";
  const std::array<std::size_t, 4> xs{4, 6, 5, 7};
  const auto x = to_device(random_tensor<S, 4>(xs, 1.0F, 0.3F));
  const auto dy = to_device(random_tensor<G, 4>(xs, 0.1F));
  model.zero_grad(ctx);
  (void)model.forward(ctx, x);
  const auto dx = to_host(model.backward(ctx, dy), ctx.stream());
  const auto full = parameter_gradients(ctx, model);
  model.zero_grad(ctx);
  (void)model.forward(ctx, x);
  model.backward_parameters(ctx, dy);
  expect(parameter_gradients(ctx, model) == full, w + ": backward_parameters gives backward's parameter gradients");
  (void)model.forward(ctx, x);
  const auto bad = to_device(random_tensor<S, 4>({4, 5, 5, 7}));
  expect_error(w + ": 5 channels", [&] { (void)model.root().forward(ctx, bad, nn::mode::train); }, "[N, 6, ...]");
  expect(same_bits(ctx, model.backward(ctx, dy), dx), w + ": backward after the refused batch");
  // One value per channel passes the shape checks; training refuses it, before the pair's
  // buffers change.
  const auto one = to_device(random_tensor<S, 4>({1, 6, 1, 1}));
  expect_error(w + ": one value per channel", [&] { (void)model.root().forward(ctx, one, nn::mode::train); },
               "more than one value per channel");
  expect(same_bits(ctx, model.backward(ctx, dy), dx), w + ": backward after the refused single values");
}

}  // namespace

int main() {
  if (!have_gpu()) return skipped;
  cuda_context ctx;
  check_nodes<presets::fp32>(ctx, "fp32");
  check_nodes<presets::bf16_mixed>(ctx, "bf16_mixed");
  check_nodes<presets::fp16_mixed>(ctx, "fp16_mixed");
  check_channels_last<presets::fp32>(ctx, "nhwc fp32");
  check_channels_last<presets::bf16_mixed>(ctx, "nhwc bf16_mixed");
  check_channels_last<presets::fp16_mixed>(ctx, "nhwc fp16_mixed");
  check_fused_relu<presets::fp32>(ctx, "fp32", image_layout::nchw);
  check_fused_relu<presets::bf16_mixed>(ctx, "bf16_mixed", image_layout::nchw);
  check_fused_relu<presets::fp16_mixed>(ctx, "nhwc fp16_mixed", nhwc);
  check_fused_relu_first<presets::fp32>(ctx, "fp32");
  check_fused_relu_first<presets::bf16_mixed>(ctx, "bf16_mixed");
  {
    const dbnet::config c{.width = 8, .inner = 16};
    check_parameters_only<presets::bf16_mixed>(ctx, "bf16_mixed pyramid", pyramid(), {2, 3, 16, 12});
    check_parameters_only<presets::fp32>(ctx, "fp32 dbnet", nn::seq(dbnet::blueprint(c), nn::subtract()),
                                         {2, 3, 64, 64});
    check_parameters_only<presets::bf16_mixed>(ctx, "nhwc bf16_mixed dbnet",
                                               nn::seq(dbnet::blueprint(c), nn::subtract()), {2, 64, 64, 3}, nhwc);
  }
  // Shapes that cannot be joined are refused, naming the join, before any launch.
  {
    auto model = nn::build<float, 4, cuda_context>(
        presets::fp32{}, nn::seq(nn::fork(nn::conv2d(3, 2, 1, {}), nn::conv2d(3, 3, 1, {})), nn::subtract()));
    const auto x = to_device(random_tensor<float, 4>({1, 3, 4, 4}));
    expect_error("subtract: other shapes", [&] { (void)model.forward(ctx, x); }, "cannot be subtracted");
  }
  return finish();
}
