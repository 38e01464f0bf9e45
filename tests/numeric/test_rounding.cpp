// Rounding of double, float and integer inputs against the exact reference in
// reference.hpp (independent of precis's encoder), stochastic rounding's exact
// probabilities, and the array conversion.
#include <precis/numeric/numeric.hpp>

#include "reference.hpp"
#include "random.hpp"

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace {

using precis::bfloat16;
using precis::float16;
using precis::float8_e4m3;
using precis::float8_e5m2;
using precis::overflow;
using precis::rounding;
using precis_test::ref_overflow;
using precis_test::ref_rounding;

constexpr ref_rounding ref_of(rounding r) {
  return r == rounding::toward_zero ? ref_rounding::toward_zero : ref_rounding::nearest_even;
}
constexpr ref_overflow ref_of(overflow o) {
  return o == overflow::saturate ? ref_overflow::saturate : ref_overflow::infinity;
}

using precis_test::rng;

/// Doubles where rounding through float first gives a different answer than rounding
/// once: a midpoint m nudged by much less than a float ulp rounds to m in float, which
/// then ties; and a few double ulps either side of each midpoint.
std::vector<double> double_inputs(const precis_test::reference_rounder& ref) {
  const auto& v = ref.values();
  std::vector<double> xs;
  for (std::size_t k = 0; k + 1 < v.size(); ++k) {
    const double mid = (v[k] + v[k + 1]) / 2;
    const double nudge = mid * 0x1p-40;  // far below float's ulp at mid
    double lo = mid, hi = mid;
    for (int i = 0; i < 3; ++i) {
      lo = std::nextafter(lo, 0.0);
      hi = std::nextafter(hi, INFINITY);
      xs.insert(xs.end(), {lo, hi, -lo, -hi});
    }
    xs.insert(xs.end(), {mid, -mid, mid + nudge, mid - nudge, -(mid + nudge), v[k]});
  }
  std::uniform_real_distribution<double> exponent(-140.0, 130.0);
  std::uniform_real_distribution<double> significand(1.0, 2.0);
  for (int i = 0; i < 200000; ++i) {
    const double x = std::ldexp(significand(rng()), int(exponent(rng())));
    xs.push_back(i % 2 ? x : -x);
  }
  xs.insert(xs.end(), {0.0, -0.0, INFINITY, -INFINITY, std::numeric_limits<double>::quiet_NaN(),
                       std::numeric_limits<double>::max(), std::numeric_limits<double>::min(),
                       std::numeric_limits<double>::denorm_min(), 1e300, -1e-300});
  return xs;
}

template <class T, rounding R, overflow O>
void check_against_reference() {
  const precis_test::reference_rounder ref(precis_test::definition_of<T>());
  std::size_t through_float_differs = 0;
  for (double x : double_inputs(ref)) {
    const auto expected = ref.round(x, ref_of(R), ref_of(O));
    const auto ours = precis::convert<T, R, O>(x).bits();
    if (ours != expected) {
      FAIL_CHECK("double " << x << ": precis 0x" << std::hex << unsigned(ours) << ", reference 0x"
                           << expected);
    }
    const auto via_float = precis::convert<T, R, O>(static_cast<float>(x)).bits();
    through_float_differs += via_float != expected;
    // Float inputs too, where they are exact.
    const auto xf = static_cast<float>(x);
    if (double(xf) == x) CHECK(via_float == expected);
  }
  if constexpr (R == rounding::nearest_even) {
    // The inputs were chosen so that going through float gets some of them wrong.
    CHECK(through_float_differs > 0);
  }
}

}  // namespace

TEST_CASE_TEMPLATE("double rounds once, as the exact reference does", T, float16, bfloat16,
                   float8_e4m3, float8_e5m2) {
  check_against_reference<T, rounding::nearest_even, overflow::infinity>();
  check_against_reference<T, rounding::nearest_even, overflow::saturate>();
  check_against_reference<T, rounding::toward_zero, overflow::infinity>();
  check_against_reference<T, rounding::toward_zero, overflow::saturate>();
}

TEST_CASE_TEMPLATE("every value decodes to its definition", T, float16, bfloat16, float8_e4m3,
                   float8_e5m2) {
  const auto d = precis_test::definition_of<T>();
  using F = precis::format_traits<T>;
  for (std::uint32_t b = 0; b <= F::max_bits; ++b) {
    const auto pos = T::from_bits(static_cast<typename T::storage_type>(b));
    const auto neg = T::from_bits(static_cast<typename T::storage_type>(b | F::sign_mask));
    REQUIRE(double(float(pos)) == precis_test::value_of(d, b));
    REQUIRE(double(float(neg)) == -precis_test::value_of(d, b));
    REQUIRE(std::signbit(float(neg)));
    // Every finite value survives the round trip through float and double.
    REQUIRE(T(float(pos)).bits() == b);
    REQUIRE(T(double(float(neg))).bits() == (b | F::sign_mask));
  }
}

