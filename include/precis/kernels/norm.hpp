/// @file
/// Layer norm and batch norm on host tensors, forward and backward.
///
/// Semantics (op::layer_norm, op::batch_norm: by default compute and accumulate in at least
/// float): means and variances are two-pass (the mean first, then the sum of squared
/// deviations, which does not cancel catastrophically as E[x^2] - E[x]^2 does); float sums
/// (the default) are vmath's blocked row sums (16 partial sums per 256 elements, blocks
/// added pairwise: accurate for long rows, the same bits under every build flag, no product
/// fused into a sum), other accumulate types one running sum; the saved statistics (mean and 1/sqrt(var + eps),
/// for the backward pass) and the running statistics are float or double tensors, never a
/// narrow format; each output element is rounded once. Work is split over rows (layer norm)
/// or channels (batch norm), never inside one sum, so results are identical for any thread
/// count.
#pragma once

#include <precis/kernels/common.hpp>
#include <precis/kernels/context.hpp>
#include <precis/kernels/cpu/support.hpp>
#include <precis/kernels/cpu/transpose.hpp>
#include <precis/kernels/cpu/vec_math.hpp>
#include <precis/kernels/elementwise.hpp>
#include <precis/tensor/host_tensor.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace precis {

/// Element types statistics are kept in: float (the rule) or wider.
template <class S>
concept statistics_element = std::same_as<S, float> || std::same_as<S, double>;

/// What batch norm applies to each output after rounding it, before storing it: nothing,
/// or ReLU, max(y, 0) of the stored value with precis::relu's bits (relu_fn: a negative y
/// becomes +0, -0 and NaN stay). A fused ReLU saves the pass that would read y back and
/// write relu(y); its backward pass is batch_norm_relu_backward.
enum class fused_activation { none, relu };

namespace detail {

/// Rounds each of the n values to Y and applies relu_fn to the stored value, in place, in
/// M: storing a result to Y afterwards is exact, and gives relu's bits after a layer that
/// stored Y.
template <class Y, class M>
void relu_of_stored(M* v, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) v[i] = relu_fn<M>{}(load<M>(round_to<Y>(v[i])));
}

inline void check_eps(std::string_view name, double eps) {
  check_argument(std::isfinite(eps) && eps >= 0, std::string(name) + ": eps",
                 "must be finite and >= 0, is " + std::to_string(eps));
}

/// Mean and biased variance of n values, two-pass, each sum kept in Acc (float: vmath's
/// blocked row sums, products never fused into them, and the row `next`, where given,
/// fetched into the cache during the second pass: rows of a large tensor then come from
/// memory while the current one is computed).
template <class Acc, class M, class Next = M>
std::pair<M, M> mean_and_variance(const M* v, std::size_t n, const Next* next = nullptr) {
  if constexpr (vmath::float_path_v<M, Acc>) {
    using vmath::vf;
    const float mu = vmath::row_sum(v, n) / static_cast<float>(n);
    const vf muv = vmath::splat(mu);
    const float var = vmath::row_sum_of(n,
                                        [&](std::size_t i) {
                                          vmath::prefetch_line(next, i);
                                          const vf d = vmath::load_padded(v, i, n) - muv;
                                          return vmath::zero_past(vmath::product(d, d), i, n);
                                        }) /
                      static_cast<float>(n);
    return {mu, var};
  }
  accumulator<Acc> s;
  for (std::size_t j = 0; j < n; ++j) accumulate(s, v[j]);
  const M mean = static_cast<M>(s.value()) / static_cast<M>(n);
  accumulator<Acc> q;
  for (std::size_t j = 0; j < n; ++j) accumulate(q, (v[j] - mean) * (v[j] - mean));
  return {mean, static_cast<M>(q.value()) / static_cast<M>(n)};
}

/// v = ((v - mu) rs) g + b over n values, in place (float: SIMD, no product fused into the
/// sum, as in the other float paths).
template <class M>
void normalize_affine(M* v, std::size_t n, M mu, M rs, M g, M b) {
  if constexpr (std::is_same_v<M, float>) {
    using vmath::vf;
    const vf muv = vmath::splat(mu), rsv = vmath::splat(rs), gv = vmath::splat(g), bv = vmath::splat(b);
    vmath::map(v, v, n, [=](vf a) { return vmath::product(vmath::product(a - muv, rsv), gv) + bv; });
  } else {
    for (std::size_t i = 0; i < n; ++i) v[i] = add((v[i] - mu) * rs * g, b);
  }
}

/// (1 - momentum) running + momentum value, each product rounded before the sum.
template <class M>
M blend(M running, M value, M momentum) {
  if constexpr (std::is_same_v<M, float>) {
    return vmath::product(1.0F - momentum, running) + vmath::product(momentum, value);
  } else {
    return add((M(1) - momentum) * running, momentum * value);
  }
}

