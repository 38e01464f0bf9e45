// How the device tests find out whether they can run, and tell CTest when they cannot; the
// seed of their random data.
#pragma once

#include <cuda_runtime.h>

#include "seed.hpp"

#include <cstdint>
#include <cstdio>

namespace precis_test {

/// The device tests' random seed, as tests/random.hpp's for the host tests: afresh each run
/// and printed ("random seed N"), PRECIS_TEST_SEED=N replays a run (a failure seen on a GPU
/// runs again on the same data).
inline std::uint32_t test_seed() {
  const auto seed = std::uint32_t(seed_from_environment());
  std::printf("random seed %u\n", unsigned(seed));
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
