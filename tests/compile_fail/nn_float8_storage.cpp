// nn layers keep activations in 16- or 32-bit types: a linear layer under a float8 policy
// does not compile (float8 belongs to kernel-level matrix products with a scaling recipe).
#include <precis/precis.hpp>

int main() {
  using namespace precis;
  nn::linear<presets::fp8_hybrid> layer(16, 16);
  (void)layer;
}
