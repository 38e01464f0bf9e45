/// @file
/// What every precis number format shares: storage, conversions, arithmetic through float,
/// classification, numeric_limits. Private: include the format headers instead.
#pragma once

#include <precis/numeric/detail/device_convert.hpp>
#include <precis/numeric/detail/encoding.hpp>
#include <precis/numeric/format_traits.hpp>

#include <concepts>
#include <cstdint>
#include <iosfwd>
#include <limits>
#include <type_traits>

namespace precis::detail {

/// Base of the number formats (float16, bfloat16, float8_e4m3, float8_e5m2). `Derived`
/// is the format type, `Format` its encoding facts (a `binary_format` with limits).
/// Holds only the bit pattern, so the formats are trivially copyable, standard layout,
/// and trivially default constructible (usable in shared memory and unions).
template <class Derived, class Format>
class float_base {
 public:
  using format = Format;
  using storage_type = typename Format::storage_type;

  float_base() = default;

  /// Rounds once to nearest-even; overflow gives infinity (NaN for float8_e4m3).
  PRECIS_HOST_DEVICE explicit constexpr float_base(float x) : bits_(round_float(x)) {}
  /// Rounds the double directly (never through float, which could round twice).
  PRECIS_HOST_DEVICE explicit constexpr float_base(double x)
      : bits_(encode<Format, rounding::nearest_even, overflow::infinity>(x)) {}
  /// Rounds the integer once to nearest-even.
  template <std::integral Int>
  PRECIS_HOST_DEVICE explicit constexpr float_base(Int x)
      : bits_(encode_integer<Format, rounding::nearest_even, overflow::infinity>(x)) {}

  /// The value with bit pattern `bits`.
  PRECIS_HOST_DEVICE static constexpr Derived from_bits(storage_type bits) {
    Derived d{};
    static_cast<float_base&>(d).bits_ = bits;
    return d;
  }
  /// The bit pattern.
  PRECIS_HOST_DEVICE constexpr storage_type bits() const { return bits_; }

  /// Exact: every value of the format is a float.
  PRECIS_HOST_DEVICE constexpr operator float() const {
#if defined(__CUDA_ARCH__)
    if constexpr (device_decode_available<Format>) {
      if (!__builtin_is_constant_evaluated()) return device_decode<Format>(bits_);
    }
#endif
    return decode<Format>(bits_);
  }

  // Arithmetic rounds the float result once to the format. For +, -, *, / this equals
  // the correctly rounded result, because float's 24-bit significand holds at least
  // 2p + 2 bits of each format's p-bit significand (p <= 11), so rounding twice is harmless.
  PRECIS_HOST_DEVICE friend constexpr Derived operator+(Derived a, Derived b) {
    return Derived(float(a) + float(b));
  }
  PRECIS_HOST_DEVICE friend constexpr Derived operator-(Derived a, Derived b) {
    return Derived(float(a) - float(b));
  }
  PRECIS_HOST_DEVICE friend constexpr Derived operator*(Derived a, Derived b) {
    return Derived(float(a) * float(b));
  }
  PRECIS_HOST_DEVICE friend constexpr Derived operator/(Derived a, Derived b) {
    return Derived(float(a) / float(b));
  }
  /// Flips the sign bit: exact, and defined for NaN.
  PRECIS_HOST_DEVICE friend constexpr Derived operator-(Derived a) {
    return Derived::from_bits(storage_type(a.bits() ^ Format::sign_mask));
  }
  PRECIS_HOST_DEVICE friend constexpr Derived operator+(Derived a) { return a; }

  PRECIS_HOST_DEVICE constexpr Derived& operator+=(Derived b) { return self() = self() + b; }
  PRECIS_HOST_DEVICE constexpr Derived& operator-=(Derived b) { return self() = self() - b; }
  PRECIS_HOST_DEVICE constexpr Derived& operator*=(Derived b) { return self() = self() * b; }
  PRECIS_HOST_DEVICE constexpr Derived& operator/=(Derived b) { return self() = self() / b; }

  // IEEE comparisons: NaN is unordered, -0 == +0.
  PRECIS_HOST_DEVICE friend constexpr bool operator==(Derived a, Derived b) {
    return float(a) == float(b);
  }
  PRECIS_HOST_DEVICE friend constexpr bool operator!=(Derived a, Derived b) {
    return float(a) != float(b);
  }
  PRECIS_HOST_DEVICE friend constexpr bool operator<(Derived a, Derived b) {
    return float(a) < float(b);
  }
  PRECIS_HOST_DEVICE friend constexpr bool operator<=(Derived a, Derived b) {
    return float(a) <= float(b);
  }
  PRECIS_HOST_DEVICE friend constexpr bool operator>(Derived a, Derived b) {
    return float(a) > float(b);
  }
  PRECIS_HOST_DEVICE friend constexpr bool operator>=(Derived a, Derived b) {
    return float(a) >= float(b);
  }

  /// Prints the value as a float would print (the stream's own formatting applies).
  template <class CharT, class Traits>
  friend std::basic_ostream<CharT, Traits>& operator<<(std::basic_ostream<CharT, Traits>& os,
                                                       Derived a) {
    return os << float(a);
  }

 private:
  PRECIS_HOST_DEVICE static constexpr storage_type round_float(float x) {
#if defined(__CUDA_ARCH__)
    if constexpr (device_encode_available<Format>) {
      if (!__builtin_is_constant_evaluated()) return device_encode<Format>(x);
    }
#endif
    return encode<Format, rounding::nearest_even, overflow::infinity>(x);
  }
  PRECIS_HOST_DEVICE constexpr Derived& self() { return static_cast<Derived&>(*this); }

