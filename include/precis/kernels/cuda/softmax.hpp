/// @file
/// Softmax and log-softmax along the last axis of device tensors, forward and backward, with the
/// calls of kernels/softmax.hpp (a cuda_context in place of the cpu_context). One warp per row
/// for rows of up to 1024 columns (several rows per block), one block per row beyond: the
/// row's maximum is subtracted before exp (NaN wins, as on the host), the sum of exp(x - max)
/// is kept in the policy's accumulate type (each thread's running sum, then the partial sums
/// added in a fixed tree order), and each output is rounded once. Compiled by nvcc only (include from a
/// .cu file).
#pragma once

#include <precis/config.hpp>
#include <precis/kernels/cuda/elementwise.hpp>
#include <precis/kernels/softmax.hpp>

#if defined(__CUDACC__)

#include <cmath>
#include <cstddef>
#include <string>

namespace precis {

namespace detail::cuda {

template <class M>
struct max_op {
  __device__ M operator()(M a, M b) const { return max_nan(a, b); }
};

template <class M, class Acc, bool Log, class X, class Y>
__global__ void softmax_rows(const X* x, Y* y, std::size_t cols) {
  __shared__ M shared[32];
  const X* row = x + blockIdx.x * cols;
  Y* out = y + blockIdx.x * cols;
  M m = -static_cast<M>(INFINITY);
  for (std::size_t j = threadIdx.x; j < cols; j += blockDim.x) m = max_nan(m, device_load<M>(row[j]));
  m = block_reduce(m, max_op<M>{}, shared);
  accumulator<Acc> s;
  for (std::size_t j = threadIdx.x; j < cols; j += blockDim.x) {
    s.add(static_cast<typename accumulator<Acc>::value_type>(math::exp(device_load<M>(row[j]) - m)));
  }
  const M total = block_sum<M>(s);
  const M lse = math::log(total);
  for (std::size_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const M v = device_load<M>(row[j]) - m;
    out[j] = round_to<Y>(Log ? v - lse : math::exp(v) / total);
  }
}

/// softmax_rows for rows of at most warp_row_limit columns: a warp per row (each lane its
/// strided share, then the warp's butterfly), several rows per block.
template <class M, class Acc, bool Log, class X, class Y>
__global__ void softmax_warp_rows(const X* x, Y* y, std::size_t rows, std::size_t cols) {
  using V = typename accumulator<Acc>::value_type;
  const std::size_t warps = blockDim.x / 32, lane = threadIdx.x % 32;
  for (std::size_t r = blockIdx.x * warps + threadIdx.x / 32; r < rows; r += std::size_t(gridDim.x) * warps) {
    const X* row = x + r * cols;
    Y* out = y + r * cols;
    M m = -static_cast<M>(INFINITY);
    for (std::size_t j = lane; j < cols; j += 32) m = max_nan(m, device_load<M>(row[j]));
    m = warp_reduce(m, max_op<M>{});
    accumulator<Acc> s;
    for (std::size_t j = lane; j < cols; j += 32) s.add(static_cast<V>(math::exp(device_load<M>(row[j]) - m)));
    const M total = static_cast<M>(warp_reduce(s.value(), acc_add<Acc, V>{}));
    const M lse = math::log(total);
    for (std::size_t j = lane; j < cols; j += 32) {
      const M v = device_load<M>(row[j]) - m;
      out[j] = round_to<Y>(Log ? v - lse : math::exp(v) / total);
    }
  }
}

// softmax: dx = y (dy - sum(dy y)); log_softmax: dx = dy - exp(y) sum(dy).
template <class M, class Acc, bool Log, class DY, class Y, class DX>
__global__ void softmax_backward_warp_rows(const DY* dy, const Y* y, DX* dx, std::size_t rows, std::size_t cols) {
  using V = typename accumulator<Acc>::value_type;
  const std::size_t warps = blockDim.x / 32, lane = threadIdx.x % 32;
  for (std::size_t r = blockIdx.x * warps + threadIdx.x / 32; r < rows; r += std::size_t(gridDim.x) * warps) {
    const std::size_t base = r * cols;
    accumulator<Acc> s;
    for (std::size_t j = lane; j < cols; j += 32) {
      const M g = device_load<M>(dy[base + j]);
      s.add(static_cast<V>(Log ? g : g * device_load<M>(y[base + j])));
    }
    const M total = static_cast<M>(warp_reduce(s.value(), acc_add<Acc, V>{}));
    for (std::size_t j = lane; j < cols; j += 32) {
      const M g = device_load<M>(dy[base + j]), p = device_load<M>(y[base + j]);
      dx[base + j] = round_to<DX>(Log ? g - math::exp(p) * total : p * (g - total));
    }
  }
}

// softmax: dx = y (dy - sum(dy y)); log_softmax: dx = dy - exp(y) sum(dy).
template <class M, class Acc, bool Log, class DY, class Y, class DX>
__global__ void softmax_backward_rows(const DY* dy, const Y* y, DX* dx, std::size_t cols) {
  const std::size_t base = blockIdx.x * cols;
  accumulator<Acc> s;
  for (std::size_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const M g = device_load<M>(dy[base + j]);
    s.add(static_cast<typename accumulator<Acc>::value_type>(Log ? g : g * device_load<M>(y[base + j])));
  }
  const M total = block_sum<M>(s);
  for (std::size_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const M g = device_load<M>(dy[base + j]), p = device_load<M>(y[base + j]);
    dx[base + j] = round_to<DX>(Log ? g - math::exp(p) * total : p * (g - total));
  }
}

template <op_kind Op, Policy P, bool Log, class X, class Y, std::size_t N>
void softmax_forward(std::string_view name, cuda_context& ctx, const device_tensor<X, N>& x,
                     device_tensor<Y, N>& y) {
  using M = math_t<Op, P, X>;
  using Acc = accumulate_t<Op, P>;
  check_shape(std::string(name) + ": y", y, x.shape());
  const auto [rows, cols] = rows_and_cols(x);
  if (rows == 0 || cols == 0) return;
  if (cols <= warp_row_limit) {
    softmax_warp_rows<M, Acc, Log><<<warp_row_blocks(rows), row_threads, 0, ctx.stream()>>>(x.data(), y.data(), rows,
                                                                                         cols);
  } else {
    softmax_rows<M, Acc, Log><<<row_blocks(rows, name), row_threads, 0, ctx.stream()>>>(x.data(), y.data(), cols);
  }
  check(cudaGetLastError(), name);
}

template <op_kind Op, Policy P, bool Log, class DY, class Y, class DX, std::size_t N>
void softmax_backward(std::string_view name, cuda_context& ctx, const device_tensor<DY, N>& dy,
                      const device_tensor<Y, N>& y, device_tensor<DX, N>& dx) {
  using M = math_t<Op, P, DY, Y>;
  using Acc = accumulate_t<Op, P>;
  check_same_shape(std::string(name) + ": dy and y", dy, y);
  check_shape(std::string(name) + ": dx", dx, y.shape());
  const auto [rows, cols] = rows_and_cols(y);
  if (rows == 0 || cols == 0) return;
  if (cols <= warp_row_limit) {
    softmax_backward_warp_rows<M, Acc, Log><<<warp_row_blocks(rows), row_threads, 0, ctx.stream()>>>(
        dy.data(), y.data(), dx.data(), rows, cols);
  } else {
    softmax_backward_rows<M, Acc, Log><<<row_blocks(rows, name), row_threads, 0, ctx.stream()>>>(
        dy.data(), y.data(), dx.data(), cols);
  }
  check(cudaGetLastError(), name);
}

}  // namespace detail::cuda

/// y = softmax(x) along the last axis, on the device.
template <Policy P, kernel_element X, kernel_element Y, std::size_t N>
  requires(N >= 1)
void softmax(cuda_context& ctx, const device_tensor<X, N>& x, device_tensor<Y, N>& y) {
  detail::cuda::softmax_forward<op::softmax, P, false>("precis::softmax", ctx, x, y);
}

/// y = log_softmax(x) along the last axis, on the device ((x - max) - log(sum), never
/// log(softmax)).
template <Policy P, kernel_element X, kernel_element Y, std::size_t N>
  requires(N >= 1)
void log_softmax(cuda_context& ctx, const device_tensor<X, N>& x, device_tensor<Y, N>& y) {
  detail::cuda::softmax_forward<op::log_softmax, P, true>("precis::log_softmax", ctx, x, y);
}

/// dx = y * (dy - sum(dy * y)) along the last axis, from the forward output y, on the device.
template <Policy P, kernel_element DY, kernel_element Y, kernel_element DX, std::size_t N>
  requires(N >= 1)
void softmax_backward(cuda_context& ctx, const device_tensor<DY, N>& dy,
                      const device_tensor<Y, N>& y, device_tensor<DX, N>& dx) {
  detail::cuda::softmax_backward<op::softmax, P, false>("precis::softmax_backward", ctx, dy, y,
                                                        dx);
}

/// dx = dy - exp(y) * sum(dy) along the last axis, from y = log_softmax(x), on the device.
template <Policy P, kernel_element DY, kernel_element Y, kernel_element DX, std::size_t N>
  requires(N >= 1)
void log_softmax_backward(cuda_context& ctx, const device_tensor<DY, N>& dy,
                          const device_tensor<Y, N>& y, device_tensor<DX, N>& dx) {
  detail::cuda::softmax_backward<op::log_softmax, P, true>("precis::log_softmax_backward", ctx,
                                                           dy, y, dx);
}

}  // namespace precis

#endif
