// Training a model with float16 gradients without a loss scaler does not compile (rule b),
// even when only one layer of the model stores float16.
#include <precis/precis.hpp>

int main() {
  using namespace precis;
  auto model = nn::make_sequential(nn::linear<presets::fp16_mixed>(4, 4), nn::cast<float16, float, float16, float>{},
                                   nn::linear<presets::fp32>(4, 2));
  nn::softmax_cross_entropy<presets::fp32> loss;
  sgd opt(model.masters());
  no_scaling scaler;
  nn::trainer tr(model, loss, opt, scaler);
  (void)tr;
}
