// Uses the installed headers: precis::bfloat16 holds 1.5 exactly. Built against
// precis::cuda, it also links the CUDA runtime (its version query needs no GPU); against
// precis::onednn, it runs a bfloat16 product with hardware products (oneDNN where the CPU
// has bfloat16 instructions) and says which engine ran.
#include <precis/precis.hpp>

#include <cstdio>

#if PRECIS_CUDA
#include <cuda_runtime_api.h>
#endif

int main() {
#if PRECIS_CUDA
  int runtime_version = 0;
  if (cudaRuntimeGetVersion(&runtime_version) != cudaSuccess || runtime_version <= 0) {
    return 1;
  }
#endif
#if PRECIS_HAS_ONEDNN
  {
    auto a = precis::host_tensor<precis::bfloat16, 2>::from_shape({3, 2});
    auto b = precis::host_tensor<precis::bfloat16, 2>::from_shape({2, 4});
    auto c = precis::host_tensor<float, 2>::from_shape({3, 4});
    a.fill(precis::bfloat16(1.5f));
    b.fill(precis::bfloat16(2.0f));
    precis::gemm<precis::presets::bf16_mixed>(precis::cpu_context{1}, a, b, c);
    std::printf("hardware products: %s\n", precis::cpu_products_engine().c_str());
    for (const float v : c) {
      if (v != 6.0f) return 1;
    }
  }
#endif
  precis::bfloat16 x(1.5f);
  return static_cast<float>(x) == 1.5f ? 0 : 1;
}
