// A float8 linear layer built on the device: its float8 products run on the host so far.
#include <precis/nn/cuda.hpp>  // first: the device kernels, then nn

struct fc : precis::layer<precis::op::matmul> {
  static constexpr std::string_view name = "fc";
};

void f() {
  auto model = precis::nn::build<precis::bfloat16, 2, precis::cuda_context>(precis::presets::fp8_hybrid{},
                                                                            precis::nn::linear<fc>(16, 16));
  (void)model;
}
