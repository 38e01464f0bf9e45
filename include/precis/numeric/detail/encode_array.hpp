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

#if defined(__F16C__) && defined(__AVX2__)
#include <immintrin.h>
#endif

namespace precis::detail {

template <class F, rounding R, overflow O>
void encode_array(const float* src, typename F::storage_type* dst, std::size_t n) {
  std::size_t i = 0;
#if defined(__F16C__) && defined(__AVX2__)
  if constexpr (F::exponent_bits == 5 && F::mantissa_bits == 10 &&
                R == rounding::nearest_even && O == overflow::infinity) {
    const __m128i canonical_nan = _mm_set1_epi16(static_cast<short>(F::quiet_nan_bits));
    for (; i + 8 <= n; i += 8) {
      const __m256 x = _mm256_loadu_ps(src + i);
      const __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
      const __m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(_mm256_castps_si256(nan)),
                                            _mm256_extracti128_si256(_mm256_castps_si256(nan), 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm_blendv_epi8(h, canonical_nan, nan16));
    }
  }
#endif
  for (; i < n; ++i) dst[i] = encode<F, R, O>(src[i]);
}

}  // namespace precis::detail
