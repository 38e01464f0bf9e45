// The trainer's loss must read the model's output type: a bfloat16 model with a float
// loss does not compile (insert the cast in the model, or give the loss the last layer's
// policy).
#include <precis/precis.hpp>

int main() {
  using namespace precis;
  auto model = nn::make_sequential(nn::linear<presets::bf16_mixed>(4, 2));
  nn::softmax_cross_entropy<presets::fp32> loss;
  sgd opt(model.masters());
  no_scaling scaler;
  nn::trainer tr(model, loss, opt, scaler);
  (void)tr;
}