/// One row of layer norm in float from x (n floats) to y: mean and biased variance (two
/// passes) as vmath row sums, then ((x - mean) rstd) gamma + beta, no product fused into a
/// sum, each result rounded once to Y (y may be x when Y is float); the row `next` (or
/// null) is fetched into the cache meanwhile. Returns {mean, rstd}.
template <class Y, class Next>
std::pair<float, float> vector_layer_norm_row(const float* x, Y* y, const float* gamma,
                                              const float* beta, std::size_t n, float eps,
                                              const Next* next) {
  using vmath::vf;
  const auto [mu, var] = mean_and_variance<float>(x, n, next);
  const float rs = 1.0F / std::sqrt(var + eps);
  const vf muv = vmath::splat(mu), rsv = vmath::splat(rs);
  map_store(
      y, n,
      [muv, rsv](vf a, vf g, vf b) { return vmath::product(vmath::product(a - muv, rsv), g) + b; },
      x, gamma, beta);
  return {mu, rs};
}

/// x viewed as [batch, channels, inner] (inner: the product of the axes after the second);
/// with `last` (channels-last images [N, H, W, C]), channels is the last axis and inner the
/// pixels, the values of channel c at (b * inner + p) * channels + c.
template <class X>
std::array<std::size_t, 3> batch_norm_dims(const X& x, bool last = false) {
  const std::size_t rank = x.dimension(), channel_axis = last ? rank - 1 : 1;
  std::size_t inner = 1;
  for (std::size_t i = 1; i < rank; ++i) {
    if (i != channel_axis) inner *= std::size_t(x.shape()[i]);
  }
  return {std::size_t(x.shape()[0]), std::size_t(x.shape()[channel_axis]), inner};
}

/// How many channels a channels-last batch norm moves at once: a cache line of them, so
/// that each pass over x reads whole lines.
template <class X>
constexpr std::size_t channel_block = 64 / sizeof(X) > 0 ? 64 / sizeof(X) : 1;
/// The most channels a block holds (one-byte elements).
inline constexpr std::size_t max_channel_block = 64;

/// Pixels a channels-last batch norm moves per tile (gather_channels).
inline constexpr std::size_t pixel_tile = 128;

/// Channels [c0, c0 + nb) of x into v, one row of count = batch * inner values (M) per
/// channel, in (batch, inner) order whatever the layout: the rows the NCHW kernels read, so
/// the same sums follow. `last`: x is channels-last; tiles of pixel_tile pixels by nb
/// channels are transposed (nb <= max_channel_block), then widened.
template <class M, class X>
void gather_channels(const X* x, const std::array<std::size_t, 3>& d, bool last, std::size_t c0, std::size_t nb,
                     M* v) {
  const std::size_t count = d[0] * d[2];
  if (!last) {
    for (std::size_t k = 0; k < nb; ++k) {
      for (std::size_t b = 0; b < d[0]; ++b) load_block(x + (b * d[1] + c0 + k) * d[2], v + k * count + b * d[2], d[2]);
    }
    return;
  }
  X tile[pixel_tile * max_channel_block];
  for (std::size_t q0 = 0; q0 < count; q0 += pixel_tile) {
    const std::size_t qn = std::min(pixel_tile, count - q0);
    transpose_matrix(x + q0 * d[1] + c0, d[1], tile, qn, qn, nb);
    for (std::size_t k = 0; k < nb; ++k) load_block(tile + k * qn, v + k * count + q0, qn);
  }
}

/// Writes the rows v of channels [c0, c0 + nb) into out (gather_channels' inverse), each
/// value rounded once.
template <class M, class Y>
void scatter_channels(const M* v, const std::array<std::size_t, 3>& d, bool last, std::size_t c0, std::size_t nb,
                      Y* out) {
  const std::size_t count = d[0] * d[2];
  if (!last) {
    for (std::size_t k = 0; k < nb; ++k) {
      for (std::size_t b = 0; b < d[0]; ++b) store_block(v + k * count + b * d[2], out + (b * d[1] + c0 + k) * d[2], d[2]);
    }
    return;
  }
  Y tile[pixel_tile * max_channel_block];
  for (std::size_t q0 = 0; q0 < count; q0 += pixel_tile) {
    const std::size_t qn = std::min(pixel_tile, count - q0);
    for (std::size_t k = 0; k < nb; ++k) store_block(v + k * count + q0, tile + k * qn, qn);
    transpose_matrix(tile, qn, out + q0 * d[1] + c0, d[1], nb, qn);
  }
}

/// Calls f(c0, nb) for the channels [begin, end) in blocks: one channel at a time for NCHW,
/// channel_block<X> at a time for channels-last images.
template <class X, class F>
void for_channel_blocks(std::size_t begin, std::size_t end, bool last, F&& f) {
  const std::size_t step = last ? channel_block<X> : 1;
  for (std::size_t c0 = begin; c0 < end; c0 += step) f(c0, std::min(step, end - c0));
}


}  // namespace detail

