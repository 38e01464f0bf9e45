/// @file
/// IEEE 754 binary16.
#pragma once

#include <precis/numeric/detail/float_base.hpp>

#include <cstdint>
#include <limits>

namespace precis {
namespace detail {

struct float16_format : binary_format<std::uint16_t, 5, 10, true> {
  static constexpr storage_type max_bits = 0x7BFF;            // (2 - 2^-10) * 2^(30-15) = 65504
  static constexpr storage_type min_normal_bits = 0x0400;     // 2^(1-15) = 2^-14
  static constexpr storage_type denorm_min_bits = 0x0001;     // 2^-10 * 2^-14 = 2^-24
  static constexpr storage_type epsilon_bits = 0x1400;        // 2^(5-15) = 2^-10
  static constexpr storage_type infinity_bits = 0x7C00;       // exponent all ones
  static constexpr storage_type signaling_nan_bits = 0x7D00;  // quiet bit (0x0200) clear
};

}  // namespace detail

/// IEEE 754 binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits. Max 65504, smallest
/// normal 2^-14, smallest subnormal 2^-24, epsilon 2^-10. Bit-compatible with CUDA's
/// `__half`. Construction from float, double or an integer is explicit and rounds once to
/// nearest-even (overflow gives infinity); the conversion to float is implicit and exact.
class float16 : public detail::float_base<float16, detail::float16_format> {
 public:
  using float_base::float_base;
};

}  // namespace precis

template <>
class std::numeric_limits<precis::float16>
    : public precis::detail::format_limits<precis::float16> {};
