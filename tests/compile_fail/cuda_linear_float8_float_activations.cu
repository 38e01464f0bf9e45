// A float8 linear layer on the device with float activations: cuBLASLt's float8 products
// write bfloat16 or float16 here (a float output would take only a bfloat16 bias).
#include <precis/nn/cuda.hpp>  // first: the device kernels, then nn

struct fc : precis::layer<precis::op::matmul> {
  static constexpr std::string_view name = "fc";
};

// fp8_hybrid's formats with float activations.
using fp8_float = precis::policy<precis::float8_e4m3, float, float, float, precis::float8_e5m2,
                                 precis::recipe::delayed>;

void f(precis::cuda_context& ctx, const precis::device_tensor<float, 2>& x) {
  auto model = precis::nn::build<float, 2, precis::cuda_context>(fp8_float{}, precis::nn::linear<fc>(16, 16));
  (void)model.forward(ctx, x);
}