/// Layer norm over the last axis (D elements): y = (x - mean) / sqrt(var + eps) * gamma +
/// beta, var biased (divided by D), gamma and beta of shape [D]. Writes the statistics the
/// backward pass needs: `mean` and `rstd` = 1 / sqrt(var + eps), of x's shape without the
/// last axis. Throws precis::error (shapes named) before writing on any shape mismatch, an
/// empty last axis, or a negative or non-finite eps.
template <Policy P, kernel_element X, kernel_element G, kernel_element B, kernel_element Y,
          statistics_element S, std::size_t N>
  requires(N >= 1)
void layer_norm(const cpu_context& ctx, const host_tensor<X, N>& x, const host_tensor<G, 1>& gamma,
                const host_tensor<B, 1>& beta, host_tensor<Y, N>& y, host_tensor<S, N - 1>& mean,
                host_tensor<S, N - 1>& rstd, double eps = 1e-5) {
  using M = detail::math_t<op::layer_norm, P, X, G, B>;
  using Acc = detail::accumulate_t<op::layer_norm, P>;
  const std::array<std::size_t, 1> d{std::size_t(x.shape()[N - 1])};
  check_shape("precis::layer_norm: gamma", gamma, d);
  check_shape("precis::layer_norm: beta", beta, d);
  check_shape("precis::layer_norm: y", y, detail::shape_array<N>(x));
  check_shape("precis::layer_norm: mean", mean, detail::shape_without<N>(x, N - 1));
  check_shape("precis::layer_norm: rstd", rstd, detail::shape_without<N>(x, N - 1));
  detail::check_argument(d[0] > 0, "precis::layer_norm: x", "has an empty last axis");
  detail::check_eps("precis::layer_norm", eps);
  const std::size_t rows = detail::element_count(mean), cols = d[0];
  std::vector<M> g(cols), bt(cols);
  detail::load_block(gamma.data(), g.data(), cols);
  detail::load_block(beta.data(), bt.data(), cols);
  const M e = static_cast<M>(eps);
  if constexpr (detail::vmath::float_path_v<M, Acc>) {
    // Rows read and written in place where they are float, converted one row at a time
    // otherwise.
    detail::for_rows(ctx, rows, cols, [&](std::size_t begin, std::size_t end) {
      std::vector<float> scratch;
      if constexpr (!std::is_same_v<X, float>) scratch.resize(cols);
      for (std::size_t r = begin; r < end; ++r) {
        const float* v = detail::float_view(x.data() + r * cols, scratch.data(), cols);
        const X* next = r + 1 < end ? x.data() + (r + 1) * cols : nullptr;
        const auto [mu, rs] = detail::vector_layer_norm_row(v, y.data() + r * cols, g.data(),
                                                            bt.data(), cols, e, next);
        mean.data()[r] = static_cast<S>(mu);
        rstd.data()[r] = static_cast<S>(rs);
      }
    });
    return;
  }
  detail::for_rows(ctx, rows, cols, [&](std::size_t begin, std::size_t end) {
    std::vector<M> v(cols);
    for (std::size_t r = begin; r < end; ++r) {
      detail::load_block(x.data() + r * cols, v.data(), cols);
      const auto [mu, var] = detail::mean_and_variance<Acc>(v.data(), cols);
      const M rs = M(1) / std::sqrt(var + e);
      for (std::size_t j = 0; j < cols; ++j) v[j] = detail::add((v[j] - mu) * rs * g[j], bt[j]);
      detail::store_block(v.data(), y.data() + r * cols, cols);
      mean.data()[r] = static_cast<S>(mu);
      rstd.data()[r] = static_cast<S>(rs);
    }
  });
}

/// Gradients of layer_norm from the saved `mean` and `rstd`: with xhat = (x - mean) rstd
/// and g = dy gamma, dx = rstd (g - mean_j(g) - xhat mean_j(g xhat)); dgamma = sum over
/// rows of dy xhat, dbeta = sum over rows of dy (one sum per column, in row order).
template <Policy P, kernel_element DY, kernel_element X, kernel_element G, statistics_element S,
          kernel_element DX, kernel_element DG, kernel_element DB, std::size_t N>
  requires(N >= 1)
