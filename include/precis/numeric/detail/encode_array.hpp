// precis/numeric/detail/encode_array.hpp: rounding whole float arrays to a format, fast.
// Private: used by precis::convert.
//
// The scalar encoder is branch-free integer code, which compilers vectorise. Where the
// target has the F16C instructions, float16 uses the hardware conversion instead (it
// rounds to nearest-even, keeps subnormals and overflows to infinity: precis's
// semantics, once NaN results are made canonical).
#pragma once

#include <precis/numeric/detail/encoding.hpp>

#include <cstddef>
#include <cstdint>

#include <precis/numeric/detail/f16c.hpp>

namespace precis::detail {

template <class F, rounding R, overflow O>
void encode_array(const float* src, typename F::storage_type* dst, std::size_t n) {
  std::size_t i = 0;
#if PRECIS_HAVE_F16C
  if constexpr (F::exponent_bits == 5 && F::mantissa_bits == 10 &&
                R == rounding::nearest_even && O == overflow::infinity) {
    for (; i + 8 <= n; i += 8) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), f16c::encode8(_mm256_loadu_ps(src + i)));
    }
  }
#endif
  for (; i < n; ++i) dst[i] = encode<F, R, O>(src[i]);
}

}  // namespace precis::detail
