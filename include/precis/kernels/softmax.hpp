/// @file
/// Softmax, log-softmax and logsumexp along the last axis of a host tensor, forward and backward.
///
/// Semantics (op::softmax, op::log_softmax, op::logsumexp: by default compute and
/// accumulate in at least float): each row's maximum m is subtracted before exp, so
/// exp never overflows and logits of 1000 or -1000 give finite results; each output element
/// is rounded once. Rows are shared among threads (results identical for any thread count).
/// A row holding NaN gives NaN; an all -inf row gives NaN from softmax (as PyTorch) and
/// -inf from logsumexp.
///
/// Float math and float sums (the default) run on SIMD vectors (kernels/cpu/vec_math.hpp),
/// float rows read and written where they are (no copies; y may be x), bfloat16 widened
/// and rounded in registers: exp within 1 ulp, softmax's quotient as a product with the
/// sum's reciprocal (within 1.5 ulp of the float quotient, as PyTorch computes it), and row
/// sums in 16 partial sums per block of 256 elements with the blocks added pairwise, so
/// long rows (a 50257-token vocabulary) keep float accuracy; the same bits under every
/// build flag. Other types (double, or an `unsafe` accumulator narrower than float) keep
/// one running sum per row in the accumulate type.
#pragma once

#include <precis/kernels/common.hpp>
#include <precis/kernels/context.hpp>
#include <precis/kernels/cpu/support.hpp>
#include <precis/kernels/cpu/vec_math.hpp>
#include <precis/tensor/host_tensor.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace precis {

