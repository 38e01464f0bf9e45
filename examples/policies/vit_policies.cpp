// One Vision Transformer blueprint under several policy maps, resolved and checked at compile
// time and printed with describe.
//
// The blueprint is written once with layer tags; nn::build gives each layer the policy the
// map resolves for its tag. At ViT-H/16 size (width 1280, 32 blocks, 16 heads) the second
// MLP projection's activations exceed float16's 65504 (declared with max_abs on its tag): a
// float16 map that leaves it in float16 does not compile (tests/compile_fail/
// nn_vit_h_fp16.cpp holds that case); the map that keeps it in bfloat16 does. The tables
// below are printed for one block of that width (the parameter count is extrapolated to 32
// blocks; building all 32 would allocate 632 million parameters).
#include <precis/precis.hpp>

#include <cstddef>
#include <cstdio>
#include <string_view>

namespace vit {

using namespace precis;

struct patch_embed : layer<op::matmul> {
  static constexpr std::string_view name = "patch_embed";
};
struct norm1 : layer<op::layer_norm> {
  static constexpr std::string_view name = "norm1";
};
struct norm2 : layer<op::layer_norm> {
  static constexpr std::string_view name = "norm2";
};
struct qkv : layer<op::matmul> {
  static constexpr std::string_view name = "qkv";
};
struct scores : layer<op::matmul> {
  static constexpr std::string_view name = "scores";
};
struct attn_softmax : layer<op::softmax> {
  static constexpr std::string_view name = "softmax";
};
struct context : layer<op::matmul> {
  static constexpr std::string_view name = "context";
};
struct attn_out : layer<op::matmul> {
  static constexpr std::string_view name = "proj";
};
struct mlp_fc1 : layer<op::matmul> {
  static constexpr std::string_view name = "fc1";
};
// Measured in large ViTs: the second MLP projection's outputs exceed float16's 65504.
struct mlp_fc2 : layer<op::matmul, max_abs<200000>> {
  static constexpr std::string_view name = "fc2";
};
struct head : layer<op::matmul> {
  static constexpr std::string_view name = "head";
};

struct config {
  std::size_t image = 224, patch = 16, channels = 3, width = 1280, heads = 16, classes = 1000;
  std::size_t tokens() const { return (image / patch) * (image / patch) + 1; }
};

// A pre-norm encoder block: attention and a GELU MLP (ratio 4), each in a residual.
auto block(std::size_t d, std::size_t heads) {
  return nn::seq(nn::residual(nn::seq(nn::layer_norm<norm1>(d),
                                      nn::named("attn", nn::attention<qkv, scores, attn_softmax, context, attn_out>(d, heads)))),
                 nn::residual(nn::seq(nn::layer_norm<norm2>(d),
                                      nn::named("mlp", nn::seq(nn::linear<mlp_fc1>(d, 4 * d), nn::gelu(),
                                                               nn::linear<mlp_fc2>(4 * d, d))))));
}

// The whole model on [N, C, H, W] images: patchify + linear embedding, class token,
// learned positions, Depth blocks, final norm, the head on the class token.
template <std::size_t Depth>
auto blueprint(const config& c) {
  return nn::seq(nn::patchify(c.patch), nn::linear<patch_embed>(c.channels * c.patch * c.patch, c.width),
                 nn::class_token(c.width), nn::position_embedding(c.tokens(), c.width),
                 nn::named("encoder", nn::repeat<Depth>(block(c.width, c.heads))), nn::layer_norm(c.width),
                 nn::select_token(0), nn::linear<head>(c.width, c.classes));
}

template <class Map>
void show(const char* title, Map map) {
  const config c;
  // The full-depth model's type: every rule checked for every layer of 32 blocks.
  using full = nn::model_t<float, 4, Map, decltype(blueprint<32>(c))>;
  static_assert(sizeof(full) > 0);
  auto one_block = nn::build<float, 4>(map, blueprint<1>(c), {.seed = 1});
  std::size_t per_block = 0;
  one_block.for_each_parameter([&](const std::string& path, const auto& p) {
    if (path.starts_with("encoder.")) per_block += p.size();
  });
  std::printf("%s\n%s", title, nn::describe(one_block).c_str());
  std::printf("ViT-H/16 (32 blocks): %zu parameters\n\n", one_block.parameter_count() + 31 * per_block);
}

}  // namespace vit

int main() {
  using namespace precis;
  // bf16 everywhere: float's range, so fc2's activations fit; norms, softmax and the loss
  // compute in float by rule.
  vit::show("bf16_mixed", make_policy_map(presets::bf16_mixed{}));

  // fp16 with the overflowing projection kept in bfloat16. Without that override this map
  // does not compile: precis: the layer declares activations (max_abs<...>) beyond what
  // its storage type holds.
  vit::show("fp16_mixed, fc2 in bf16", make_policy_map(presets::fp16_mixed{}, for_layer<vit::mlp_fc2>(presets::bf16_mixed{})));

  // A map with overrides by operation kind and by layer: bf16 by default, the attention
  // products in fp16 (their values are small), the head in float.
  vit::show("bf16, attention products fp16, head fp32",
            make_policy_map(presets::bf16_mixed{}, for_layer<vit::scores>(presets::fp16_mixed{}),
                            for_layer<vit::context>(presets::fp16_mixed{}), for_layer<vit::head>(presets::fp32{})));
  return 0;
}
