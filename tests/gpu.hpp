// How the device tests find out whether they can run, and tell CTest when they cannot; the
// seed of their random data.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace precis_test {

/// The device tests' random seed: PRECIS_TEST_SEED where set, else a fixed one, so that a
/// failure seen on a GPU can be run again on the same data. Printed where it is taken.
inline std::uint32_t test_seed() {
  const char* env = std::getenv("PRECIS_TEST_SEED");
  const std::uint32_t seed = env != nullptr ? std::uint32_t(std::strtoul(env, nullptr, 10)) : 20261207U;
  std::printf("random data from seed %u (PRECIS_TEST_SEED)\n", unsigned(seed));
  return seed;
}

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
