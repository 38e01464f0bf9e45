/// @file
/// Encoding facts of every floating-point format precis knows (its own four and the two built-in
/// ones), and the rounding and overflow modes of conversions.
#pragma once

#include <precis/config.hpp>

#include <cstdint>

namespace precis {

/// How a conversion to a narrower format picks between the two nearest representable
/// values.
enum class rounding {
  nearest_even,  ///< IEEE round-to-nearest, ties to the even significand (the default)
  toward_zero,   ///< truncate the magnitude
  stochastic,    ///< round up with probability equal to the discarded fraction
};

/// What a conversion does with a value beyond the target format's largest finite value.
enum class overflow {
  /// IEEE behaviour: the result is infinity (NaN for float8_e4m3, which has no
  /// infinity); under `rounding::toward_zero` a finite value becomes +-max instead, as
  /// IEEE 754 prescribes for that direction.
  infinity,
  /// Every value beyond +-max, infinities included, becomes +-max; NaN stays NaN. This is
  /// CUDA's `satfinite` mode (`__NV_SATFINITE`).
  saturate,
};

/// Encoding facts of a binary floating-point format: sign bit, `ExponentBits` exponent
/// bits with bias 2^(ExponentBits-1) - 1, `MantissaBits` explicit significand bits.
/// Each format adds its limits as bit patterns (`max_bits`, `min_normal_bits`, ...).
template <class Storage, int ExponentBits, int MantissaBits, bool HasInfinity>
struct binary_format {
  /// Unsigned integer type holding one encoded value.
  using storage_type = Storage;
  /// Number of exponent bits.
  static constexpr int exponent_bits = ExponentBits;
  /// Number of explicit significand (mantissa) bits; the leading 1 of normals is implicit.
  static constexpr int mantissa_bits = MantissaBits;
  /// Exponent bias, 2^(exponent_bits-1) - 1: a normal value is 2^(e - bias) * 1.m.
  static constexpr int exponent_bias = (1 << (ExponentBits - 1)) - 1;
  /// Bits of one encoded value: sign, exponent and mantissa.
  static constexpr int total_bits = 1 + ExponentBits + MantissaBits;
  /// Whether the format encodes infinities (false for float8_e4m3).
  static constexpr bool has_infinity = HasInfinity;
  /// The sign bit (the highest bit).
  static constexpr storage_type sign_mask = storage_type(storage_type(1) << (total_bits - 1));
  /// The mantissa bits (the lowest `mantissa_bits` bits).
  static constexpr storage_type mantissa_mask = storage_type((storage_type(1) << MantissaBits) - 1);
  /// The exponent bits, between the sign bit and the mantissa.
  static constexpr storage_type exponent_mask =
      storage_type(((storage_type(1) << ExponentBits) - 1) << MantissaBits);
  /// The NaN every conversion produces: positive, all exponent and mantissa bits set
  /// (0x7FFF for 16-bit formats, 0x7F for 8-bit ones), as CUDA's conversions produce.
  static constexpr storage_type quiet_nan_bits = storage_type(exponent_mask | mantissa_mask);
};

/// Facts of a format type `T`: the members of its `binary_format` plus `max_bits`,
/// `min_normal_bits`, `denorm_min_bits`, `epsilon_bits`, `infinity_bits` (0 where the
/// format has no infinity), `signaling_nan_bits` (0 where it has none), and the values
/// `max()`, `lowest()`, `min_normal()`, `denorm_min()`, `epsilon()` as `T`.
/// Specialised for `float`, `double` and the four precis formats.
template <class T>
struct format_traits;

namespace detail {

template <class T, class Format>
struct format_values : Format {
  using typename Format::storage_type;
  PRECIS_HOST_DEVICE static constexpr T max() { return make(Format::max_bits); }
  PRECIS_HOST_DEVICE static constexpr T lowest() {
    return make(storage_type(Format::max_bits | Format::sign_mask));
  }
  PRECIS_HOST_DEVICE static constexpr T min_normal() { return make(Format::min_normal_bits); }
  PRECIS_HOST_DEVICE static constexpr T denorm_min() { return make(Format::denorm_min_bits); }
  PRECIS_HOST_DEVICE static constexpr T epsilon() { return make(Format::epsilon_bits); }

 private:
  PRECIS_HOST_DEVICE static constexpr T make(storage_type bits) {
    if constexpr (requires { T::from_bits(bits); }) {
      return T::from_bits(bits);
    } else {
      return __builtin_bit_cast(T, bits);
    }
  }
};

struct float_format : binary_format<std::uint32_t, 8, 23, true> {
  static constexpr storage_type max_bits = 0x7F7FFFFF;            // (2 - 2^-23) * 2^127
  static constexpr storage_type min_normal_bits = 0x00800000;     // 2^-126
  static constexpr storage_type denorm_min_bits = 0x00000001;     // 2^-149
  static constexpr storage_type epsilon_bits = 0x34000000;        // 2^-23
  static constexpr storage_type infinity_bits = 0x7F800000;
  static constexpr storage_type signaling_nan_bits = 0x7FA00000;  // quiet bit clear
};

struct double_format : binary_format<std::uint64_t, 11, 52, true> {
  static constexpr storage_type max_bits = 0x7FEFFFFFFFFFFFFF;            // (2 - 2^-52) * 2^1023
  static constexpr storage_type min_normal_bits = 0x0010000000000000;     // 2^-1022
  static constexpr storage_type denorm_min_bits = 0x0000000000000001;     // 2^-1074
  static constexpr storage_type epsilon_bits = 0x3CB0000000000000;        // 2^-52
  static constexpr storage_type infinity_bits = 0x7FF0000000000000;
  static constexpr storage_type signaling_nan_bits = 0x7FF4000000000000;  // quiet bit clear
};

}  // namespace detail

template <>
struct format_traits<float> : detail::format_values<float, detail::float_format> {};
template <>
struct format_traits<double> : detail::format_values<double, detail::double_format> {};

}  // namespace precis
