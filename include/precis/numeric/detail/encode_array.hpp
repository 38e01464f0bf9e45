/// @file
/// Rounding whole float arrays to a format, fast. Private: used by precis::convert.
///
/// Where the target has the F16C instructions, float16 uses the hardware conversion (it
/// rounds to nearest-even, keeps subnormals and overflows to infinity: precis's semantics,
/// once NaN results are made canonical). Otherwise rounding to nearest-even goes through
/// encode_nearest_vector below, and the other modes through the scalar encoder (branch-free
/// integer code, which compilers vectorise where the target has per-lane variable shifts,
/// AVX2 or later, and which stays scalar on baseline x86-64).
#pragma once

#include <precis/numeric/detail/encoding.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>

#include <precis/numeric/detail/f16c.hpp>

namespace precis::detail {

/// float -> F (float16 or a float8 format) rounded to nearest-even, the same bits as
/// encode<F, rounding::nearest_even, O>, written with no per-lane variable shift, so that
/// compilers vectorise it with SSE2 alone (4x the scalar encoder there; on AVX2 a little
/// faster than the vectorised scalar encoder for float8):
/// - a result in F's normal range is rounded on the bit pattern with constant shifts (add
///   just under half of the dropped part, plus the lowest kept bit, then shift);
/// - a result in F's subnormal range is |x| times 2^(bias - 1 + m) (exact: a power of two,
///   result normal), truncated to an integer (truncation does not depend on the rounding
///   mode) and rounded up when the remainder, exact as well, is above one half or is one
///   half after an odd integer.
/// No step rounds, and no step makes or reads a subnormal float except |x| itself, which
/// rounds to zero in F either way: the rounding mode, flush-to-zero and
/// denormals-are-zero do not change the result (checked on all 2^32 inputs under each).
/// Selects are written as masks, which compilers vectorise where they would not convert
/// the equivalent conditionals.
template <class F, overflow O>
inline typename F::storage_type encode_nearest_vector(float x) {
  using U = std::uint32_t;
  static_assert(F::exponent_bits < 8 && F::total_bits <= 16,
                "precis: the vector encoder is for float16 and the float8 formats");
  constexpr int m = F::mantissa_bits, drop = 23 - m;
  constexpr U rebias = U(127 - F::exponent_bias);
  constexpr U min_normal = (rebias + 1) << 23;  // F's smallest normal, as float bits
  constexpr float scale = std::bit_cast<float>(U(127 + F::exponent_bias - 1 + m) << 23);
  const U u = std::bit_cast<U>(x);
  const U a = u & 0x7FFFFFFFU;
  const U small = U(0) - U(a < min_normal);  // all ones where the result is subnormal
  const U normal_bits =
      ((a + ((U(1) << (drop - 1)) - 1U) + ((a >> drop) & 1U)) >> drop) - (rebias << m);
  // Only small magnitudes are converted to an integer, so the conversion is in range.
  const float t = std::bit_cast<float>(a & small) * scale;
  const std::int32_t k = std::int32_t(t);
  const float rest = t - float(k);
  const U up = U(rest > 0.5F) | (U(rest == 0.5F) & U(k));
  const U subnormal_bits = U(k) + (up & 1U);  // 2^m, the smallest normal, when it rounds up
  U result = (subnormal_bits & small) | (normal_bits & ~small);
  // Overflow, sign and NaN as encode_bits treats them.
  constexpr U infinite_result = F::has_infinity ? U(F::infinity_bits) : U(F::quiet_nan_bits);
  constexpr U overflow_result = O == overflow::saturate ? U(F::max_bits) : infinite_result;
  const U over = U(0) - U(result > U(F::max_bits));
  result = (overflow_result & over) | (result & ~over);
  result |= (u >> 31) << (F::total_bits - 1);
  const U nan = U(0) - U(a > 0x7F800000U);
  result = (U(F::quiet_nan_bits) & nan) | (result & ~nan);
  return typename F::storage_type(result);
}

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
  if constexpr (R == rounding::nearest_even && F::exponent_bits < 8) {
    for (; i < n; ++i) dst[i] = encode_nearest_vector<F, O>(src[i]);
  } else {
    for (; i < n; ++i) dst[i] = encode<F, R, O>(src[i]);
  }
}

}  // namespace precis::detail
