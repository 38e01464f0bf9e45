// nn layers keep activations in 16- or 32-bit types: a model built under fp8_hybrid (float8
// storage for matrix products) does not compile until the layer's products take float8
// inputs with their own scaling recipes.
#include <precis/precis.hpp>

int main() {
  using namespace precis;
  auto model = nn::build<bfloat16, 2>(presets::fp8_hybrid{}, nn::linear(16, 16));
  (void)model;
}
