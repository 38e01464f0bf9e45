// nn::model::forward on a tensor of another element type does not compile: the conversion
// would make a temporary copy, whose address the layers keep for backward() after it is gone.
#include <precis/precis.hpp>

int main() {
  using namespace precis;
  auto model = nn::build<float, 2>(presets::fp32{}, nn::seq(nn::linear(4, 8), nn::relu(), nn::linear(8, 3)));
  cpu_context ctx;
  host_tensor<double, 2> x({16, 4});
  (void)model.forward(ctx, x);
}
