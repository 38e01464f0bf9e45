/// @file
/// What "wider" means between number types, the tfloat32 compute tag, type promotion, and the names
/// policies print.
#pragma once

#include <precis/numeric/bfloat16.hpp>
#include <precis/numeric/float16.hpp>
#include <precis/numeric/float8.hpp>

#include <limits>
#include <string_view>
#include <type_traits>

namespace precis {

/// Tensor-core TF32: float's exponent range with 10 mantissa bits. A compute type only:
/// tensors stay float and the matrix units round their inputs (the `tf32` preset).
struct tfloat32 {};

/// Range and precision of a number type, for comparing types in policies.
/// `digits`: significand bits including the implicit one; `max_exponent` and
/// `min_exponent` as in std::numeric_limits. Specialise it to teach precis a new type.
template <class T>
struct precision_traits {
  static_assert(std::numeric_limits<T>::is_specialized && !std::numeric_limits<T>::is_integer,
                "precis: precision_traits<T> needs a floating-point T with numeric_limits; "
                "specialise precis::precision_traits for other types");
  /// Significand bits, the implicit leading one included.
  static constexpr int digits = std::numeric_limits<T>::digits;
  /// One more than the largest binary exponent of a finite value.
  static constexpr int max_exponent = std::numeric_limits<T>::max_exponent;
  /// One more than the smallest binary exponent of a normal value.
  static constexpr int min_exponent = std::numeric_limits<T>::min_exponent;
};

/// TF32: 11 significand bits (10 stored) with float's exponent range.
template <>
struct precision_traits<tfloat32> {
  static constexpr int digits = 11;  ///< 10 mantissa bits plus the implicit one.
  /// float's `max_exponent`.
  static constexpr int max_exponent = std::numeric_limits<float>::max_exponent;
  /// float's `min_exponent`.
  static constexpr int min_exponent = std::numeric_limits<float>::min_exponent;
};

/// True when `A` holds every value of `B`: at least as many significand bits and at
/// least the exponent range. float16 and bfloat16 are not comparable either way.
template <class A, class B>
inline constexpr bool at_least_as_wide_v =
    precision_traits<A>::digits >= precision_traits<B>::digits &&
    precision_traits<A>::max_exponent >= precision_traits<B>::max_exponent &&
    precision_traits<A>::min_exponent <= precision_traits<B>::min_exponent;

/// True when `A` has less exponent range than float: values that float holds overflow
/// or underflow in A. Gradients stored in such a type need loss scaling.
template <class A>
inline constexpr bool narrower_range_than_float_v =
    precision_traits<A>::max_exponent < precision_traits<float>::max_exponent ||
    precision_traits<A>::min_exponent > precision_traits<float>::min_exponent;

/// True for the two 8-bit formats.
template <class T>
inline constexpr bool is_float8_v =
    std::is_same_v<T, float8_e4m3> || std::is_same_v<T, float8_e5m2>;

namespace detail {
template <class A, class B>
struct promote2 {
  using type = std::conditional_t<
      at_least_as_wide_v<A, B>, A,
      std::conditional_t<at_least_as_wide_v<B, A>, B,
                         // Neither holds the other (float16 and bfloat16): float holds both.
                         std::conditional_t<at_least_as_wide_v<double, A> &&
                                                at_least_as_wide_v<double, B> &&
                                                !(at_least_as_wide_v<float, A> &&
                                                  at_least_as_wide_v<float, B>),
                                            double, float>>>;
};
}  // namespace detail

/// The type an elementwise operation mixing `Ts...` computes in: the widest of them, or
/// the narrowest standard type holding all of them when none does (float16 with bfloat16
/// gives float).
template <class T, class... Ts>
struct promote {
  using type = T;  ///< The promoted type.
};
/// Promotes the first two types, then the result with the rest.
template <class A, class B, class... Ts>
struct promote<A, B, Ts...> : promote<typename detail::promote2<A, B>::type, Ts...> {};
/// The type an elementwise operation mixing `Ts...` computes in (`promote<Ts...>::type`).
template <class... Ts>
using promote_t = typename promote<Ts...>::type;

/// The name a number type prints under (`describe`): "float16", "float", ...
template <class T>
inline constexpr std::string_view type_name_v = "?";
/// `float` prints as "float".
template <>
inline constexpr std::string_view type_name_v<float> = "float";
/// `double` prints as "double".
template <>
inline constexpr std::string_view type_name_v<double> = "double";
/// `tfloat32` prints as "tfloat32".
template <>
inline constexpr std::string_view type_name_v<tfloat32> = "tfloat32";
/// `float16` prints as "float16".
template <>
inline constexpr std::string_view type_name_v<float16> = "float16";
/// `bfloat16` prints as "bfloat16".
template <>
inline constexpr std::string_view type_name_v<bfloat16> = "bfloat16";
/// `float8_e4m3` prints as "float8_e4m3".
template <>
inline constexpr std::string_view type_name_v<float8_e4m3> = "float8_e4m3";
/// `float8_e5m2` prints as "float8_e5m2".
template <>
inline constexpr std::string_view type_name_v<float8_e5m2> = "float8_e5m2";

}  // namespace precis
