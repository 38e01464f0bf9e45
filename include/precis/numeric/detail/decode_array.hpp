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

#include <precis/numeric/detail/f16c.hpp>

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
#if PRECIS_HAVE_F16C
    if constexpr (F::exponent_bits == 5 && F::mantissa_bits == 10) {
      for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(dst + i, f16c::decode8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
      }
    }
#endif
    for (; i < n; ++i) dst[i] = decode<F>(src[i]);
  }
}

}  // namespace precis::detail