namespace detail {

/// The smallest and largest values of a row (both NaN if the row holds a NaN; float: one
/// vmath pass).
template <class M>
vmath::row_range<M> row_min_max(const M* x, std::size_t n) {
  if constexpr (std::is_same_v<M, float>) {
    if (n > 0) {
      return vmath::row_range_of(n, [x, n](std::size_t j) { return vmath::load_padded(x, j, n); });
    }
  }
  vmath::row_range<M> b{std::numeric_limits<M>::infinity(), -std::numeric_limits<M>::infinity()};
  for (std::size_t j = 0; j < n; ++j) {
    if (std::isnan(x[j])) return {x[j], x[j]};
    b.min = x[j] < b.min ? x[j] : b.min;
    b.max = x[j] > b.max ? x[j] : b.max;
  }
  return b;
}

/// Replaces the row x by exp(x - m), m = b.max, and returns the sum of those, kept in Acc,
/// as M (float: vmath's exp and blocked row sum; vmath::exp_normal, the same bits in fewer
/// operations, where every x - m is within its range, as softmax_rows does).
template <class Acc, class A, class M>
M exp_shifted_sum(M* x, std::size_t n, vmath::row_range<M> b) {
  const M m = b.max;
  if constexpr (vmath::float_path_v<M, Acc>) {
    const vmath::vf mv = vmath::splat(m);
    if (vmath::exp_normal_covers(b.min, m)) {
      vmath::map(x, x, n, [mv](vmath::vf v) { return vmath::exp_normal<A>(v - mv); });
    } else {
      vmath::map(x, x, n, [mv](vmath::vf v) { return vmath::exp<A>(v - mv); });
    }
    return vmath::row_sum(x, n);
  }
  accumulator<Acc> s;
  for (std::size_t j = 0; j < n; ++j) {
    x[j] = std::exp(x[j] - m);
    accumulate(s, x[j]);
  }
  return static_cast<M>(s.value());
}

/// Checks `t` (rank N - 1) has x's shape without its last axis.
template <std::size_t N, class X, class T>
void check_row_shape(std::string_view what, const X& x, const T& t) {
  check_shape(what, t, shape_without<N>(x, N - 1));
}

enum class softmax_kind { softmax, log_softmax };

/// A row's floats for the float path and their range: the row itself where X is float;
/// bfloat16 widened into `scratch` in the same pass as the range; other formats converted
/// into `scratch` first.
template <class X>
std::pair<const float*, vmath::row_range<float>> float_row_and_range(const X* row, float* scratch,
                                                                     std::size_t cols) {
  if constexpr (std::is_same_v<X, bfloat16>) {
    const auto* bits = reinterpret_cast<const std::uint16_t*>(row);
    const vmath::row_range<float> r = vmath::row_range_of(cols, [&](std::size_t j) {
      const vmath::vf v = vmath::load_upper_half(bits + j, std::min(vmath::lanes, cols - j));
      vmath::store_padded(scratch, j, cols, v);
      return v;
    });
    return {scratch, r};
  } else {
    const float* v = float_view(row, scratch, cols);
    return {v, row_min_max(v, cols)};
  }
}

/// The float softmax or log-softmax of k rows of `cols` elements from `in` to `out`
/// (scratch: cols floats, used where X or Y is not float). Softmax: one pass for the
/// row's range (reading the input, widening bfloat16), one that writes e = exp(x - m)
/// (m the maximum) and sums it (the blocked row sum, in the same order as vmath::row_sum),
/// one that multiplies by 1 / sum (as PyTorch does: a division per element would cost more
/// than the exp) and rounds to Y. Log-softmax: the range, the sum of exp(x - m) without
/// storing it, then (x - m) - log(sum). Where the row's minimum is within 86 of m (so is
/// every x - m), exp is vmath::exp_normal, the same bits in fewer operations. Float rows are
/// read and written in place (no copies), so out may be in.
template <softmax_kind K, class A, class X, class Y>
void softmax_rows(const X* in, Y* out, float* scratch, std::size_t k, std::size_t cols) {
  using vmath::vf;
  for (std::size_t i = 0; i < k; ++i) {
    Y* y = out + i * cols;
    // (Not a structured binding: clang 14 does not let the lambdas below capture one.)
    const std::pair<const float*, vmath::row_range<float>> row =
        float_row_and_range(in + i * cols, scratch, cols);
    const float* x = row.first;
    const float max = row.second.max;
    if (!std::isfinite(max)) {
      // A NaN, +inf or an all -inf row: x - max is NaN in some lane, and then so is the
      // sum and every result (as computing it would give).
      const vf nan = vmath::splat(std::numeric_limits<float>::quiet_NaN());
      map_store(
          y, cols, [nan](vf) { return nan; }, x);
      continue;
    }
    const vf m = vmath::splat(max);
    // The next row is fetched during the exp pass (see vmath::prefetch_line).
    const X* next = i + 1 < k ? in + (i + 1) * cols : nullptr;
    const auto finish_row = [&](auto exp) {
      if constexpr (K == softmax_kind::softmax) {
        float* e = scratch;
        if constexpr (std::is_same_v<Y, float>) e = y;
        const float s = vmath::row_sum_of(cols, [&](std::size_t j) {
          vmath::prefetch_line(next, j);
          const vf ej = exp(vmath::load_padded(x, j, cols) - m);
          vmath::store_padded(e, j, cols, ej);
          return vmath::zero_past(ej, j, cols);
        });
        const vf inv = vmath::splat(1.0F / s);
        map_store(
            y, cols, [inv](vf v) { return v * inv; }, static_cast<const float*>(e));
      } else {
        const float s = vmath::row_sum_of(cols, [&](std::size_t j) {
          vmath::prefetch_line(next, j);
          return vmath::zero_past(exp(vmath::load_padded(x, j, cols) - m), j, cols);
        });
        const vf lse = vmath::splat(std::log(s));
        map_store(
            y, cols, [m, lse](vf v) { return (v - m) - lse; }, x);
      }
    };
    if (vmath::exp_normal_covers(row.second.min, max)) {
      finish_row([](vf v) { return vmath::exp_normal<A>(v); });
    } else {
      finish_row([](vf v) { return vmath::exp_not_nan<A>(v); });
    }
  }
}

template <op_kind Op, Policy P, softmax_kind K, class X, class Y, std::size_t N>
void softmax_forward(std::string_view name, const cpu_context& ctx, const host_tensor<X, N>& x,
                     host_tensor<Y, N>& y) {
  using M = math_t<Op, P, X>;
  using Acc = accumulate_t<Op, P>;
  check_shape(std::string(name) + ": y", y, shape_array<N>(x));
  const auto shape_rc = rows_and_cols(x);
  const std::size_t rows = shape_rc.first, cols = shape_rc.second;
  const X* in = x.data();
  Y* out = y.data();
  if (cols == 0) return;
  if constexpr (vmath::float_path_v<M, Acc>) {
    for_rows(ctx, rows, cols, [&](std::size_t begin, std::size_t end) {
      std::vector<float> scratch;
      if constexpr (!std::is_same_v<X, float> || !std::is_same_v<Y, float>) scratch.resize(cols);
      softmax_rows<K, arith_t<P>>(in + begin * cols, out + begin * cols, scratch.data(),
                                  end - begin, cols);
    });
    return;
  }
  for_rows(ctx, rows, cols, [&](std::size_t begin, std::size_t end) {
    std::vector<M> buf(cols);
    for (std::size_t r = begin; r < end; ++r) {
      load_block(in + r * cols, buf.data(), cols);
      const vmath::row_range<M> b = row_min_max(buf.data(), cols);
      const M m = b.max;
      if constexpr (K == softmax_kind::softmax) {
        const M s = exp_shifted_sum<Acc, arith_t<P>>(buf.data(), cols, b);
        for (auto& v : buf) v = v / s;
      } else {
        std::vector<M>& shifted = buf;
        accumulator<Acc> acc;
        for (std::size_t j = 0; j < cols; ++j) {
          shifted[j] -= m;
          accumulate(acc, std::exp(shifted[j]));
        }
        const M lse = std::log(static_cast<M>(acc.value()));
        for (auto& v : shifted) v -= lse;
      }
      store_block(buf.data(), out + r * cols, cols);
    }
  });
}

}  // namespace detail

