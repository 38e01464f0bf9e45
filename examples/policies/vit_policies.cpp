// Per-layer precision for a ViT-H/16-like encoder block, under three policy maps, printed
// with describe. Everything here is decided at compile time: change a map so that a rule
// is broken (e.g. drop the bfloat16 override of mlp_fc2 under fp16) and it stops compiling.
#include <precis/policy/policy.hpp>

#include <cstdio>
#include <string_view>

namespace vit {

using namespace precis;

// ViT-H/16: width 1280, MLP 5120, 16 heads, 257 tokens per image (batch 32 -> 8224 rows).
struct patch_embed : layer<op::conv> {
  static constexpr std::string_view name = "patch_embed";
};
struct norm1 : layer<op::layer_norm> {
  static constexpr std::string_view name = "norm1";
};
struct qkv : layer<op::matmul, gemm_shape<8224, 3840, 1280>> {
  static constexpr std::string_view name = "qkv";
};
struct scores : layer<op::matmul, gemm_shape<257, 257, 80>> {  // per head: 80 = 1280 / 16
  static constexpr std::string_view name = "scores";
};
struct attn_softmax : layer<op::softmax> {
  static constexpr std::string_view name = "attn_softmax";
};
struct mlp_fc1 : layer<op::matmul, gemm_shape<8224, 5120, 1280>> {
  static constexpr std::string_view name = "mlp_fc1";
};
struct gelu : layer<op::elementwise> {
  static constexpr std::string_view name = "gelu";
};
// Measured in large ViTs: the second MLP projection's outputs exceed float16's 65504.
struct mlp_fc2 : layer<op::matmul, max_abs<200000>, gemm_shape<8224, 1280, 5120>> {
  static constexpr std::string_view name = "mlp_fc2";
};
struct head : layer<op::matmul, gemm_shape<32, 1000, 1280>> {
  static constexpr std::string_view name = "head";
};
struct cross_entropy : layer<op::loss> {
  static constexpr std::string_view name = "cross_entropy";
};

template <class Map>
void show(const char* title, Map map) {
  std::printf("%s\n%s\n", title,
              describe<patch_embed, norm1, qkv, scores, attn_softmax, mlp_fc1, gelu, mlp_fc2, head,
                       cross_entropy>(map)
                  .c_str());
}

}  // namespace vit

int main() {
  using namespace precis;
  // bf16 everywhere: float's range, so mlp_fc2's activations fit; softmax, norms and the
  // loss compute in float by rule.
  vit::show("bf16_mixed", make_policy_map(presets::bf16_mixed{}));

  // fp16 with the overflowing projection kept in bfloat16. Without that override this map
  // does not compile: precis: the layer declares activations (max_abs<...>) beyond what
  // its storage type holds.
  vit::show("fp16_mixed, mlp_fc2 in bf16",
            make_policy_map(presets::fp16_mixed{}, for_layer<vit::mlp_fc2>(presets::bf16_mixed{})));

  // float8 for the aligned matrix products; the per-head score product (257 x 257 x 80) is
  // not a multiple of 16, and the classifier head (N = 1000) neither: bf16 for those.
  vit::show("fp8_hybrid, misaligned products in bf16",
            make_policy_map(presets::fp8_hybrid{}, for_layer<vit::scores>(presets::bf16_mixed{}),
                            for_layer<vit::head>(presets::bf16_mixed{})));
  return 0;
}
