// Fused attention (cuDNN's flash attention, kernels/cuda/fused_attention.hpp) in nn::attention
// on the device against the host's unfused pieces, built from one blueprint with the same
// masters: the output, the input gradient and the four parameter gradients within the storage
// type's bounds. The fused kernel keeps the scores in float where the pieces store them in the
// scores' 16-bit type, and sums in its own order, hence a factor of 8 on the bounds. Also:
// which maps fuse (compile-time), describe's note, deterministic backward passes, a head
// width cuDNN does not take (refused, naming the remedy), and a second geometry (a second
// plan). Exits 77 (skipped) where no GPU is present or the build has no cuDNN frontend.
#include <precis/nn/cuda.hpp>  // first: the device kernels, then nn

#include "nn_compare.hpp"

#include <cstdio>
#include <cstring>
#include <string>

namespace {

using namespace precis_test;
using namespace precis;

template <class Map, class Ctx = cuda_context>
using attention_t = nn::attention_layer<nn::tags::attention_qkv, nn::tags::attention_scores, nn::tags::attention_softmax,
                                        nn::tags::attention_context, nn::tags::attention_out, Map, Ctx>;
template <class P>
using map_of = decltype(make_policy_map(P{}));

// Which maps fuse: bfloat16 or float16 with the hardware's products, on the device, where
// the build has the frontend. Exact products, float and TF32 keep the pieces, and so does
// the host.
static_assert(attention_t<map_of<presets::bf16_mixed>>::fused == has_fused_attention);
static_assert(attention_t<map_of<presets::fp16_hardware>>::fused == has_fused_attention);
static_assert(!attention_t<map_of<presets::bf16_exact>>::fused && !attention_t<map_of<presets::fp16_mixed>>::fused);
static_assert(!attention_t<map_of<presets::fp32>>::fused && !attention_t<map_of<presets::tf32>>::fused);
static_assert(!attention_t<map_of<presets::bf16_mixed>, cpu_context>::fused);
// A map that sends the scores product through exact products keeps every piece.
using pieces_map =
    decltype(make_policy_map(presets::bf16_mixed{}, for_layer<nn::tags::attention_scores>(presets::bf16_exact{})));
static_assert(!attention_t<pieces_map>::fused);

template <class P>
void check_against_host(cuda_context& ctx, const std::string& tag) {
  // ViT's token count (64 patches and a class token), head width 16, and a wider head.
  compare_models<P, 3>(ctx, tag + " attention, 65 tokens, 4 heads of 16", nn::attention(64, 4), {3, 65, 64}, 8);
  compare_models<P, 3>(ctx, tag + " attention, 17 tokens, 2 heads of 64", nn::attention(128, 2), {2, 17, 128}, 8);
  compare_models<P, 3>(ctx, tag + " two attention layers",
                       nn::seq(nn::attention(64, 2), nn::gelu(), nn::attention(64, 4)), {2, 33, 64}, 8);
}

// Two backward passes from the same state give the same bits (cuDNN's deterministic
// algorithm), and the model keeps one plan per direction and geometry.
void check_deterministic(cuda_context& ctx) {
  auto m = nn::build<bfloat16, 3, cuda_context>(presets::bf16_mixed{}, nn::attention(64, 4), {.seed = 3});
  const auto x = to_device(random_tensor<bfloat16, 3>({2, 65, 64}));
  const auto dy = to_device(random_tensor<bfloat16, 3>({2, 65, 64}, 0.1F));
  const auto pass = [&] {
    m.zero_grad(ctx);
    (void)m.forward(ctx, x);
    return to_host(m.backward(ctx, dy), ctx.stream());
  };
  const auto a = pass();
  const auto b = pass();
  expect(std::memcmp(a.data(), b.data(), a.size() * sizeof(bfloat16)) == 0, "fused backward: the same bits twice");
  expect(m.root().engine().plans() == 2, "fused: one plan forward and one backward for one geometry");
  const auto x2 = to_device(random_tensor<bfloat16, 3>({1, 9, 64}));
  (void)m.forward(ctx, x2);
  expect(m.root().engine().plans() == 3, "fused: a new geometry makes its own plan");
}

}  // namespace

int main() {
  if constexpr (!has_fused_attention) {
    std::printf("skipped: built without precis::cudnn_frontend (pip install nvidia-cudnn-frontend)\n");
    return skipped;
  } else {
    if (!have_gpu()) return skipped;
    cuda_context ctx;
    check_against_host<presets::bf16_mixed>(ctx, "bf16_mixed");
    check_against_host<presets::fp16_hardware>(ctx, "fp16_hardware");
    check_deterministic(ctx);
    // describe notes the fused pieces, and only where they are.
    {
      const auto fused = nn::build<bfloat16, 3, cuda_context>(presets::bf16_mixed{}, nn::attention(64, 4));
      const auto pieces = nn::build<bfloat16, 3, cuda_context>(presets::bf16_exact{}, nn::attention(64, 4));
      const std::string note = "fused (cuDNN flash attention)";
      const auto count = [&](const std::string& table) {
        std::size_t n = 0;
        for (auto at = table.find(note); at != std::string::npos; at = table.find(note, at + 1)) ++n;
        return n;
      };
      expect(count(nn::describe(fused)) == 3, "describe: scores, softmax and context noted fused");
      expect(count(nn::describe(pieces)) == 0, "describe: no fused note where the pieces run");
    }
    // cuDNN takes head widths that are multiples of 8: heads of 4 are refused before any launch.
    {
      auto m = nn::build<bfloat16, 3, cuda_context>(presets::bf16_mixed{}, nn::attention(16, 4));
      const auto x = to_device(random_tensor<bfloat16, 3>({1, 5, 16}));
      expect_error("fused: head width 4", [&] { (void)m.forward(ctx, x); }, "products::exact");
    }
    return finish();
  }
}
