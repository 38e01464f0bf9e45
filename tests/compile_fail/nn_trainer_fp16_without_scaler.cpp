// Training a model with float16 gradients without a loss scaler does not compile (rule b),
// even when only one layer of the model stores float16.
#include <precis/precis.hpp>

struct half_layer : precis::layer<precis::op::matmul> {};

int main() {
  using namespace precis;
  constexpr auto map = make_policy_map(presets::fp32{}, for_layer<half_layer>(presets::fp16_mixed{}));
  auto model = nn::build<float, 2>(map, nn::seq(nn::linear<half_layer>(4, 4), nn::linear(4, 2)));
  nn::softmax_cross_entropy<presets::fp32> loss;
  sgd opt(model.masters());
  no_scaling scaler;
  nn::trainer tr(model, loss, opt, scaler);
  (void)tr;
}