TEST_CASE_TEMPLATE("integers round once", T, float16, bfloat16, float8_e4m3, float8_e5m2) {
  const precis_test::reference_rounder ref(precis_test::definition_of<T>());
  for (int i = -70000; i <= 70000; i += 7) {
    CHECK(T(i).bits() == ref.round(double(i), ref_rounding::nearest_even, ref_overflow::infinity));
  }
  // 64-bit integers beyond 2^53 must not round twice: 2^60 + 2^52 + 1 is just above a
  // bfloat16 tie, but rounds to the tie as a double.
  const std::int64_t big = (std::int64_t(1) << 60) + (std::int64_t(1) << 52) + 1;
  CHECK(bfloat16(big).bits() == bfloat16(0x1.02p60).bits());
  CHECK(bfloat16(-big).bits() == bfloat16(-0x1.02p60).bits());
  CHECK(bfloat16(std::numeric_limits<std::uint64_t>::max()).bits() == bfloat16(0x1p64).bits());
  CHECK(float16(std::numeric_limits<std::int64_t>::min()).bits() == 0xFC00);  // -inf
}

TEST_CASE_TEMPLATE("stochastic rounding rounds up with the discarded fraction's probability", T,
                   float16, bfloat16, float8_e4m3, float8_e5m2) {
  using F = precis::format_traits<T>;
  const precis_test::reference_rounder ref(precis_test::definition_of<T>());
  const auto& v = ref.values();
  std::uniform_int_distribution<std::uint32_t> pick(1, F::max_bits - 2);
  for (int trial = 0; trial < 6; ++trial) {
    const std::uint32_t k = pick(rng());
    // A float strictly between two neighbours; its offset in float ulps is known exactly.
    std::uniform_real_distribution<double> where(v[k], v[k + 1]);
    const auto x = static_cast<float>(where(rng()));
    if (double(x) == v[k] || double(x) == v[k + 1]) continue;
    // Number of discarded bits: log2 of (neighbour gap / float ulp at x).
    const double gap = v[k + 1] - v[k];
    const double ulp = double(std::nextafter(x, INFINITY)) - double(x);
    const int s = int(std::lround(std::log2(gap / ulp)));
    REQUIRE(s <= 25);
    const auto expected_ups = std::uint64_t(std::llround((double(x) - v[k]) / ulp));
    // Every r of s bits, counted here and checked once after the loop (2^21 draws for
    // float8_e5m2: a check per draw would cost more than the draws).
    std::uint64_t ups = 0, elsewhere = 0, high_bits_read = 0;
    for (std::uint32_t r = 0; r < (1U << s); ++r) {
      const auto bits = precis::stochastic_round<T>(x, r).bits();
      elsewhere += bits != k && bits != k + 1;
      ups += bits == k + 1;
      // Bits above the discarded ones are ignored.
      high_bits_read += precis::stochastic_round<T>(x, r | (1U << s)).bits() != bits;
    }
    INFO("x " << x << " between values " << k << " and " << k + 1 << ", " << s << " discarded bits");
    REQUIRE(elsewhere == 0);
    CHECK(high_bits_read == 0);
    CHECK(ups == expected_ups);
    // Representable values never move.
    CHECK(precis::stochastic_round<T>(float(v[k]), 0xFFFFFFFFU).bits() == k);
  }
  CHECK((precis::isnan)(precis::stochastic_round<T>(NAN, 12345U)));
  CHECK(precis::stochastic_round<T, overflow::saturate>(INFINITY, 0U).bits() == F::max_bits);
}

TEST_CASE("array conversion matches the scalar one and checks sizes") {
  std::normal_distribution<float> normal(0.0f, 100.0f);
  std::vector<float> x(10000);
  for (auto& e : x) e = normal(rng());
  x[0] = NAN;
  x[1] = INFINITY;
  x[2] = 1e-30f;
  std::vector<float8_e4m3> y(x.size());
  precis::convert<rounding::nearest_even, overflow::saturate>(x, y);
  for (std::size_t i = 0; i < x.size(); ++i) {
    CHECK(y[i].bits() == precis::saturate_cast<float8_e4m3>(x[i]).bits());
  }
  std::vector<float> back(x.size(), -1.0f);
  precis::convert(y, back);
  for (std::size_t i = 0; i < x.size(); ++i) {
    CHECK(std::bit_cast<std::uint32_t>(back[i]) == std::bit_cast<std::uint32_t>(float(y[i])));
  }
  std::vector<bfloat16> z(x.size());
  precis::convert(y, z);  // format to format, through float: exact here
  for (std::size_t i = 1; i < x.size(); ++i) CHECK(float(z[i]) == float(y[i]));

  // A size mismatch throws before anything is written.
  std::vector<float16> short_out(x.size() - 1, float16::from_bits(0x1234));
  CHECK_THROWS_AS(precis::convert(x, short_out), precis::error);
  CHECK_THROWS_WITH(precis::convert(x, short_out),
                    doctest::Contains("output has 9999 elements, the input has 10000"));
  for (auto e : short_out) CHECK(e.bits() == 0x1234);
}
