// Helpers shared by the elementwise, cast, reduce, softmax, loss and norm kernel tests:
// random inputs rounded to the element type under test, float64 copies of them for the
// references, NaN poisoning of outputs, error measures and finite differences.
//
// Error bounds, per output element type: max |kernel - reference| / max |reference| (the
// error relative to the output's max norm), the reference computed in float64 from the
// same rounded inputs. The kernels compute in float, so the error is the output's rounding
// (unit roundoff u = 2^-p for p significand bits, relative to the element, so at most u
// relative to the norm) plus float arithmetic (a few float ulps per element; the row sums
// of softmax and norms add about sqrt(n) ulps, about 1e-6 for the rows used here):
//
//   output type   u           bound    why the margin
//   float         6.0e-8      1e-5     float math: exp/erf/tanh a few ulps, sums of <= 4096
//                                      terms sqrt(n) u ~ 4e-6 at most in practice
//   double        1.1e-16     1e-12    (double policies only)
//   bfloat16      3.9e-3/2    1e-2     one rounding (2^-9 = 1.95e-3) plus float math
//   float16       4.9e-4      2e-3     one rounding (2^-11) plus float math
//   float8_e4m3   6.3e-2/2    7e-2     one rounding (2^-4 = 6.25e-2 at worst, relative)
//   float8_e5m2   1.3e-1/2    1.3e-1   one rounding (2^-3)
//
// Scalars (reductions, losses) are returned in float: their bound is 1e-5 relative to the
// sum of the magnitudes of their terms (sums of positive terms in the tests), i.e.
// sqrt(n) float ulps with room to spare for n <= 10^4.
#pragma once

#include <precis/numeric/numeric.hpp>
#include <precis/policy/policy.hpp>
#include <precis/tensor/host_tensor.hpp>

#include "random.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace precis_test {

/// One precision configuration under test: element type and the policy that goes with it.
template <class Element, class Policy>
struct config {
  using T = Element;
  using P = Policy;
};
using fp32_config = config<float, precis::presets::fp32>;
/// Float tensors with the hardware's products (oneDNN's float kernels where the test links
/// precis::onednn, else the exact kernel): held to fp32's float64 bounds.
using fp32_hw_config = config<float, precis::presets::fp32_hardware>;
using bf16_config = config<precis::bfloat16, precis::presets::bf16_mixed>;
using fp16_config = config<precis::float16, precis::presets::fp16_mixed>;
/// float16 tensors with the hardware's products (oneDNN's float kernels on the converted
/// inputs where the test links precis::onednn, else the exact kernel): fp16's bounds.
using fp16_hw_config = config<precis::float16, precis::presets::fp16_hardware>;

/// The error bound of the table above for output element type T.
template <class T>
constexpr double bound() {
  if constexpr (std::is_same_v<T, float>) return 1e-5;
  else if constexpr (std::is_same_v<T, double>) return 1e-12;
  else if constexpr (std::is_same_v<T, precis::bfloat16>) return 1e-2;
  else if constexpr (std::is_same_v<T, precis::float16>) return 2e-3;
  else if constexpr (std::is_same_v<T, precis::float8_e4m3>) return 7e-2;
  else return 1.3e-1;
}

/// Bound for float scalars (losses, reductions) relative to the sum of |terms|.
inline constexpr double scalar_bound = 1e-5;

/// Bound of central differences against the analytic float64 gradient (h = 1e-5:
/// truncation h^2 ~ 1e-10, cancellation 1e-16 / h ~ 1e-11).
inline constexpr double fd_bound = 1e-6;

template <class T>
double to_double(T v) {
  if constexpr (precis::detail::precis_format<T>) {
    return double(float(v));
  } else {
    return static_cast<double>(v);
  }
}

template <class T>
T from_double(double v) {
  if constexpr (precis::detail::precis_format<T>) {
    return T(v);
  } else {
    return static_cast<T>(v);
  }
}

/// A tensor of uniform values in [lo, hi] rounded to T. With lo < hi and a continuous
/// distribution, never all zero; a tensor that rounded to all zeros is drawn again.
template <class T, std::size_t N>
precis::host_tensor<T, N> random_tensor(const std::array<std::size_t, N>& shape, double lo = -2.0,
                                        double hi = 2.0) {
  auto t = precis::host_tensor<T, N>::from_shape(shape);
  std::uniform_real_distribution<double> u(lo, hi);
  bool nonzero = t.size() == 0;
  while (!nonzero) {
    for (auto& v : t) {
      v = from_double<T>(u(rng()));
      nonzero = nonzero || to_double(v) != 0.0;
    }
  }
  return t;
}

