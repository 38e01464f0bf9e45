/// @file
/// Sum, mean, max and L2 norm of host tensors, over all elements (returning a scalar) or along one
/// axis (writing a tensor of one rank less).
///
/// Semantics (op::reduction under the policy: by default compute and accumulate in at least
/// float): each sum is one running sum in the policy's accumulate type, taken in element
/// order (for an accumulate type narrower than float it is rounded after every addition,
/// so an unsafe float16 accumulator stalls at 2048 when summing ones, as one would). A sum
/// is never split between threads: a whole-tensor reduction runs on the calling thread and
/// an axis reduction shares out its output elements, so results are identical for any
/// thread count. The scalar forms return float, or double where the compute or accumulate
/// type is double.
#pragma once

#include <precis/kernels/common.hpp>
#include <precis/kernels/context.hpp>
#include <precis/kernels/cpu/support.hpp>
#include <precis/tensor/host_tensor.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

namespace precis {

namespace detail {

/// What a reduction under P of elements T returns: float, or double when the math or the
/// accumulate type is double.
template <Policy P, class T>
using reduce_result_t =
    std::common_type_t<math_t<op::reduction, P, T>, opmath_t<accumulate_t<op::reduction, P>>>;

// Each reducer: a state, how an element enters it, and the value it ends with for an axis
// of `count` elements.
template <class M, class Acc, class R>
struct sum_reducer {
  using state = accumulator<Acc>;
  static state init() { return state{}; }
  static void add(state& s, M v) { accumulate(s, v); }
  static R finish(const state& s, std::size_t) { return R(s.value()); }
};
template <class M, class Acc, class R>
struct mean_reducer : sum_reducer<M, Acc, R> {
  static R finish(const accumulator<Acc>& s, std::size_t count) {
    return R(s.value()) / static_cast<R>(count);
  }
};
template <class M, class Acc, class R>
struct l2_reducer : sum_reducer<M, Acc, R> {
  static void add(accumulator<Acc>& s, M v) { accumulate(s, v * v); }
  static R finish(const accumulator<Acc>& s, std::size_t) { return std::sqrt(R(s.value())); }
};
template <class M, class Acc, class R>
struct max_reducer {
  using state = M;
  static state init() { return -std::numeric_limits<M>::infinity(); }
  static void add(state& s, M v) {
    if (!std::isnan(s) && (v > s || std::isnan(v))) s = v;  // NaN wins and stays
  }
  static R finish(const state& s, std::size_t) { return R(s); }
};

/// The whole tensor through one reducer state, in element order.
template <class Red, class M, class T>
auto reduce_all(const T* x, std::size_t n) {
  auto s = Red::init();
  std::array<M, block_size> buf;
  for (std::size_t i = 0; i < n; i += block_size) {
    const std::size_t len = std::min(block_size, n - i);
    load_block(x + i, buf.data(), len);
    for (std::size_t j = 0; j < len; ++j) Red::add(s, buf[j]);
  }
  return Red::finish(s, n);
}

/// True for a sum or mean of floats in a float accumulator: its running sums are plain float
/// additions (nothing to fuse, no rounding to a narrower type), which reduce_axis does a
/// row segment at a time, each output element's additions in the same k order.
template <class Red>
inline constexpr bool float_sum_reducer_v = false;
template <class R>
inline constexpr bool float_sum_reducer_v<sum_reducer<float, float, R>> = true;
template <class R>
inline constexpr bool float_sum_reducer_v<mean_reducer<float, float, R>> = true;

/// out[o, i] = reduction over k of x[o, k, i] (x viewed as [outer, count, inner]); output
/// elements are shared among threads, each one reduced in k order.
template <class Red, class M, class T, class U>
void reduce_axis(const cpu_context& ctx, const T* x, std::size_t outer, std::size_t count,
                 std::size_t inner, U* out) {
  const std::size_t per_thread =
      std::max<std::size_t>(1, elements_per_thread / std::max<std::size_t>(1, count));
  parallel_for(ctx, outer * inner, per_thread, [&](std::size_t begin, std::size_t end) {
    if constexpr (float_sum_reducer_v<Red>) {
      // Float sums: each row's segment converted by the vector unit, then added lane-wise
      // into the running sums (the same additions, in the same order, as one at a time).
      std::vector<float> sums, row_values;
      for (std::size_t idx = begin; idx < end;) {
        const std::size_t o = idx / inner, i0 = idx % inner;
        const std::size_t len = std::min(inner, i0 + (end - idx)) - i0;
        sums.assign(len, 0.0F);
        row_values.resize(len);
        for (std::size_t k = 0; k < count; ++k) {
          const T* row = x + (o * count + k) * inner + i0;
          const float* v = row_values.data();
          if constexpr (std::is_same_v<T, float>) {
            v = row;
          } else {
            load_block(row, row_values.data(), len);
          }
          float* s = sums.data();
          for (std::size_t i = 0; i < len; ++i) s[i] += v[i];
        }
        for (std::size_t i = 0; i < len; ++i) {
          out[o * inner + i0 + i] = round_to<U>(Red::finish(typename Red::state(sums[i]), count));
        }
        idx += len;
      }
    } else {
      std::vector<typename Red::state> st;
      for (std::size_t idx = begin; idx < end;) {
        const std::size_t o = idx / inner, i0 = idx % inner;
        const std::size_t i1 = std::min(inner, i0 + (end - idx));
        st.assign(i1 - i0, Red::init());
        for (std::size_t k = 0; k < count; ++k) {
          const T* row = x + (o * count + k) * inner;
          for (std::size_t i = i0; i < i1; ++i) Red::add(st[i - i0], load<M>(row[i]));
        }
        for (std::size_t i = i0; i < i1; ++i)
          out[o * inner + i] = round_to<U>(Red::finish(st[i - i0], count));
        idx += i1 - i0;
      }
    }
  });
}

template <template <class, class, class> class Red, Policy P, class T, std::size_t N>
auto reduce_all_of(const host_tensor<T, N>& x) {
  using M = math_t<op::reduction, P, T>;
  using R = reduce_result_t<P, T>;
  return reduce_all<Red<M, accumulate_t<op::reduction, P>, R>, M>(x.data(), element_count(x));
}

template <template <class, class, class> class Red, Policy P, class T, std::size_t N, class U>
void reduce_axis_of(std::string_view name, const cpu_context& ctx, const host_tensor<T, N>& x,
                    std::size_t axis, host_tensor<U, N - 1>& out, bool needs_elements) {
  check_argument(axis < N, std::string(name) + ": axis " + std::to_string(axis),
                 "is out of range for a tensor of rank " + std::to_string(N));
  check_shape(std::string(name) + ": out", out, shape_without<N>(x, axis));
  const std::size_t count = std::size_t(x.shape()[axis]);
  if (needs_elements && count == 0 && element_count(out) != 0) {
    throw error(std::string(name) + ": axis " + std::to_string(axis) + " of shape " +
                shape_string(x.shape()) + " is empty");
  }
  std::size_t outer = 1, inner = 1;
  for (std::size_t i = 0; i < axis; ++i) outer *= std::size_t(x.shape()[i]);
  for (std::size_t i = axis + 1; i < N; ++i) inner *= std::size_t(x.shape()[i]);
  using M = math_t<op::reduction, P, T>;
  using R = reduce_result_t<P, T>;
  reduce_axis<Red<M, accumulate_t<op::reduction, P>, R>, M>(ctx, x.data(), outer, count, inner,
                                                            out.data());
}

/// An image tensor's planes (image n, channel c) as an axis reduction's [outer, count,
/// inner], the axis being the plane's pixels: [N C, H W, 1] for NCHW, [N, H W, C] for
/// channels-last. Output o * inner + i is then plane n * C + c in either layout, and each is
/// reduced over its pixels in pixel order.
struct plane_axes {
  std::size_t outer;  ///< N C, or N
  std::size_t count;  ///< H W
  std::size_t inner;  ///< 1, or C
};
/// The plane_axes of images of shape `s` in `layout`.
inline plane_axes plane_axes_of(const std::array<std::size_t, 4>& s, image_layout layout) {
  if (layout == image_layout::nhwc) return {s[0], s[1] * s[2], s[3]};
  return {s[0] * s[1], s[2] * s[3], 1};
}
/// The images' shape read as [N, C, H, W] (channels-last [N, H, W, C] reordered).
inline std::array<std::size_t, 4> images_as_nchw(const std::array<std::size_t, 4>& s,
                                                 image_layout layout) {
  if (layout == image_layout::nhwc) return {s[0], s[3], s[1], s[2]};
  return s;
}

/// The checks of global_avg_pool and its backward pass (host and device tensors): planes with
/// at least one pixel, and the pooled tensor [N, C] of the images'. `images` names the image
/// tensor (x, or dx), `pooled` the other. Throws precis::error naming both shapes.
template <class Images, class Pooled>
void check_global_avg_pool(std::string_view name, std::string_view images, const Images& x,
                           std::string_view pooled, const Pooled& y, image_layout layout) {
  const auto nchw = images_as_nchw(shape_array<4>(x), layout);
  if (nchw[2] * nchw[3] == 0) {
    throw error(std::string(name) + ": " + std::string(images) + " has planes of no pixel (shape " +
                shape_string(x.shape()) + ")");
  }
  check_shape(std::string(name) + ": " + std::string(pooled), y,
              std::array<std::size_t, 2>{nchw[0], nchw[1]});
}

/// What each pixel of a plane receives in the gradient of the plane's mean: dy / count in
/// the math type M, rounded once to U. Host and device (global_avg_pool_backward).
template <class U, class M>
PRECIS_HOST_DEVICE U mean_share(M dy, std::size_t count) {
  return round_to<U>(dy / static_cast<M>(count));
}

}  // namespace detail

/// y[n, c] = the mean of image n's channel c over its H x W pixels, for images x [N, C, H, W]
/// or, with image_layout::nhwc, channels-last [N, H, W, C]: one running sum in pixel order
/// under op::reduction's rules (see the file comment), divided once by the pixel count,
/// rounded once. Both layouts give the same bits. Throws precis::error, before writing, for
/// planes of no pixel or a y that is not [N, C].
template <Policy P, kernel_element T, kernel_element U>
void global_avg_pool(const cpu_context& ctx, const host_tensor<T, 4>& x, host_tensor<U, 2>& y,
                     image_layout layout = image_layout::nchw) {
  detail::check_global_avg_pool("precis::global_avg_pool", "x", x, "y", y, layout);
  const auto a = detail::plane_axes_of(detail::shape_array<4>(x), layout);
  using M = detail::math_t<op::reduction, P, T>;
  using Red = detail::mean_reducer<M, detail::accumulate_t<op::reduction, P>,
                                   detail::reduce_result_t<P, T>>;
  detail::reduce_axis<Red, M>(ctx, x.data(), a.outer, a.count, a.inner, y.data());
}

/// dx [N, C, H, W] (or channels-last) from dy [N, C]: every pixel of plane (n, c) gets
/// dy[n, c] / (H W), computed in op::reduction's math type and rounded once (the gradient of
/// global_avg_pool). Throws precis::error, before writing, for planes of no pixel or a dy
/// that is not [N, C].
template <Policy P, kernel_element G, kernel_element U>
void global_avg_pool_backward(const cpu_context& ctx, const host_tensor<G, 2>& dy,
                              host_tensor<U, 4>& dx, image_layout layout = image_layout::nchw) {
  detail::check_global_avg_pool("precis::global_avg_pool_backward", "dx", dx, "dy", dy, layout);
  const auto a = detail::plane_axes_of(detail::shape_array<4>(dx), layout);
  using M = detail::math_t<op::reduction, P, G>;
  const G* g = dy.data();
  U* out = dx.data();
  if (layout == image_layout::nchw) {  // a plane's pixels, one share each
    detail::for_rows(ctx, a.outer, a.count, [&](std::size_t begin, std::size_t end) {
      for (std::size_t plane = begin; plane < end; ++plane) {
        std::fill_n(out + plane * a.count, a.count,
                    detail::mean_share<U>(detail::load<M>(g[plane]), a.count));
      }
    });
    return;
  }
  // Channels-last: rows of one pixel's channels, image n's shares.
  detail::for_rows(ctx, a.outer * a.count, a.inner, [&](std::size_t begin, std::size_t end) {
    for (std::size_t r = begin; r < end; ++r) {
      const G* shares = g + r / a.count * a.inner;
      for (std::size_t i = 0; i < a.inner; ++i)
        out[r * a.inner + i] = detail::mean_share<U>(detail::load<M>(shares[i]), a.count);
    }
  });
}

namespace detail {

/// out[j] = the sum over the rows of x[r * cols + j] (x: rows x cols, packed), under P's
/// reduction rules, each column's additions in row order: a layer's bias gradient. The
/// device overload (kernels/cuda/reduce.hpp) sums in another fixed order.
template <Policy P, class T, class U>
void column_sums(const cpu_context& ctx, const T* x, std::size_t rows, std::size_t cols, U* out) {
  using M = math_t<op::reduction, P, T>;
  reduce_axis<sum_reducer<M, accumulate_t<op::reduction, P>, reduce_result_t<P, T>>, M>(ctx, x, 1, rows,
                                                                                        cols, out);
}

}  // namespace detail

/// The sum of all elements, one running sum in the accumulate type, in element order
/// (the calling thread only: one sum is never split). 0 for an empty tensor.
template <Policy P, kernel_element T, std::size_t N>
detail::reduce_result_t<P, T> sum(const cpu_context& /*ctx*/, const host_tensor<T, N>& x) {
  return detail::reduce_all_of<detail::sum_reducer, P>(x);
}

/// out = x summed along `axis` (out has x's shape without that axis). Throws precis::error
/// for an axis >= N or a wrong out shape, before writing.
template <Policy P, kernel_element T, std::size_t N, kernel_element U>
requires(N >= 1) void sum(const cpu_context& ctx, const host_tensor<T, N>& x, std::size_t axis,
                          host_tensor<U, N - 1>& out) {
  detail::reduce_axis_of<detail::sum_reducer, P>("precis::sum", ctx, x, axis, out, false);
}

/// The mean of all elements: the sum as in `sum`, divided once by the count. Throws
/// precis::error for an empty tensor.
template <Policy P, kernel_element T, std::size_t N>
detail::reduce_result_t<P, T> mean(const cpu_context& /*ctx*/, const host_tensor<T, N>& x) {
  detail::check_not_empty("precis::mean: x", x);
  return detail::reduce_all_of<detail::mean_reducer, P>(x);
}

/// out = mean of x along `axis`.
template <Policy P, kernel_element T, std::size_t N, kernel_element U>
requires(N >= 1) void mean(const cpu_context& ctx, const host_tensor<T, N>& x, std::size_t axis,
                           host_tensor<U, N - 1>& out) {
  detail::reduce_axis_of<detail::mean_reducer, P>("precis::mean", ctx, x, axis, out, true);
}

/// The largest element (exact: no rounding is involved); NaN if any element is NaN.
/// Throws precis::error for an empty tensor.
template <Policy P, kernel_element T, std::size_t N>
detail::reduce_result_t<P, T> max(const cpu_context& /*ctx*/, const host_tensor<T, N>& x) {
  detail::check_not_empty("precis::max: x", x);
  return detail::reduce_all_of<detail::max_reducer, P>(x);
}

/// out = max of x along `axis`.
template <Policy P, kernel_element T, std::size_t N, kernel_element U>
requires(N >= 1) void max(const cpu_context& ctx, const host_tensor<T, N>& x, std::size_t axis,
                          host_tensor<U, N - 1>& out) {
  detail::reduce_axis_of<detail::max_reducer, P>("precis::max", ctx, x, axis, out, true);
}

/// sqrt(sum of squares): the squares summed in the accumulate type (a float16
/// accumulator overflows once the sum passes 65504, which is why the rule set asks for
/// float), one square root at the end. Not scaled against overflow: float's range
/// suffices for the norms of gradients this is meant for.
template <Policy P, kernel_element T, std::size_t N>
detail::reduce_result_t<P, T> l2_norm(const cpu_context& /*ctx*/, const host_tensor<T, N>& x) {
  return detail::reduce_all_of<detail::l2_reducer, P>(x);
}

/// out = L2 norm of x along `axis`.
template <Policy P, kernel_element T, std::size_t N, kernel_element U>
requires(N >= 1) void l2_norm(const cpu_context& ctx, const host_tensor<T, N>& x, std::size_t axis,
                              host_tensor<U, N - 1>& out) {
  detail::reduce_axis_of<detail::l2_reducer, P>("precis::l2_norm", ctx, x, axis, out, false);
}

}  // namespace precis
