// nn::add_all joins tensors of one storage type: a fork whose branches end in float and in
// bfloat16 cannot be added without a cast.
#include <precis/precis.hpp>

struct wide : precis::layer<precis::op::matmul> {};

int main() {
  using namespace precis;
  constexpr auto map = make_policy_map(presets::bf16_mixed{}, for_layer<wide>(presets::fp32{}));
  auto model = nn::build<bfloat16, 2>(map, nn::seq(nn::fork(nn::linear(4, 4), nn::linear<wide>(4, 4)), nn::add_all()));
  (void)model;
}
