// The array conversions, which take vectorised and hardware (F16C) routes, against the
// scalar conversions, on a strided sweep of float patterns and every 16-bit pattern.
// Built twice: test_numeric_arrays with F16C/AVX2 enabled, so that the hardware routes are
// the ones tested (exits 77, skipped, on a processor without them), and
// test_numeric_arrays_portable without target flags, for the portable routes.
#include <precis/numeric/numeric.hpp>

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <cstdint>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <cfenv>
#include <cstdlib>
#include <vector>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

namespace {

#if PRECIS_HAVE_F16C
// F16C (CPUID.1:ECX bit 29) and AVX2 (CPUID.7.0:EBX bit 5), read directly: clang 14's
// __builtin_cpu_supports does not know "f16c".
bool cpu_has_f16c_and_avx2() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1U << 29))) return false;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return (b & (1U << 5)) != 0;
#else
  return false;
#endif
}
#endif

using precis::overflow;
using precis::rounding;

std::vector<float> sweep() {
  std::vector<float> x;
  for (std::uint64_t b = 0; b < (std::uint64_t(1) << 32); b += 509) {
    x.push_back(std::bit_cast<float>(std::uint32_t(b)));
  }
  return x;
}

template <class T, rounding R, overflow O>
void check_encode(const std::vector<float>& x) {
  std::vector<T> y(x.size());
  precis::convert<R, O>(x, y);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const auto expected = precis::convert<T, R, O>(x[i]).bits();
    if (y[i].bits() != expected && bad++ < 10) {
      FAIL_CHECK("x bits 0x" << std::hex << std::bit_cast<std::uint32_t>(x[i]) << ": array 0x"
                             << unsigned(y[i].bits()) << ", scalar 0x" << unsigned(expected));
    }
  }
  CHECK(bad == 0);
}

template <class T>
void check_decode() {
  using storage = typename T::storage_type;
  const std::uint32_t count = 1U << (8 * sizeof(storage));
  std::vector<T> x(count);
  for (std::uint32_t b = 0; b < count; ++b) x[b] = T::from_bits(static_cast<storage>(b));
  std::vector<float> y(count);
  precis::convert(x, y);
  for (std::uint32_t b = 0; b < count; ++b) {
    REQUIRE(std::bit_cast<std::uint32_t>(y[b]) == std::bit_cast<std::uint32_t>(float(x[b])));
  }
}

}  // namespace

TEST_CASE_TEMPLATE("array conversions equal the scalar ones", T, precis::float16,
                   precis::bfloat16, precis::float8_e4m3, precis::float8_e5m2) {
#if PRECIS_HAVE_F16C
  if (!cpu_has_f16c_and_avx2()) std::exit(77);  // built for F16C, running without it
#endif
  const auto x = sweep();
  check_encode<T, rounding::nearest_even, overflow::infinity>(x);
  check_encode<T, rounding::nearest_even, overflow::saturate>(x);
  check_encode<T, rounding::toward_zero, overflow::infinity>(x);
  check_decode<T>();
}

TEST_CASE_TEMPLATE("array rounding ignores the rounding mode, flush-to-zero and denormals-are-zero",
                   T, precis::float16, precis::float8_e4m3, precis::float8_e5m2) {
#if PRECIS_HAVE_F16C
  if (!cpu_has_f16c_and_avx2()) std::exit(77);
#endif
  const auto x = sweep();
  const int round = std::fegetround();
  REQUIRE(std::fesetround(FE_TOWARDZERO) == 0);
#if defined(__SSE__)
  const unsigned csr = _mm_getcsr();
  _mm_setcsr(csr | 0x8040U);  // flush-to-zero and denormals-are-zero
#endif
  check_encode<T, rounding::nearest_even, overflow::infinity>(x);
  check_encode<T, rounding::nearest_even, overflow::saturate>(x);
#if defined(__SSE__)
  _mm_setcsr(csr);
#endif
  std::fesetround(round);
}

TEST_CASE("array conversion from double to float follows the rounding and overflow modes") {
  const double big = 1e300;
  const std::vector<double> in = {big, -big, 1.0 + std::ldexp(3.0, -25), std::numeric_limits<double>::infinity()};
  std::vector<float> out(in.size());
  precis::convert(in, out);
  CHECK(std::isinf(out[0]));
  CHECK(out[2] == 1.0f + std::ldexp(1.0f, -23));  // 0.75 ulp above 1: nearest is one ulp up
  precis::convert<precis::rounding::toward_zero>(in, out);
  CHECK(out[0] == std::numeric_limits<float>::max());  // toward zero never overflows
  CHECK(out[1] == -std::numeric_limits<float>::max());
  CHECK(out[2] == 1.0f);
  CHECK(std::isinf(out[3]));  // an infinity stays infinite
  precis::convert<precis::rounding::nearest_even, precis::overflow::saturate>(in, out);
  CHECK(out[0] == std::numeric_limits<float>::max());
  CHECK(out[3] == std::numeric_limits<float>::max());
}
