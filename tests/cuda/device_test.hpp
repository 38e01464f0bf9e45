// What the device tests share: random host tensors, NaN-poisoned device outputs, and the
// comparisons of a device result with the CPU kernel's (within a bound relative to the
// largest host value, or bit for bit). Failures are counted and printed; main returns
// failures == 0.
#pragma once

#include <precis/tensor/device_tensor.hpp>
#include <precis/tensor/host_tensor.hpp>

#include "../gpu.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>

namespace precis_test {

inline int failures = 0;
inline std::mt19937 rng(test_seed());

/// The relative error a device result of type T may have against the host's: one
/// rounding of each plus float arithmetic in another order and the device's libm.
template <class T>
constexpr double bound() {
  if constexpr (std::is_same_v<T, float>) {
    return 1e-5;
  } else if constexpr (std::is_same_v<T, precis::bfloat16>) {
    return 1e-2;
  } else {
    return 2e-3;  // float16
  }
}

inline void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::printf("FAILED: %s\n", what.c_str());
    ++failures;
  }
}

/// Normal values with the given spread and mean, rounded to T.
template <class T, std::size_t N>
precis::host_tensor<T, N> random_tensor(const std::array<std::size_t, N>& shape, float scale = 1.0F,
                                        float mean = 0.0F) {
  std::normal_distribution<float> d(mean, scale);
  auto t = precis::host_tensor<T, N>::from_shape(shape);
  for (auto& v : t) v = T(d(rng));
  return t;
}

/// A device tensor of the shape, every byte 0xFF (NaN in float, bfloat16 and float16).
/// The fill is finished before this returns: the legacy default stream it runs on is not
/// ordered with a context's non-blocking stream.
template <class T, std::size_t N>
precis::device_tensor<T, N> poisoned(const std::array<std::size_t, N>& shape) {
  precis::device_tensor<T, N> d(shape);
  precis::check(cudaMemset(d.data(), 0xFF, d.size() * sizeof(T)), "cudaMemset");
  precis::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  return d;
}

/// Whether two tensors of rank N have one shape.
template <class A, class B>
bool equal_shapes(const A& a, const B& b) {
  if (a.shape().size() != b.shape().size()) return false;
  for (std::size_t k = 0; k < a.shape().size(); ++k) {
    if (std::size_t(a.shape()[k]) != std::size_t(b.shape()[k])) return false;
  }
  return true;
}

/// max |device - host| / max(max |host|, scale) < limit; any non-finite value, or a shape
/// that is not the host's, fails.
/// `scale` is the size of the terms a result is the difference of, where that difference
/// can cancel to (near) zero: there the error is measured against the terms, not the result.
template <class T, std::size_t N>
void compare(const std::string& what, precis::cuda_context& ctx,
             const precis::device_tensor<T, N>& got, const precis::host_tensor<T, N>& want,
             double limit = bound<T>(), double scale = 0) {
  const auto g = precis::to_host(got, ctx.stream());
  if (!precis_test::equal_shapes(g, want)) {
    std::printf("FAILED: %s: the device result's shape is not the host's\n", what.c_str());
    ++failures;
    return;
  }
  double err = 0, norm = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double a = double(g.data()[i]), b = double(want.data()[i]);
    if (!std::isfinite(a) || !std::isfinite(b)) {
      err = std::numeric_limits<double>::infinity();
      break;
    }
    err = std::max(err, std::abs(a - b));
    norm = std::max(norm, std::abs(b));
  }
  norm = std::max(norm, scale);
  const double rel = norm == 0 ? err : err / norm;
  if (!(rel < limit)) {
    std::printf("FAILED: %s: device vs host %g >= %g\n", what.c_str(), rel, limit);
    ++failures;
  }
}

/// The device result has the host result's bits.
template <class T, std::size_t N>
bool same_bits(precis::cuda_context& ctx, const precis::device_tensor<T, N>& got,
               const precis::host_tensor<T, N>& want) {
  const auto g = precis::to_host(got, ctx.stream());
  return precis_test::equal_shapes(g, want) && std::memcmp(g.data(), want.data(), g.size() * sizeof(T)) == 0;
}

/// f() throws precis::error whose message holds `needle`.
template <class F>
void expect_error(const std::string& what, F f, const std::string& needle) {
  try {
    f();
  } catch (const precis::error& e) {
    if (std::string(e.what()).find(needle) != std::string::npos) return;
    std::printf("FAILED: %s: message \"%s\" lacks \"%s\"\n", what.c_str(), e.what(),
                needle.c_str());
    ++failures;
    return;
  }
  std::printf("FAILED: %s: no precis::error\n", what.c_str());
  ++failures;
}

/// What main returns: prints the count of failures.
inline int finish() {
  std::printf("%d failures\n", failures);
  return failures == 0 ? 0 : 1;
}

}  // namespace precis_test
