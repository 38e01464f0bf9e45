// gemm under a bfloat16 policy given float16 tensors.
#include <precis/kernels/gemm.hpp>
void f(const precis::cpu_context& ctx) {
  precis::host_tensor<precis::float16, 2> a, b;
  precis::host_tensor<precis::float16, 2> c;
  precis::gemm<precis::presets::bf16_mixed>(ctx, a, b, c);
}
