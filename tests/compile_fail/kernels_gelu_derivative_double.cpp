// gelu_with_derivative under a policy whose elementwise math is double: the one-pass form
// exists for float math only.
#include <precis/kernels/elementwise.hpp>
void f(const precis::cpu_context& ctx) {
  precis::host_tensor<double, 1> x, y;
  precis::host_tensor<float, 1> d;
  precis::gelu_with_derivative<precis::policy<double, double, double, double>>(ctx, x, y, d);
}
