/// @file
/// The losses of kernels/loss.hpp on device tensors -- cross-entropy from logits, binary
/// cross-entropy with logits, dice, L1, smooth-L1 -- each with its backward, with the host calls (a
/// cuda_context in place of the cpu_context).
///
/// Each term is computed by the host's formula (shared PRECIS_HOST_DEVICE helpers) in the
/// same math type; the mean is taken as the device reductions take sums (kernels/cuda/
/// reduce.hpp: accumulate type, an order fixed by the element count, so repeated calls give
/// the same bits), then divided once. The loss is written to a one-element device tensor
/// (`loss`, shape {1}, rounded once to its element type) so that nothing waits for the
/// device.
///
/// `dloss`, the derivative of the objective with respect to the loss, is a host value or a
/// float in device memory (e.g. &state->scale of a device_scaler_state), so a scaled
/// backward pass needs no host synchronisation either.
///
/// Cross-entropy targets live on the device, where the host cannot check them without
/// waiting: a target outside [0, C) makes that row's loss term and gradient NaN (so the
/// loss is NaN and a loss scaler skips the step) rather than reading out of bounds. Shapes
/// and arguments are checked on the host, with the host's messages, before any launch.
/// Compiled by nvcc only (include from a .cu file).
#pragma once

#include <precis/config.hpp>
#include <precis/kernels/cuda/reduce.hpp>
#include <precis/kernels/cuda/softmax.hpp>
#include <precis/kernels/loss.hpp>

#if defined(__CUDACC__)

#include <array>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <string>
#include <string_view>