void layer_norm_backward(const cpu_context& ctx, const host_tensor<DY, N>& dy, const host_tensor<X, N>& x,
                         const host_tensor<G, 1>& gamma, const host_tensor<S, N - 1>& mean,
                         const host_tensor<S, N - 1>& rstd, host_tensor<DX, N>& dx,
                         host_tensor<DG, 1>& dgamma, host_tensor<DB, 1>& dbeta) {
  using M = detail::math_t<op::layer_norm, P, DY, X, G>;
  using Acc = detail::accumulate_t<op::layer_norm, P>;
  const std::array<std::size_t, 1> d{std::size_t(x.shape()[N - 1])};
  check_same_shape("precis::layer_norm_backward: dy and x", dy, x);
  check_shape("precis::layer_norm_backward: gamma", gamma, d);
  check_shape("precis::layer_norm_backward: mean", mean, detail::shape_without<N>(x, N - 1));
  check_shape("precis::layer_norm_backward: rstd", rstd, detail::shape_without<N>(x, N - 1));
  check_shape("precis::layer_norm_backward: dx", dx, detail::shape_array<N>(x));
  check_shape("precis::layer_norm_backward: dgamma", dgamma, d);
  check_shape("precis::layer_norm_backward: dbeta", dbeta, d);
  const std::size_t rows = detail::element_count(mean), cols = d[0];
  if (cols == 0) return;
  std::vector<M> gm(cols);
  detail::load_block(gamma.data(), gm.data(), cols);
  if constexpr (detail::vmath::float_path_v<M, Acc>) {
    using detail::vmath::vf;
    namespace vm = detail::vmath;
    detail::for_rows(ctx, rows, cols, [&](std::size_t begin, std::size_t end) {
      const std::size_t run = std::min(detail::row_run(cols), end - begin);
      std::vector<float> xs(run * cols), gs(run * cols);
      for (std::size_t r0 = begin; r0 < end; r0 += run) {
        const std::size_t k = std::min(run, end - r0);
        detail::load_block(x.data() + r0 * cols, xs.data(), k * cols);
        detail::load_block(dy.data() + r0 * cols, gs.data(), k * cols);
        for (std::size_t i = 0; i < k; ++i) {
          float* v = xs.data() + i * cols;
          float* g = gs.data() + i * cols;
          const vf muv = vm::splat(float(mean.data()[r0 + i]));
          const vf rsv = vm::splat(float(rstd.data()[r0 + i]));
          vm::map(v, v, cols, [muv, rsv](vf a) { return vm::product(a - muv, rsv); });
          vm::map2(g, gm.data(), g, cols, [](vf a, vf b) { return a * b; });
          const vf a = vm::splat(vm::row_sum(g, cols) / static_cast<float>(cols));
          const vf b = vm::splat(vm::row_dot(g, v, cols) / static_cast<float>(cols));
          vm::map2(g, v, v, cols,
                   [a, b, rsv](vf gj, vf xh) { return rsv * ((gj - a) - vm::product(xh, b)); });
        }
        detail::store_block(xs.data(), dx.data() + r0 * cols, k * cols);
      }
    });
  } else {
    detail::for_rows(ctx, rows, cols, [&](std::size_t begin, std::size_t end) {
      std::vector<M> v(cols), g(cols);
      for (std::size_t r = begin; r < end; ++r) {
        detail::load_block(x.data() + r * cols, v.data(), cols);
        detail::load_block(dy.data() + r * cols, g.data(), cols);
        const M mu = static_cast<M>(mean.data()[r]), rs = static_cast<M>(rstd.data()[r]);
        accumulator<Acc> sg, sgx;
        for (std::size_t j = 0; j < cols; ++j) {
          v[j] = (v[j] - mu) * rs;  // xhat
          g[j] *= gm[j];
          detail::accumulate(sg, g[j]);
          detail::accumulate(sgx, g[j] * v[j]);
        }
        const M a = static_cast<M>(sg.value()) / static_cast<M>(cols);
        const M b = static_cast<M>(sgx.value()) / static_cast<M>(cols);
        for (std::size_t j = 0; j < cols; ++j) v[j] = rs * (g[j] - a - detail::mul(v[j], b));
        detail::store_block(v.data(), dx.data() + r * cols, cols);
      }
    });
  }
  // dgamma and dbeta: column sums, columns shared among threads, each summed in row order
  // (products never fused into the sums, so the bits do not depend on -ffp-contract).
  const std::size_t per_thread =
      std::max<std::size_t>(1, detail::elements_per_thread / std::max<std::size_t>(1, rows));
  if constexpr (detail::vmath::float_path_v<M, Acc>) {
    namespace vm = detail::vmath;
    // A thread's columns, in tiles of up to 256: a tile's part of a row is converted at once
    // and its sums are kept a vector of columns at a time (zeros past the tile), each
    // column's in row order.
    detail::parallel_for(ctx, cols, per_thread, [&](std::size_t begin, std::size_t end) {
      constexpr std::size_t tile = 256;
      std::vector<float> tg(tile), tx(tile), sg(tile), sb(tile);
      for (std::size_t t0 = begin; t0 < end; t0 += tile) {
        const std::size_t len = std::min(tile, end - t0);
        const std::size_t width = (len + vm::lanes - 1) / vm::lanes * vm::lanes;
        std::fill(tg.begin(), tg.end(), 0.0F);
        std::fill(tx.begin(), tx.end(), 0.0F);
        std::fill(sg.begin(), sg.end(), 0.0F);
        std::fill(sb.begin(), sb.end(), 0.0F);
        for (std::size_t r = 0; r < rows; ++r) {
          detail::load_block(dy.data() + r * cols + t0, tg.data(), len);
          detail::load_block(x.data() + r * cols + t0, tx.data(), len);
          const vm::vf mu = vm::splat(float(mean.data()[r]));
          const vm::vf rs = vm::splat(float(rstd.data()[r]));
          for (std::size_t j = 0; j < width; j += vm::lanes) {
            const vm::vf gy = vm::load(tg.data() + j);
            const vm::vf xh = vm::product(vm::load(tx.data() + j) - mu, rs);
            vm::store(sg.data() + j, vm::load(sg.data() + j) + vm::product(gy, xh));
            vm::store(sb.data() + j, vm::load(sb.data() + j) + gy);
          }
        }
        detail::store_block(sg.data(), dgamma.data() + t0, len);
        detail::store_block(sb.data(), dbeta.data() + t0, len);
      }
    });
    return;
  }
  detail::parallel_for(ctx, cols, per_thread, [&](std::size_t begin, std::size_t end) {
    std::vector<accumulator<Acc>> ag(end - begin), ab(end - begin);
    for (std::size_t r = 0; r < rows; ++r) {
      const M mu = static_cast<M>(mean.data()[r]), rs = static_cast<M>(rstd.data()[r]);
      for (std::size_t j = begin; j < end; ++j) {
        const M gy = detail::load<M>(dy.data()[r * cols + j]);
        const M xh = (detail::load<M>(x.data()[r * cols + j]) - mu) * rs;
        detail::accumulate(ag[j - begin], gy * xh);
        detail::accumulate(ab[j - begin], gy);
      }
    }
    for (std::size_t j = begin; j < end; ++j) {
      dgamma.data()[j] = round_to<DG>(ag[j - begin].value());
      dbeta.data()[j] = round_to<DB>(ab[j - begin].value());
    }
  });
}

