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
#include "model.hpp"

#include <cstddef>
#include <cstdio>
#include <string_view>

namespace vit {

template <class Map>
void show(const char* title, Map map) {
  const config c = vit_h16;
  // The full-depth model's type: every rule checked for every layer of 32 blocks.
  using full = nn::model_t<float, 4, Map, decltype(blueprint<32, fc2_vit_h>(c))>;
  static_assert(sizeof(full) > 0);
  auto one_block = nn::build<float, 4>(map, blueprint<1, fc2_vit_h>(c), {.seed = 1});
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
  vit::show("fp16_mixed, fc2 in bf16", make_policy_map(presets::fp16_mixed{}, for_layer<vit::fc2_vit_h>(presets::bf16_mixed{})));

  // A map with overrides by operation kind and by layer: bf16 by default, the attention
  // products in fp16 (their values are small), the head in float.
  vit::show("bf16, attention products fp16, head fp32",
            make_policy_map(presets::bf16_mixed{}, for_layer<vit::scores>(presets::fp16_mixed{}),
                            for_layer<vit::context>(presets::fp16_mixed{}), for_layer<vit::head>(presets::fp32{})));
  return 0;
}
