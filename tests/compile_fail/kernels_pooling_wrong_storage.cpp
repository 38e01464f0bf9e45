// Pooling under a float16 policy given bfloat16 tensors.
#include <precis/kernels/pooling.hpp>
void f(const precis::cpu_context& ctx) {
  precis::host_tensor<precis::bfloat16, 4> x, y;
  precis::max_pool2d<precis::presets::fp16_mixed>(ctx, x, y, {});
}
