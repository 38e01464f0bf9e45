// precis::cast between every pair of float, double and the four formats: each element
// equals the scalar precis::convert (itself checked against CUDA's conversions, every bit
// pattern) and is within one rounding of the float64 value (bounds: kernel_checks.hpp);
// the rounding and overflow modes, NaN, shape errors and thread determinism.
#include <precis/kernels/cast.hpp>

#include "kernel_checks.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>

namespace {

using namespace precis_test;
using precis::bfloat16;
using precis::cpu_context;
using precis::float16;
using precis::float8_e4m3;
using precis::float8_e5m2;
using precis::host_tensor;
using precis::overflow;
using precis::rounding;

template <class T>
std::string name() {
  return std::string(precis::type_name_v<T>);
}

// What the scalar conversion gives, for any target (float and double by the language's
// own conversion, which is nearest-even).
template <class To, rounding R, overflow O, class From>
To scalar(From x) {
  if constexpr (precis::detail::precis_format<To>) {
    return precis::convert<To, R, O>(x);
  } else if constexpr (precis::detail::precis_format<From>) {
    return static_cast<To>(float(x));
  } else {
    return static_cast<To>(x);
  }
}

template <class T>
bool same_value(T a, T b) {
  const double x = to_double(a), y = to_double(b);
  return (std::isnan(x) && std::isnan(y)) || x == y;
}

template <class From, class To>
void check_pair() {
  INFO(name<From>() << " -> " << name<To>());
  const cpu_context ctx{1};
  // Within e4m3's range (448), so every target holds every value's magnitude.
  const auto x = random_tensor<From, 2>({5, 77}, -400, 400);
  auto y = poisoned<To, 2>(x.shape());
  precis::cast(ctx, x, y);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    bad += same_value(y.data()[i], scalar<To, rounding::nearest_even, overflow::infinity>(x.data()[i])) ? 0U : 1U;
  }
  CHECK(bad == 0);
  // Within one rounding of the float64 value, element by element (relative to the
  // smallest normal of To below it: subnormals have a fixed absolute step).
  const auto xd = to_double(x);
  const double tiny = to_double(std::numeric_limits<To>::min());
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double r = xd.data()[i];
    worst = std::max(worst, std::abs(to_double(y.data()[i]) - r) / std::max(std::abs(r), tiny));
  }
  CHECK(worst < bound<To>());
}

template <class From, class... To>
void check_from() {
  (check_pair<From, To>(), ...);
}

}  // namespace

TEST_CASE("cast between every pair of element types") {
  check_from<float, float, double, bfloat16, float16, float8_e4m3, float8_e5m2>();
  check_from<double, float, double, bfloat16, float16, float8_e4m3, float8_e5m2>();
  check_from<bfloat16, float, double, bfloat16, float16, float8_e4m3, float8_e5m2>();
  check_from<float16, float, double, bfloat16, float16, float8_e4m3, float8_e5m2>();
  check_from<float8_e4m3, float, double, bfloat16, float16, float8_e4m3, float8_e5m2>();
  check_from<float8_e5m2, float, double, bfloat16, float16, float8_e4m3, float8_e5m2>();
}

TEST_CASE("cast modes: saturate, toward_zero, NaN") {
  const cpu_context ctx{1};
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  host_tensor<float, 1> x = {1000.0f, -1000.0f, 1.2f, float(nan), float(inf)};
  auto y = poisoned<float8_e4m3, 1>(x.shape());
  precis::cast(ctx, x, y);
  CHECK(std::isnan(float(y(0))));  // e4m3 has no infinity
  CHECK(std::isnan(float(y(1))));
  precis::cast<rounding::nearest_even, overflow::saturate>(ctx, x, y);
  CHECK(float(y(0)) == 448.0f);
  CHECK(float(y(1)) == -448.0f);
  CHECK(float(y(2)) == 1.25f);  // 1.2 rounds to 1.25 (step 1/8)
  CHECK(std::isnan(float(y(3))));
  CHECK(float(y(4)) == 448.0f);
  precis::cast<rounding::toward_zero, overflow::saturate>(ctx, x, y);
  CHECK(float(y(2)) == 1.125f);

  host_tensor<double, 1> d = {1e300, -1e300, 1.0 + std::ldexp(1.0, -30), -(1.0 + std::ldexp(3.0, -25)), nan, inf};
  auto f = poisoned<float, 1>(d.shape());
  precis::cast(ctx, d, f);
  CHECK(std::isinf(f(0)));
  CHECK(f(2) == 1.0f);
  CHECK(f(3) == -(1.0f + std::ldexp(1.0f, -23)));  // 0.75 ulp: nearest is one ulp up
  CHECK(std::isnan(f(4)));
  precis::cast<rounding::toward_zero, overflow::infinity>(ctx, d, f);
  CHECK(f(0) == std::numeric_limits<float>::max());  // IEEE: toward zero never overflows
  CHECK(f(1) == -std::numeric_limits<float>::max());
  CHECK(f(3) == -1.0f);
  CHECK(std::isinf(f(5)));
  precis::cast<rounding::nearest_even, overflow::saturate>(ctx, d, f);
  CHECK(f(0) == std::numeric_limits<float>::max());
  CHECK(f(5) == std::numeric_limits<float>::max());
  CHECK(std::isnan(f(4)));

  auto h = poisoned<float16, 1>(d.shape());
  precis::cast<rounding::nearest_even, overflow::saturate>(ctx, d, h);
  CHECK(float(h(0)) == 65504.0f);
  precis::cast(ctx, d, h);
  CHECK(std::isinf(float(h(0))));
}

TEST_CASE("cast shape mismatch throws naming both shapes, writing nothing") {
  const cpu_context ctx{1};
  const auto x = random_tensor<float, 2>({2, 3});
  auto y = poisoned<bfloat16, 2>(std::array<std::size_t, 2>{3, 2});
  check_error([&] { precis::cast(ctx, x, y); }, "precis::cast", "[3, 2]", "[2, 3]");
  for (auto v : y) CHECK(std::isnan(float(v)));
}

TEST_CASE("cast is bit-identical for 1 and 2 threads") {
  const auto x = random_tensor<float, 1>({500000}, -1000, 1000);
  auto a = poisoned<float8_e5m2, 1>(x.shape()), b = a;
  precis::cast(cpu_context{1}, x, a);
  precis::cast(cpu_context{2}, x, b);
  CHECK(same_bits(a, b));
}
