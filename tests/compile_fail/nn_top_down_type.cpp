// nn::top_down adds the node's output to the level before it: a node that gives another
// storage type than it reads (a float layer in a bfloat16 pyramid) does not compile.
#include <precis/precis.hpp>

struct wide : precis::layer<precis::op::matmul> {};

int main() {
  using namespace precis;
  constexpr auto map = make_policy_map(presets::bf16_mixed{}, for_layer<wide>(presets::fp32{}));
  auto model = nn::build<bfloat16, 2>(
      map, nn::seq(nn::fork(nn::linear(4, 4), nn::linear(4, 4)), nn::top_down(nn::linear<wide>(4, 4)), nn::add_all()));
  (void)model;
}
