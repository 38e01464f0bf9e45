/// @file
/// Version, host/device annotations, feature macros and the error type.
#pragma once

#include <stdexcept>
#include <string>

/// Major version: changes with incompatible API changes.
#define PRECIS_VERSION_MAJOR 0
/// Minor version: changes with compatible additions.
#define PRECIS_VERSION_MINOR 1
/// Patch version: changes with compatible fixes.
#define PRECIS_VERSION_PATCH 0
/// Version as one integer: major * 10000 + minor * 100 + patch.
#define PRECIS_VERSION \
  (PRECIS_VERSION_MAJOR * 10000 + PRECIS_VERSION_MINOR * 100 + PRECIS_VERSION_PATCH)

/// Marks a function usable from host and device code. Under nvcc it expands to
/// `__host__ __device__ inline`; elsewhere to `inline`.
#if defined(__CUDACC__)
#define PRECIS_HOST_DEVICE __host__ __device__ inline
#else
#define PRECIS_HOST_DEVICE inline
#endif

/// 1 when this translation unit is compiled for a device (nvcc's device pass), else 0.
#if defined(__CUDA_ARCH__)
#define PRECIS_DEVICE_CODE 1
#else
#define PRECIS_DEVICE_CODE 0
#endif

/// 1 when CUDA's type headers (<cuda_fp16.h>, <cuda_bf16.h>, <cuda_fp8.h>) are to be
/// included, giving the conversions between precis's formats and CUDA's types. On by
/// default under nvcc; the `precis::cuda` CMake target defines PRECIS_CUDA=1 for host code.
#if !defined(PRECIS_CUDA)
#if defined(__CUDACC__)
#define PRECIS_CUDA 1
#else
#define PRECIS_CUDA 0
#endif
#endif

/// 1 when the CPU's bfloat16 dot-product instructions are reached through oneDNN (hardware
/// products, precis::products::hardware). The `precis::onednn` CMake target defines it;
/// without it hardware products run precis's exact kernel. Every translation unit of a
/// program must see the same value (the kernels' inline functions depend on it).
#if !defined(PRECIS_HAS_ONEDNN)
#define PRECIS_HAS_ONEDNN 0
#endif

namespace precis {

/// Every runtime failure precis reports (bad shapes, bad checkpoints, size mismatches)
/// is a `precis::error` or derives from it; its message says what was expected and what
/// was found.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
/// false for every T: the condition of a static_assert that fires only where the template
/// holding it is instantiated (a refused overload's body).
template <class T>
inline constexpr bool dependent_false_v = false;
}  // namespace detail

}  // namespace precis
