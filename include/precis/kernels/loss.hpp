/// @file
/// Cross-entropy from logits, binary cross-entropy with logits, dice, L1 and smooth-L1 losses on
/// host tensors, each with its backward.
///
/// Semantics (op::loss: by default compute and accumulate in at least float): every loss
/// is a mean (over the batch for cross-entropy, over all elements for the others), its
/// terms computed in the math type and summed in the accumulate type (float: blocked sums,
/// as kernels/cpu/vec_math.hpp's row_sum, accurate for long rows and large maps; other
/// types one running sum in element order), then divided once. The loss comes back as float (double where the
/// compute type or an input is double). Terms may be computed on several threads, the sum
/// never is, so results are identical for any thread count.
///
/// Backward kernels write d(objective)/d(input) for an objective whose derivative with
/// respect to the loss value is `dloss` (1 for the loss itself; the loss scale when the
/// loss was scaled), each element rounded once to the gradient tensor's type.
#pragma once

#include <precis/kernels/common.hpp>
#include <precis/kernels/context.hpp>
#include <precis/kernels/cpu/support.hpp>
#include <precis/kernels/elementwise.hpp>
#include <precis/kernels/softmax.hpp>
#include <precis/tensor/host_tensor.hpp>

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <string>
#include <vector>

namespace precis {

namespace detail {

/// The sum over i in [0, n) of term(i), kept in Acc in index order (float: each chunk of
/// 65536 terms summed as vmath::row_sum does, the chunks in order); the terms of each
/// chunk are computed on the context's threads first.
template <class M, class Acc, class F>
M sum_terms(const cpu_context& ctx, std::size_t n, F term) {
  constexpr std::size_t chunk = std::size_t(1) << 16;
  std::vector<M> buf(std::min(n, chunk));
  accumulator<Acc> acc;
  for (std::size_t base = 0; base < n; base += chunk) {
    const std::size_t len = std::min(chunk, n - base);
    parallel_for(ctx, len, elements_per_thread / 4, [&](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i) buf[i] = term(base + i);
    });
    if constexpr (vmath::float_path_v<M, Acc>) {
      accumulate(acc, vmath::row_sum(buf.data(), len));  // chunks: blocked, then in order
    } else {
      for (std::size_t i = 0; i < len; ++i) accumulate(acc, buf[i]);
    }
  }
  return static_cast<M>(acc.value());
}

/// dx[i] = g(i) for i in [0, n), each element computed alone.
template <class DX, class F>
void write_terms(const cpu_context& ctx, std::size_t n, DX* dx, F g) {
  parallel_for(ctx, n, elements_per_thread / 4, [&](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i) dx[i] = round_to<DX>(g(i));
  });
}

/// Checks the shapes of a pointwise loss: pred non-empty, target with pred's shape.
template <class A, class B>
void check_pointwise_loss(std::string_view name, const A& pred, const B& target) {
  check_same_shape(std::string(name) + ": input and target", pred, target);
  check_not_empty(std::string(name) + ": input", pred);
}

/// Checks cross-entropy arguments: logits [B, C] with B, C >= 1, targets [B] in [0, C).
template <class X, class I>
void check_cross_entropy(std::string_view name, const host_tensor<X, 2>& logits,
                         const host_tensor<I, 1>& targets) {
  check_shape(std::string(name) + ": targets", targets,
              std::array<std::size_t, 1>{std::size_t(logits.shape()[0])});
  check_not_empty(std::string(name) + ": logits", logits);
  const auto classes = static_cast<long long>(logits.shape()[1]);
  for (std::size_t r = 0; r < targets.size(); ++r) {
    const auto t = static_cast<long long>(targets.data()[r]);
    if (t < 0 || t >= classes) {
      throw error(std::string(name) + ": targets[" + std::to_string(r) + "] is " +
                  std::to_string(t) + ", expected a class in [0, " + std::to_string(classes) + ")");
    }
  }
}

/// smooth-L1's term for difference d (host and device).
template <class M>
PRECIS_HOST_DEVICE M smooth_l1(M d, M beta) {
  const M a = math::abs(d);
  return a < beta ? M(0.5) * d * d / beta : a - mul(M(0.5), beta);
}

/// smooth-L1's derivative for difference d, without the 1/n (host and device).
template <class M>
PRECIS_HOST_DEVICE M smooth_l1_grad(M d, M beta) {
  return math::abs(d) < beta ? d / beta : (d > M(0) ? M(1) : (d < M(0) ? M(-1) : M(0)));
}

template <class M>
PRECIS_HOST_DEVICE M sign(M d) {
  return d > M(0) ? M(1) : (d < M(0) ? M(-1) : M(0));
}

