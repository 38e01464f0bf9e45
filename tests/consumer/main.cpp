// Uses the installed headers: precis::bfloat16 holds 1.5 exactly. Built against
// precis::cuda, it also links the CUDA runtime (its version query needs no GPU).
#include <precis/precis.hpp>

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
  precis::bfloat16 x(1.5f);
  return static_cast<float>(x) == 1.5f ? 0 : 1;
}
