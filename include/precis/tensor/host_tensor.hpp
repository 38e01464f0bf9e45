/// @file
/// Tensors in host memory, on xtensor, holding any precis number format, and the shape checks every
/// kernel makes.
#pragma once

#include <precis/config.hpp>
#include <precis/numeric/numeric.hpp>

#include <xtensor/xtensor.hpp>

#include <array>
#include <cstddef>
#include <initializer_list>
#include <limits>
#include <new>
#include <string>
#include <string_view>
#include <type_traits>

namespace precis {

/// The alignment of a host tensor's elements: a cache line, which is also the width of
/// an AVX-512 register and of an AMX tile row.
inline constexpr std::size_t host_tensor_alignment = 64;

/// The allocator of host tensors: storage aligned to host_tensor_alignment bytes. malloc
/// aligns to 16 bytes only (large blocks sit 16 bytes past a page boundary), which splits
/// every 64-byte load and store of the vector and matrix units over two cache lines.
template <class T>
struct aligned_allocator {
  /// The element type it allocates.
  using value_type = T;

  aligned_allocator() noexcept = default;
  /// A copy from the allocator of another element type (the allocator has no state).
  template <class U>
  constexpr aligned_allocator(const aligned_allocator<U>& /*other*/) noexcept {}

  /// Uninitialised, aligned storage for `n` elements. Throws std::bad_array_new_length when
  /// n * sizeof(T) overflows, std::bad_alloc when there is no memory.
  T* allocate(std::size_t n) {
    if (n > std::numeric_limits<std::size_t>::max() / sizeof(T)) throw std::bad_array_new_length();
    return static_cast<T*>(::operator new (n * sizeof(T), std::align_val_t{host_tensor_alignment}));
  }
  /// Frees storage that allocate() returned.
  void deallocate(T* p, std::size_t /*n*/) noexcept {
    ::operator delete (p, std::align_val_t{host_tensor_alignment});
  }

  /// The same allocator for elements of type U.
  template <class U>
  struct rebind {
    using other = aligned_allocator<U>;  ///< aligned_allocator of U
  };

  friend constexpr bool operator==(const aligned_allocator&, const aligned_allocator&) noexcept {
    return true;
  }
};

/// A dense row-major tensor of rank N in host memory, its elements aligned to
/// host_tensor_alignment bytes. xtensor's containers, views and expressions work with
/// float16, bfloat16 and the float8 formats (arithmetic on them goes through float and
/// rounds once, as the formats themselves do).
template <class T, std::size_t N>
using host_tensor = xt::xtensor<T, N, xt::layout_type::row_major, aligned_allocator<T>>;

/// True for host_tensor<T, N> of any T and N.
template <class X>
inline constexpr bool is_host_tensor_v = false;
/// The specialisation for host tensors (true).
template <class T, std::size_t N>
inline constexpr bool is_host_tensor_v<host_tensor<T, N>> = true;

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