  storage_type bits_;
};

/// True for precis's number formats.
template <class T>
concept precis_format =
    requires { typename T::format; } && std::is_base_of_v<float_base<T, typename T::format>, T>;

/// std::numeric_limits members for a precis format, each from its definition in the
/// standard ([numeric.limits.members]) and the format's facts.
template <class T>
struct format_limits {
 private:
  using F = typename T::format;
  static constexpr int decimal_exponent_floor(double v) {  // floor(log10(v)) for v >= 1
    int k = 0;
    while (v >= 10.0) {
      v /= 10.0;
      ++k;
    }
    return k;
  }
  static constexpr int decimal_exponent_ceil(double v) {  // ceil(log10(v)) for 0 < v < 1
    int k = 0;
    double p = 1.0;
    while (p / 10.0 >= v) {
      p /= 10.0;
      --k;
    }
    return k;
  }

 public:
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool is_exact = false;
  static constexpr bool has_infinity = F::has_infinity;
  static constexpr bool has_quiet_NaN = true;
  /// A format with infinity has the IEEE NaN space, with signaling NaNs; float8_e4m3 has
  /// a single NaN pattern per sign.
  static constexpr bool has_signaling_NaN = F::has_infinity;
  static constexpr std::float_denorm_style has_denorm = std::denorm_present;
  static constexpr bool has_denorm_loss = false;
  static constexpr std::float_round_style round_style = std::round_to_nearest;
  /// Only float16 is an IEEE 754 interchange format.
  static constexpr bool is_iec559 = F::exponent_bits == 5 && F::mantissa_bits == 10;
  static constexpr bool is_bounded = true;
  static constexpr bool is_modulo = false;
  static constexpr int digits = F::mantissa_bits + 1;
  static constexpr int digits10 = (digits - 1) * 30103 / 100000;  // floor((digits-1) log10 2)
  static constexpr int max_digits10 = 2 + digits * 30103 / 100000;  // ceil(digits log10 2 + 1)
  static constexpr int radix = 2;
  static constexpr int min_exponent = 2 - F::exponent_bias;  // min() == 2^(min_exponent-1)
  static constexpr int max_exponent =  // max() < 2^max_exponent
      int(F::max_bits >> F::mantissa_bits) - F::exponent_bias + 1;
  static constexpr int min_exponent10 = decimal_exponent_ceil(decode<F>(F::min_normal_bits));
  static constexpr int max_exponent10 = decimal_exponent_floor(decode<F>(F::max_bits));
  static constexpr bool traps = false;
  static constexpr bool tinyness_before = false;

  PRECIS_HOST_DEVICE static constexpr T min() noexcept { return T::from_bits(F::min_normal_bits); }
  PRECIS_HOST_DEVICE static constexpr T max() noexcept { return T::from_bits(F::max_bits); }
  PRECIS_HOST_DEVICE static constexpr T lowest() noexcept {
    return T::from_bits(typename F::storage_type(F::max_bits | F::sign_mask));
  }
  PRECIS_HOST_DEVICE static constexpr T epsilon() noexcept { return T::from_bits(F::epsilon_bits); }
  PRECIS_HOST_DEVICE static constexpr T round_error() noexcept { return T(0.5f); }
  /// Infinity where the format has one; otherwise 0, the standard's value for a member
  /// that is not meaningful.
  PRECIS_HOST_DEVICE static constexpr T infinity() noexcept {
    return T::from_bits(F::infinity_bits);
  }
  PRECIS_HOST_DEVICE static constexpr T quiet_NaN() noexcept {
    return T::from_bits(F::quiet_nan_bits);
  }
  /// A signaling NaN where the format has one; otherwise 0.
  PRECIS_HOST_DEVICE static constexpr T signaling_NaN() noexcept {
    return T::from_bits(F::signaling_nan_bits);
  }
  PRECIS_HOST_DEVICE static constexpr T denorm_min() noexcept {
    return T::from_bits(F::denorm_min_bits);
  }
};

}  // namespace precis::detail

namespace precis {

template <detail::precis_format T>
struct format_traits<T> : detail::format_values<T, typename T::format> {};

// Classification and absolute value of the formats, read from the bits (exact, cheap,
// defined for NaN). Found by argument-dependent lookup, so `using std::isnan; isnan(x)`
// works for every type; the names are parenthesised so that C's macros cannot expand them.

namespace detail {
template <class T>
PRECIS_HOST_DEVICE constexpr typename T::storage_type magnitude_bits(T x) {
  return typename T::storage_type(x.bits() & (T::format::exponent_mask | T::format::mantissa_mask));
}
}  // namespace detail

template <detail::precis_format T>
PRECIS_HOST_DEVICE constexpr bool(isnan)(T x) {
  if constexpr (T::format::has_infinity) {
    return detail::magnitude_bits(x) > T::format::infinity_bits;
  } else {
    return detail::magnitude_bits(x) == T::format::quiet_nan_bits;
  }
}
template <detail::precis_format T>
PRECIS_HOST_DEVICE constexpr bool(isinf)(T x) {
  if constexpr (T::format::has_infinity) {
    return detail::magnitude_bits(x) == T::format::infinity_bits;
  } else {
    return false;
  }
}
template <detail::precis_format T>
PRECIS_HOST_DEVICE constexpr bool(isfinite)(T x) {
  return detail::magnitude_bits(x) <= T::format::max_bits;
}
template <detail::precis_format T>
PRECIS_HOST_DEVICE constexpr bool(signbit)(T x) {
  return (x.bits() & T::format::sign_mask) != 0;
}
/// Clears the sign bit.
template <detail::precis_format T>
PRECIS_HOST_DEVICE constexpr T(abs)(T x) {
  return T::from_bits(detail::magnitude_bits(x));
}

}  // namespace precis
