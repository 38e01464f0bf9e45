// A ResNet basic block with a projection shortcut (convolutions, batch norm, ReLU, residual
// add) built by nn::build from one blueprint on the host and on the device (cuda_context):
// the same masters, the same input; the device's output, input gradient and parameter
// gradients against the host's within the storage type's bound; and a max pooling layer,
// whose indices the device keeps, with the host's bits. Exits 77 (skipped) where no GPU is
// present.
#include <precis/nn/cuda.hpp>  // first: the device kernels, then nn

#include "nn_compare.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using namespace precis_test;
using namespace precis;

struct conv1 : layer<op::conv> {
  static constexpr std::string_view name = "conv1";
};
struct conv2 : layer<op::conv> {
  static constexpr std::string_view name = "conv2";
};
struct proj : layer<op::conv> {
  static constexpr std::string_view name = "proj";
};

auto basic_block(std::size_t in, std::size_t out) {
  const conv2d_params s2p1{.stride = {2, 2}, .padding = {1, 1}}, p1{.padding = {1, 1}}, s2{.stride = {2, 2}};
  return nn::seq(nn::residual(nn::seq(nn::conv2d<conv1>(in, out, 3, s2p1, nn::no_bias), nn::batch_norm(out), nn::relu(),
                                      nn::conv2d<conv2>(out, out, 3, p1, nn::no_bias), nn::batch_norm(out)),
                              nn::seq(nn::conv2d<proj>(in, out, 1, s2, nn::no_bias), nn::batch_norm(out))),
                 nn::relu());
}

// nvcc compiles this file twice, for the host and for the device, and both passes must see
// the model's children: where the device pass did not (a lambda in `composite`'s
// requires-expression), kernels launched only while walking the model (the casts of
// refresh and parameter::set) got no device code and failed at run time with "invalid
// device function". These assertions stop such a build instead.
using block_model =
    decltype(nn::build<bfloat16, 4, cuda_context>(presets::bf16_mixed{}, basic_block(8, 16)));
using block_root = std::remove_cvref_t<decltype(std::declval<block_model&>().root())>;
static_assert(nn::composite<block_root>, "the device pass must see the model's children");
static_assert(!nn::composite<nn::parameter<bfloat16, float, 4, cuda_context>>);

template <class P>
void check_block(cuda_context& ctx, const std::string& tag) {
  compare_models<P, 4>(ctx, tag, basic_block(8, 16), {2, 8, 12, 10});
}

// nn::max_pool2d alone on the host and the device: the device layer keeps its indices in a
// device tensor, and both passes give the host's bits.
template <class P>
void check_max_pool(cuda_context& ctx, const std::string& tag) {
  using S = typename P::storage_type;
  using G = typename P::gradient_type;
  const cpu_context cpu{2};
  const pool2d_params stem{.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}};
  auto host = nn::build<S, 4>(P{}, nn::max_pool2d(stem));
  auto device = nn::build<S, 4, cuda_context>(P{}, nn::max_pool2d(stem));
  const auto x = random_tensor<S, 4>({2, 8, 13, 12});
  const auto dy = random_tensor<G, 4>({2, 8, 7, 6});
  const auto xd = to_device(x);  // alive until the backward pass, which reads its shape
  expect(same_bits(ctx, device.forward(ctx, xd), host.forward(cpu, x)),
         tag + " max_pool2d layer forward");
  expect(same_bits(ctx, device.backward(ctx, to_device(dy)), host.backward(cpu, dy)),
         tag + " max_pool2d layer backward");
}

}  // namespace

int main() {
  if (!have_gpu()) return skipped;
  cuda_context ctx;
  check_block<presets::fp32>(ctx, "fp32");
  check_block<presets::bf16_mixed>(ctx, "bf16_mixed");
  check_block<presets::fp16_mixed>(ctx, "fp16_mixed");
  check_max_pool<presets::fp32>(ctx, "fp32");
  check_max_pool<presets::bf16_mixed>(ctx, "bf16_mixed");
  return finish();
}
