// A device product of a bfloat16 and a float operand: cuBLASLt multiplies one type.
#include <precis/kernels/cuda/gemm.hpp>
void f(precis::cuda_context& ctx) {
  precis::device_tensor<precis::bfloat16, 2> a, c;
  precis::device_tensor<float, 2> b;
  precis::gemm<precis::presets::bf16_mixed>(ctx, a, b, c);
}
