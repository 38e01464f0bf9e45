// nn layers keep float master weights: presets::bf16_pure (bfloat16 masters, rule f
// waived) is refused by nn's parameters.
#include <precis/precis.hpp>

int main() {
  using namespace precis;
  nn::linear<presets::bf16_pure> layer(16, 16);
  (void)layer;
}
