/// @file
/// Tensors in GPU memory, with copies to and from host tensors. Available when CUDA's headers are
/// (PRECIS_CUDA=1 or nvcc).
#pragma once

#include <precis/config.hpp>
#include <precis/cuda_error.hpp>
#include <precis/tensor/host_tensor.hpp>

#include <array>
#include <cstddef>
#include <numeric>
#include <span>
#include <utility>

#if PRECIS_CUDA

namespace precis {

namespace detail {

/// cudaMalloc of `bytes`. Where the device is out of memory, it tries once more after handing
/// back to the driver what the device's stream-ordered pool holds unused (cuda_context raises
/// the pool's release threshold, so memory freed in stream order stays with the pool, out of
/// cudaMalloc's reach): the device synchronised (frees still queued complete), then the pool
/// trimmed (cudaMemPoolTrimTo 0). Throws precis::cuda_error, naming `where`, when that fails
/// too.
inline void* device_malloc(std::size_t bytes, const source_location& where = source_location::current()) {
  void* p = nullptr;
  cudaError_t status = cudaMalloc(&p, bytes);
  if (status == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // not a sticky error: clear it before the calls below
    int device = 0;
    cudaMemPool_t pool = nullptr;
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize", where);
    check(cudaGetDevice(&device), "cudaGetDevice", where);
    check(cudaDeviceGetMemPool(&pool, device), "cudaDeviceGetMemPool", where);
    check(cudaMemPoolTrimTo(pool, 0), "cudaMemPoolTrimTo", where);
    status = cudaMalloc(&p, bytes);
  }
  check(status, "cudaMalloc", where);
  return p;
}

}  // namespace detail

/// A dense row-major tensor of rank N in device memory, owning its allocation (RAII,
/// move-only). With a stream, memory is allocated and freed in stream order
/// (cudaMallocAsync / cudaFreeAsync); without one, with cudaMalloc / cudaFree.
template <class T, std::size_t N>
class device_tensor {
 public:
  /// The element type.
  using value_type = T;
  /// The extent of each dimension, outermost first.
  using shape_type = std::array<std::size_t, N>;

  device_tensor() = default;
  /// Uninitialised device memory of the given shape.
  explicit device_tensor(const shape_type& shape, cudaStream_t stream = nullptr)
      : shape_(shape), stream_(stream) {
    allocate(size());
  }
  /// Takes over `o`'s allocation, shape and stream; `o` is left without memory, of shape
  /// all zeros.
  device_tensor(device_tensor&& o) noexcept { swap(o); }
  /// Frees this tensor's memory (in its stream's order), then takes over `o`'s allocation,
  /// shape and stream; `o` is left without memory, of shape all zeros.
  device_tensor& operator=(device_tensor&& o) noexcept {
    if (this != &o) {
      reset();
      shape_ = shape_type{};
      swap(o);
    }
    return *this;
  }
  device_tensor(const device_tensor&) = delete;
  device_tensor& operator=(const device_tensor&) = delete;
  ~device_tensor() { reset(); }

  /// The extent of each dimension.
  const shape_type& shape() const { return shape_; }
  /// The rank N.
  std::size_t dimension() const { return N; }
  /// The number of elements (the product of the extents).
  std::size_t size() const {
    return std::accumulate(shape_.begin(), shape_.end(), std::size_t(1), std::multiplies<>());
  }
  /// Device pointer to the first element (null when empty).
  T* data() { return data_; }
  /// Device pointer to the first element, read-only.
  const T* data() const { return data_; }
  /// The elements as a span of device memory (not dereferenceable on the host).
  std::span<T> span() { return {data_, size()}; }
  /// The elements as a read-only span of device memory.
  std::span<const T> span() const { return {data_, size()}; }
  /// Elements its memory holds: at least size(), more after fit() to a smaller shape.
  std::size_t capacity() const { return capacity_; }

  /// Gives the tensor `shape`. Its memory is kept where it holds that many elements (a
  /// smaller batch after larger ones, and back), otherwise freed and allocated anew, in the
  /// tensor's stream's order as at construction. The contents are unspecified either way.
  /// Returns whether it allocated.
  bool fit(const shape_type& shape) {
    const std::size_t n = std::accumulate(shape.begin(), shape.end(), std::size_t(1), std::multiplies<>());
    if (n <= capacity_) {
      shape_ = shape;
      return false;
    }
    reset();
    shape_ = shape_type{};
    allocate(n);  // may throw: the tensor is then empty
    shape_ = shape;
    return true;
  }

 private:
  void allocate(std::size_t n) {
    if (n == 0) return;
    void* p = nullptr;  // data_ stays null if the allocation fails
    if (stream_) {
      check(cudaMallocAsync(&p, n * sizeof(T), stream_), "cudaMallocAsync");
    } else {
      p = detail::device_malloc(n * sizeof(T));
    }
    data_ = static_cast<T*>(p);
    capacity_ = n;
  }
  void swap(device_tensor& o) noexcept {
    std::swap(shape_, o.shape_);
    std::swap(data_, o.data_);
    std::swap(capacity_, o.capacity_);
    std::swap(stream_, o.stream_);
  }
  void reset() noexcept {
    if (data_) {
      if (stream_) {
        (void)cudaFreeAsync(data_, stream_);
      } else {
        (void)cudaFree(data_);
      }
    }
    data_ = nullptr;
    capacity_ = 0;
  }

  shape_type shape_{};
  T* data_ = nullptr;
  std::size_t capacity_ = 0;
  cudaStream_t stream_ = nullptr;
};

/// Copies a host tensor to a new device tensor (stream-ordered when a stream is given).
template <class T, std::size_t N>
device_tensor<T, N> to_device(const host_tensor<T, N>& h, cudaStream_t stream = nullptr) {
  typename device_tensor<T, N>::shape_type shape{};
  for (std::size_t i = 0; i < N; ++i) shape[i] = h.shape()[i];
  device_tensor<T, N> d(shape, stream);
  if (d.size() != 0) {
    check(cudaMemcpyAsync(d.data(), h.data(), d.size() * sizeof(T), cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");  // h may go away
  }
  return d;
}

/// Copies a device tensor to a new host tensor, waiting for the copy.
template <class T, std::size_t N>
host_tensor<T, N> to_host(const device_tensor<T, N>& d, cudaStream_t stream = nullptr) {
  host_tensor<T, N> h(d.shape());
  if (d.size() != 0) {
    check(cudaMemcpyAsync(h.data(), d.data(), d.size() * sizeof(T), cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }
  return h;
}

}  // namespace precis

#endif
