// The vectorised float math of the host kernels (kernels/cpu/vec_math.hpp) against
// float64: every bfloat16 and every float16 value as input, and a million random floats
// over each function's range. Errors are in float ulps of the reference (for a gradient
// that crosses zero, ulps of the sum of its terms' magnitudes, since the cancellation
// there is the function's, not the kernel's); where the reference is subnormal in float,
// in units of the smallest subnormal (2^-149), counted separately. The bounds are what the
// functions are documented to reach, in both arithmetics (vmath::exact_arith, and
// fused_arith, which uses fused multiply-adds where the build targets them); the measured
// maxima are printed.
#include <precis/kernels/cpu/vec_math.hpp>
#include <precis/numeric/numeric.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace {

namespace vm = precis::detail::vmath;

/// The spacing of floats at |r| (subnormal spacing below the normal range).
double float_ulp(double r) {
  const double a = std::abs(r);
  if (a < std::ldexp(1.0, -126)) return std::ldexp(1.0, -149);
  int e = 0;
  std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1)
  return std::ldexp(1.0, e - 24);
}

/// Every input the tests run: all bfloat16 and float16 values (NaN and infinities
/// included) and a million uniform floats in [lo, hi].
std::vector<float> inputs(float lo, float hi) {
  std::vector<float> xs;
  for (std::uint32_t b = 0; b < 65536; ++b) {
    xs.push_back(float(precis::bfloat16::from_bits(std::uint16_t(b))));
    xs.push_back(float(precis::float16::from_bits(std::uint16_t(b))));
  }
  std::mt19937 g(2024);
  std::uniform_real_distribution<float> u(lo, hi);
  for (int i = 0; i < 1000000; ++i) xs.push_back(u(g));
  return xs;
}

/// The largest errors of f over xs: in ulps of scale(x, ref) where that is a normal float,
/// and in units of 2^-149 where it is subnormal; NaN must match NaN, and infinities and
/// exact zeros of the reference must come out exactly.
struct errors {
  double ulps = 0, subnormal = 0;
  std::string worst, worst_subnormal;
};

template <class F, class Ref, class Scale>
errors measure(const std::vector<float>& xs, F f, Ref ref, Scale scale) {
  std::vector<float> ys(xs.size());
  vm::map(xs.data(), ys.data(), xs.size(), f);
  errors out;
  double& most = out.ulps;
  std::string& worst = out.worst;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const double r = ref(double(xs[i]));
    const double y = double(ys[i]);
    if (std::isnan(r) || std::isnan(y)) {
      if (std::isnan(r) != std::isnan(y)) {
        most = std::numeric_limits<double>::infinity();
        worst = "x = " + std::to_string(xs[i]) + ": NaN mismatch";
      }
      continue;
    }
    if (std::isinf(r) || std::isinf(y) || r == 0) {
      // Overflow to infinity and exact zeros: the float reference decides.
      const double want = double(float(r));
      if (y != want) {
        most = std::numeric_limits<double>::infinity();
        worst = "x = " + std::to_string(xs[i]) + ": got " + std::to_string(y);
      }
      continue;
    }
    const double sc = std::abs(scale(double(xs[i]), r));
    const double err = std::abs(y - r) / float_ulp(sc);
    const bool sub = sc < std::ldexp(1.0, -126);
    if (err > (sub ? out.subnormal : most)) {
      (sub ? out.subnormal : most) = err;
      (sub ? out.worst_subnormal : worst) =
          "x = " + std::to_string(xs[i]) + " (" + std::to_string(y) + " vs " + std::to_string(r) + ")";
    }
  }
  return out;
}

#define PRECIS_REPORT(name, e)                                                                 \
  MESSAGE(name << ": max " << (e).ulps << " ulp at " << (e).worst << "; subnormal results: max " \
               << (e).subnormal << " x 2^-149 at " << (e).worst_subnormal)

const auto itself = [](double, double r) { return r; };

