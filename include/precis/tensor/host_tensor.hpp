// precis/tensor/host_tensor.hpp: tensors in host memory, on xtensor, holding any precis
// number format, and the shape checks every kernel makes.
#pragma once

#include <precis/config.hpp>
#include <precis/numeric/numeric.hpp>

#include <xtensor/xtensor.hpp>

#include <array>
#include <cstddef>
#include <initializer_list>
#include <string>
#include <string_view>
#include <type_traits>

namespace precis {

/// A dense row-major tensor of rank N in host memory. xtensor's containers, views and
/// expressions work with float16, bfloat16 and the float8 formats (arithmetic on them
/// goes through float and rounds once, as the formats themselves do).
template <class T, std::size_t N>
using host_tensor = xt::xtensor<T, N, xt::layout_type::row_major>;

/// True for host_tensor<T, N> of any T and N.
template <class X>
inline constexpr bool is_host_tensor_v = false;
template <class T, std::size_t N>
inline constexpr bool is_host_tensor_v<xt::xtensor<T, N, xt::layout_type::row_major>> = true;

/// A host tensor.
template <class X>
concept HostTensor = is_host_tensor_v<std::remove_cvref_t<X>>;

/// "[2, 3, 4]".
template <class Shape>
std::string shape_string(const Shape& shape) {
  std::string s = "[";
  bool first = true;
  for (auto d : shape) {
    if (!first) s += ", ";
    s += std::to_string(d);
    first = false;
  }
  return s + "]";
}

/// Throws precis::error naming `what` (e.g. "precis::gemm: c") and both shapes unless
/// `t` has exactly `expected` as its shape.
template <class X, std::size_t N>
void check_shape(std::string_view what, const X& t, const std::array<std::size_t, N>& expected) {
  bool same = t.dimension() == N;
  for (std::size_t i = 0; same && i < N; ++i) same = std::size_t(t.shape()[i]) == expected[i];
  if (!same) {
    throw error(std::string(what) + " has shape " + shape_string(t.shape()) + ", expected " +
                shape_string(expected));
  }
}

/// Throws precis::error unless `a` and `b` have the same shape.
template <class A, class B>
void check_same_shape(std::string_view what, const A& a, const B& b) {
  bool same = a.dimension() == b.dimension();
  for (std::size_t i = 0; same && i < a.dimension(); ++i) same = a.shape()[i] == b.shape()[i];
  if (!same) {
    throw error(std::string(what) + ": shapes " + shape_string(a.shape()) + " and " +
                shape_string(b.shape()) + " differ");
  }
}

}  // namespace precis
