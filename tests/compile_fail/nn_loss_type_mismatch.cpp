// The trainer's loss must read the model's output type: a bfloat16 model with a float
// loss does not compile (give the loss's tag the last layer's policy, or end the model in
// float).
#include <precis/precis.hpp>

int main() {
  using namespace precis;
  auto model = nn::build<bfloat16, 2>(presets::bf16_mixed{}, nn::linear(4, 2));
  nn::softmax_cross_entropy<presets::fp32> loss;
  sgd opt(model.masters());
  no_scaling scaler;
  nn::trainer tr(model, loss, opt, scaler);
  (void)tr;
}