double phi(double x) { return 0.5 * std::erfc(-x / std::numbers::sqrt2); }
double pdf(double x) { return std::exp(-0.5 * x * x) / std::sqrt(2 * std::numbers::pi); }

}  // namespace

TEST_CASE_TEMPLATE("vectorised exp is within 1 ulp (1.05 with fused multiply-adds)", A,
                   vm::exact_arith, vm::fused_arith) {
  const errors e = measure(inputs(-104.0F, 89.0F), [](vm::vf v) { return vm::exp<A>(v); },
                           [](double x) { return std::exp(x); }, itself);
  PRECIS_REPORT("exp", e);
  // Measured: 0.99 exact, 1.03 fused (AVX-512; the largest error moves, it does not grow).
  CHECK(e.ulps <= (std::is_same_v<A, vm::exact_arith> ? 1.0 : 1.05));
  CHECK(e.subnormal <= 1.0);
}

TEST_CASE_TEMPLATE("exp_normal gives exp's bits over its whole range", A, vm::exact_arith,
                   vm::fused_arith) {
  // Every 1021st float of [-86, 88] (a prime stride, so every exponent and every part of
  // the mantissas is visited), both ends and their neighbours, and the bfloat16 and
  // float16 values inside the range.
  std::vector<float> xs{
      vm::exp_normal_low,          88.0F, std::nextafter(vm::exp_normal_low, 0.0F),
      std::nextafter(88.0F, 0.0F), 0.0F,  -0.0F};
  const auto add_range = [&](float lo, float hi) {  // lo < hi, same sign
    const auto a = std::bit_cast<std::uint32_t>(lo), b = std::bit_cast<std::uint32_t>(hi);
    for (std::uint32_t u = std::min(a, b); u <= std::max(a, b); u += 1021) {
      xs.push_back(std::bit_cast<float>(u));
    }
  };
  add_range(std::numeric_limits<float>::denorm_min(), 88.0F);
  add_range(-std::numeric_limits<float>::denorm_min(), vm::exp_normal_low);
  for (std::uint32_t bits = 0; bits < 65536; ++bits) {
    for (const float x : {float(precis::bfloat16::from_bits(std::uint16_t(bits))),
                          float(precis::float16::from_bits(std::uint16_t(bits)))}) {
      if (x >= vm::exp_normal_low && x <= 88.0F) xs.push_back(x);
    }
  }
  while (xs.size() % vm::lanes != 0) xs.push_back(1.0F);
  std::size_t differ = 0;
  float first = 0;
  for (std::size_t i = 0; i < xs.size(); i += vm::lanes) {
    const vm::vf x = vm::load(xs.data() + i);
    const vm::vf fast = vm::exp_normal<A>(x), general = vm::exp<A>(x);
    for (std::size_t l = 0; l < vm::lanes; ++l) {
      if (std::bit_cast<std::uint32_t>(fast[l]) != std::bit_cast<std::uint32_t>(general[l])) {
        if (differ++ == 0) first = xs[i + l];
      }
    }
  }
  INFO(xs.size() << " inputs; the first that differs: " << first);
  CHECK(differ == 0);
}

TEST_CASE_TEMPLATE("vectorised normal CDF and GELU are within 6 ulps, tails included", A,
                   vm::exact_arith, vm::fused_arith) {
  const auto xs = inputs(-20.0F, 20.0F);
  const errors c = measure(xs, [](vm::vf v) { return vm::normal_cdf<A>(v); }, phi, itself);
  PRECIS_REPORT("normal cdf", c);
  CHECK(c.ulps <= 6.0);
  CHECK(c.subnormal <= 4.0);
  const errors g = measure(xs, [](vm::vf v) { return vm::gelu<A>(v); },
                           [](double x) { return x * phi(x); }, itself);
  PRECIS_REPORT("gelu", g);
  CHECK(g.ulps <= 6.0);
  CHECK(g.subnormal <= 16.0);
}

