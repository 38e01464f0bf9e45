// Channels-last models on the device (nn/layout.hpp): every spatial layer and a DBNet at
// width 8, built with image_layout::nhwc on the device and on the host from one blueprint
// with the same masters, one forward and backward pass on the same [N, H, W, C] data, within
// the types' bounds. The host's channels-last model gives the NCHW model's bits
// (tests/nn/test_layout.cpp), so these compare the device's NHWC convolutions (cuDNN's
// NHWC tensors and filter layout), its column-ordered batch norm, its moved pooling and
// upsampling, and the channel-axis concatenations against the NCHW reference. Exits 77
// (skipped) where no GPU is present.
#include <precis/nn/cuda.hpp>  // first: the device kernels, then nn

#include "../../examples/dbnet/model.hpp"
#include "nn_compare.hpp"

#include <string>

namespace {

using namespace precis_test;
using namespace precis;

constexpr image_layout nhwc = image_layout::nhwc;
const conv2d_params same{.padding = {1, 1}};

template <class P>
void check_layers(cuda_context& ctx, const std::string& tag) {
  // Convolutions with and without a bias, strided, grouped, transposed; the weight's move
  // to cuDNN's filter layout and the weight gradient's move back.
  compare_models<P, 4>(ctx, tag + " conv2d with bias", nn::conv2d(3, 5, 3, same), {2, 9, 11, 3}, 4, nhwc);
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
  compare_models<P, 4>(ctx, tag + " concat along the channels",
                       nn::seq(nn::concat(nn::channel_axis, nn::conv2d(3, 2, 3, same), nn::identity(), nn::conv2d(3, 5, 1, {})),
                               nn::fork(nn::conv2d(10, 2, 1, {}), nn::conv2d(10, 3, 1, {})),
                               nn::concat_all(nn::channel_axis)),
                       {2, 6, 7, 3}, 4, nhwc);
  const dbnet::config c{.width = 8, .inner = 16};
  compare_models<P, 4>(ctx, tag + " dbnet", nn::seq(dbnet::blueprint(c), nn::subtract()), {2, 64, 64, 3}, 16, nhwc);
}

}  // namespace

int main() {
  if (!have_gpu()) return skipped;
  cuda_context ctx;
  check_layers<presets::fp32>(ctx, "fp32");
  check_layers<presets::bf16_mixed>(ctx, "bf16_mixed");
  check_layers<presets::fp16_mixed>(ctx, "fp16_mixed");
  return finish();
}
