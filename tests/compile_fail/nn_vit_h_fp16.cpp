// The example's ViT blueprint at ViT-H/16 size, its second MLP projection declaring
// activations beyond float16's range (vit::fc2_vit_h), built under a float16 map that leaves
// that layer in float16: rule d does not let it compile (the compiler's note names the
// layer's tag, vit::fc2_vit_h). examples/vit/vit_h.cpp builds it under the map that keeps the
// layer in bfloat16.
#include "../../examples/vit/model.hpp"

int main() {
  using namespace precis;
  using model = nn::model_t<float, 4, presets::fp16_mixed, decltype(vit::blueprint<32, vit::fc2_vit_h>(vit::vit_h16))>;
  static_assert(sizeof(model) > 0);
}
