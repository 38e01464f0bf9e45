// nn::each applies node i to tensor i of a multi-tensor edge: three nodes for a two-tensor
// edge do not compile.
#include <precis/precis.hpp>

int main() {
  using namespace precis;
  auto model = nn::build<float, 2>(presets::fp32{}, nn::seq(nn::fork(nn::linear(4, 4), nn::linear(4, 4)),
                                                            nn::each(nn::relu(), nn::relu(), nn::relu())));
  (void)model;
}