/// Float64 values in [-1, 1), 2e-3 apart in a random order: no two within central
/// differences' step of each other, so that a maximum's winner does not change under them
/// (random_tensor's values can, and then the difference quotient straddles the switch).
template <std::size_t N>
precis::host_tensor<double, N> tie_free_tensor(const std::array<std::size_t, N>& shape) {
  auto t = precis::host_tensor<double, N>::from_shape(shape);
  std::vector<std::size_t> order(t.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng());
  for (std::size_t i = 0; i < t.size(); ++i) t.data()[i] = -1.0 + 2e-3 * double(order[i]);
  return t;
}

/// The same values in float64.
template <class T, std::size_t N>
precis::host_tensor<double, N> to_double(const precis::host_tensor<T, N>& t) {
  auto d = precis::host_tensor<double, N>::from_shape(t.shape());
  for (std::size_t i = 0; i < t.size(); ++i) d.data()[i] = to_double(t.data()[i]);
  return d;
}

/// A tensor of shape `shape` filled with NaN, so that an element a kernel fails to write
/// shows up.
template <class T, std::size_t N, class Shape>
precis::host_tensor<T, N> poisoned(const Shape& shape) {
  auto t = precis::host_tensor<T, N>::from_shape(shape);
  t.fill(from_double<T>(std::numeric_limits<double>::quiet_NaN()));
  return t;
}

/// Refills `t` with NaN.
template <class T, std::size_t N>
void poison(precis::host_tensor<T, N>& t) {
  t.fill(from_double<T>(std::numeric_limits<double>::quiet_NaN()));
}

/// max |got - ref| / max |ref| (infinity if anything is NaN or infinite).
template <class T, std::size_t N>
double rel_error(const precis::host_tensor<T, N>& got, const precis::host_tensor<double, N>& ref) {
  REQUIRE(got.size() == ref.size());
  double err = 0, norm = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = to_double(got.data()[i]), r = ref.data()[i];
    if (!std::isfinite(g) || !std::isfinite(r)) return std::numeric_limits<double>::infinity();
    err = std::max(err, std::abs(g - r));
    norm = std::max(norm, std::abs(r));
  }
  return norm == 0 ? err : err / norm;
}

/// |got - ref| / scale (scale: the sum of the magnitudes of the terms).
inline double scalar_error(double got, double ref, double scale) {
  if (!std::isfinite(got)) return std::numeric_limits<double>::infinity();
  return std::abs(got - ref) / (scale == 0 ? 1.0 : scale);
}

/// The gradient of the scalar function f at x by central differences.
template <class F, std::size_t N>
precis::host_tensor<double, N> fd_gradient(F f, const precis::host_tensor<double, N>& x,
                                           double h = 1e-5) {
  auto g = precis::host_tensor<double, N>::from_shape(x.shape());
  auto xp = x;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double v = x.data()[i];
    xp.data()[i] = v + h;
    const double fp = f(xp);
    xp.data()[i] = v - h;
    const double fm = f(xp);
    xp.data()[i] = v;
    g.data()[i] = (fp - fm) / (2 * h);
  }
  return g;
}

/// sum(w * y): turns a vector function into the scalar whose gradient is the
/// vector-Jacobian product with w.
template <std::size_t N>
double dot(const precis::host_tensor<double, N>& w, const precis::host_tensor<double, N>& y) {
  double s = 0;
  for (std::size_t i = 0; i < w.size(); ++i) s += w.data()[i] * y.data()[i];
  return s;
}

/// True when the two tensors hold the same bits.
template <class T, std::size_t N>
bool same_bits(const precis::host_tensor<T, N>& a, const precis::host_tensor<T, N>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

/// A float tensor rounded to T by precis::convert (the reference for a kernel's narrow
/// output: its float output rounded once).
template <class T, std::size_t N>
precis::host_tensor<T, N> rounded(const precis::host_tensor<float, N>& y) {
  auto r = precis::host_tensor<T, N>::from_shape(y.shape());
  precis::convert(std::span<const float>(y.data(), y.size()), std::span<T>(r.data(), r.size()));
  return r;
}

/// Runs f and checks it throws precis::error whose message contains every one of `parts`.
template <class F, class... Parts>
void check_error(F f, const Parts&... parts) {
  const std::vector<std::string> wanted{std::string(parts)...};
  bool thrown = false;
  try {
    f();
  } catch (const precis::error& e) {
    thrown = true;
    const std::string what = e.what();
    INFO("message: " << what);
    for (const auto& part : wanted) CHECK(what.find(part) != std::string::npos);
  }
  CHECK(thrown);
}

}  // namespace precis_test