/// binary cross-entropy with logits' term, max(x, 0) - x t + log1p(exp(-|x|)) (host and
/// device).
template <class M>
PRECIS_HOST_DEVICE M bce_logits_term(M x, M t) {
  return (x < M(0) ? M(0) : x) - mul(x, t) + math::log1p(math::exp(-math::abs(x)));
}

/// Its derivative in x, sigmoid(x) - t, without the 1/n.
template <class M>
PRECIS_HOST_DEVICE M bce_logits_grad(M x, M t) {
  return M(1) / (M(1) + math::exp(-x)) - t;
}

}  // namespace detail

/// The mean over the batch of -log softmax(logits[b])[targets[b]], from logits [B, C] and
/// integer class targets [B] (computed as logsumexp - logit, max-subtracted). Throws
/// precis::error, naming shapes or the offending target, on a wrong targets shape, an
/// empty batch or a target outside [0, C).
template <Policy P, kernel_element X, std::integral I>
detail::math_t<op::loss, P, X> cross_entropy(const cpu_context& ctx, const host_tensor<X, 2>& logits,
                                             const host_tensor<I, 1>& targets) {
  using M = detail::math_t<op::loss, P, X>;
  using Acc = detail::accumulate_t<op::loss, P>;
  detail::check_cross_entropy("precis::cross_entropy", logits, targets);
  const std::size_t rows = std::size_t(logits.shape()[0]), cols = std::size_t(logits.shape()[1]);
  std::vector<M> per_row(rows);
  detail::for_rows(ctx, rows, cols, [&](std::size_t begin, std::size_t end) {
    std::vector<M> buf(cols);
    for (std::size_t r = begin; r < end; ++r) {
      detail::load_block(logits.data() + r * cols, buf.data(), cols);
      const detail::vmath::row_range<M> b = detail::row_min_max(buf.data(), cols);
      const M m = b.max;
      const M picked = buf[static_cast<std::size_t>(targets.data()[r])];
      const M s = detail::exp_shifted_sum<Acc, detail::arith_t<P>>(buf.data(), cols, b);
      per_row[r] = m + std::log(s) - picked;
    }
  });
  accumulator<Acc> total;
  for (const M v : per_row) detail::accumulate(total, v);
  return static_cast<M>(total.value()) / static_cast<M>(rows);
}

/// dlogits = dloss * (softmax(logits) - onehot(targets)) / B.
template <Policy P, kernel_element X, std::integral I, kernel_element DX>
void cross_entropy_backward(const cpu_context& ctx, const host_tensor<X, 2>& logits,
                            const host_tensor<I, 1>& targets, host_tensor<DX, 2>& dlogits,
                            double dloss = 1.0) {
  using M = detail::math_t<op::loss, P, X>;
  using Acc = detail::accumulate_t<op::loss, P>;
  detail::check_cross_entropy("precis::cross_entropy_backward", logits, targets);
  check_shape("precis::cross_entropy_backward: dlogits", dlogits, detail::shape_array<2>(logits));
  const std::size_t rows = std::size_t(logits.shape()[0]), cols = std::size_t(logits.shape()[1]);
  const M scale = static_cast<M>(dloss) / static_cast<M>(rows);
  detail::for_rows(ctx, rows, cols, [&](std::size_t begin, std::size_t end) {
    std::vector<M> buf(cols);
    for (std::size_t r = begin; r < end; ++r) {
      detail::load_block(logits.data() + r * cols, buf.data(), cols);
      const M s = detail::exp_shifted_sum<Acc, detail::arith_t<P>>(
          buf.data(), cols, detail::row_min_max(buf.data(), cols));
      for (auto& v : buf) v = v / s;
      buf[static_cast<std::size_t>(targets.data()[r])] -= M(1);
      for (auto& v : buf) v *= scale;
      detail::store_block(buf.data(), dlogits.data() + r * cols, cols);
    }
  });
}

/// The mean over all elements of -[t log sigmoid(x) + (1 - t) log(1 - sigmoid(x))], in
/// the stable form max(x, 0) - x t + log1p(exp(-|x|)), which never takes the log of a
/// rounded probability (DESIGN.md: binary cross-entropy on probabilities is replaced by
/// this). Targets are probabilities in [0, 1], of logits' shape.
template <Policy P, kernel_element X, kernel_element T, std::size_t N>
detail::math_t<op::loss, P, X, T> bce_with_logits(const cpu_context& ctx, const host_tensor<X, N>& logits,
                                                  const host_tensor<T, N>& targets) {
  using M = detail::math_t<op::loss, P, X, T>;
  detail::check_pointwise_loss("precis::bce_with_logits", logits, targets);
  const std::size_t n = detail::element_count(logits);
  const X* x = logits.data();
  const T* t = targets.data();
  const M s = detail::sum_terms<M, detail::accumulate_t<op::loss, P>>(ctx, n, [x, t](std::size_t i) {
    return detail::bce_logits_term(detail::load<M>(x[i]), detail::load<M>(t[i]));
  });
  return s / static_cast<M>(n);
}

