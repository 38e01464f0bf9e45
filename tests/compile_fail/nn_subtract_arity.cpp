// nn::subtract gives a - b for an edge of two tensors: three do not compile.
#include <precis/precis.hpp>

int main() {
  using namespace precis;
  auto model = nn::build<float, 2>(presets::fp32{},
                                   nn::seq(nn::fork(nn::relu(), nn::tanh(), nn::sigmoid()), nn::subtract()));
  (void)model;
}
