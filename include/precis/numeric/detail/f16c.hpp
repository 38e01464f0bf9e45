/// @file
/// Eight float16 conversions at a time with the x86 F16C instructions, where the target has them
/// (PRECIS_HAVE_F16C). Private.
///
/// The instructions round to nearest-even, keep subnormals and overflow to infinity, as
/// precis does; their NaN results keep payloads, so NaNs are made canonical here to give
/// the same bits as precis's scalar conversions.
#pragma once

#if defined(__F16C__) && defined(__AVX2__)
#define PRECIS_HAVE_F16C 1
#include <immintrin.h>

namespace precis::detail::f16c {

/// Eight floats to float16 bit patterns, NaN -> 0x7FFF.
inline __m128i encode8(__m256 x) {
  const __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  const __m128i nan16 =
      _mm_packs_epi32(_mm256_castsi256_si128(nan), _mm256_extracti128_si256(nan, 1));
  return _mm_blendv_epi8(h, _mm_set1_epi16(0x7FFF), nan16);
}

/// Eight float16 bit patterns to floats, NaN -> 0x7FFFFFFF.
inline __m256 decode8(__m128i h) {
  const __m256 f = _mm256_cvtph_ps(h);
  const __m256 nan = _mm256_cmp_ps(f, f, _CMP_UNORD_Q);
  return _mm256_blendv_ps(f, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF)), nan);
}

/// Lanes (16-bit) whose float16 pattern is infinite or NaN, as all-ones.
inline __m128i nonfinite8(__m128i h) {
  const __m128i e = _mm_and_si128(h, _mm_set1_epi16(0x7C00));
  return _mm_cmpeq_epi16(e, _mm_set1_epi16(0x7C00));
}

}  // namespace precis::detail::f16c
#else
#define PRECIS_HAVE_F16C 0
#endif
