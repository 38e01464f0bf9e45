// A chain whose neighbouring layers store different types does not compile: the cast
// between them must be visible (nn::sequential inserts it).
#include <precis/precis.hpp>

int main() {
  using namespace precis;
  nn::chain<nn::linear<presets::bf16_mixed>, nn::linear<presets::fp32>> model(
      nn::linear<presets::bf16_mixed>(4, 4), nn::linear<presets::fp32>(4, 2));
  (void)model;
}
