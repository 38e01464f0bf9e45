// Gradient checks for nn models: every input and parameter gradient against central
// differences in float64. The model is built under an all-double policy, so the check
// measures the derivative, not rounding.
#pragma once

#include <precis/precis.hpp>

#include <doctest/doctest.h>

#include "random.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <vector>
#include <random>
#include <string>

namespace precis_test {

/// Every type float64: nn layers under it compute, store and accumulate in double.
using f64 = precis::policy<double, double, double, double>;

/// A tensor of the given shape, uniform in [lo, hi).
template <std::size_t N>
precis::host_tensor<double, N> random_tensor(const std::array<std::size_t, N>& shape, double lo = -1.0,
                                             double hi = 1.0) {
  std::uniform_real_distribution<double> d(lo, hi);
  precis::host_tensor<double, N> t(shape);
  for (auto& v : t) v = d(rng());
  return t;
}

/// L(x) = sum(w * model(x)): its gradient with respect to the output is w.
template <class Model, class X, class W>
double objective(const precis::cpu_context& ctx, Model& m, const X& x, const W& w) {
  const auto& y = m.forward(ctx, x, precis::nn::mode::train);
  REQUIRE(y.size() == w.size());
  double s = 0.0;
  for (std::size_t i = 0; i < y.size(); ++i) s += double(y.data()[i]) * w.data()[i];
  return s;
}

/// Whether `analytic` is the derivative that the values of the objective at the point
/// (`at`) and a step h either side (`up`, `down`) give: the central difference within `tol`
/// relative to `scale`; or, where a kink (a ReLU's, a max's) lies within h of the point, the
/// difference on the point's own side of it, within a one-sided difference's larger error
/// (100 tol). At a kink the central difference mixes the slopes of both sides, and random
/// inputs put one within h of a point now and then; a wrong gradient matches neither side.
inline bool derivative_matches(double analytic, double at, double up, double down, double h, double scale,
                               double tol) {
  const auto near = [&](double numeric, double t) {
    return analytic == doctest::Approx(numeric).scale(scale).epsilon(t);
  };
  return near((up - down) / (2 * h), tol) || near((up - at) / h, 100 * tol) || near((at - down) / h, 100 * tol);
}

/// Checks the model's input and parameter gradients against central differences (steps
/// of h on the float64 values themselves; one-sided ones where a kink is within h, see
/// derivative_matches). `tol` is relative to the largest gradient.
template <class Model, std::size_t N>
void check_gradients(Model& m, precis::host_tensor<double, N> x, double tol = 1e-6, double h = 1e-6) {
  const precis::cpu_context ctx{1};
  const auto out = m.output_shape(precis::nn::shape_of<N>(x));
  const auto w = random_tensor(out);
  const double at = objective(ctx, m, x, w);
  m.zero_grad();
  const auto dx = m.backward(ctx, w);  // a copy: the model's buffers change below
  double scale = 1.0;
  for (auto v : dx) scale = std::max(scale, std::fabs(v));
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double keep = x.data()[i];
    x.data()[i] = keep + h;
    const double up = objective(ctx, m, x, w);
    x.data()[i] = keep - h;
    const double down = objective(ctx, m, x, w);
    x.data()[i] = keep;
    INFO("input element " << i << ": " << dx.data()[i] << " against central difference " << (up - down) / (2 * h));
    CHECK(derivative_matches(dx.data()[i], at, up, down, h, scale, tol));
  }
  m.for_each_parameter([&](const std::string& name, auto& p) {
    const auto grad = p.grad();
    double gscale = 1.0;
    for (auto v : grad) gscale = std::max(gscale, std::fabs(double(v)));
    for (std::size_t i = 0; i < p.size(); ++i) {
      const double keep = p.master().data()[i];
      p.master().data()[i] = keep + h;
      p.refresh();
      const double up = objective(ctx, m, x, w);
      p.master().data()[i] = keep - h;
      p.refresh();
      const double down = objective(ctx, m, x, w);
      p.master().data()[i] = keep;
      p.refresh();
      INFO("parameter " << name << "[" << i << "]: " << double(grad.data()[i]) << " against central difference "
                         << (up - down) / (2 * h));
      CHECK(derivative_matches(double(grad.data()[i]), at, up, down, h, gscale, tol));
    }
  });
}

/// True when two tensors hold the same bits.
template <class A, class B>
bool same_bits(const A& a, const B& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(*a.data())) == 0;
}

/// Runs forward and backward (output gradient: `dy_value` everywhere) on copies of `m` with
/// 1 and 2 threads; checks that outputs, input gradients and parameter gradients have the
/// same bits.
template <class Model, class X>
void check_thread_independent(const Model& m, const X& x, float dy_value = 0.25f) {
  Model a = m, b = m;
  const precis::cpu_context one{1}, two{2};
  const auto ya = a.forward(one, x);
  const auto yb = b.forward(two, x);
  CHECK(same_bits(ya, yb));
  typename Model::output_grad_tensor dy(ya.shape());
  dy.fill(typename Model::output_grad_type(dy_value));
  a.zero_grad();
  b.zero_grad();
  const auto dxa = a.backward(one, dy);
  const auto dxb = b.backward(two, dy);
  CHECK(same_bits(dxa, dxb));
  std::vector<std::vector<unsigned char>> ga, gb;
  auto collect = [](std::vector<std::vector<unsigned char>>& out) {
    return [&out](const std::string&, const auto& p) {
      const auto* bytes = reinterpret_cast<const unsigned char*>(p.grad().data());
      out.emplace_back(bytes, bytes + p.size() * sizeof(*p.grad().data()));
    };
  };
  a.for_each_parameter(collect(ga));
  b.for_each_parameter(collect(gb));
  CHECK(ga == gb);
}

}  // namespace precis_test
