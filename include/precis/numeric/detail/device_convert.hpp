/// @file
/// The GPU's own conversion instructions, used in device code where the architecture has them.
/// Private: the format types call these.
#pragma once

#include <precis/config.hpp>

#include <cstdint>

namespace precis::detail {

/// Hardware round-to-nearest-even from float, where the target architecture has an
/// instruction with precis's semantics (NaN -> canonical NaN, overflow -> infinity).
/// `device_encode_available<F>` says whether `device_encode<F>` may be called.
template <class F>
inline constexpr bool device_encode_available = false;
/// Hardware round-to-nearest-even from float with CUDA's `satfinite` (beyond +-max,
/// infinities included, to +-max; NaN to the canonical NaN): precis::saturate_cast's
/// semantics, which the host encoder gives bit for bit (tests/numeric/test_cuda_oracle.cpp
/// checks it against CUDA's own satfinite conversion). `device_saturate_available<F>` says
/// whether `device_encode_saturate<F>` may be called.
template <class F>
inline constexpr bool device_saturate_available = false;
/// Hardware decode to float, where the architecture has the instruction.
template <class F>
inline constexpr bool device_decode_available = false;

#if defined(__CUDA_ARCH__)
struct float16_format;
struct bfloat16_format;
struct float8_e4m3_format;
struct float8_e5m2_format;

template <>
inline constexpr bool device_encode_available<float16_format> = true;
template <>
inline constexpr bool device_decode_available<float16_format> = true;
#if __CUDA_ARCH__ >= 800
template <>
inline constexpr bool device_encode_available<bfloat16_format> = true;
#endif
#if __CUDA_ARCH__ >= 890
template <>
inline constexpr bool device_decode_available<float8_e4m3_format> = true;
template <>
inline constexpr bool device_decode_available<float8_e5m2_format> = true;
template <>
inline constexpr bool device_saturate_available<float8_e4m3_format> = true;
template <>
inline constexpr bool device_saturate_available<float8_e5m2_format> = true;
#endif

template <class F>
__device__ inline typename F::storage_type device_encode(float x) {
  unsigned short r;
  if constexpr (F::exponent_bits == 5) {
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(x));
  } else {
#if __CUDA_ARCH__ >= 800
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x));
#endif
  }
  return r;
}

template <class F>
__device__ inline typename F::storage_type device_encode_saturate(float x) {
  unsigned short pair = 0;  // the second operand's value in the low byte
#if __CUDA_ARCH__ >= 890
  if constexpr (F::exponent_bits == 4) {
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0F), "f"(x));
  } else {
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0F), "f"(x));
  }
#endif
  return static_cast<typename F::storage_type>(pair & 0xFFU);
}

template <class F>
__device__ inline float device_decode(typename F::storage_type bits) {
  unsigned short h = bits;
  if constexpr (F::total_bits == 8) {
#if __CUDA_ARCH__ >= 890
    unsigned int h2;
    const unsigned short pair = bits;
    if constexpr (F::exponent_bits == 4) {
      asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(pair));
    } else {
      asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(h2) : "h"(pair));
    }
    h = static_cast<unsigned short>(h2 & 0xFFFFU);
#endif
  }
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
#endif

}  // namespace precis::detail
