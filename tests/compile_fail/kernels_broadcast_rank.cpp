// add with a broadcast operand of higher rank than the other.
#include <precis/kernels/elementwise.hpp>
void f(const precis::cpu_context& ctx) {
  precis::host_tensor<float, 1> a, out;
  precis::host_tensor<float, 2> b;
  precis::add<precis::presets::fp32>(ctx, a, b, out);
}
