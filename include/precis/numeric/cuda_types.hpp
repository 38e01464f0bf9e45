/// @file
/// Bit-exact conversions between precis's formats and CUDA's own types (__half, __nv_bfloat16,
/// __nv_fp8_e4m3, __nv_fp8_e5m2).
///
/// Available when CUDA's headers are: under nvcc, with PRECIS_CUDA=1 (the precis::cuda
/// CMake target defines it), or when <cuda_fp16.h> etc. were included before this header.
#pragma once

#include <precis/config.hpp>
#include <precis/numeric/bfloat16.hpp>
#include <precis/numeric/float16.hpp>
#include <precis/numeric/float8.hpp>

#if PRECIS_CUDA
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#endif

namespace precis {

// to_cuda(x) gives CUDA's type with the same bits; from_cuda(c) gives precis's type with
// the same bits. Nothing is rounded, NaN payloads included.

#if defined(__CUDA_FP16_H__)
PRECIS_HOST_DEVICE __half to_cuda(float16 x) {
  __half_raw r;
  r.x = x.bits();
  return __half(r);
}
PRECIS_HOST_DEVICE float16 from_cuda(__half x) {
  return float16::from_bits(static_cast<__half_raw>(x).x);
}
#endif

#if defined(__CUDA_BF16_H__)
PRECIS_HOST_DEVICE __nv_bfloat16 to_cuda(bfloat16 x) {
  __nv_bfloat16_raw r;
  r.x = x.bits();
  return __nv_bfloat16(r);
}
PRECIS_HOST_DEVICE bfloat16 from_cuda(__nv_bfloat16 x) {
  return bfloat16::from_bits(static_cast<__nv_bfloat16_raw>(x).x);
}
#endif

#if defined(__CUDA_FP8_H__)
PRECIS_HOST_DEVICE __nv_fp8_e4m3 to_cuda(float8_e4m3 x) {
  __nv_fp8_e4m3 r;
  r.__x = x.bits();
  return r;
}
PRECIS_HOST_DEVICE float8_e4m3 from_cuda(__nv_fp8_e4m3 x) { return float8_e4m3::from_bits(x.__x); }
PRECIS_HOST_DEVICE __nv_fp8_e5m2 to_cuda(float8_e5m2 x) {
  __nv_fp8_e5m2 r;
  r.__x = x.bits();
  return r;
}
PRECIS_HOST_DEVICE float8_e5m2 from_cuda(__nv_fp8_e5m2 x) { return float8_e5m2::from_bits(x.__x); }
#endif

}  // namespace precis
