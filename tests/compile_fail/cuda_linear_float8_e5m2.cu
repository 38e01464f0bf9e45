// A float8 linear layer on the device stored in float8_e5m2 (its policy's rule on the forward
// format waived): cuBLASLt refuses e5m2 x e5m2 products, so the device layer takes e4m3.
#include <precis/nn/cuda.hpp>  // first: the device kernels, then nn

struct fc : precis::layer<precis::op::matmul> {
  static constexpr std::string_view name = "fc";
};

using fp8_e5m2 = precis::unsafe<precis::policy<precis::float8_e5m2, precis::bfloat16, float, float,
                                               precis::float8_e5m2, precis::recipe::delayed>,
                                precis::rule::e5m2_forward>;

void f() {
  auto model = precis::nn::build<precis::bfloat16, 2, precis::cuda_context>(fp8_e5m2{}, precis::nn::linear<fc>(16, 16));
  (void)model;
}