namespace detail {

/// Checks that every named tensor has shape [C], C = x's axis 1 (host or device tensors).
template <class XT, class... T>
void check_channel_tensors(std::string_view name, const XT& x, bool last,
                           const std::pair<std::string_view, const T*>&... ts) {
  const std::array<std::size_t, 1> c{batch_norm_dims(x, last)[1]};
  (check_shape(std::string(name) + ": " + std::string(ts.first), *ts.second, c), ...);
}

template <class T>
std::pair<std::string_view, const T*> named(std::string_view name, const T& t) {
  return {name, &t};
}

/// Whether batch norm can train on `values` values per channel: more than one (the running
/// variance is the unbiased one, which divides by the count less one). The kernels' checks
/// and nn::batch_norm's, which refuses a batch before it sizes any buffer, both ask this.
constexpr bool batch_norm_trains_on(std::size_t values) { return values > 1; }

/// The checks of batch_norm_train (host and device tensors): channel tensors of shape [C],
/// y of x's shape, two values per channel, momentum in [0, 1], a valid eps.
template <std::size_t N, class XT, class GT, class BT, class RT, class YT, class ST>
void check_batch_norm_train(std::string_view name, const XT& x, const GT& gamma, const BT& beta,
                            const RT& running_mean, const RT& running_var, const YT& y, const ST& save_mean,
                            const ST& save_rstd, double momentum, double eps, bool last = false) {
  check_channel_tensors(name, x, last, named("gamma", gamma), named("beta", beta), named("running_mean", running_mean),
                        named("running_var", running_var), named("save_mean", save_mean),
                        named("save_rstd", save_rstd));
  check_shape(std::string(name) + ": y", y, shape_array<N>(x));
  const auto d = batch_norm_dims(x, last);
  if (!batch_norm_trains_on(d[0] * d[2]) && d[1] > 0) {
    throw error(std::string(name) + ": x has shape " + shape_string(x.shape()) +
                ", expected more than one value per channel in training mode");
  }
  check_argument(std::isfinite(momentum) && momentum >= 0 && momentum <= 1, std::string(name) + ": momentum",
                 "must be in [0, 1], is " + std::to_string(momentum));
  check_eps(name, eps);
}

/// The checks of batch_norm_infer (host and device tensors).
template <std::size_t N, class XT, class GT, class BT, class RT, class YT>
void check_batch_norm_infer(std::string_view name, const XT& x, const GT& gamma, const BT& beta,
                            const RT& running_mean, const RT& running_var, const YT& y, double eps,
                            bool last = false) {
  check_channel_tensors(name, x, last, named("gamma", gamma), named("beta", beta), named("running_mean", running_mean),
                        named("running_var", running_var));
  check_shape(std::string(name) + ": y", y, shape_array<N>(x));
  check_eps(name, eps);
}

/// The checks of batch_norm_backward (host and device tensors).
template <std::size_t N, class DYT, class XT, class GT, class ST, class DXT, class DGT, class DBT>
void check_batch_norm_backward(std::string_view name, const DYT& dy, const XT& x, const GT& gamma,
                               const ST& save_mean, const ST& save_rstd, const DXT& dx, const DGT& dgamma,
                               const DBT& dbeta, bool last = false) {
  check_same_shape(std::string(name) + ": dy and x", dy, x);
  check_channel_tensors(name, x, last, named("gamma", gamma), named("save_mean", save_mean),
                        named("save_rstd", save_rstd), named("dgamma", dgamma), named("dbeta", dbeta));
  check_shape(std::string(name) + ": dx", dx, shape_array<N>(x));
}

}  // namespace detail

