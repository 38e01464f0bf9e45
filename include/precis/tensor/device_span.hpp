/// @file
/// A view of elements in device memory that host code cannot read by mistake. A model built on
/// a cuda_context hands out its master weights and gradients as device spans: they carry the
/// pointer and the count for device kernels and libraries (NCCL, a device optimizer), but
/// they are not ranges, so a host algorithm given one (the host optimizers, unscale,
/// grad_norm, clip_grad_norm) does not compile instead of dereferencing device pointers.
/// Needs no CUDA headers: host code can name the type.
#pragma once

#include <cstddef>
#include <type_traits>

namespace precis {

/// `size()` elements of type T at `data()` in device memory (not dereferenceable on the
/// host). Trivially copyable, like std::span; unlike it, not a range.
template <class T>
class device_span {
 public:
  /// The element type.
  using element_type = T;

  /// An empty view.
  constexpr device_span() = default;
  /// The `size` elements at device pointer `data`.
  constexpr device_span(T* data, std::size_t size) : data_(data), size_(size) {}
  /// A read-only view of a writable one.
  template <class U>
    requires std::is_same_v<const U, T>
  constexpr device_span(device_span<U> other) : data_(other.data()), size_(other.size()) {}

  /// Device pointer to the first element.
  constexpr T* data() const { return data_; }
  /// Number of elements.
  constexpr std::size_t size() const { return size_; }
  /// Number of bytes.
  constexpr std::size_t size_bytes() const { return size_ * sizeof(T); }
  /// True when the view has no elements.
  constexpr bool empty() const { return size_ == 0; }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

/// True for precis::device_span<T>.
template <class T>
inline constexpr bool is_device_span_v = false;
/// True: a precis::device_span.
template <class T>
inline constexpr bool is_device_span_v<device_span<T>> = true;

}  // namespace precis