TEST_CASE_TEMPLATE("vectorised GELU gradient is within 8 ulps of its terms", A, vm::exact_arith,
                   vm::fused_arith) {
  const auto xs = inputs(-20.0F, 20.0F);
  const errors g = measure(
      xs, [](vm::vf v) { return vm::gelu_grad<A>(vm::splat(1.0F), v); },
      [](double x) { return phi(x) + x * pdf(x); },
      [](double x, double) { return std::abs(phi(x)) + std::abs(x * pdf(x)); });
  PRECIS_REPORT("gelu grad", g);
  CHECK(g.ulps <= 8.0);
  CHECK(g.subnormal <= 16.0);
}

TEST_CASE_TEMPLATE("GELU with its gradient factor in one pass: the bits of the two functions", A,
                   vm::exact_arith, vm::fused_arith) {
  // Every bfloat16 and float16 value and a million floats in [-20, 20], plus the specials
  // and the ends of the clamps. (All 2^32 floats gave no difference when this was written.)
  auto xs = inputs(-20.0F, 20.0F);
  for (float v : {0.0F, -0.0F, 20.0F, -20.0F, 20.000002F, -20.000002F, 1e-45F, -1e-45F,
                  std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                  std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN()}) {
    xs.push_back(v);
  }
  std::vector<float> y(xs.size()), f(xs.size()), y0(xs.size()), f0(xs.size());
  for (std::size_t i = 0; i < xs.size(); i += vm::lanes) {
    const std::size_t n = std::min(vm::lanes, xs.size() - i);
    vm::vf factor;
    vm::store_partial(y.data() + i, vm::gelu_and_grad_factor<A>(vm::load_partial(xs.data() + i, n), factor), n);
    vm::store_partial(f.data() + i, factor, n);
  }
  vm::map(xs.data(), y0.data(), xs.size(), [](vm::vf v) { return vm::gelu<A>(v); });
  vm::map(xs.data(), f0.data(), xs.size(), [](vm::vf v) { return vm::gelu_grad_factor<A>(v); });
  std::size_t differ = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const bool same = std::bit_cast<std::uint32_t>(y[i]) == std::bit_cast<std::uint32_t>(y0[i]) &&
                      std::bit_cast<std::uint32_t>(f[i]) == std::bit_cast<std::uint32_t>(f0[i]);
    if (!same && differ++ < 5) MESSAGE("x = " << xs[i] << ": " << y[i] << ", " << f[i] << " vs " << y0[i] << ", " << f0[i]);
  }
  CHECK(differ == 0);
}

TEST_CASE("fused_arith fuses where the build targets FMA, and only there") {
  // Random floats where GELU is neither 0 nor x: a fused multiply-add changes the last bit
  // of some of them.
  std::mt19937 g(11);
  std::uniform_real_distribution<float> u(-8.0F, 8.0F);
  std::vector<float> xs(1 << 16), exact(xs.size()), fused(xs.size());
  for (auto& v : xs) v = u(g);
  vm::map(xs.data(), exact.data(), xs.size(), [](vm::vf v) { return vm::gelu<vm::exact_arith>(v); });
  vm::map(xs.data(), fused.data(), xs.size(), [](vm::vf v) { return vm::gelu<vm::fused_arith>(v); });
  std::size_t differ = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) differ += exact[i] != fused[i] ? 1U : 0U;
  MESSAGE("GELU results that fused multiply-adds changed: " << differ << " of " << xs.size());
#if defined(__AVX512F__) || defined(__FMA__)
  CHECK(differ > 0);
#else
  CHECK(differ == 0);
#endif
}

