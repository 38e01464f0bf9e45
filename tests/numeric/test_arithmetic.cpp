// Arithmetic, comparison, negation, classification and printing: exhaustively over all
// pairs of 8-bit values, and on random pairs of 16-bit values, against the exact
// reference applied to the double result.
#include <precis/numeric/numeric.hpp>

#include "reference.hpp"

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>

namespace {

using precis::bfloat16;
using precis::float16;
using precis::float8_e4m3;
using precis::float8_e5m2;
using precis_test::ref_overflow;
using precis_test::ref_rounding;

template <class T>
T make(std::uint32_t b) {
  return T::from_bits(static_cast<typename T::storage_type>(b));
}

// The loops below make millions of comparisons: each is a plain test here, and only a
// failure goes through doctest (with the operands), which keeps the sanitizer build's run
// short.
template <class T>
void check_pair(const precis_test::reference_rounder& ref, T a, T b) {
  const double x = float(a), y = float(b);
  auto expect = [&](double r) { return ref.round(r, ref_rounding::nearest_even, ref_overflow::infinity); };
  auto same = [&](T got, double r) {
    if (std::isnan(r)) return (precis::isnan)(got);
    return got.bits() == expect(r);
  };
  auto holds = [&](bool ok, const char* op) {
    if (!ok) FAIL_CHECK(x << " " << std::string(op) << " " << y);
  };
  // double holds the exact sum/product of two values of these formats (or rounds it with
  // 53 >= 2p + 2 bits, which a second rounding to p bits cannot spoil), so rounding the
  // double result is the correctly rounded result.
  holds(same(a + b, x + y), "+");
  holds(same(a - b, x - y), "-");
  holds(same(a * b, x * y), "*");
  holds(same(a / b, x / y), "/");
  // Comparisons are IEEE comparisons of the values.
  holds((a < b) == (x < y), "<");
  holds((a <= b) == (x <= y), "<=");
  holds((a > b) == (x > y), ">");
  holds((a >= b) == (x >= y), ">=");
  holds((a == b) == (x == y), "==");
  holds((a != b) == (x != y), "!=");
}

template <class T>
void check_unary(T a) {
  const float x = a;
  auto holds = [&](bool ok, const char* what) {
    if (!ok) FAIL_CHECK(std::string(what) << " fails for " << x << " (bits " << unsigned(a.bits()) << ")");
  };
  holds((-(-a)).bits() == a.bits(), "-(-a) == a");
  holds((precis::signbit)(-a) != (precis::signbit)(a), "signbit(-a) != signbit(a)");
  holds((precis::abs)(a).bits() == (precis::abs)(-a).bits(), "abs(a) == abs(-a)");
  holds(!(precis::signbit)((precis::abs)(a)), "!signbit(abs(a))");
  holds((precis::isnan)(a) == (std::isnan)(x), "isnan");
  holds((precis::isinf)(a) == (std::isinf)(x), "isinf");
  holds((precis::isfinite)(a) == (std::isfinite)(x), "isfinite");
  if (!(std::isnan)(x)) {
    holds((precis::signbit)(a) == (std::signbit)(x), "signbit");
    holds(float(-a) == -x, "float(-a) == -float(a)");
    holds(float((precis::abs)(a)) == std::fabs(x), "float(abs(a)) == fabs(float(a))");
    // ADL finds precis's overloads beside std's.
    using std::isnan;
    holds(!isnan(a), "!isnan(a) through ADL");
  }
  holds((+a).bits() == a.bits(), "+a == a");
}

}  // namespace

TEST_CASE_TEMPLATE("8-bit arithmetic is correctly rounded, exhaustively", T, float8_e4m3,
                   float8_e5m2) {
  const precis_test::reference_rounder ref(precis_test::definition_of<T>());
  for (std::uint32_t i = 0; i < 256; ++i) {
    check_unary(make<T>(i));
    for (std::uint32_t j = 0; j < 256; ++j) check_pair(ref, make<T>(i), make<T>(j));
  }
}

TEST_CASE_TEMPLATE("16-bit arithmetic is correctly rounded", T, float16, bfloat16) {
  const precis_test::reference_rounder ref(precis_test::definition_of<T>());
  const auto seed = std::random_device{}();
  INFO("random seed " << seed);
  std::mt19937 g(seed);
  std::uniform_int_distribution<std::uint32_t> pattern(0, 0xFFFF);
  for (std::uint32_t i = 0; i < 65536; ++i) check_unary(make<T>(i));
  for (int n = 0; n < 300000; ++n) check_pair(ref, make<T>(pattern(g)), make<T>(pattern(g)));
  // Near neighbours exercise cancellation; 1 + tiny exercises ties.
  for (int n = 0; n < 100000; ++n) {
    const auto a = pattern(g);
    check_pair(ref, make<T>(a), make<T>((a + (pattern(g) & 3U)) ^ 0x8000U));
  }
}

TEST_CASE("compound assignment and mixed-type expressions") {
  float16 a(1.0f);
  a += float16(0.5f);
  a *= float16(4.0f);
  a -= float16(1.0f);
  a /= float16(2.0f);
  CHECK(float(a) == 2.5f);
  // Mixing a format with float, or two different formats, computes in float.
  static_assert(std::is_same_v<decltype(a + 1.0f), float>);
  static_assert(std::is_same_v<decltype(a + bfloat16(1.0f)), float>);
  static_assert(std::is_same_v<decltype(a * 2.0), double>);
  static_assert(std::is_same_v<decltype(a + a), float16>);
  // Overflow in arithmetic follows the conversion: 448 + 32 is NaN in e4m3.
  CHECK((precis::isnan)(float8_e4m3(448.0f) + float8_e4m3(32.0f)));
  CHECK((precis::isinf)(float16(60000.0f) + float16(60000.0f)));
}

TEST_CASE("constexpr use") {
  constexpr float16 h = float16(2.0f) * float16(3.0f);
  static_assert(float(h) == 6.0f);
  static_assert(precis::saturate_cast<float8_e4m3>(1e6f).bits() == 0x7E);
  static_assert((precis::isnan)(float8_e4m3(1e6f)));
  static_assert(float(bfloat16(1.0) + bfloat16(0x1p-8)) == 1.0f);  // tie to even
  static_assert(std::numeric_limits<float8_e5m2>::max_exponent == 16);
  CHECK(float(h) == 6.0f);
}

TEST_CASE("printing shows the value") {
  std::ostringstream os;
  os << float16(1.5f) << ' ' << bfloat16(-2.0f) << ' ' << float8_e4m3(1e9f) << ' '
     << float8_e5m2(1e9f);
  CHECK(os.str() == "1.5 -2 nan inf");
}
