/// @file
/// bfloat16, the upper half of an IEEE float.
#pragma once

#include <precis/numeric/detail/float_base.hpp>

#include <cstdint>
#include <limits>

namespace precis {
namespace detail {

struct bfloat16_format : binary_format<std::uint16_t, 8, 7, true> {
  static constexpr storage_type max_bits = 0x7F7F;            // (2 - 2^-7) * 2^(254-127) ~ 3.39e38
  static constexpr storage_type min_normal_bits = 0x0080;     // 2^(1-127) = 2^-126
  static constexpr storage_type denorm_min_bits = 0x0001;     // 2^-7 * 2^-126 = 2^-133
  static constexpr storage_type epsilon_bits = 0x3C00;        // 2^(120-127) = 2^-7
  static constexpr storage_type infinity_bits = 0x7F80;       // exponent all ones
  static constexpr storage_type signaling_nan_bits = 0x7FA0;  // quiet bit (0x0040) clear
};

}  // namespace detail

/// bfloat16: 1 sign, 8 exponent (bias 127), 7 mantissa bits; float's range with 8
/// significant bits. Max ~3.39e38, smallest normal 2^-126, smallest subnormal 2^-133,
/// epsilon 2^-7. Bit-compatible with CUDA's `__nv_bfloat16`. Construction is explicit and
/// rounds once to nearest-even; the conversion to float is implicit and exact.
class bfloat16 : public detail::float_base<bfloat16, detail::bfloat16_format> {
 public:
  using float_base::float_base;
};

}  // namespace precis

template <>
class std::numeric_limits<precis::bfloat16>
    : public precis::detail::format_limits<precis::bfloat16> {};