/// dlogits = dloss * (sigmoid(x) - t) / n.
template <Policy P, kernel_element X, kernel_element T, kernel_element DX, std::size_t N>
void bce_with_logits_backward(const cpu_context& ctx, const host_tensor<X, N>& logits,
                              const host_tensor<T, N>& targets, host_tensor<DX, N>& dlogits,
                              double dloss = 1.0) {
  using M = detail::math_t<op::loss, P, X, T>;
  detail::check_pointwise_loss("precis::bce_with_logits_backward", logits, targets);
  check_shape("precis::bce_with_logits_backward: dlogits", dlogits, detail::shape_array<N>(logits));
  const std::size_t n = detail::element_count(logits);
  const M scale = static_cast<M>(dloss) / static_cast<M>(n);
  const X* x = logits.data();
  const T* t = targets.data();
  detail::write_terms(ctx, n, dlogits.data(), [x, t, scale](std::size_t i) {
    return scale * detail::bce_logits_grad(detail::load<M>(x[i]), detail::load<M>(t[i]));
  });
}

/// 1 - (2 sum(p t) + eps) / (sum(p) + sum(t) + eps) over all elements (one dice score for
/// the whole tensor, as DBNet's loss on its probability maps). `pred` holds probabilities
/// (a sigmoid's output), `target` the 0/1 map; a mask is applied by multiplying it into
/// both beforehand. `eps` smooths the ratio and keeps empty maps defined (1 - 1 = 0 when
/// both are all zero). The three sums are kept in the accumulate type. Throws
/// precis::error for a negative or non-finite eps, or shapes that differ.
template <Policy P, kernel_element X, kernel_element T, std::size_t N>
detail::math_t<op::loss, P, X, T> dice_loss(const cpu_context& /*ctx*/, const host_tensor<X, N>& pred,
                                            const host_tensor<T, N>& target, double eps = 1.0) {
  using M = detail::math_t<op::loss, P, X, T>;
  using Acc = detail::accumulate_t<op::loss, P>;
  detail::check_pointwise_loss("precis::dice_loss", pred, target);
  detail::check_argument(std::isfinite(eps) && eps >= 0, "precis::dice_loss: eps",
                         "must be finite and >= 0, is " + std::to_string(eps));
  accumulator<Acc> inter, sp, st;
  const std::size_t n = detail::element_count(pred);
  std::array<M, detail::block_size> pb, tb;
  for (std::size_t i = 0; i < n; i += detail::block_size) {
    const std::size_t len = std::min(detail::block_size, n - i);
    detail::load_block(pred.data() + i, pb.data(), len);
    detail::load_block(target.data() + i, tb.data(), len);
    for (std::size_t j = 0; j < len; ++j) {
      detail::accumulate(inter, pb[j] * tb[j]);
      detail::accumulate(sp, pb[j]);
      detail::accumulate(st, tb[j]);
    }
  }
  const M e = static_cast<M>(eps);
  const M num = detail::mul(M(2), static_cast<M>(inter.value())) + e;
  const M den = static_cast<M>(sp.value()) + static_cast<M>(st.value()) + e;
  return M(1) - num / den;
}

/// dpred = dloss * -(2 t den - num) / den^2, with num and den the dice ratio's numerator
/// and denominator (recomputed, in the accumulate type, as the forward pass does).
template <Policy P, kernel_element X, kernel_element T, kernel_element DX, std::size_t N>
void dice_loss_backward(const cpu_context& ctx, const host_tensor<X, N>& pred,
                        const host_tensor<T, N>& target, host_tensor<DX, N>& dpred,
                        double eps = 1.0, double dloss = 1.0) {
  using M = detail::math_t<op::loss, P, X, T>;
  using Acc = detail::accumulate_t<op::loss, P>;
  detail::check_pointwise_loss("precis::dice_loss_backward", pred, target);
  check_shape("precis::dice_loss_backward: dpred", dpred, detail::shape_array<N>(pred));
  detail::check_argument(std::isfinite(eps) && eps >= 0, "precis::dice_loss_backward: eps",
                         "must be finite and >= 0, is " + std::to_string(eps));
  accumulator<Acc> inter, sp, st;
  const std::size_t n = detail::element_count(pred);
  const X* p = pred.data();
  const T* t = target.data();
  for (std::size_t i = 0; i < n; ++i) {
    const M pv = detail::load<M>(p[i]), tv = detail::load<M>(t[i]);
    detail::accumulate(inter, pv * tv);
    detail::accumulate(sp, pv);
    detail::accumulate(st, tv);
  }
  const M e = static_cast<M>(eps);
  const M num = detail::mul(M(2), static_cast<M>(inter.value())) + e;
  const M den = static_cast<M>(sp.value()) + static_cast<M>(st.value()) + e;
  const M scale = -static_cast<M>(dloss) / (den * den);
  detail::write_terms(ctx, n, dpred.data(), [t, num, den, scale](std::size_t i) {
    return scale * (detail::mul(M(2) * detail::load<M>(t[i]), den) - num);
  });
}

