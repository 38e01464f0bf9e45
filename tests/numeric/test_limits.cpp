// numeric_limits and format_traits of every format, each member checked against its
// definition in the standard, computed from the list of the format's values.
#include <precis/numeric/numeric.hpp>

#include "reference.hpp"

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <type_traits>

using precis::bfloat16;
using precis::float16;
using precis::float8_e4m3;
using precis::float8_e5m2;

TEST_CASE_TEMPLATE("the formats are plain bit patterns", T, float16, bfloat16, float8_e4m3,
                   float8_e5m2) {
  static_assert(sizeof(T) == sizeof(typename T::storage_type));
  static_assert(alignof(T) == alignof(typename T::storage_type));
  static_assert(std::is_trivially_copyable_v<T>);
  static_assert(std::is_standard_layout_v<T>);
  static_assert(std::is_trivially_default_constructible_v<T>);
  static_assert(!std::is_convertible_v<float, T>, "narrowing must be explicit");
  static_assert(!std::is_convertible_v<double, T>);
  static_assert(!std::is_convertible_v<int, T>);
  static_assert(std::is_convertible_v<T, float>, "widening to float is implicit");
  static_assert(std::is_constructible_v<T, float> && std::is_constructible_v<T, double> &&
                std::is_constructible_v<T, long long>);
  static_assert(T::from_bits(0x3C).bits() == 0x3C);
  CHECK(sizeof(T) * 8 == std::size_t(precis::format_traits<T>::total_bits));
}

TEST_CASE_TEMPLATE("numeric_limits follow their definitions", T, float16, bfloat16, float8_e4m3,
                   float8_e5m2) {
  using L = std::numeric_limits<T>;
  using F = precis::format_traits<T>;
  const auto d = precis_test::definition_of<T>();
  const precis_test::reference_rounder ref(d);
  const auto& v = ref.values();  // ascending, finite, plus one beyond max
  const double max = v[v.size() - 2];
  const double min_normal = precis_test::value_of(d, 1U << d.mantissa_bits);
  const double one_up = *std::upper_bound(v.begin(), v.end(), 1.0);

  static_assert(L::is_specialized && L::is_signed && !L::is_integer && !L::is_exact);
  static_assert(L::radix == 2 && L::is_bounded && !L::is_modulo && !L::traps);
  CHECK(L::digits == d.mantissa_bits + 1);
  CHECK(double(float(L::max())) == max);
  CHECK(double(float(L::lowest())) == -max);
  CHECK(double(float(L::min())) == min_normal);
  CHECK(double(float(L::denorm_min())) == v[1]);
  CHECK(double(float(L::epsilon())) == one_up - 1.0);
  CHECK(float(L::round_error()) == 0.5f);
  CHECK(L::digits10 == int(std::floor((L::digits - 1) * std::log10(2.0))));
  CHECK(L::max_digits10 == int(std::ceil(1 + L::digits * std::log10(2.0))));
  CHECK(std::ldexp(1.0, L::min_exponent - 1) == min_normal);
  CHECK(std::ldexp(1.0, L::max_exponent - 1) <= max);
  CHECK(max < std::ldexp(1.0, L::max_exponent));
  CHECK(L::min_exponent10 == int(std::ceil(std::log10(min_normal))));
  CHECK(L::max_exponent10 == int(std::floor(std::log10(max))));
  CHECK(L::has_infinity == d.has_infinity);
  CHECK(L::has_denorm == std::denorm_present);
  CHECK(L::is_iec559 == std::is_same_v<T, float16>);
  CHECK(L::round_style == std::round_to_nearest);
  CHECK((std::isnan)(float(L::quiet_NaN())));
  if constexpr (L::has_infinity) {
    CHECK(float(L::infinity()) == INFINITY);
    CHECK((precis::isinf)(L::infinity()));
  } else {
    CHECK(float(L::infinity()) == 0.0f);  // the standard's value when not meaningful
  }
  if constexpr (L::has_signaling_NaN) {
    const auto s = L::signaling_NaN();
    CHECK((precis::isnan)(s));
    // The quiet bit (top mantissa bit) is clear.
    CHECK((s.bits() & (1U << (d.mantissa_bits - 1))) == 0);
  }
  // format_traits agree with numeric_limits.
  CHECK(F::max().bits() == L::max().bits());
  CHECK(F::lowest().bits() == L::lowest().bits());
  CHECK(F::min_normal().bits() == L::min().bits());
  CHECK(F::denorm_min().bits() == L::denorm_min().bits());
  CHECK(F::epsilon().bits() == L::epsilon().bits());
  CHECK(F::exponent_bias == (1 << (F::exponent_bits - 1)) - 1);
}

TEST_CASE("format_traits of float and double are the built-in limits") {
  using FF = precis::format_traits<float>;
  using FD = precis::format_traits<double>;
  CHECK(FF::max() == std::numeric_limits<float>::max());
  CHECK(FF::min_normal() == std::numeric_limits<float>::min());
  CHECK(FF::denorm_min() == std::numeric_limits<float>::denorm_min());
  CHECK(FF::epsilon() == std::numeric_limits<float>::epsilon());
  CHECK(FF::mantissa_bits + 1 == std::numeric_limits<float>::digits);
  CHECK(FD::max() == std::numeric_limits<double>::max());
  CHECK(FD::min_normal() == std::numeric_limits<double>::min());
  CHECK(FD::denorm_min() == std::numeric_limits<double>::denorm_min());
  CHECK(FD::epsilon() == std::numeric_limits<double>::epsilon());
  CHECK(FD::mantissa_bits + 1 == std::numeric_limits<double>::digits);
  CHECK(std::bit_cast<float>(FF::infinity_bits) == INFINITY);
  CHECK(std::bit_cast<double>(FD::infinity_bits) == INFINITY);
}

TEST_CASE("the documented constants") {
  CHECK(float(std::numeric_limits<float16>::max()) == 65504.0f);
  CHECK(float(std::numeric_limits<bfloat16>::max()) == 0x1.FEp127f);
  CHECK(float(std::numeric_limits<float8_e4m3>::max()) == 448.0f);
  CHECK(float(std::numeric_limits<float8_e5m2>::max()) == 57344.0f);
  CHECK(float(std::numeric_limits<float8_e4m3>::denorm_min()) == 0x1p-9f);
  CHECK(float(std::numeric_limits<float8_e5m2>::denorm_min()) == 0x1p-16f);
  CHECK(float(std::numeric_limits<float16>::denorm_min()) == 0x1p-24f);
  CHECK(float(std::numeric_limits<bfloat16>::denorm_min()) == 0x1p-133f);
}
