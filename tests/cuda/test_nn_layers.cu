// nn layers on the device against the same layers on the host, built by nn::build from one
// blueprint with the same masters: one forward and backward pass on the same data, the
// outputs, input gradients and parameter gradients within the types' bounds; float8 linear
// layers over three training steps. Exits 77 (skipped) where no GPU is present.
#include <precis/nn/cuda.hpp>  // first: the device kernels, then nn

#include "../../examples/vit/model.hpp"
#include "../nn/layer_scale.hpp"
#include "nn_compare.hpp"

#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using namespace precis_test;
using namespace precis;

// Rows of several slabs of the column sum (64 rows each), and a last slab cut short.
auto mlp() { return nn::seq(nn::linear<fc1>(24, 40), nn::relu(), nn::linear<fc2>(40, 10, nn::no_bias)); }

template <class P>
void check_linear(cuda_context& ctx, const std::string& tag) {
  compare_models<P, 2>(ctx, tag + " mlp", mlp(), {150, 24});
  // Rank 3: the leading axes are rows of one product.
  compare_models<P, 3>(ctx, tag + " linear rank 3", nn::linear<fc1>(24, 40), {3, 70, 24});
  // 256 outputs: the bias gradient's column sums read 16 bytes of columns per row and thread.
  compare_models<P, 3>(ctx, tag + " linear of 256 outputs", nn::linear<fc1>(24, 256), {3, 70, 24});
}

// The layers of a Vision Transformer, alone and together.
template <class P>
void check_vit_layers(cuda_context& ctx, const std::string& tag) {
  compare_models<P, 3>(ctx, tag + " softmax", nn::softmax(), {2, 5, 37});
  compare_models<P, 3>(ctx, tag + " attention", nn::attention(32, 4), {3, 17, 32});
  compare_models<P, 3>(ctx, tag + " class token and position embedding",
                       nn::seq(nn::class_token(16), nn::position_embedding(10, 16)), {70, 9, 16});
  compare_models<P, 4>(ctx, tag + " patchify", nn::patchify(4), {2, 3, 8, 12}, 1);
  compare_models<P, 3>(ctx, tag + " select_token", nn::seq(nn::select_token(2), nn::linear<fc1>(16, 8)), {5, 4, 16});
  compare_models<P, 4>(ctx, tag + " flatten", nn::seq(nn::flatten(), nn::linear<fc1>(60, 8)), {3, 3, 4, 5});
  compare_models<P, 3>(ctx, tag + " reshape and permute",
                       nn::seq(nn::reshape<3>({4, 3, 5}), nn::permute<4>({0, 2, 3, 1}),
                               nn::scale(0.5), nn::linear<fc1>(4, 6)),
                       {2, 6, 10});
  // The mask is drawn from (seed, call, index) on both sides: the host's bits.
  // Whole 16-byte packs, then 9 x 61 elements: packs and a partial one.
  compare_models<P, 2>(ctx, tag + " dropout", nn::seq(nn::linear<fc1>(16, 64), nn::dropout(0.25)), {9, 16});
  compare_models<P, 2>(ctx, tag + " dropout, a partial pack",
                       nn::seq(nn::linear<fc1>(16, 61), nn::dropout(0.25), nn::scale(0.5)), {9, 16});
  // A layer written outside the library (tests/nn/layer_scale.hpp): the same class on both,
  // its scales drawn per feature (one common value would hide a wrong broadcast axis).
  compare_models<P, 3>(ctx, tag + " a user layer (layer_scale)",
                       nn::seq(nn::linear<fc1>(24, 40), user::layer_scale(40, 0.5), nn::gelu()), {3, 70, 24}, 4,
                       precis::image_layout::nchw, [](auto& host) {
                         host.for_each_parameter([](const std::string& path, auto& p) {
                           if (path.ends_with("gamma")) {
                             std::uniform_real_distribution<float> d(0.25F, 1.75F);
                             for (auto& v : p.master()) v = d(precis_test::rng);
                             p.refresh();
                           }
                         });
                       });
  const vit::config c{.image = 16, .patch = 4, .channels = 1, .width = 32, .heads = 2, .classes = 10};
  compare_models<P, 4>(ctx, tag + " vit", vit::blueprint<2>(c), {6, 1, 16, 16}, 8);
}

