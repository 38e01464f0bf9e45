// A ViT-H/16 whose second MLP projection declares activations beyond float16's range,
// built under a float16 map that leaves that layer in float16: rule d does not let it
// compile (the compiler's note names the layer's tag, vit_mlp_fc2).
#include <precis/precis.hpp>

struct vit_mlp_fc2 : precis::layer<precis::op::matmul, precis::max_abs<200000>> {};

int main() {
  using namespace precis;
  constexpr std::size_t width = 1280, heads = 16;
  auto block = nn::seq(nn::residual(nn::seq(nn::layer_norm(width), nn::attention(width, heads))),
                       nn::residual(nn::seq(nn::layer_norm(width), nn::linear(width, 4 * width), nn::gelu(),
                                            nn::linear<vit_mlp_fc2>(4 * width, width))));
  auto vit_h = nn::seq(nn::patchify(16), nn::linear(3 * 16 * 16, width), nn::class_token(width),
                       nn::position_embedding(197, width), nn::repeat<32>(block), nn::layer_norm(width),
                       nn::select_token(0), nn::linear(width, 1000));
  using model = nn::model_t<float, 4, presets::fp16_mixed, decltype(vit_h)>;
  static_assert(sizeof(model) > 0);
}
