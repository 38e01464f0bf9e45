// nn::repeat<N>(block) holds N blocks of one type: a block that ends in another storage
// type than it starts with cannot follow itself.
#include <precis/precis.hpp>

struct widened : precis::layer<precis::op::matmul> {};

int main() {
  using namespace precis;
  constexpr auto map = make_policy_map(presets::bf16_mixed{}, for_layer<widened>(presets::fp32{}));
  auto model = nn::build<bfloat16, 2>(map, nn::repeat<3>(nn::seq(nn::linear(4, 4), nn::linear<widened>(4, 4))));
  (void)model;
}
