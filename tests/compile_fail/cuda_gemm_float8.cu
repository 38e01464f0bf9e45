// A device product of float8 tensors through precis::gemm: float8 needs per-tensor scales.
#include <precis/kernels/cuda/gemm.hpp>
void f(precis::cuda_context& ctx) {
  precis::device_tensor<precis::float8_e4m3, 2> a, b;
  precis::device_tensor<precis::bfloat16, 2> c;
  precis::gemm<precis::presets::fp8_hybrid>(ctx, a, b, c);
}