/// Batch norm in training mode over x [N, C] or [N, C, H, W] (any rank >= 2, channels on
/// axis 1): per channel, the batch mean and biased variance over the other axes normalise
/// x, y = (x - mean) / sqrt(var + eps) * gamma + beta. The running statistics are updated
/// as PyTorch does, running = (1 - momentum) running + momentum batch_statistic, with the
/// unbiased variance (divided by count - 1) for running_var; so `momentum` is the weight
/// of the new batch (0.1), not Keras's weight of the old value (0.99). `save_mean` and
/// `save_rstd` = 1 / sqrt(var + eps) are for the backward pass. All channel tensors have
/// shape [C]. Throws precis::error before writing on a shape mismatch, fewer than two
/// values per channel, momentum outside [0, 1], or a negative or non-finite eps.
///
/// `layout` image_layout::nhwc takes channels-last images [N, H, W, C] (channels on the last
/// axis, for any rank): each channel's values are gathered in the same (image, pixel) order
/// as from NCHW, so both layouts give the same bits. Channels-last moves a cache line of
/// channels at a time, holding that many rows of N * H * W math values per thread.
///
/// `act` fused_activation::relu stores relu(y) instead (the bits of precis::relu on the
/// stored y); the backward pass is then batch_norm_relu_backward, given that output.
template <Policy P, kernel_element X, kernel_element G, kernel_element B, statistics_element R,
          kernel_element Y, statistics_element S, std::size_t N>
  requires(N >= 2)
void batch_norm_train(const cpu_context& ctx, const host_tensor<X, N>& x, const host_tensor<G, 1>& gamma,
                      const host_tensor<B, 1>& beta, host_tensor<R, 1>& running_mean,
                      host_tensor<R, 1>& running_var, host_tensor<Y, N>& y, host_tensor<S, 1>& save_mean,
                      host_tensor<S, 1>& save_rstd, double momentum = 0.1, double eps = 1e-5,
                      image_layout layout = image_layout::nchw, fused_activation act = fused_activation::none) {
  using M = detail::math_t<op::batch_norm, P, X, G, B>;
  using Acc = detail::accumulate_t<op::batch_norm, P>;
  constexpr std::string_view name = "precis::batch_norm_train";
  const bool last = layout == image_layout::nhwc;
  detail::check_batch_norm_train<N>(name, x, gamma, beta, running_mean, running_var, y, save_mean, save_rstd,
                                    momentum, eps, last);
  const auto d = detail::batch_norm_dims(x, last);
  const std::size_t count = d[0] * d[2];
  const M e = static_cast<M>(eps), mom = static_cast<M>(momentum);
  detail::for_rows(ctx, d[1], count, [&](std::size_t begin, std::size_t end) {
    std::vector<M> rows;
    detail::for_channel_blocks<X>(begin, end, last, [&](std::size_t c0, std::size_t nb) {
      rows.resize(nb * count);
      detail::gather_channels(x.data(), d, last, c0, nb, rows.data());
      for (std::size_t k = 0; k < nb; ++k) {
        const std::size_t c = c0 + k;
        M* v = rows.data() + k * count;
        const auto [mu, var] = detail::mean_and_variance<Acc>(v, count);
        const M rs = M(1) / std::sqrt(var + e);
        const M g = detail::load<M>(gamma.data()[c]), bt = detail::load<M>(beta.data()[c]);
        detail::normalize_affine(v, count, mu, rs, g, bt);
        if (act == fused_activation::relu) detail::relu_of_stored<Y>(v, count);
        save_mean.data()[c] = static_cast<S>(mu);
        save_rstd.data()[c] = static_cast<S>(rs);
        const M unbiased = var * static_cast<M>(count) / static_cast<M>(count - 1);
        running_mean.data()[c] =
            static_cast<R>(detail::blend(static_cast<M>(running_mean.data()[c]), mu, mom));
        running_var.data()[c] =
            static_cast<R>(detail::blend(static_cast<M>(running_var.data()[c]), unbiased, mom));
      }
      detail::scatter_channels(rows.data(), d, last, c0, nb, y.data());
    });
  });
}

/// Batch norm in inference mode: y = (x - running_mean) / sqrt(running_var + eps) * gamma +
/// beta, per channel (axis 1; the last axis with `layout` image_layout::nhwc, with the same
/// bits). Same shape rules as batch_norm_train; `act` as batch_norm_train's.
template <Policy P, kernel_element X, kernel_element G, kernel_element B, statistics_element R,
          kernel_element Y, std::size_t N>
  requires(N >= 2)
