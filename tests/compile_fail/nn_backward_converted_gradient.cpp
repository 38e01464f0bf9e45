// nn::model::backward on a gradient of another element type does not compile: the
// conversion would copy it into a temporary (and other ranks fail in the conversion).
#include <precis/precis.hpp>

int main() {
  using namespace precis;
  auto model = nn::build<float, 2>(presets::fp32{}, nn::seq(nn::linear(4, 8), nn::relu(), nn::linear(8, 3)));
  cpu_context ctx;
  host_tensor<float, 2> x({16, 4});
  (void)model.forward(ctx, x);
  host_tensor<double, 2> dy({16, 3});
  (void)model.backward(ctx, dy);
}
