// nn layers keep float master weights: presets::bf16_pure (bfloat16 masters, rule f
// waived) is refused by nn's parameters.
#include <precis/precis.hpp>

int main() {
  using namespace precis;
  auto model = nn::build<bfloat16, 2>(presets::bf16_pure{}, nn::linear(16, 16));
  (void)model;
}
