// nn::trainer::step with its inputs and targets swapped does not compile: xtensor's
// converting constructors would otherwise turn the rank-1 labels into the rank-2 input (and
// the reverse) as temporary copies, failing at run time.
#include <precis/precis.hpp>

#include <cstdint>

int main() {
  using namespace precis;
  auto model = nn::build<float, 2>(presets::fp32{}, nn::seq(nn::linear(4, 8), nn::relu(), nn::linear(8, 3)));
  nn::softmax_cross_entropy<presets::fp32> loss;
  sgd opt(model.masters());
  no_scaling scaler;
  nn::trainer tr(model, loss, opt, scaler);
  cpu_context ctx;
  host_tensor<float, 2> x({16, 4});
  host_tensor<std::int32_t, 1> y({16});
  (void)tr.step(ctx, y, x);
}
