/// @file
/// Decoding whole arrays to float, fast. Private: used by precis::convert.
///
/// A decoder's subnormal branch needs a normalisation that compilers will not
/// vectorise without giving up on floating-point traps, so arrays take other routes:
/// bfloat16 is a shift; 8-bit formats read a 256-entry table; float16 uses the F16C
/// instructions where the target has them (their NaN results are made canonical, as the
/// scalar decoder's are), and otherwise a branch-free form the compiler vectorises, in
/// which a subnormal is its mantissa converted to float (exact) times 2^-24: a normal
/// float, so flush-to-zero and denormals-are-zero modes cannot change it.
#pragma once

#include <precis/numeric/detail/encoding.hpp>

#include <array>
#include <bit>
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

/// float16 bits to float without branches (see the file comment); NaN gives the
/// canonical 0x7FFFFFFF, as decode<F> does.
inline float decode_float16_branch_free(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000U) << 16;
  const std::uint32_t e = (h >> 10) & 0x1FU, m = h & 0x3FFU;
  // All-ones masks rather than conditionals, which compilers do not if-convert here.
  const std::uint32_t sub = 0U - std::uint32_t(e == 0), special = 0U - std::uint32_t(e == 31);
  const std::uint32_t nan = special & (0U - std::uint32_t(m != 0));
  const std::uint32_t normal = sign | ((e + 112U) << 23) | (m << 13);
  const std::uint32_t subnormal = sign | std::bit_cast<std::uint32_t>(float(m) * 0x1p-24F);
  const std::uint32_t infinity = sign | 0x7F800000U;
  return std::bit_cast<float>((subnormal & sub) | (normal & ~(sub | special)) | (infinity & special & ~nan) |
                              (0x7FFFFFFFU & nan));
}

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
    if constexpr (F::exponent_bits == 5 && F::mantissa_bits == 10) {
      for (; i < n; ++i) dst[i] = decode_float16_branch_free(src[i]);
    } else {
      for (; i < n; ++i) dst[i] = decode<F>(src[i]);
    }
  }
}

}  // namespace precis::detail
