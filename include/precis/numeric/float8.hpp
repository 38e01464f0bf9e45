/// @file
/// The two 8-bit formats of the OCP FP8 specification.
#pragma once

#include <precis/numeric/detail/float_base.hpp>

#include <cstdint>
#include <limits>

namespace precis {
namespace detail {

// E4M3 "fn": finite only. The exponent field 1111 holds normal values except for
// S.1111.111, the only NaN, which buys one more binade than IEEE encoding would.
struct float8_e4m3_format : binary_format<std::uint8_t, 4, 3, false> {
  static constexpr storage_type max_bits = 0x7E;            // (1 + 6/8) * 2^(15-7) = 448
  static constexpr storage_type min_normal_bits = 0x08;     // 2^(1-7) = 2^-6
  static constexpr storage_type denorm_min_bits = 0x01;     // 2^-3 * 2^-6 = 2^-9
  static constexpr storage_type epsilon_bits = 0x20;        // 2^(4-7) = 2^-3
  static constexpr storage_type infinity_bits = 0x00;       // none: numeric_limits gives 0
  static constexpr storage_type signaling_nan_bits = 0x00;  // none
};

// E5M2: IEEE-like, with infinities and NaNs; the upper byte of a float16.
struct float8_e5m2_format : binary_format<std::uint8_t, 5, 2, true> {
  static constexpr storage_type max_bits = 0x7B;            // (1 + 3/4) * 2^(30-15) = 57344
  static constexpr storage_type min_normal_bits = 0x04;     // 2^(1-15) = 2^-14
  static constexpr storage_type denorm_min_bits = 0x01;     // 2^-2 * 2^-14 = 2^-16
  static constexpr storage_type epsilon_bits = 0x34;        // 2^(13-15) = 2^-2
  static constexpr storage_type infinity_bits = 0x7C;       // exponent all ones
  static constexpr storage_type signaling_nan_bits = 0x7D;  // quiet bit (0x02) clear
};

}  // namespace detail

/// OCP FP8 E4M3 ("e4m3fn"): 1 sign, 4 exponent (bias 7), 3 mantissa bits, no infinity;
/// NaN is S.1111.111. Max 448, smallest normal 2^-6, smallest subnormal 2^-9, epsilon
/// 2^-3. For forward-pass tensors under per-tensor scaling. Bit-compatible with CUDA's
/// `__nv_fp8_e4m3`. Construction rounds once to nearest-even; a value beyond 448 becomes
/// NaN (use `precis::saturate_cast` to clamp to +-448).
class float8_e4m3 : public detail::float_base<float8_e4m3, detail::float8_e4m3_format> {
 public:
  using float_base::float_base;
};

/// OCP FP8 E5M2: 1 sign, 5 exponent (bias 15), 2 mantissa bits, IEEE infinities and NaNs.
/// Max 57344, smallest normal 2^-14, smallest subnormal 2^-16, epsilon 2^-2. For
/// gradients, whose range matters more than their precision. Bit-compatible with CUDA's
/// `__nv_fp8_e5m2`. Construction rounds once to nearest-even; overflow gives infinity.
class float8_e5m2 : public detail::float_base<float8_e5m2, detail::float8_e5m2_format> {
 public:
  using float_base::float_base;
};

}  // namespace precis

template <>
class std::numeric_limits<precis::float8_e4m3>
    : public precis::detail::format_limits<precis::float8_e4m3> {};
template <>
class std::numeric_limits<precis::float8_e5m2>
    : public precis::detail::format_limits<precis::float8_e5m2> {};