// float8 linear layers (presets::fp8_hybrid) on the device against the host's, three training
// steps from the same masters: both sides cast with the same delayed recipes, step for step.
// The tensors both sides share (fc1's input, the weights, fc2's output gradient) are the same
// float8 values; those that come out of a product (fc2's input, a GELU of fc1's output, and
// fc1's output gradient, fc2's dx) differ by cuBLASLt's summation order (then one rounding to
// bfloat16): the bfloat16 bounds. The inputs and output gradients grow from step to step, so
// that a stale or wrong scale saturates. After each step every recipe (x, W, dy of both
// layers), read back from the device, has the host's scale and amax history: bit for bit
// where its tensor is shared, within one bfloat16 step (2^-7, relative) where it comes out of
// a product (its largest element may round to the next bfloat16 value); a forward pass in
// evaluation mode on another, larger input between steps leaves them so on both sides.
struct recipe_match {
  bool input_exact = true, grad_exact = true;
};
template <class HostState, class DeviceState>
void compare_recipe_states(const std::string& at, cuda_context& ctx, const HostState& h, const DeviceState& d,
                           recipe_match exact = {}) {
  const auto close = [](double a, double b, bool bits) {
    return bits ? a == b : std::abs(a - b) <= 0x1.0p-7 * std::max(std::abs(a), std::abs(b));
  };
  const auto same = [&](const std::string& which, const auto& host_recipe, const auto& device_recipe, bool bits) {
    // A recipe of the host's options, the device state written into it.
    delayed_scaling<typename std::remove_cvref_t<decltype(host_recipe)>::format> got(host_recipe.options());
    device_recipe->store(ctx, got);
    const auto gh = got.amax_history(), hh = host_recipe.amax_history();
    bool ok = close(got.scale(), host_recipe.scale(), bits) && gh.size() == hh.size();
    for (std::size_t i = 0; ok && i < gh.size(); ++i) ok = close(gh[i], hh[i], bits);
    expect(ok, at + ": the " + which + " recipe's scale and amax history are the host's" +
                   (bits ? "" : " (within a bfloat16 step)"));
  };
  same("input", h.input, d.input, exact.input_exact);
  same("weight", h.weight, d.weight, true);
  same("output gradient", h.grad_output, d.grad_output, exact.grad_exact);
}

// compare_recipe_states on each float8 layer of host model h and its counterpart in device
// model d (the same path); `how(path)` gives the checks' name and what must match bit for
// bit. Returns how many layers were compared.
template <class H, class D, class How>
std::size_t compare_float8_layers(cuda_context& ctx, H& h, D& d, How&& how) {
  std::size_t compared = 0;
  h.for_each_layer([&](const std::string& path, const auto& hl) {
    if constexpr (requires { hl.float8_products().input.amax_history(); }) {
      d.for_each_layer([&](const std::string& dpath, const auto& dl) {
        if constexpr (requires { dl.float8_products().input->scale(); }) {
          if (dpath == path) {
            const auto [name, match] = how(path);
            compare_recipe_states(name, ctx, hl.float8_products(), dl.float8_products(), match);
            ++compared;
          }
        }
      });
    }
  });
  return compared;
}

