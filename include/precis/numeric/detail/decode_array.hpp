// precis/numeric/detail/decode_array.hpp: decoding whole arrays to float, fast. Private:
// used by precis::convert.
//
// A decoder's subnormal branch needs a normalisation that compilers will not
// vectorise without giving up on floating-point traps, so arrays take other routes:
// bfloat16 is a shift; 8-bit formats read a 256-entry table; float16 uses the F16C
// instructions where the target has them (their NaN results are made canonical, as the
// scalar decoder's are), and the scalar decoder otherwise.
#pragma once

#include <precis/numeric/detail/encoding.hpp>

#include <array>
#include <cstddef>
#include <cstdint>

#if defined(__F16C__) && defined(__AVX__)
#include <immintrin.h>
#endif

namespace precis::detail {

template <class F>
inline constexpr std::array<float, 256> decode_table = [] {
  std::array<float, 256> t{};
  for (unsigned b = 0; b < 256; ++b) t[b] = decode<F>(static_cast<typename F::storage_type>(b));
  return t;
}();

template <class F>
void decode_array(const typename F::storage_type* src, float* dst, std::size_t n) {
  if constexpr (F::total_bits == 8) {
    const auto& table = decode_table<F>;
    for (std::size_t i = 0; i < n; ++i) dst[i] = table[src[i]];
  } else {
    std::size_t i = 0;
#if defined(__F16C__) && defined(__AVX__)
    if constexpr (F::exponent_bits == 5 && F::mantissa_bits == 10) {
      const __m256 canonical_nan = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
      for (; i + 8 <= n; i += 8) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
        const __m256 f = _mm256_cvtph_ps(h);
        const __m256 nan = _mm256_cmp_ps(f, f, _CMP_UNORD_Q);
        _mm256_storeu_ps(dst + i, _mm256_blendv_ps(f, canonical_nan, nan));
      }
    }
#endif
    for (; i < n; ++i) dst[i] = decode<F>(src[i]);
  }
}

}  // namespace precis::detail