/// y = softmax(x) along the last axis: exp(x - max) / sum(exp(x - max)).
template <Policy P, kernel_element X, kernel_element Y, std::size_t N>
  requires(N >= 1)
void softmax(const cpu_context& ctx, const host_tensor<X, N>& x, host_tensor<Y, N>& y) {
  detail::softmax_forward<op::softmax, P, detail::softmax_kind::softmax>("precis::softmax", ctx, x, y);
}

/// y = log_softmax(x) along the last axis: (x - max) - log(sum(exp(x - max))), never
/// log(softmax), which is -inf where softmax underflows.
template <Policy P, kernel_element X, kernel_element Y, std::size_t N>
  requires(N >= 1)
void log_softmax(const cpu_context& ctx, const host_tensor<X, N>& x, host_tensor<Y, N>& y) {
  detail::softmax_forward<op::log_softmax, P, detail::softmax_kind::log_softmax>(
      "precis::log_softmax", ctx, x, y);
}

/// out = log(sum(exp(x))) along the last axis (out has x's shape without it), computed as
/// max + log(sum(exp(x - max))); a row whose maximum is infinite gives that maximum.
template <Policy P, kernel_element X, kernel_element Y, std::size_t N>
  requires(N >= 1)
void logsumexp(const cpu_context& ctx, const host_tensor<X, N>& x, host_tensor<Y, N - 1>& out) {
  using M = detail::math_t<op::logsumexp, P, X>;
  using Acc = detail::accumulate_t<op::logsumexp, P>;
  detail::check_row_shape<N>("precis::logsumexp: out", x, out);
  const auto shape_rc = detail::rows_and_cols(x);
  const std::size_t rows = shape_rc.first, cols = shape_rc.second;
  const X* in = x.data();
  Y* o = out.data();
  detail::for_rows(ctx, rows, cols, [&](std::size_t begin, std::size_t end) {
    std::vector<M> buf(cols);
    for (std::size_t r = begin; r < end; ++r) {
      detail::load_block(in + r * cols, buf.data(), cols);
      const detail::vmath::row_range<M> b = detail::row_min_max(buf.data(), cols);
      const M m = b.max;
      if (std::isinf(m)) {
        o[r] = round_to<Y>(m);
        continue;
      }
      const M s = detail::exp_shifted_sum<Acc, detail::arith_t<P>>(buf.data(), cols, b);
      o[r] = round_to<Y>(m + std::log(s));
    }
  });
}

/// dx = y * (dy - sum(dy * y)) along the last axis, from the forward output y (as the
/// frameworks keep it); the row's dot product is one sum in the accumulate type.
template <Policy P, kernel_element DY, kernel_element Y, kernel_element DX, std::size_t N>
  requires(N >= 1)
void softmax_backward(const cpu_context& ctx, const host_tensor<DY, N>& dy, const host_tensor<Y, N>& y,
                      host_tensor<DX, N>& dx) {
  using M = detail::math_t<op::softmax, P, DY, Y>;
  using Acc = detail::accumulate_t<op::softmax, P>;
  check_same_shape("precis::softmax_backward: dy and y", dy, y);
  check_shape("precis::softmax_backward: dx", dx, detail::shape_array<N>(y));
  const auto shape_rc = detail::rows_and_cols(y);
  const std::size_t rows = shape_rc.first, cols = shape_rc.second;
  if (cols == 0) return;
  detail::for_rows(ctx, rows, cols, [&](std::size_t begin, std::size_t end) {
    const std::size_t run = std::min(detail::row_run(cols), end - begin);
    std::vector<M> g(run * cols), p(run * cols);
    for (std::size_t r0 = begin; r0 < end; r0 += run) {
      const std::size_t k = std::min(run, end - r0);
      detail::load_block(dy.data() + r0 * cols, g.data(), k * cols);
      detail::load_block(y.data() + r0 * cols, p.data(), k * cols);
      for (std::size_t i = 0; i < k; ++i) {
        M* gr = g.data() + i * cols;
        const M* pr = p.data() + i * cols;
        M d;
        if constexpr (detail::vmath::float_path_v<M, Acc>) {
          d = detail::vmath::row_dot(gr, pr, cols);
        } else {
          accumulator<Acc> dot;
          for (std::size_t j = 0; j < cols; ++j) detail::accumulate(dot, gr[j] * pr[j]);
          d = static_cast<M>(dot.value());
        }
        for (std::size_t j = 0; j < cols; ++j) gr[j] = pr[j] * (gr[j] - d);
      }
      detail::store_block(g.data(), dx.data() + r0 * cols, k * cols);
    }
  });
}