void batch_norm_infer(const cpu_context& ctx, const host_tensor<X, N>& x, const host_tensor<G, 1>& gamma,
                      const host_tensor<B, 1>& beta, const host_tensor<R, 1>& running_mean,
                      const host_tensor<R, 1>& running_var, host_tensor<Y, N>& y, double eps = 1e-5,
                      image_layout layout = image_layout::nchw, fused_activation act = fused_activation::none) {
  using M = detail::math_t<op::batch_norm, P, X, G, B>;
  constexpr std::string_view name = "precis::batch_norm_infer";
  const bool last = layout == image_layout::nhwc;
  detail::check_batch_norm_infer<N>(name, x, gamma, beta, running_mean, running_var, y, eps, last);
  const auto d = detail::batch_norm_dims(x, last);
  const M e = static_cast<M>(eps);
  if (last) {
    // Each channel's rows, normalised by the same function as below: the same bits.
    const std::size_t count = d[0] * d[2];
    detail::for_rows(ctx, d[1], count, [&](std::size_t begin, std::size_t end) {
      std::vector<M> rows;
      detail::for_channel_blocks<X>(begin, end, true, [&](std::size_t c0, std::size_t nb) {
        rows.resize(nb * count);
        detail::gather_channels(x.data(), d, true, c0, nb, rows.data());
        for (std::size_t k = 0; k < nb; ++k) {
          const std::size_t c = c0 + k;
          const M mu = static_cast<M>(running_mean.data()[c]);
          const M rs = M(1) / std::sqrt(static_cast<M>(running_var.data()[c]) + e);
          const M g = detail::load<M>(gamma.data()[c]), bt = detail::load<M>(beta.data()[c]);
          detail::normalize_affine(rows.data() + k * count, count, mu, rs, g, bt);
          if (act == fused_activation::relu) detail::relu_of_stored<Y>(rows.data() + k * count, count);
        }
        detail::scatter_channels(rows.data(), d, true, c0, nb, y.data());
      });
    });
    return;
  }
  // Per channel, y = x * scale + shift would round differently from the training formula;
  // the normalisation is written the same way in both modes.
  detail::for_rows(ctx, d[0] * d[1], d[2], [&](std::size_t begin, std::size_t end) {
    std::vector<M> v(d[2]);
    for (std::size_t bc = begin; bc < end; ++bc) {
      const std::size_t c = bc % d[1];
      const M mu = static_cast<M>(running_mean.data()[c]);
      const M rs = M(1) / std::sqrt(static_cast<M>(running_var.data()[c]) + e);
      const M g = detail::load<M>(gamma.data()[c]), bt = detail::load<M>(beta.data()[c]);
      detail::load_block(x.data() + bc * d[2], v.data(), d[2]);
      detail::normalize_affine(v.data(), d[2], mu, rs, g, bt);
      if (act == fused_activation::relu) detail::relu_of_stored<Y>(v.data(), d[2]);
      detail::store_block(v.data(), y.data() + bc * d[2], d[2]);
    }
  });
}