namespace precis {

/// d(objective)/d(loss) for a device backward kernel: a value known on the host, or a
/// float in device memory read by the kernel (for a loss scale kept on the device).
struct device_dloss {
  double value = 1.0;                          ///< used when `device` is null
  const float* device = nullptr;               ///< a device pointer, read when the kernel runs
  double divisor = 1.0;                        ///< what `*device` is divided by (in double)
  /// A value known on the host (implicit, so a number can be passed as `dloss`).
  device_dloss(double v = 1.0) : value(v) {}   // NOLINT(google-explicit-constructor)
  /// A float in device memory, read when the kernel runs (implicit, as above).
  device_dloss(const float* d) : device(d) {}  // NOLINT(google-explicit-constructor)
  /// `*d / divisor`, computed in double when the kernel runs: the scale of one of
  /// `divisor` micro-batches, as the host trainer's double(scale) / double(count).
  device_dloss(const float* d, double divide_by) : device(d), divisor(divide_by) {}
};

namespace detail::cuda {

template <class M>
__device__ inline M dloss_of(const device_dloss& d) {
  if (d.device == nullptr) return static_cast<M>(d.value);
  // (A double division only for micro-batches: x / 1.0 is x.)
  return d.divisor == 1.0 ? static_cast<M>(*d.device) : static_cast<M>(static_cast<double>(*d.device) / d.divisor);
}

/// loss[0] = round(total / n): the mean of a sum of terms.
template <class M, class L>
struct mean_finish {
  L* loss;
  std::size_t n;
  template <class S>
  __device__ void operator()(const S* totals) const {
    loss[0] = round_to<L>(static_cast<M>(totals[0]) / static_cast<M>(n));
  }
};

/// dx[i] = round(g(i)): a thread computes V consecutive elements and writes them as one
/// 16-byte pack (g reads its operands element by element).
template <class DX, class G>
struct write_terms_body {
  G g;
  DX* dx;
  template <int V>
  __device__ void at(std::size_t i) const {
    pack<DX, V> r;
#pragma unroll
    for (int k = 0; k < V; ++k) r.v[k] = round_to<DX>(g(i + std::size_t(k)));
    store_pack<V>(dx + i, r);
  }
};

template <class DX, class G>
void write_terms(cuda_context& ctx, std::size_t n, DX* dx, const G& g, std::string_view name) {
  constexpr int V = pack_width<DX>;
  launch_packed<V>(ctx.stream(), write_terms_body<DX, G>{g, dx}, n, pack_aligned<V>(dx), name);
}

enum class pointwise_loss { bce_with_logits, l1, smooth_l1 };

template <pointwise_loss Kind, class M, class X, class T>
struct pointwise_terms {
  const X* x;
  const T* t;
  M beta;
  __device__ term_values<M, 1> operator()(std::size_t i) const {
    const M a = device_load<M>(x[i]), b = device_load<M>(t[i]);
    if constexpr (Kind == pointwise_loss::bce_with_logits) {
      return {{bce_logits_term(a, b)}};
    } else if constexpr (Kind == pointwise_loss::l1) {
      return {{math::abs(a - b)}};
    } else {
      return {{smooth_l1(a - b, beta)}};
    }
  }
};

template <pointwise_loss Kind, class M, class X, class T>
struct pointwise_grads {
  const X* x;
  const T* t;
  M beta;
  device_dloss dloss;
  std::size_t n;
  __device__ M operator()(std::size_t i) const {
    const M scale = dloss_of<M>(dloss) / static_cast<M>(n);
    const M a = device_load<M>(x[i]), b = device_load<M>(t[i]);
    if constexpr (Kind == pointwise_loss::bce_with_logits) {
      return scale * bce_logits_grad(a, b);
    } else if constexpr (Kind == pointwise_loss::l1) {
      return scale * sign(a - b);
    } else {
      return scale * smooth_l1_grad(a - b, beta);
    }
  }
};

template <class L>
void check_loss_output(std::string_view name, const device_tensor<L, 1>& loss) {
  check_shape(std::string(name) + ": loss", loss, std::array<std::size_t, 1>{1});
}

template <pointwise_loss Kind, Policy P, class X, class T, std::size_t N, class L>
void pointwise_forward(std::string_view name, cuda_context& ctx, const device_tensor<X, N>& x,
                       const device_tensor<T, N>& t, device_tensor<L, 1>& loss, double beta) {
  using M = math_t<op::loss, P, X, T>;
  check_pointwise_loss(name, x, t);
  check_loss_output(name, loss);
  reduce_terms<device_sum<accumulate_t<op::loss, P>>, 1>(
      ctx, x.size(), pointwise_terms<Kind, M, X, T>{x.data(), t.data(), static_cast<M>(beta)},
      mean_finish<M, L>{loss.data(), x.size()}, name);
}

template <pointwise_loss Kind, Policy P, class X, class T, class DX, std::size_t N>
void pointwise_backward(std::string_view name, cuda_context& ctx, const device_tensor<X, N>& x,
                        const device_tensor<T, N>& t, device_tensor<DX, N>& dx, double beta,
                        const device_dloss& dloss) {
  using M = math_t<op::loss, P, X, T>;
  check_pointwise_loss(name, x, t);
  check_shape(
      std::string(name) + ": d" + (Kind == pointwise_loss::bce_with_logits ? "logits" : "pred"), dx,
      x.shape());
  write_terms(
      ctx, x.size(), dx.data(),
      pointwise_grads<Kind, M, X, T>{x.data(), t.data(), static_cast<M>(beta), dloss, x.size()},
      name);
}

inline void check_nonnegative(std::string_view name, const char* arg, double v) {
  check_argument(std::isfinite(v) && v >= 0, std::string(name) + ": " + arg,
                 "must be finite and >= 0, is " + std::to_string(v));
}

// ---- dice ----

template <class M, class X, class T>
struct dice_terms {
  const X* p;
  const T* t;
  __device__ term_values<M, 3> operator()(std::size_t i) const {
    const M a = device_load<M>(p[i]), b = device_load<M>(t[i]);
    return {{a * b, a, b}};
  }
};

/// The dice ratio's numerator and denominator from the three sums (the host's formula).
template <class M, class S>
__device__ inline void dice_ratio(const S* sums, M eps, M& num, M& den) {
  num = M(2) * static_cast<M>(sums[0]) + eps;
  den = static_cast<M>(sums[1]) + static_cast<M>(sums[2]) + eps;
}

template <class M, class L>
struct dice_finish {
  L* loss;
  M eps;
  template <class S>
  __device__ void operator()(const S* sums) const {
    M num, den;
    dice_ratio(sums, eps, num, den);
    loss[0] = round_to<L>(M(1) - num / den);
  }
};

/// Keeps the numerator and denominator in device memory for the backward pass.
template <class M>
struct dice_ratio_finish {
  M* ratio;
  M eps;
  template <class S>
  __device__ void operator()(const S* sums) const {
    dice_ratio(sums, eps, ratio[0], ratio[1]);
  }
};

template <class M, class T>
struct dice_grads {
  const T* t;
  const M* ratio;
  device_dloss dloss;
  __device__ M operator()(std::size_t i) const {
    const M num = ratio[0], den = ratio[1];
    const M scale = -dloss_of<M>(dloss) / (den * den);
    return scale * (M(2) * device_load<M>(t[i]) * den - num);
  }
};

// ---- cross-entropy ----

/// The target of row r as an index, or cols when it is outside [0, cols).
template <class I>
__device__ inline std::size_t target_index(const I* targets, std::size_t r, std::size_t cols) {
  const I t = targets[r];
  if constexpr (std::is_signed_v<I>) {
    if (t < 0) return cols;
  }
  return static_cast<unsigned long long>(t) < cols ? std::size_t(t) : cols;
}

// per_row[r] = max + log(sum) - logits[r, target[r]] (NaN for a bad target).
template <class M, class Acc, class X, class I>
__global__ void cross_entropy_rows(const X* logits, const I* targets, M* per_row,
                                   std::size_t cols) {
  __shared__ M shared[32];
  const X* row = logits + blockIdx.x * cols;
  M m, s;
  row_max_and_sum<M, Acc>(row, cols, shared, m, s);
  if (threadIdx.x == 0) {
    const std::size_t t = target_index(targets, blockIdx.x, cols);
    per_row[blockIdx.x] =
        t == cols ? static_cast<M>(NAN) : m + math::log(s) - device_load<M>(row[t]);
  }
}

// dlogits = dloss (softmax - onehot) / rows; a bad target makes the row NaN.
template <class M, class Acc, class X, class I, class DX>
__global__ void cross_entropy_backward_rows(const X* logits, const I* targets, DX* dlogits,
                                            std::size_t rows, std::size_t cols,
                                            device_dloss dloss) {
  __shared__ M shared[32];
  const X* row = logits + blockIdx.x * cols;
  DX* out = dlogits + blockIdx.x * cols;
  M m, s;
  row_max_and_sum<M, Acc>(row, cols, shared, m, s);
  const std::size_t t = target_index(targets, blockIdx.x, cols);
  const M scale = dloss_of<M>(dloss) / static_cast<M>(rows);
  for (std::size_t j = threadIdx.x; j < cols; j += blockDim.x) {
    M v = math::exp(device_load<M>(row[j]) - m) / s;
    if (j == t) v -= M(1);
    out[j] = round_to<DX>(t == cols ? static_cast<M>(NAN) : v * scale);
  }
}

/// cross_entropy_rows for rows of at most resident_row_limit columns, each read once (the row
/// group G's threads hold it in registers: common.hpp's row_share). With `Backward`, dlogits =
/// dloss (softmax - onehot) / rows; otherwise per_row[r] = max + log(sum) - logits[r, target].
template <bool Backward, class G, class M, class Acc, int V, int S, class X, class I, class DX>
__global__ void __launch_bounds__(G::max_threads)
    cross_entropy_resident(const X* logits, const I* targets, M* per_row, DX* dlogits, std::size_t rows,
                           std::size_t cols, device_dloss dloss, bool packed) {
  using A = typename accumulator<Acc>::value_type;
  for_each_row_share<G, M, V, S>(logits, rows, cols, packed, [&](std::size_t r, row_share<M, V, S>& s) {
    const M m = s.template row_max<G>(cols);
    accumulator<Acc> acc;
    s.template each<G>(cols, [&](M& v, std::size_t) {
      const M e = math::exp(v - m);
      acc.add(static_cast<A>(e));
      if constexpr (Backward) v = e;  // kept for the gradient: one exp per element
    });
    const M sum = static_cast<M>(G::reduce(acc.value(), acc_add<Acc, A>{}));
    const std::size_t t = target_index(targets, r, cols);
    if constexpr (Backward) {
      const M scale = dloss_of<M>(dloss) / static_cast<M>(rows);
      DX* out = dlogits + r * cols;
#pragma unroll
      for (int i = 0; i < s.groups; ++i) {
        const std::size_t c = slot_column(i, G::rank(), G::threads(), V);
        M o[V];
#pragma unroll
        for (int k = 0; k < V; ++k) {
          M v = s.v[i][k] / sum;
          if (c + k == t) v -= M(1);
          o[k] = t == cols ? static_cast<M>(NAN) : v * scale;
        }
        store_slots<V>(out, c, cols, packed, o);
      }
    } else if (G::rank() == 0) {
      per_row[r] = t == cols ? static_cast<M>(NAN) : m + math::log(sum) - device_load<M>(logits[r * cols + t]);
    }
  });
}

/// Runs cross_entropy_resident over rows of at most resident_row_limit columns, or the
/// block-per-row kernels (cross_entropy_rows, cross_entropy_backward_rows) over longer ones.
template <bool Backward, class M, class Acc, class X, class I, class DX>
void cross_entropy_launch(cuda_context& ctx, const X* logits, const I* targets, M* per_row, DX* dlogits,
                          std::size_t rows, std::size_t cols, device_dloss dloss, std::string_view name) {
  if (cols <= resident_row_limit) {
    constexpr int V = pack_width<X>;
    const bool packed = cols % V == 0 && pack_aligned<V>(logits) && (!Backward || pack_aligned<V>(dlogits));
    with_resident_rows<V>(rows, cols, packed, true, [&](auto group, auto slots, auto width, unsigned blocks,
                                                   unsigned threads) {
      cross_entropy_resident<Backward, decltype(group), M, Acc, decltype(width)::value, decltype(slots)::value>
          <<<blocks, threads, 0, ctx.stream()>>>(logits, targets, per_row, dlogits, rows, cols, dloss, packed);
    });
  } else if constexpr (Backward) {
    cross_entropy_backward_rows<M, Acc><<<row_blocks(rows, name), row_threads, 0, ctx.stream()>>>(
        logits, targets, dlogits, rows, cols, dloss);
  } else {
    cross_entropy_rows<M, Acc><<<row_blocks(rows, name), row_threads, 0, ctx.stream()>>>(logits, targets, per_row,
                                                                                         cols);
  }
  check(cudaGetLastError(), name);
}

template <class M>
struct row_terms {
  const M* per_row;
  __device__ term_values<M, 1> operator()(std::size_t i) const { return {{per_row[i]}}; }
};

template <class X, class I>
void check_device_cross_entropy(std::string_view name, const device_tensor<X, 2>& logits,
                                const device_tensor<I, 1>& targets) {
  check_shape(std::string(name) + ": targets", targets,
              std::array<std::size_t, 1>{logits.shape()[0]});
  check_not_empty(std::string(name) + ": logits", logits);
}

}  // namespace detail::cuda

/// loss[0] = the mean over the batch of -log softmax(logits[b])[targets[b]], on the device
/// (see the host cross_entropy). A target outside [0, C) makes the loss NaN.
template <Policy P, kernel_element X, std::integral I, kernel_element L>
void cross_entropy(cuda_context& ctx, const device_tensor<X, 2>& logits,
                   const device_tensor<I, 1>& targets, device_tensor<L, 1>& loss) {
  using M = detail::math_t<op::loss, P, X>;
  using Acc = detail::accumulate_t<op::loss, P>;
  constexpr std::string_view name = "precis::cross_entropy";
  detail::cuda::check_device_cross_entropy(name, logits, targets);
  detail::cuda::check_loss_output(name, loss);
  const std::size_t rows = logits.shape()[0], cols = logits.shape()[1];
  device_tensor<M, 1> per_row({rows}, ctx.stream());
  detail::cuda::cross_entropy_launch<false, M, Acc>(ctx, logits.data(), targets.data(), per_row.data(),
                                                    static_cast<X*>(nullptr), rows, cols, device_dloss(1.0), name);
  detail::cuda::reduce_terms<detail::cuda::device_sum<Acc>, 1>(
      ctx, rows, detail::cuda::row_terms<M>{per_row.data()},
      detail::cuda::mean_finish<M, L>{loss.data(), rows}, name);
}

/// dlogits = dloss * (softmax(logits) - onehot(targets)) / B, on the device. A target
/// outside [0, C) makes its row NaN.
template <Policy P, kernel_element X, std::integral I, kernel_element DX>
void cross_entropy_backward(cuda_context& ctx, const device_tensor<X, 2>& logits,
                            const device_tensor<I, 1>& targets, device_tensor<DX, 2>& dlogits,
                            device_dloss dloss = 1.0) {
  using M = detail::math_t<op::loss, P, X>;
  using Acc = detail::accumulate_t<op::loss, P>;
  constexpr std::string_view name = "precis::cross_entropy_backward";
  detail::cuda::check_device_cross_entropy(name, logits, targets);
  check_shape(std::string(name) + ": dlogits", dlogits, logits.shape());
  const std::size_t rows = logits.shape()[0], cols = logits.shape()[1];
  detail::cuda::cross_entropy_launch<true, M, Acc>(ctx, logits.data(), targets.data(), static_cast<M*>(nullptr),
                                                   dlogits.data(), rows, cols, dloss, name);
}

/// loss[0] = the mean of max(x, 0) - x t + log1p(exp(-|x|)), on the device (see the host
/// bce_with_logits).
template <Policy P, kernel_element X, kernel_element T, std::size_t N, kernel_element L>
void bce_with_logits(cuda_context& ctx, const device_tensor<X, N>& logits,
                     const device_tensor<T, N>& targets, device_tensor<L, 1>& loss) {
  detail::cuda::pointwise_forward<detail::cuda::pointwise_loss::bce_with_logits, P>(
      "precis::bce_with_logits", ctx, logits, targets, loss, 0.0);
}

/// dlogits = dloss * (sigmoid(x) - t) / n, on the device.
template <Policy P, kernel_element X, kernel_element T, kernel_element DX, std::size_t N>
void bce_with_logits_backward(cuda_context& ctx, const device_tensor<X, N>& logits,
                              const device_tensor<T, N>& targets, device_tensor<DX, N>& dlogits,
                              device_dloss dloss = 1.0) {
  detail::cuda::pointwise_backward<detail::cuda::pointwise_loss::bce_with_logits, P>(
      "precis::bce_with_logits_backward", ctx, logits, targets, dlogits, 0.0, dloss);
}

/// loss[0] = 1 - (2 sum(p t) + eps) / (sum(p) + sum(t) + eps), on the device (see the host
/// dice_loss; the three sums in the accumulate type). Throws precis::error for a negative
/// or non-finite eps.
template <Policy P, kernel_element X, kernel_element T, std::size_t N, kernel_element L>
void dice_loss(cuda_context& ctx, const device_tensor<X, N>& pred,
               const device_tensor<T, N>& target, device_tensor<L, 1>& loss, double eps = 1.0) {
  using M = detail::math_t<op::loss, P, X, T>;
  constexpr std::string_view name = "precis::dice_loss";
  detail::check_pointwise_loss(name, pred, target);
  detail::cuda::check_loss_output(name, loss);
  detail::cuda::check_nonnegative(name, "eps", eps);
  detail::cuda::reduce_terms<detail::cuda::device_sum<detail::accumulate_t<op::loss, P>>, 3>(
      ctx, pred.size(), detail::cuda::dice_terms<M, X, T>{pred.data(), target.data()},
      detail::cuda::dice_finish<M, L>{loss.data(), static_cast<M>(eps)}, name);
}

/// dpred = dloss * -(2 t den - num) / den^2, on the device (num and den recomputed in the
/// accumulate type, as the forward pass computes them).
template <Policy P, kernel_element X, kernel_element T, kernel_element DX, std::size_t N>
void dice_loss_backward(cuda_context& ctx, const device_tensor<X, N>& pred,
                        const device_tensor<T, N>& target, device_tensor<DX, N>& dpred,
                        double eps = 1.0, device_dloss dloss = 1.0) {
  using M = detail::math_t<op::loss, P, X, T>;
  constexpr std::string_view name = "precis::dice_loss_backward";
  detail::check_pointwise_loss(name, pred, target);
  check_shape(std::string(name) + ": dpred", dpred, pred.shape());
  detail::cuda::check_nonnegative(name, "eps", eps);
  device_tensor<M, 1> ratio({2}, ctx.stream());
  detail::cuda::reduce_terms<detail::cuda::device_sum<detail::accumulate_t<op::loss, P>>, 3>(
      ctx, pred.size(), detail::cuda::dice_terms<M, X, T>{pred.data(), target.data()},
      detail::cuda::dice_ratio_finish<M>{ratio.data(), static_cast<M>(eps)}, name);
  detail::cuda::write_terms(ctx, pred.size(), dpred.data(),
                            detail::cuda::dice_grads<M, T>{target.data(), ratio.data(), dloss},
                            name);
}

/// loss[0] = the mean of |pred - target|, on the device.
template <Policy P, kernel_element X, kernel_element T, std::size_t N, kernel_element L>
void l1_loss(cuda_context& ctx, const device_tensor<X, N>& pred, const device_tensor<T, N>& target,
             device_tensor<L, 1>& loss) {
  detail::cuda::pointwise_forward<detail::cuda::pointwise_loss::l1, P>("precis::l1_loss", ctx, pred,
                                                                       target, loss, 0.0);
}

/// dpred = dloss * sign(pred - target) / n, on the device.
template <Policy P, kernel_element X, kernel_element T, kernel_element DX, std::size_t N>
void l1_loss_backward(cuda_context& ctx, const device_tensor<X, N>& pred,
                      const device_tensor<T, N>& target, device_tensor<DX, N>& dpred,
                      device_dloss dloss = 1.0) {
  detail::cuda::pointwise_backward<detail::cuda::pointwise_loss::l1, P>(
      "precis::l1_loss_backward", ctx, pred, target, dpred, 0.0, dloss);
}

/// loss[0] = the mean of smooth-L1(pred - target) with `beta`, on the device (see the host
/// smooth_l1_loss). Throws precis::error for a negative or non-finite beta.
template <Policy P, kernel_element X, kernel_element T, std::size_t N, kernel_element L>
void smooth_l1_loss(cuda_context& ctx, const device_tensor<X, N>& pred,
                    const device_tensor<T, N>& target, device_tensor<L, 1>& loss,
                    double beta = 1.0) {
  detail::cuda::check_nonnegative("precis::smooth_l1_loss", "beta", beta);
  detail::cuda::pointwise_forward<detail::cuda::pointwise_loss::smooth_l1, P>(
      "precis::smooth_l1_loss", ctx, pred, target, loss, beta);
}

/// dpred = dloss / n * (d / beta where |d| < beta, sign(d) elsewhere), on the device.
template <Policy P, kernel_element X, kernel_element T, kernel_element DX, std::size_t N>
void smooth_l1_loss_backward(cuda_context& ctx, const device_tensor<X, N>& pred,
                             const device_tensor<T, N>& target, device_tensor<DX, N>& dpred,
                             double beta = 1.0, device_dloss dloss = 1.0) {
  detail::cuda::check_nonnegative("precis::smooth_l1_loss_backward", "beta", beta);
  detail::cuda::pointwise_backward<detail::cuda::pointwise_loss::smooth_l1, P>(
      "precis::smooth_l1_loss_backward", ctx, pred, target, dpred, beta, dloss);
}

}  // namespace precis

#endif
