// nn::evaluate with its inputs and targets swapped does not compile (xtensor would convert
// each into the other's type and rank, and fail at run time).
#include <precis/precis.hpp>

#include <cstdint>

int main() {
  using namespace precis;
  auto model = nn::build<float, 2>(presets::fp32{}, nn::seq(nn::linear(4, 8), nn::relu(), nn::linear(8, 3)));
  nn::softmax_cross_entropy<presets::fp32> loss;
  cpu_context ctx;
  host_tensor<float, 2> x({16, 4});
  host_tensor<std::int32_t, 1> y({16});
  (void)nn::evaluate(ctx, model, loss, y, x);
}
