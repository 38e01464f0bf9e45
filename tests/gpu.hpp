// How the device tests find out whether they can run, and tell CTest when they cannot.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>

namespace precis_test {

/// The exit code CTest reads as "skipped" (SKIP_RETURN_CODE of the tests labelled gpu).
inline constexpr int skipped = 77;

/// True when a CUDA device can be used; otherwise prints why and returns false.
inline bool have_gpu() {
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess || devices == 0) {
    std::printf("skipped: no CUDA device (%s)\n",
                status != cudaSuccess ? cudaGetErrorString(status) : "none found");
    return false;
  }
  return true;
}

}  // namespace precis_test
