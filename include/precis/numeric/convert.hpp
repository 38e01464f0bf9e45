/// @file
/// Conversions with a chosen rounding and overflow mode, for one value and for whole arrays.
#pragma once

#include <precis/config.hpp>
#include <precis/numeric/detail/decode_array.hpp>
#include <precis/numeric/detail/encode_array.hpp>
#include <precis/numeric/detail/float_base.hpp>
#include <precis/numeric/format_traits.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <ranges>
#include <string>
#include <type_traits>

namespace precis {

namespace detail {
template <class T>
concept convertible_source =
    std::is_same_v<T, float> || std::is_same_v<T, double> || precis_format<T>;
}  // namespace detail

/// Converts `x` (float, double, or another precis format) to format `To`, rounding once
/// as `R` says and treating overflow as `O` says (see `precis::rounding`,
/// `precis::overflow`). A double is rounded directly, never through float. NaN gives
/// `To`'s canonical NaN.
///
///     auto a = precis::convert<precis::float8_e4m3>(500.0f);  // NaN: beyond 448
///     auto b = precis::convert<precis::float8_e4m3, precis::rounding::nearest_even,
///                              precis::overflow::saturate>(500.0f);  // 448
template <class To, rounding R = rounding::nearest_even, overflow O = overflow::infinity,
          detail::convertible_source From>
  requires detail::precis_format<To>
PRECIS_HOST_DEVICE constexpr To convert(From x) {
  static_assert(R != rounding::stochastic,
                "precis: stochastic rounding needs random bits; call "
                "precis::stochastic_round<T>(x, random_bits)");
#if defined(__CUDA_ARCH__)
  // saturate_cast to float8 in one instruction where the architecture has it (sm_89 on).
  if constexpr (R == rounding::nearest_even && O == overflow::saturate &&
                detail::device_saturate_available<typename To::format> && !std::is_same_v<From, double>) {
    if (!__builtin_is_constant_evaluated()) {
      return To::from_bits(detail::device_encode_saturate<typename To::format>(float(x)));
    }
  }
#endif
  if constexpr (detail::precis_format<From>) {
    return To::from_bits(detail::encode<typename To::format, R, O>(float(x)));
  } else {
    return To::from_bits(detail::encode<typename To::format, R, O>(x));
  }
}

/// Rounds to nearest-even and clamps every value beyond +-max, infinities included, to
/// +-max (CUDA's `satfinite`); NaN stays NaN.
template <class To, detail::convertible_source From>
  requires detail::precis_format<To>
PRECIS_HOST_DEVICE constexpr To saturate_cast(From x) {
  return convert<To, rounding::nearest_even, overflow::saturate>(x);
}

/// Stochastic rounding of a float to `To`: rounds away from zero with probability equal to
/// the fraction of an ulp that is discarded, reading as many low bits of `random_bits` as
/// the conversion discards (at most 25). The caller supplies the random bits (one fresh
/// 32-bit word per value), so results are reproducible and no generator state is hidden.
template <class To, overflow O = overflow::infinity>
  requires detail::precis_format<To>
PRECIS_HOST_DEVICE constexpr To stochastic_round(float x, std::uint32_t random_bits) {
  return To::from_bits(detail::encode<typename To::format, rounding::stochastic, O>(x, random_bits));
}
/// Any other input type (double, an integer, a precis format) is refused at compile time
/// rather than converted to float first: rounding a double to float and then stochastically
/// would round twice.
template <class To, overflow O = overflow::infinity, class From>
  requires detail::precis_format<To> && (!std::is_same_v<From, float>)
PRECIS_HOST_DEVICE constexpr To stochastic_round(From, std::uint32_t) {
  static_assert(std::is_same_v<From, float>,  // false here: the message for the overload set
                "precis: stochastic rounding is defined for float inputs; convert the value to "
                "float first (a double is then rounded twice) or round to nearest");
  return To{};
}

namespace detail {

template <class T>
concept element_of_conversion =
    std::is_same_v<T, float> || std::is_same_v<T, double> || precis_format<T>;

/// double to float rounded as R says, values beyond float's range as O says. The C++
/// conversion is nearest-even with overflow to infinity; toward_zero steps back one ulp
/// where it went beyond d (an overflow becomes the largest float, as IEEE 754 has it).
template <rounding R, overflow O>
float double_to_float(double d) {
  float f = static_cast<float>(d);
  if constexpr (R == rounding::toward_zero) {
    if (std::fabs(double(f)) > std::fabs(d)) f = std::nextafter(f, 0.0f);
  }
  if constexpr (O == overflow::saturate) {
    constexpr float max = std::numeric_limits<float>::max();
    if (std::isinf(f)) f = f > 0 ? max : -max;
  }
  return f;
}

}  // namespace detail

/// Converts a whole contiguous range `in` into `out` (both sized ranges, for example
/// `std::vector` or `std::span`), element by element as the scalar `convert` does, with
/// rounding `R` and overflow `O` for narrowing conversions. Widening conversions are exact.
/// Throws `precis::error` before writing anything if the sizes differ.
///
///     std::vector<float> x(n);  std::vector<precis::bfloat16> y(n);
///     precis::convert(x, y);
template <rounding R = rounding::nearest_even, overflow O = overflow::infinity,
          std::ranges::contiguous_range In, std::ranges::contiguous_range Out>
  requires std::ranges::sized_range<In> && std::ranges::sized_range<Out> &&
           detail::element_of_conversion<std::ranges::range_value_t<In>> &&
           detail::element_of_conversion<std::ranges::range_value_t<Out>>
void convert(const In& in, Out&& out) {
  using from_t = std::ranges::range_value_t<In>;
  using to_t = std::ranges::range_value_t<Out>;
  static_assert(R != rounding::stochastic,
                "precis: stochastic rounding needs random bits per element; call "
                "precis::stochastic_round<T>(x, random_bits) in your loop");
  const std::size_t n = std::ranges::size(in);
  if (std::ranges::size(out) != n) {
    throw error("precis::convert: the output has " + std::to_string(std::ranges::size(out)) +
                " elements, the input has " + std::to_string(n));
  }
  const from_t* src = std::ranges::data(in);
  to_t* dst = std::ranges::data(out);
  if constexpr (detail::precis_format<to_t> && !detail::precis_format<from_t>) {
    // Loops over the bit patterns (a format is standard layout around its one member).
    if constexpr (std::is_same_v<from_t, float>) {
      detail::encode_array<typename to_t::format, R, O>(
          src, reinterpret_cast<typename to_t::storage_type*>(dst), n);
    } else {
      auto* d = reinterpret_cast<typename to_t::storage_type*>(dst);
      for (std::size_t i = 0; i < n; ++i) d[i] = detail::encode<typename to_t::format, R, O>(src[i]);
    }
  } else if constexpr (std::is_same_v<to_t, float> && detail::precis_format<from_t>) {
    detail::decode_array<typename from_t::format>(
        reinterpret_cast<const typename from_t::storage_type*>(src), dst, n);
  } else if constexpr (detail::precis_format<to_t>) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = convert<to_t, R, O>(src[i]);
  } else if constexpr (std::is_same_v<from_t, double> && std::is_same_v<to_t, float>) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = detail::double_to_float<R, O>(src[i]);
  } else {
    for (std::size_t i = 0; i < n; ++i) dst[i] = static_cast<to_t>(src[i]);
  }
}

}  // namespace precis