/// dx = dy - exp(y) * sum(dy) along the last axis, from the forward output y = log_softmax(x).
template <Policy P, kernel_element DY, kernel_element Y, kernel_element DX, std::size_t N>
  requires(N >= 1)
void log_softmax_backward(const cpu_context& ctx, const host_tensor<DY, N>& dy,
                          const host_tensor<Y, N>& y, host_tensor<DX, N>& dx) {
  using M = detail::math_t<op::log_softmax, P, DY, Y>;
  using Acc = detail::accumulate_t<op::log_softmax, P>;
  check_same_shape("precis::log_softmax_backward: dy and y", dy, y);
  check_shape("precis::log_softmax_backward: dx", dx, detail::shape_array<N>(y));
  const auto shape_rc = detail::rows_and_cols(y);
  const std::size_t rows = shape_rc.first, cols = shape_rc.second;
  detail::for_rows(ctx, rows, cols, [&](std::size_t begin, std::size_t end) {
    std::vector<M> g(cols), p(cols);
    for (std::size_t r = begin; r < end; ++r) {
      detail::load_block(dy.data() + r * cols, g.data(), cols);
      detail::load_block(y.data() + r * cols, p.data(), cols);
      if constexpr (detail::vmath::float_path_v<M, Acc>) {
        using detail::vmath::vf;
        const vf s = detail::vmath::splat(detail::vmath::row_sum(g.data(), cols));
        detail::vmath::map2(g.data(), p.data(), g.data(), cols, [s](vf gv, vf pv) {
          return gv - detail::vmath::product(detail::vmath::exp<detail::arith_t<P>>(pv), s);
        });
      } else {
        accumulator<Acc> total;
        for (std::size_t j = 0; j < cols; ++j) detail::accumulate(total, g[j]);
        const M s = static_cast<M>(total.value());
        for (std::size_t j = 0; j < cols; ++j) g[j] -= std::exp(p[j]) * s;
      }
      detail::store_block(g.data(), dx.data() + r * cols, cols);
    }
  });
}

/// dx = dy * exp(x - out) along the last axis (the softmax of x), from the forward input x
/// and output out = logsumexp(x); dy has out's shape.
template <Policy P, kernel_element DY, kernel_element X, kernel_element L, kernel_element DX,
          std::size_t N>
  requires(N >= 1)
void logsumexp_backward(const cpu_context& ctx, const host_tensor<DY, N - 1>& dy,
                        const host_tensor<X, N>& x, const host_tensor<L, N - 1>& out,
                        host_tensor<DX, N>& dx) {
  using M = detail::math_t<op::logsumexp, P, DY, X, L>;
  detail::check_row_shape<N>("precis::logsumexp_backward: dy", x, dy);
  detail::check_row_shape<N>("precis::logsumexp_backward: out", x, out);
  check_shape("precis::logsumexp_backward: dx", dx, detail::shape_array<N>(x));
  const auto shape_rc = detail::rows_and_cols(x);
  const std::size_t rows = shape_rc.first, cols = shape_rc.second;
  detail::for_rows(ctx, rows, cols, [&](std::size_t begin, std::size_t end) {
    std::vector<M> v(cols);
    for (std::size_t r = begin; r < end; ++r) {
      detail::load_block(x.data() + r * cols, v.data(), cols);
      const M g = detail::load<M>(dy.data()[r]), l = detail::load<M>(out.data()[r]);
      if constexpr (std::is_same_v<M, float>) {
        using detail::vmath::vf;
        const vf gv = detail::vmath::splat(g), lv = detail::vmath::splat(l);
        detail::vmath::map(v.data(), v.data(), cols, [gv, lv](vf e) {
          return gv * detail::vmath::exp<detail::arith_t<P>>(e - lv);
        });
      } else {
        for (auto& e : v) e = g * std::exp(e - l);
      }
      detail::store_block(v.data(), dx.data() + r * cols, cols);
    }
  });
}

}  // namespace precis
