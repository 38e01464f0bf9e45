// Compiled (not run) by CTest after `example_vit --monitor --advise` (example_vit_monitor),
// from the header that run wrote (fresh_advice.hpp, not the committed advised_map.hpp):
// the ViT built under the map the advisor wrote, with the measured ranges in view, must
// compile: the advice passes every rule for the model it was measured on.
#include "model.hpp"

#include "fresh_advice.hpp"

int main() {
  const vit::config vc;
  auto model =
      precis::nn::build<precis::nn::activation_type_t<decltype(advised_map)::default_policy>, 4>(
          advised_map, vit::blueprint<4>(vc), {.seed = 1});
  return model.parameter_count() == 0 ? 1 : 0;
}
