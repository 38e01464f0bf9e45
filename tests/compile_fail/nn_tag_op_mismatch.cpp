// A layer's tag names the operation kind its precision is resolved for: a linear layer
// tagged as a softmax does not compile.
#include <precis/precis.hpp>

struct mislabelled : precis::layer<precis::op::softmax> {};

int main() {
  using namespace precis;
  auto model = nn::build<float, 2>(presets::fp32{}, nn::linear<mislabelled>(4, 4));
  (void)model;
}
