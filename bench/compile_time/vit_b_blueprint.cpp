// Compile-time cost of a model: a 12-block ViT-B/16 blueprint built from a policy map with a
// dozen layer overrides (not run). PRECIS_BENCH_STAGE selects how much is instantiated:
// 1 nn::build (every layer's policy resolved and checked, construction, initialisation),
// 2 that and describe, 3 that and one forward and backward pass. Compare with
// nn_baseline.cpp, which includes the same headers and builds nothing
// (bench/compile_time.py).
#include <precis/precis.hpp>

#include <cstdio>
#include <string_view>

namespace bench {

using namespace precis;

#define PRECIS_BENCH_TAG(tag, kind)               \
  struct tag : layer<op::kind> {                  \
    static constexpr std::string_view name = #tag; \
  }
PRECIS_BENCH_TAG(patch_embed, matmul);
PRECIS_BENCH_TAG(norm1, layer_norm);
PRECIS_BENCH_TAG(norm2, layer_norm);
PRECIS_BENCH_TAG(qkv, matmul);
PRECIS_BENCH_TAG(scores, matmul);
PRECIS_BENCH_TAG(probs, softmax);
PRECIS_BENCH_TAG(context, matmul);
PRECIS_BENCH_TAG(proj, matmul);
PRECIS_BENCH_TAG(fc1, matmul);
PRECIS_BENCH_TAG(act, elementwise);
PRECIS_BENCH_TAG(fc2, matmul);
PRECIS_BENCH_TAG(final_norm, layer_norm);
PRECIS_BENCH_TAG(head, matmul);
#undef PRECIS_BENCH_TAG

auto block(std::size_t d, std::size_t h) {
  return nn::seq(nn::residual(nn::seq(nn::layer_norm<norm1>(d),
                                      nn::named("attn", nn::attention<qkv, scores, probs, context, proj>(d, h)))),
                 nn::residual(nn::seq(nn::layer_norm<norm2>(d), nn::linear<fc1>(d, 4 * d), nn::gelu<act>(),
                                      nn::linear<fc2>(4 * d, d))));
}

auto vit_b() {
  const std::size_t d = 768;
  return nn::seq(nn::patchify(16), nn::linear<patch_embed>(3 * 16 * 16, d), nn::class_token(d),
                 nn::position_embedding(197, d), nn::named("encoder", nn::repeat<12>(block(d, 12))),
                 nn::layer_norm<final_norm>(d), nn::select_token(0), nn::linear<head>(d, 1000));
}

// Twelve layer overrides over three policies, and two operation-kind overrides.
constexpr auto policies = make_policy_map(
    presets::bf16_mixed{}, for_op<op::softmax>(presets::fp32{}), for_op<op::elementwise>(presets::bf16_mixed{}),
    for_layer<patch_embed>(presets::fp32{}), for_layer<norm1>(presets::fp32{}), for_layer<norm2>(presets::fp32{}),
    for_layer<qkv>(presets::fp16_mixed{}), for_layer<scores>(presets::fp16_mixed{}),
    for_layer<probs>(presets::fp32{}), for_layer<context>(presets::fp16_mixed{}), for_layer<proj>(presets::fp16_mixed{}),
    for_layer<fc1>(presets::bf16_mixed{}), for_layer<act>(presets::fp32{}), for_layer<fc2>(presets::bf16_mixed{}),
    for_layer<head>(presets::fp32{}));

}  // namespace bench

#ifndef PRECIS_BENCH_STAGE
#define PRECIS_BENCH_STAGE 3
#endif

// Built only when run with an argument: the point is what the compiler does.
int main(int argc, char**) {
  if (argc < 2) return 0;
  auto model = precis::nn::build<float, 4>(bench::policies, bench::vit_b(), {.seed = 1});
  std::printf("%zu parameters\n", model.parameter_count());
#if PRECIS_BENCH_STAGE >= 2
  std::puts(precis::nn::describe(model).c_str());
#endif
#if PRECIS_BENCH_STAGE >= 3
  precis::host_tensor<float, 4> x(std::array<std::size_t, 4>{1, 3, 224, 224});
  const precis::cpu_context ctx{1};
  const auto& y = model.forward(ctx, x);
  precis::host_tensor<float, 2> dy(y.shape());
  model.backward(ctx, dy);
#endif
  return 0;
}