TEST_CASE_TEMPLATE("vectorised sigmoid is within 3 ulps, its gradient within 4", A, vm::exact_arith,
                   vm::fused_arith) {
  const auto xs = inputs(-100.0F, 100.0F);
  const errors s = measure(xs, [](vm::vf v) { return vm::sigmoid<A>(v); },
                           [](double x) { return 1 / (1 + std::exp(-x)); }, itself);
  PRECIS_REPORT("sigmoid", s);
  CHECK(s.ulps <= 3.0);
  CHECK(s.subnormal <= 2.0);
  const errors d = measure(
      xs, [](vm::vf v) { return vm::sigmoid_grad<A>(vm::splat(1.0F), v); },
      [](double x) {
        const double e = std::exp(-std::abs(x));
        return e / ((1 + e) * (1 + e));
      },
      itself);
  PRECIS_REPORT("sigmoid grad", d);
  CHECK(d.ulps <= 4.0);
  CHECK(d.subnormal <= 4.0);
}

TEST_CASE("row sums of long rows stay accurate, and do not depend on where a row starts") {
  std::mt19937 g(7);
  std::uniform_real_distribution<float> u(0.0F, 1.0F);
  for (std::size_t n : {1U, 15U, 16U, 17U, 1000U, 1024U, 1025U, 4096U, 16384U, 50257U, 1000003U}) {
    std::vector<float> x(n + 1);
    for (auto& v : x) v = u(g);
    double ref = 0, mag = 0;
    for (std::size_t i = 0; i < n; ++i) {
      ref += double(x[i]);
      mag += std::abs(double(x[i]));
    }
    const float s = vm::row_sum(x.data(), n);
    INFO("n = " << n);
    // A few float ulps of the sum's magnitude, whatever n (a plain loop loses ~sqrt(n)).
    CHECK(std::abs(double(s) - ref) <= 4 * float_ulp(mag));
    // The same row copied elsewhere (another alignment) sums to the same bits.
    std::vector<float> y(x.begin(), x.begin() + std::ptrdiff_t(n));
    CHECK(vm::row_sum(y.data(), n) == s);
  }
}

TEST_CASE("bfloat16 vector loads are exact and stores round as precis::convert does") {
  using precis::bfloat16;
  // Every bfloat16 bit pattern widens to its value (NaNs keep their bits).
  std::vector<std::uint16_t> bits(1U << 16);
  for (std::size_t i = 0; i < bits.size(); ++i) bits[i] = std::uint16_t(i);
  std::size_t wrong_loads = 0;
  for (std::size_t i = 0; i < bits.size(); i += vm::lanes) {
    float out[vm::lanes];
    vm::store(out, vm::load_upper_half(bits.data() + i));
    for (std::size_t j = 0; j < vm::lanes; ++j) {
      wrong_loads += std::bit_cast<std::uint32_t>(out[j]) != std::uint32_t(bits[i + j]) << 16;
    }
  }
  CHECK(wrong_loads == 0);
  // Stores: every upper half with lower halves at and around the rounding boundaries
  // (ties, just below and above them, the extremes) and random ones, against the scalar
  // conversion; NaNs become the canonical quiet NaN, overflow infinity.
  std::mt19937 g(3);
  std::vector<float> in;
  for (std::uint32_t hi = 0; hi < (1U << 16); ++hi) {
    for (const std::uint32_t lo :
         {0x0000U, 0x0001U, 0x7FFFU, 0x8000U, 0x8001U, 0xFFFFU, std::uint32_t(g() & 0xFFFFU)}) {
      in.push_back(std::bit_cast<float>((hi << 16) | lo));
    }
  }
  while (in.size() % vm::lanes != 0) in.push_back(0.0F);
  std::vector<std::uint16_t> out(in.size());
  for (std::size_t i = 0; i < in.size(); i += vm::lanes) {
    vm::store_upper_half<bfloat16::format>(out.data() + i, vm::load(in.data() + i));
  }
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < in.size(); ++i) wrong += out[i] != bfloat16(in[i]).bits();
  CHECK(wrong == 0);
  // Partial vectors read and write only their lanes.
  for (std::size_t count = 1; count < vm::lanes; ++count) {
    std::vector<std::uint16_t> dst(vm::lanes, 0xABCDU);
    vm::store_upper_half<bfloat16::format>(dst.data(), vm::load(in.data() + 7 * vm::lanes), count);
    const vm::vf back = vm::load_upper_half(dst.data(), count);
    for (std::size_t j = 0; j < vm::lanes; ++j) {
      if (j < count) {
        CHECK(dst[j] == bfloat16(in[7 * vm::lanes + j]).bits());
        CHECK(std::bit_cast<std::uint32_t>(float(back[j])) == std::uint32_t(dst[j]) << 16);
      } else {
        CHECK(dst[j] == 0xABCDU);
        CHECK(float(back[j]) == 0.0F);
      }
    }
  }
}