void check_float8(cuda_context& ctx) {
  const cpu_context cpu{2};
  const auto blueprint = nn::seq(nn::linear<fc1>(32, 48), nn::gelu(), nn::linear<fc2>(48, 16, nn::no_bias));
  auto host = nn::build<bfloat16, 3>(presets::fp8_hybrid{}, blueprint, {.seed = 5});
  auto dev = nn::build<bfloat16, 3, cuda_context>(presets::fp8_hybrid{}, blueprint, {.seed = 5});
  nn::copy_masters(ctx, host, dev);
  for (int step = 0; step < 3; ++step) {
    const std::string at = "fp8_hybrid linear step " + std::to_string(step + 1);
    const auto x = random_tensor<bfloat16, 3>({2, 16, 32}, float(1 << step));  // amaxes that change
    const auto dy = random_tensor<bfloat16, 3>({2, 16, 16}, 0.1F * float(1 << (3 * step)));
    const auto xe = random_tensor<bfloat16, 3>({2, 16, 32}, float(64 << step));  // evaluation only
    const auto xd = to_device(x);
    const auto dyd = to_device(dy);
    const auto xed = to_device(xe);
    host.zero_grad();
    dev.zero_grad(ctx);
    compare(at + " forward", ctx, dev.forward(ctx, xd), host.forward(cpu, x), 4 * bound<bfloat16>());
    compare(at + " input gradient", ctx, dev.backward(ctx, dyd), host.backward(cpu, dy), 4 * bound<bfloat16>());
    compare_gradients(at, ctx, host, dev, 4 * bound<bfloat16>());
    compare(at + " evaluation", ctx, dev.forward(ctx, xed, nn::mode::eval), host.forward(cpu, xe, nn::mode::eval),
            4 * bound<bfloat16>());
    const std::size_t compared = compare_float8_layers(ctx, host, dev, [&](const std::string& path) {
      // fc1's output gradient is fc2's dx; fc2's input is a GELU of fc1's output.
      expect(path == "fc1" || path == "fc2", at + ": the float8 layers' paths are their tags' names");
      return std::pair{at + " " + path, recipe_match{.input_exact = path != "fc2", .grad_exact = path != "fc1"}};
    });
    expect(compared == 2, at + ": both layers' recipes compared");
  }
  // nn::copy_state: the trained device model into a host model of other weights (its
  // recipes then hold the device's state), and that into two device models, one before any
  // pass (the recipes kept and made by its first) and one after a pass (replaced in place):
  // a training pass of each gives the trained model's bits.
  auto host2 = nn::build<bfloat16, 3>(presets::fp8_hybrid{}, blueprint, {.seed = 9});
  nn::copy_state(ctx, dev, host2);
  const std::size_t copied = compare_float8_layers(ctx, host2, dev, [](const std::string& path) {
    return std::pair{"copy_state to the host " + path, recipe_match{}};
  });
  expect(copied == 2, "copy_state: both layers' recipes compared");
  auto fresh = nn::build<bfloat16, 3, cuda_context>(presets::fp8_hybrid{}, blueprint, {.seed = 11});
  auto used = nn::build<bfloat16, 3, cuda_context>(presets::fp8_hybrid{}, blueprint, {.seed = 12});
  const auto xc = to_device(random_tensor<bfloat16, 3>({2, 16, 32}, 8.0F));
  const auto dyc = to_device(random_tensor<bfloat16, 3>({2, 16, 16}, 100.0F));
  (void)used.forward(ctx, xc);
  nn::copy_state(ctx, host2, fresh);
  nn::copy_state(ctx, host2, used);
  const auto want_y = to_host(dev.forward(ctx, xc), ctx.stream());
  const auto want_dx = to_host(dev.backward(ctx, dyc), ctx.stream());
  for (auto* m : {&fresh, &used}) {
    const std::string which = m == &fresh ? "copy_state before any pass" : "copy_state after a pass";
    expect(same_bits(ctx, m->forward(ctx, xc), want_y), which + ": the forward pass's bits");
    expect(same_bits(ctx, m->backward(ctx, dyc), want_dx), which + ": the input gradient's bits");
  }
  // cuBLASLt's float8 products take multiples of 16: 20 features are refused, naming them.
  auto odd = nn::build<bfloat16, 2, cuda_context>(presets::fp8_hybrid{}, nn::linear<fc1>(20, 16));
  const auto x = to_device(random_tensor<bfloat16, 2>({16, 20}));
  expect_error("fp8_hybrid linear: 20 features", [&] { (void)odd.forward(ctx, x); }, "multiples of 16");
  // And rows: 15 of them are refused by the layer's shape pass, naming the layer.
  auto even = nn::build<bfloat16, 2, cuda_context>(presets::fp8_hybrid{}, nn::linear<fc1>(32, 16));
  const auto rows15 = to_device(random_tensor<bfloat16, 2>({15, 32}));
  expect_error("fp8_hybrid linear: 15 rows", [&] { (void)even.forward(ctx, rows15); }, "(linear) expects");
}

}  // namespace

int main() {
  if (!have_gpu()) return skipped;
  cuda_context ctx;
  check_linear<presets::fp32>(ctx, "fp32");
  check_linear<presets::bf16_mixed>(ctx, "bf16_mixed");
  check_linear<presets::fp16_mixed>(ctx, "fp16_mixed");
  check_vit_layers<presets::fp32>(ctx, "fp32");
  check_vit_layers<presets::bf16_mixed>(ctx, "bf16_mixed");
  check_vit_layers<presets::fp16_mixed>(ctx, "fp16_mixed");
  check_float8(ctx);
  // A batch of the wrong width is refused, naming the layer, before any launch.
  {
    auto model = nn::build<bfloat16, 2, cuda_context>(presets::bf16_mixed{}, mlp());
    const auto x = to_device(random_tensor<bfloat16, 2>({4, 23}));
    expect_error("linear: wrong width", [&] { (void)model.forward(ctx, x); }, "fc1");
  }
  return finish();
}