/// The mean of |pred - target| over all elements.
template <Policy P, kernel_element X, kernel_element T, std::size_t N>
detail::math_t<op::loss, P, X, T> l1_loss(const cpu_context& ctx, const host_tensor<X, N>& pred,
                                          const host_tensor<T, N>& target) {
  using M = detail::math_t<op::loss, P, X, T>;
  detail::check_pointwise_loss("precis::l1_loss", pred, target);
  const std::size_t n = detail::element_count(pred);
  const X* p = pred.data();
  const T* t = target.data();
  return detail::sum_terms<M, detail::accumulate_t<op::loss, P>>(ctx, n, [p, t](std::size_t i) {
           return std::abs(detail::load<M>(p[i]) - detail::load<M>(t[i]));
         }) /
         static_cast<M>(n);
}

/// dpred = dloss * sign(pred - target) / n (0 where they are equal, as PyTorch).
template <Policy P, kernel_element X, kernel_element T, kernel_element DX, std::size_t N>
void l1_loss_backward(const cpu_context& ctx, const host_tensor<X, N>& pred,
                      const host_tensor<T, N>& target, host_tensor<DX, N>& dpred, double dloss = 1.0) {
  using M = detail::math_t<op::loss, P, X, T>;
  detail::check_pointwise_loss("precis::l1_loss_backward", pred, target);
  check_shape("precis::l1_loss_backward: dpred", dpred, detail::shape_array<N>(pred));
  const std::size_t n = detail::element_count(pred);
  const M scale = static_cast<M>(dloss) / static_cast<M>(n);
  const X* p = pred.data();
  const T* t = target.data();
  detail::write_terms(ctx, n, dpred.data(), [p, t, scale](std::size_t i) {
    return scale * detail::sign(detail::load<M>(p[i]) - detail::load<M>(t[i]));
  });
}

/// The mean over all elements of smooth-L1 (Huber divided by beta, as PyTorch's
/// smooth_l1_loss): 0.5 d^2 / beta where |d| < beta, |d| - 0.5 beta elsewhere, d = pred -
/// target. beta = 0 is L1. Throws precis::error for a negative or non-finite beta.
template <Policy P, kernel_element X, kernel_element T, std::size_t N>
detail::math_t<op::loss, P, X, T> smooth_l1_loss(const cpu_context& ctx, const host_tensor<X, N>& pred,
                                                 const host_tensor<T, N>& target, double beta = 1.0) {
  using M = detail::math_t<op::loss, P, X, T>;
  detail::check_pointwise_loss("precis::smooth_l1_loss", pred, target);
  detail::check_argument(std::isfinite(beta) && beta >= 0, "precis::smooth_l1_loss: beta",
                         "must be finite and >= 0, is " + std::to_string(beta));
  const std::size_t n = detail::element_count(pred);
  const X* p = pred.data();
  const T* t = target.data();
  const M b = static_cast<M>(beta);
  return detail::sum_terms<M, detail::accumulate_t<op::loss, P>>(ctx, n, [p, t, b](std::size_t i) {
           return detail::smooth_l1(detail::load<M>(p[i]) - detail::load<M>(t[i]), b);
         }) /
         static_cast<M>(n);
}

/// dpred = dloss / n * (d / beta where |d| < beta, sign(d) elsewhere).
template <Policy P, kernel_element X, kernel_element T, kernel_element DX, std::size_t N>
void smooth_l1_loss_backward(const cpu_context& ctx, const host_tensor<X, N>& pred,
                             const host_tensor<T, N>& target, host_tensor<DX, N>& dpred,
                             double beta = 1.0, double dloss = 1.0) {
  using M = detail::math_t<op::loss, P, X, T>;
  detail::check_pointwise_loss("precis::smooth_l1_loss_backward", pred, target);
  check_shape("precis::smooth_l1_loss_backward: dpred", dpred, detail::shape_array<N>(pred));
  detail::check_argument(std::isfinite(beta) && beta >= 0, "precis::smooth_l1_loss_backward: beta",
                         "must be finite and >= 0, is " + std::to_string(beta));
  const std::size_t n = detail::element_count(pred);
  const M scale = static_cast<M>(dloss) / static_cast<M>(n);
  const M b = static_cast<M>(beta);
  const X* p = pred.data();
  const T* t = target.data();
  detail::write_terms(ctx, n, dpred.data(), [p, t, b, scale](std::size_t i) {
    return scale * detail::smooth_l1_grad(detail::load<M>(p[i]) - detail::load<M>(t[i]), b);
  });
}

}  // namespace precis
