// A scaled cast to bfloat16: scaled_cast_async is the float8 cast of a scaling recipe.
#include <precis/kernels/cuda/scaling_kernels.hpp>
void f(precis::cuda_context& ctx, const float* scale, float* amax) {
  precis::device_tensor<float, 1> x;
  precis::device_tensor<precis::bfloat16, 1> y;
  precis::scaled_cast_async(ctx, x, y, scale, amax);
}
