/// @file
/// Softmax and log-softmax along the last axis of device tensors, forward and backward, with the
/// calls of kernels/softmax.hpp (a cuda_context in place of the cpu_context). Rows of up to
/// 8192 columns are read once and held in registers (common.hpp's row_share: a warp per row
/// up to 1024 columns, several rows per block; a block per row beyond), longer rows are read
/// once per pass by a block each: the row's maximum is subtracted before exp (NaN wins, as on the
/// host), the sum of exp(x - max) is kept in the policy's accumulate type (each thread's running
/// sum, then the partial sums added in a fixed tree order), and each output is rounded once.
/// Compiled by nvcc only (include from a .cu file). logsumexp and its backward pass are here too.
#pragma once

#include <precis/config.hpp>
#include <precis/kernels/cuda/elementwise.hpp>
#include <precis/kernels/softmax.hpp>

#if defined(__CUDACC__)

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

namespace precis {

namespace detail::cuda {

/// exp(x - max) / sum as the host's softmax computes it: times the sum's reciprocal on its
/// float path (float math and sums: kernels/softmax.hpp), else divided by the sum. The
/// multiplication also spares the device an IEEE division per element (a dozen
/// instructions, as many as the rest of the element's arithmetic).
template <class M, class Acc>
__device__ __forceinline__ M probability(M e, M total, M inv) {
  if constexpr (vmath::float_path_v<M, Acc>) {
    return e * inv;
  } else {
    return e / total;
  }
}

/// The row's maximum and sum of exp(x - max) (Acc), with every thread of the block (the long
/// rows of softmax, logsumexp and cross-entropy, kernels/cuda/loss.hpp).
template <class M, class Acc, class X>
__device__ inline void row_max_and_sum(const X* row, std::size_t cols, M* shared, M& m, M& s) {
  m = -static_cast<M>(INFINITY);
  for (std::size_t j = threadIdx.x; j < cols; j += blockDim.x)
    m = max_nan(m, device_load<M>(row[j]));
  m = block_reduce(m, max_nan_op<M>{}, shared);
  accumulator<Acc> acc;
  for (std::size_t j = threadIdx.x; j < cols; j += blockDim.x) {
    acc.add(
        static_cast<typename accumulator<Acc>::value_type>(math::exp(device_load<M>(row[j]) - m)));
  }
  s = block_sum<M>(acc);
}

template <class M, class Acc, bool Log, class X, class Y>
__global__ void softmax_rows(const X* x, Y* y, std::size_t cols) {
  __shared__ M shared[32];
  const X* row = x + blockIdx.x * cols;
  Y* out = y + blockIdx.x * cols;
  M m, total;
  row_max_and_sum<M, Acc>(row, cols, shared, m, total);
  const M lse = math::log(total);
  const M inv = M(1) / total;
  for (std::size_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const M v = device_load<M>(row[j]) - m;
    out[j] = round_to<Y>(Log ? v - lse : probability<M, Acc>(math::exp(v), total, inv));
  }
}

/// softmax_rows for rows of at most resident_row_limit columns, each read once: the row group
/// G's threads hold it in registers (common.hpp's row_share), V columns per access.
template <class G, class M, class Acc, bool Log, int V, int S, class X, class Y>
__global__ void __launch_bounds__(G::max_threads)
    softmax_resident(const X* x, Y* y, std::size_t rows, std::size_t cols, bool packed) {
  using A = typename accumulator<Acc>::value_type;
  for_each_row_share<G, M, V, S>(x, rows, cols, packed, [&](std::size_t r, row_share<M, V, S>& s) {
    const M m = s.template row_max<G>(cols);
    accumulator<Acc> sum;
    s.template each<G>(cols, [&](M& v, std::size_t) {
      v -= m;
      const M e = math::exp(v);
      sum.add(static_cast<A>(e));
      if constexpr (!Log) v = e;
    });
    const M total = static_cast<M>(G::reduce(sum.value(), acc_add<Acc, A>{}));
    const M lse = math::log(total);
    const M inv = M(1) / total;
    Y* out = y + r * cols;
#pragma unroll
    for (int i = 0; i < s.groups; ++i) {
      M o[V];
#pragma unroll
      for (int k = 0; k < V; ++k) o[k] = Log ? s.v[i][k] - lse : probability<M, Acc>(s.v[i][k], total, inv);
      store_slots<V>(out, slot_column(i, G::rank(), G::threads(), V), cols, packed, o);
    }
  });
}

// softmax: dx = y (dy - sum(dy y)); log_softmax: dx = dy - exp(y) sum(dy). Rows of at most
// resident_row_limit columns, dy and y each read once (as softmax_resident).
template <class G, class M, class Acc, bool Log, int V, int S, class DY, class Y, class DX>
__global__ void __launch_bounds__(G::max_threads)
    softmax_backward_resident(const DY* dy, const Y* y, DX* dx, std::size_t rows, std::size_t cols, bool packed) {
  using A = typename accumulator<Acc>::value_type;
  struct shares {
    row_raw<DY, V, S> g;
    row_raw<Y, V, S> p;
  };
  const auto load = [&](std::size_t r) {
    shares s;
    s.g.template load<G>(dy + r * cols, cols, packed);
    s.p.template load<G>(y + r * cols, cols, packed);
    return s;
  };
  pipelined_rows<G, false>(rows, load, [&](std::size_t r, const shares& raw) {
    const auto g = raw.g.template share<M>();
    const auto p = raw.p.template share<M>();
    accumulator<Acc> sum;
#pragma unroll
    for (int i = 0; i < g.groups; ++i) {
      const std::size_t c = slot_column(i, G::rank(), G::threads(), V);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        if (c + k < cols) sum.add(static_cast<A>(Log ? g.v[i][k] : g.v[i][k] * p.v[i][k]));
      }
    }
    const M total = static_cast<M>(G::reduce(sum.value(), acc_add<Acc, A>{}));
    DX* out = dx + r * cols;
#pragma unroll
    for (int i = 0; i < g.groups; ++i) {
      M o[V];
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const M gv = g.v[i][k], pv = p.v[i][k];
        o[k] = Log ? gv - math::exp(pv) * total : pv * (gv - total);
      }
      store_slots<V>(out, slot_column(i, G::rank(), G::threads(), V), cols, packed, o);
    }
  });
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

/// logsumexp's value of a row from its maximum m and the sum of exp(x - m): m itself where
/// it is infinite (as on the host), else m + log(total).
template <class M>
__device__ __forceinline__ M logsumexp_of(M m, M total) {
  return ::isinf(m) ? m : m + math::log(total);
}

/// logsumexp along rows of at most resident_row_limit columns, each read once into the row
/// group G's registers (as softmax_resident); the group's first thread writes out[r].
template <class G, class M, class Acc, int V, int S, class X, class Y>
__global__ void __launch_bounds__(G::max_threads)
    logsumexp_resident(const X* x, Y* out, std::size_t rows, std::size_t cols, bool packed) {
  using A = typename accumulator<Acc>::value_type;
  for_each_row_share<G, M, V, S>(x, rows, cols, packed, [&](std::size_t r, row_share<M, V, S>& s) {
    const M m = s.template row_max<G>(cols);
    accumulator<Acc> sum;
    s.template each<G>(cols, [&](M& v, std::size_t) { sum.add(static_cast<A>(math::exp(v - m))); });
    const M total = static_cast<M>(G::reduce(sum.value(), acc_add<Acc, A>{}));
    if (G::rank() == 0) out[r] = round_to<Y>(logsumexp_of(m, total));
  });
}

/// logsumexp along longer rows: a block per row, which reads it twice (its maximum, then
/// the sum of exp(x - max)).
template <class M, class Acc, class X, class Y>
__global__ void logsumexp_rows(const X* x, Y* out, std::size_t cols) {
  __shared__ M shared[32];
  M m, total;
  row_max_and_sum<M, Acc>(x + blockIdx.x * cols, cols, shared, m, total);
  if (threadIdx.x == 0) out[blockIdx.x] = round_to<Y>(logsumexp_of(m, total));
}

/// dx[i] = dy[r] exp(x[i] - l[r]) in M, r the row of element i (cols a row): by fast_divmod
/// where the element count fits 32 bits and cols fast_divmod, else by a 64-bit division.
template <class M, class DY, class X, class L, class DX>
struct logsumexp_backward_body {
  const DY* dy;
  const X* x;
  const L* l;
  DX* dx;
  std::size_t cols;
  fast_divmod fc;
  bool fast;
  __device__ std::size_t row(std::size_t i) const {
    return fast ? std::size_t(fc.div(std::uint32_t(i))) : i / cols;
  }
  template <int V>
  __device__ void at(std::size_t i) const {
    const auto in = load_pack<V>(x + i);
    pack<DX, V> out;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const std::size_t r = row(i + k);
      out.v[k] = round_to<DX>(device_load<M>(dy[r]) *
                              math::exp(device_load<M>(in.v[k]) - device_load<M>(l[r])));
    }
    store_pack<V>(dx + i, out);
  }
};