TEST_CASE("row ranges: the smallest and largest values, NaN if there is one, tails ignored") {
  std::mt19937 g(5);
  std::uniform_real_distribution<float> u(-100.0F, 100.0F);
  const auto range = [](const std::vector<float>& x, std::size_t n) {
    return vm::row_range_of(n, [&](std::size_t i) { return vm::load_padded(x.data(), i, n); });
  };
  for (std::size_t n : {1U, 15U, 16U, 17U, 100U}) {
    for (const float beyond : {1e30F, -1e30F}) {  // beyond n: never read
      INFO("n = " << n << ", beyond n: " << beyond);
      std::vector<float> x(n + vm::lanes, beyond);
      for (std::size_t i = 0; i < n; ++i) x[i] = u(g);
      const auto first = x.begin(), last = x.begin() + std::ptrdiff_t(n);
      CHECK(range(x, n).max == *std::max_element(first, last));
      CHECK(range(x, n).min == *std::min_element(first, last));
      x[n - 1] = std::numeric_limits<float>::quiet_NaN();
      CHECK(std::isnan(range(x, n).max));
      CHECK(std::isnan(range(x, n).min));
    }
  }
  // Whether a row's shifted values x - max all lie in exp_normal's range.
  CHECK(vm::exp_normal_covers(-86.0F, 0.0F));
  CHECK(vm::exp_normal_covers(1.0F, 87.0F));
  CHECK(!vm::exp_normal_covers(std::nextafter(-86.0F, -87.0F), 0.0F));
  CHECK(!vm::exp_normal_covers(-std::numeric_limits<float>::infinity(), 0.0F));
  CHECK(!vm::exp_normal_covers(std::numeric_limits<float>::quiet_NaN(), 0.0F));
}

TEST_CASE("min and max follow a < b ? a : b and a > b ? a : b in every lane") {
  // NaN on either side, zeros of both signs, infinities, subnormals and ordinary values:
  // every pair, against the scalar conditional (bit for bit: the sign of a zero counts).
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> v{nan,  -nan,  0.0F,  -0.0F,  inf,    -inf, 1e-45F, -1e-45F,
                             1.5F, -2.0F, 3e38F, -3e38F, 1e-40F, 7.0F, -7.0F};
  std::vector<float> a, b;
  for (float p : v) {
    for (float q : v) {
      a.push_back(p);
      b.push_back(q);
    }
  }
  while (a.size() % vm::lanes != 0) {
    a.push_back(0.0F);
    b.push_back(1.0F);
  }
  for (std::size_t i = 0; i < a.size(); i += vm::lanes) {
    const vm::vf x = vm::load(a.data() + i), y = vm::load(b.data() + i);
    const vm::vf lo = vm::min(x, y), hi = vm::max(x, y);
    for (std::size_t l = 0; l < vm::lanes; ++l) {
      INFO("a = " << a[i + l] << ", b = " << b[i + l]);
      const float want_lo = a[i + l] < b[i + l] ? a[i + l] : b[i + l];
      const float want_hi = a[i + l] > b[i + l] ? a[i + l] : b[i + l];
      CHECK(std::bit_cast<std::uint32_t>(lo[l]) == std::bit_cast<std::uint32_t>(want_lo));
      CHECK(std::bit_cast<std::uint32_t>(hi[l]) == std::bit_cast<std::uint32_t>(want_hi));
    }
  }
}
