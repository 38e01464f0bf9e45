// Only nn::linear (and attention's projections, which are linear layers) take float8
// inputs in their products: a convolution under fp8_hybrid (float8 storage for op::conv)
// does not compile.
#include <precis/precis.hpp>

int main() {
  using namespace precis;
  auto model = nn::build<bfloat16, 4>(presets::fp8_hybrid{}, nn::conv2d(16, 16, 3));
  (void)model;
}