template <op_kind Op, Policy P, bool Log, class X, class Y, std::size_t N>
void softmax_forward(std::string_view name, cuda_context& ctx, const device_tensor<X, N>& x,
                     device_tensor<Y, N>& y) {
  using M = math_t<Op, P, X>;
  using Acc = accumulate_t<Op, P>;
  check_shape(std::string(name) + ": y", y, x.shape());
  const auto [rows, cols] = rows_and_cols(x);
  if (rows == 0 || cols == 0) return;
  if (cols <= resident_row_limit) {
    constexpr int V = pack_width<X>;
    const bool packed = cols % V == 0 && pack_aligned<V>(x.data(), y.data());
    with_resident_rows<V>(rows, cols, packed, true, [&](auto group, auto slots, auto width, unsigned blocks,
                                                         unsigned threads) {
      softmax_resident<decltype(group), M, Acc, Log, decltype(width)::value, decltype(slots)::value>
          <<<blocks, threads, 0, ctx.stream()>>>(x.data(), y.data(), rows, cols, packed);
    });
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
  if (cols <= resident_row_limit) {
    constexpr int V = pack_width<DY, Y>;
    const bool packed = cols % V == 0 && pack_aligned<V>(dy.data(), y.data(), dx.data());
    with_resident_rows<V>(rows, cols, packed, false, [&](auto group, auto slots, auto width, unsigned blocks,
                                                          unsigned threads) {
      softmax_backward_resident<decltype(group), M, Acc, Log, decltype(width)::value, decltype(slots)::value>
          <<<blocks, threads, 0, ctx.stream()>>>(dy.data(), y.data(), dx.data(), rows, cols, packed);
    });
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

/// out = log(sum(exp(x))) along the last axis on the device (see the host logsumexp):
/// max + log(sum(exp(x - max))), the sum in the policy's accumulate type as softmax keeps
/// it; a row whose maximum is infinite gives that maximum, and NaN wins. Rows of up to
/// 8192 columns are read once (as softmax's).
template <Policy P, kernel_element X, kernel_element Y, std::size_t N>
requires(N >= 1) void logsumexp(cuda_context& ctx, const device_tensor<X, N>& x,
                                device_tensor<Y, N - 1>& out) {
  using M = detail::math_t<op::logsumexp, P, X>;
  using Acc = detail::accumulate_t<op::logsumexp, P>;
  detail::check_row_shape<N>("precis::logsumexp: out", x, out);
  const auto [rows, cols] = detail::rows_and_cols(x);
  if (rows == 0) return;
  const auto name = "precis::logsumexp";
  // Rows of no column take the block kernel: a maximum of -inf, which is their value (the
  // host's).
  if (cols != 0 && cols <= detail::resident_row_limit) {
    constexpr int V = detail::cuda::pack_width<X>;
    const bool packed = cols % V == 0 && detail::cuda::pack_aligned<V>(x.data());
    detail::cuda::with_resident_rows<V>(
        rows, cols, packed, true,
        [&](auto group, auto slots, auto width, unsigned blocks, unsigned threads) {
          detail::cuda::logsumexp_resident<decltype(group), M, Acc, decltype(width)::value,
                                           decltype(slots)::value>
              <<<blocks, threads, 0, ctx.stream()>>>(x.data(), out.data(), rows, cols, packed);
        });
  } else {
    detail::cuda::logsumexp_rows<M, Acc>
        <<<detail::cuda::row_blocks(rows, name), detail::cuda::row_threads, 0, ctx.stream()>>>(
            x.data(), out.data(), cols);
  }
  check(cudaGetLastError(), name);
}

/// dx = dy * exp(x - out) along the last axis on the device (the softmax of x), from the
/// forward input x and output out = logsumexp(x); dy has out's shape. Each element is the
/// host's expression in the same math type, rounded once.
template <Policy P, kernel_element DY, kernel_element X, kernel_element L, kernel_element DX,
          std::size_t N>
requires(N >= 1) void logsumexp_backward(cuda_context& ctx, const device_tensor<DY, N - 1>& dy,
                                         const device_tensor<X, N>& x,
                                         const device_tensor<L, N - 1>& out,
                                         device_tensor<DX, N>& dx) {
  using M = detail::math_t<op::logsumexp, P, DY, X, L>;
  detail::check_row_shape<N>("precis::logsumexp_backward: dy", x, dy);
  detail::check_row_shape<N>("precis::logsumexp_backward: out", x, out);
  check_shape("precis::logsumexp_backward: dx", dx, x.shape());
  const std::size_t n = x.size(), cols = detail::rows_and_cols(x).second;
  if (n == 0) return;
  const bool fast = n <= std::size_t(UINT32_MAX) && detail::fast_divmod::fits(cols);
  constexpr int V = detail::cuda::pack_width<X, DX>;
  detail::cuda::launch_packed<V>(ctx.stream(),
                                 detail::cuda::logsumexp_backward_body<M, DY, X, L, DX>{
                                     dy.data(), x.data(), out.data(), dx.data(), cols,
                                     detail::fast_divmod(fast ? std::uint32_t(cols) : 1U), fast},
                                 n, detail::cuda::pack_aligned<V>(x.data(), dx.data()),
                                 "precis::logsumexp_backward");
}

}  // namespace precis

#endif
