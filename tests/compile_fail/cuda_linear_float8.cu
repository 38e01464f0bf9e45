// A float8 linear layer on the device with current scaling: the device's float8 recipes are
// delayed (presets::fp8_hybrid's); current scaling runs on the host so far.
#include <precis/nn/cuda.hpp>  // first: the device kernels, then nn

struct fc : precis::layer<precis::op::matmul> {
  static constexpr std::string_view name = "fc";
};

using fp8_current = precis::policy<precis::float8_e4m3, precis::bfloat16, float, float, precis::float8_e5m2,
                                   precis::recipe::current>;

void f() {
  auto model = precis::nn::build<precis::bfloat16, 2, precis::cuda_context>(fp8_current{}, precis::nn::linear<fc>(16, 16));
  (void)model;
}