namespace detail {

/// batch_norm_backward, and with z (not null) batch_norm_relu_backward: dy is then the
/// gradient of relu(y), and relu_grad_fn of it where z, the stored relu(y), is positive
/// (where y is, with relu_fn's bits) takes dy's place.
template <Policy P, kernel_element DY, kernel_element Z, kernel_element X, kernel_element G, statistics_element S,
          kernel_element DX, kernel_element DG, kernel_element DB, std::size_t N>
void batch_norm_backward_of(std::string_view name, const cpu_context& ctx, const host_tensor<DY, N>& dy,
                            const host_tensor<Z, N>* z, const host_tensor<X, N>& x, const host_tensor<G, 1>& gamma,
                            const host_tensor<S, 1>& save_mean, const host_tensor<S, 1>& save_rstd,
                            host_tensor<DX, N>& dx, host_tensor<DG, 1>& dgamma, host_tensor<DB, 1>& dbeta,
                            image_layout layout) {
  using M = math_t<op::batch_norm, P, DY, X, G>;
  using Acc = accumulate_t<op::batch_norm, P>;
  const bool last = layout == image_layout::nhwc;
  check_batch_norm_backward<N>(name, dy, x, gamma, save_mean, save_rstd, dx, dgamma, dbeta, last);
  if (z != nullptr) check_same_shape(std::string(name) + ": z and x", *z, x);
  const auto d = batch_norm_dims(x, last);
  const std::size_t count = d[0] * d[2];
  if (count == 0) return;
  for_rows(ctx, d[1], count, [&](std::size_t begin, std::size_t end) {
    std::vector<M> xs, gs, zs;
    for_channel_blocks<X>(begin, end, last, [&](std::size_t c0, std::size_t nb) {
      xs.resize(nb * count);
      gs.resize(nb * count);
      gather_channels(x.data(), d, last, c0, nb, xs.data());
      gather_channels(dy.data(), d, last, c0, nb, gs.data());
      if (z != nullptr) {
        zs.resize(nb * count);
        gather_channels(z->data(), d, last, c0, nb, zs.data());
        for (std::size_t i = 0; i < nb * count; ++i) gs[i] = relu_grad_fn<M>{}(gs[i], zs[i]);
      }
      for (std::size_t c = c0; c < c0 + nb; ++c) {
        const std::span<M> v(xs.data() + (c - c0) * count, count), g(gs.data() + (c - c0) * count, count);
        const M mu = static_cast<M>(save_mean.data()[c]), rs = static_cast<M>(save_rstd.data()[c]);
        const M k = load<M>(gamma.data()[c]) * rs;
        M sum_dy, sum_dyx;
        if constexpr (vmath::float_path_v<M, Acc>) {
          namespace vm = vmath;
          const vm::vf muv = vm::splat(mu), rsv = vm::splat(rs);
          vm::map(v.data(), v.data(), count, [=](vm::vf a) { return vm::product(a - muv, rsv); });
          sum_dy = vm::row_sum(g.data(), count);
          sum_dyx = vm::row_dot(g.data(), v.data(), count);
          const vm::vf av = vm::splat(sum_dy / static_cast<M>(count));
          const vm::vf bv = vm::splat(sum_dyx / static_cast<M>(count)), kv = vm::splat(k);
          vm::map2(g.data(), v.data(), v.data(), count,
                   [=](vm::vf gi, vm::vf xh) { return kv * ((gi - av) - vm::product(xh, bv)); });
        } else {
          accumulator<Acc> sdy, sdyx;
          for (std::size_t i = 0; i < count; ++i) {
            v[i] = (v[i] - mu) * rs;  // xhat
            accumulate(sdy, g[i]);
            accumulate(sdyx, g[i] * v[i]);
          }
          sum_dy = static_cast<M>(sdy.value());
          sum_dyx = static_cast<M>(sdyx.value());
          const M a = sum_dy / static_cast<M>(count), b = sum_dyx / static_cast<M>(count);
          for (std::size_t i = 0; i < count; ++i) v[i] = k * (g[i] - a - mul(v[i], b));
        }
        dgamma.data()[c] = round_to<DG>(sum_dyx);
        dbeta.data()[c] = round_to<DB>(sum_dy);
      }
      scatter_channels(xs.data(), d, last, c0, nb, dx.data());
    });
  });
}

}  // namespace detail

/// Gradients of batch_norm_train from its saved statistics: per channel, with xhat =
/// (x - mean) rstd over the `count` values of the channel, dbeta = sum(dy), dgamma =
/// sum(dy xhat), dx = gamma rstd (dy - dbeta / count - xhat dgamma / count). The running
/// statistics do not take part (they are not a function of the loss). `layout` as in
/// batch_norm_train (the same bits in both).
template <Policy P, kernel_element DY, kernel_element X, kernel_element G, statistics_element S,
          kernel_element DX, kernel_element DG, kernel_element DB, std::size_t N>
  requires(N >= 2)
void batch_norm_backward(const cpu_context& ctx, const host_tensor<DY, N>& dy, const host_tensor<X, N>& x,
                         const host_tensor<G, 1>& gamma, const host_tensor<S, 1>& save_mean,
                         const host_tensor<S, 1>& save_rstd, host_tensor<DX, N>& dx,
                         host_tensor<DG, 1>& dgamma, host_tensor<DB, 1>& dbeta,
                         image_layout layout = image_layout::nchw) {
  const host_tensor<DY, N>* no_relu = nullptr;
  detail::batch_norm_backward_of<P>("precis::batch_norm_backward", ctx, dy, no_relu, x, gamma, save_mean, save_rstd,
                                    dx, dgamma, dbeta, layout);
}

/// Gradients of z = relu(batch_norm_train(x)), the forward pass with fused_activation::relu,
/// from dz and its output z: batch_norm_backward of dy = dz where z > 0, else 0 (relu's
/// gradient, with precis::relu_backward's bits: z > 0 exactly where y > 0). The same
/// checks as batch_norm_backward, and z of x's shape.
template <Policy P, kernel_element DZ, kernel_element Z, kernel_element X, kernel_element G, statistics_element S,
          kernel_element DX, kernel_element DG, kernel_element DB, std::size_t N>
  requires(N >= 2)
void batch_norm_relu_backward(const cpu_context& ctx, const host_tensor<DZ, N>& dz, const host_tensor<Z, N>& z,
                              const host_tensor<X, N>& x, const host_tensor<G, 1>& gamma,
                              const host_tensor<S, 1>& save_mean, const host_tensor<S, 1>& save_rstd,
                              host_tensor<DX, N>& dx, host_tensor<DG, 1>& dgamma, host_tensor<DB, 1>& dbeta,
                              image_layout layout = image_layout::nchw) {
  detail::batch_norm_backward_of<P>("precis::batch_norm_relu_backward", ctx, dz, &z, x, gamma, save_mean, save_rstd,
                                    dx, dgamma, dbeta, layout);
}

}  // namespace precis
