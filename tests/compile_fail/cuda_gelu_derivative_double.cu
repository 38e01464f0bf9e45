// gelu_with_derivative on the device under a policy whose elementwise math is double: the
// one-pass form exists for float math only, on the device as on the host.
#include <precis/kernels/cuda/elementwise.hpp>
void f(precis::cuda_context& ctx) {
  precis::device_tensor<double, 1> x, y;
  precis::device_tensor<float, 1> d;
  precis::gelu_with_derivative<precis::policy<double, double, double, double>>(ctx, x, y, d);
}
