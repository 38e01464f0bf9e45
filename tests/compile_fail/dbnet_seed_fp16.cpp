// The DBNet example's seed configuration, the one whose float16 H-mean collapsed: float16
// storage everywhere, the loss terms and the binarization's exp computed in float16, no loss
// scaler. It does not compile: rule fp32_operation for the loss (dbnet::db_loss) and for the
// binarization (dbnet::binarize), rule unscaled_gradients for the float16 gradients.
// examples/dbnet/train_dbnet.cpp trains it only with the three rules waived.
#include "../../examples/dbnet/loss.hpp"
#include "../../examples/dbnet/model.hpp"

int main() {
  using namespace precis;
  using half_everything = policy<float16, float16, float16, float, float16>;
  using map = decltype(make_policy_map(presets::fp16_mixed{}, for_layer<dbnet::db_loss>(half_everything{}),
                                       for_layer<dbnet::binarize>(half_everything{})));
  auto model = nn::build<float16, 4>(map{}, dbnet::blueprint({.width = 8, .inner = 32}));
  dbnet::loss_t<map, decltype(model)> loss;
  adamw opt(model.masters());
  no_scaling scaler;
  nn::trainer tr(model, loss, opt, scaler);
  (void)tr;
}
