/// @file
/// Max and average pooling, nearest and bilinear upsampling (NCHW), forward and backward, on host
/// tensors.
///
/// Semantics (op::pooling under the policy): inputs converted to the math type (float for
/// the narrow formats, double for double), window sums and gradient sums kept in the
/// accumulate type, each output rounded once. Backward passes add every output gradient
/// into a float (math-type) image of the input plane in a fixed order and round that image
/// once, so a plane's result does not depend on the threads, which take whole planes.
/// Max pooling's gradient goes to each window's first maximum (as in PyTorch; NaN propagates
/// and wins), which the backward pass from x finds again. Both passes find it separably: the first
/// maximum of each input row's part of a window (a vectorised pass along the rows), then the first
/// of those down the window's rows, which is the window's first maximum in row-major order. With
/// float math and rows of at least a vector of outputs, both steps run on vmath's vectors (the row
/// pass for strides 1 and 2): a vector of outputs at a time, held in registers while each lane folds
/// its window's taps, or its rows' maxima, in the scalar loop's order (the same bits). Elsewhere the
/// compiler vectorises the scalar loops, whose remainders and edges run one output at a time.
/// max_pool2d can also write each maximum's index in its plane (4 bytes per output, which nn's
/// max_pool2d keeps in training passes); the backward pass from those indices adds each dy where its
/// index names, in output order: the bits of the pass from x, without x or a second search.
///
/// Shapes are checked before anything is written; a mismatch throws precis::error naming
/// both shapes.
#pragma once

#include <precis/kernels/common.hpp>
#include <precis/kernels/context.hpp>
#include <precis/kernels/cpu/gemm_kernel.hpp>
#include <precis/kernels/cpu/support.hpp>
#include <precis/tensor/host_tensor.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace precis {

/// Window of a 2-D pooling, PyTorch's MaxPool2d/AvgPool2d arguments: output size
/// (in + 2 padding - kernel) / stride + 1 per axis. A zero stride means stride = kernel.
/// `count_include_pad` (average pooling only): divide by the full window (PyTorch's
/// default) rather than by the elements inside the input.
struct pool2d_params {
  std::array<std::size_t, 2> kernel{2, 2};   ///< window size {rows, columns}
  std::array<std::size_t, 2> stride{0, 0};   ///< step between windows (0: the kernel)
  std::array<std::size_t, 2> padding{0, 0};  ///< per side, at most half the kernel
  bool count_include_pad = true;             ///< average pooling: divide by the full window
};

namespace detail {

struct pool_geometry {
  std::size_t planes, h, w, ho, wo, kh, kw, sh, sw, ph, pw;
};

template <class X>
pool_geometry pool_geometry_of(std::string_view name, const X& x, const pool2d_params& p) {
  const std::string n(name);
  pool_geometry g{};
  g.planes = std::size_t(x.shape()[0]) * std::size_t(x.shape()[1]);
  g.h = std::size_t(x.shape()[2]);
  g.w = std::size_t(x.shape()[3]);
  g.kh = p.kernel[0];
  g.kw = p.kernel[1];
  g.sh = p.stride[0] == 0 ? g.kh : p.stride[0];
  g.sw = p.stride[1] == 0 ? g.kw : p.stride[1];
  g.ph = p.padding[0];
  g.pw = p.padding[1];
  check_argument(g.kh >= 1 && g.kw >= 1, n + ":", "kernel must be at least 1x1");
  check_argument(2 * g.ph <= g.kh && 2 * g.pw <= g.kw, n + ":",
                 "padding must be at most half the kernel (as in PyTorch)");
  if (g.h + 2 * g.ph < g.kh || g.w + 2 * g.pw < g.kw) {
    throw error(n + ": window " + shape_string(p.kernel) + " does not fit input " +
                shape_string(x.shape()) + " plus padding");
  }
  if (g.h == 0 || g.w == 0) {
    throw error(n + ": input " + shape_string(x.shape()) + " has no pixels");
  }
  g.ho = (g.h + 2 * g.ph - g.kh) / g.sh + 1;
  g.wo = (g.w + 2 * g.pw - g.kw) / g.sw + 1;
  return g;
}

template <class X>
std::array<std::size_t, 4> pooled_shape(const X& x, const pool_geometry& g) {
  return {std::size_t(x.shape()[0]), std::size_t(x.shape()[1]), g.ho, g.wo};
}

/// The window of output (oy, ox) clipped to the input: [y0, y1) x [x0, x1).
struct window {
  std::size_t y0, y1, x0, x1;
};
inline window window_at(const pool_geometry& g, std::size_t oy, std::size_t ox) {
  const std::size_t ty = oy * g.sh, tx = ox * g.sw;  // top-left in padded coordinates
  return {ty < g.ph ? 0 : ty - g.ph, std::min(g.h, ty + g.kh - g.ph),
          tx < g.pw ? 0 : tx - g.pw, std::min(g.w, tx + g.kw - g.pw)};
}

/// Runs f(plane) for each plane on ctx's threads.
template <class F>
void for_planes(const cpu_context& ctx, std::size_t planes, std::size_t plane_size, F&& f) {
  for_rows(ctx, planes, plane_size, [&](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i) f(i);
  });
}

/// A plane's values in math type M: the tensor's own memory when it holds M, else
/// converted into `buffer`.
template <class M, class T>
const M* plane_as(const T* src, std::size_t n, std::vector<M>& buffer) {
  if constexpr (std::is_same_v<T, M>) {
    return src;
  } else {
    buffer.resize(n);
    load_block(src, buffer.data(), n);
    return buffer.data();
  }
}

/// Whether v replaces b as a window's maximum so far: larger, or NaN where b is not. Taking
/// the first element of a window and folding the rest in row-major order with this gives
/// its first maximum (equal values, -0 and +0 among them, keep the first; the first NaN
/// wins). Bitwise operators keep it branch-free, so the loops below vectorise. On vmath
/// vectors, lane by lane: all ones in the lanes where v replaces b.
template <class M>
inline auto beats(M v, M b) {
  return (v > b) | ((v != v) & (b == b));  // NOLINT(misc-redundant-expression): NaN tests
}

/// p[0], p[2], ..., p[2 (lanes - 1)], reading p[0 .. 2 lanes - 2] only: the second load
/// starts one value early, so that the lanes it gives are its odd ones.
inline vmath::vf load_even(const float* p) {
  const vmath::vf a = vmath::load(p), b = vmath::load(p + vmath::lanes - 1);
#if defined(__AVX512F__)
  return __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14, 17, 19, 21, 23, 25, 27, 29, 31);
#elif defined(__AVX__)
  return __builtin_shufflevector(a, b, 0, 2, 4, 6, 9, 11, 13, 15);
#else
  return __builtin_shufflevector(a, b, 0, 2, 5, 7);
#endif
}

/// m ? a : b for lanes of indices (m all ones or all zeros per lane). Indices are unsigned
/// lanes, which wrap where signed ones would overflow: a plane may hold up to 2^32 - 1 values.
inline vmath::vu select_u(vmath::vi m, vmath::vu a, vmath::vu b) {
  const auto mu = (vmath::vu)m;
  return (mu & a) | (~mu & b);
}
inline vmath::vu splat_u(std::size_t v) { return vmath::vu{} + std::uint32_t(v); }
inline vmath::vu load_u(const std::uint32_t* p) {
  vmath::vu v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store_u(std::uint32_t* p, vmath::vu v) { std::memcpy(p, &v, sizeof v); }

/// The row pass of window_maxima on float vectors, for strides S = 1 and 2 and at least
/// `lanes` outputs inside the row ([lo, hi)): a vector of outputs at a time, the last one
/// moved back to end at hi (it computes some outputs again, the same). Each lane folds its
/// window's taps in order with beats(), as the scalar loop does: the same bits.
template <bool WithIndex, std::size_t S>
void row_maxima_simd(const float* row, std::size_t lo, std::size_t hi, std::size_t pw,
                     std::size_t kw, float* bv, std::uint32_t* bi) {
  static_assert(S == 1 || S == 2);
  constexpr std::size_t n = vmath::lanes, s = S;
  for (std::size_t ox = lo; ox < hi; ox += n) {
    const std::size_t b = std::min(ox, hi - n);
    const float* p = row + b * s - pw;  // tap 0 of lane 0
    const auto tap = [&](std::size_t k) {
      if constexpr (S == 1) {
        return vmath::load(p + k);
      } else {
        return load_even(p + k);
      }
    };
    vmath::vf best = tap(0);
    const vmath::vu first = splat_u(b * s - pw) + (vmath::vu)vmath::lane_index() * splat_u(s);
    vmath::vu at = first;
    for (std::size_t k = 1; k < kw; ++k) {
      const vmath::vf v = tap(k);
      const vmath::vi take = beats(v, best);
      best = vmath::select(take, v, best);
      if constexpr (WithIndex) at = select_u(take, first + splat_u(k), at);
    }
    vmath::store(bv + b, best);
    if constexpr (WithIndex) store_u(bi + b, at);
  }
}

/// The pass down the rows of window_maxima on float vectors (wo >= lanes), for one row of
/// outputs: a vector of outputs at a time, held in registers while it folds the first maxima
/// of the window's rows [y0, y1) (rv's values, at ri's columns) in order, then stored once;
/// the last vector is moved back to end at wo, as in the row pass.
template <bool WithIndex>
void fold_rows_simd(std::size_t wo, std::size_t w, std::size_t y0, std::size_t y1, const float* rv,
                    const std::uint32_t* ri, float* ov, std::uint32_t* oi) {
  constexpr std::size_t n = vmath::lanes;
  for (std::size_t ox = 0; ox < wo; ox += n) {
    const std::size_t b = std::min(ox, wo - n);
    vmath::vf best = vmath::load(rv + y0 * wo + b);
    vmath::vu at{};
    if constexpr (WithIndex) at = load_u(ri + y0 * wo + b) + splat_u(y0 * w);
    for (std::size_t y = y0 + 1; y < y1; ++y) {
      const vmath::vf v = vmath::load(rv + y * wo + b);
      const vmath::vi take = beats(v, best);
      best = vmath::select(take, v, best);
      if constexpr (WithIndex) at = select_u(take, load_u(ri + y * wo + b) + splat_u(y * w), at);
    }
    vmath::store(ov + b, best);
    if constexpr (WithIndex) store_u(oi + b, at);
  }
}

/// The first maximum of every window of a plane, found separably (see the file comment):
/// out_v[oy * wo + ox] its value and, where WithIndex, out_i[...] its index in the plane.
/// `rv` / `ri` are the caller's scratch (h * wo values, and indices).
template <bool WithIndex, class M>
void window_maxima(const pool_geometry& g, const M* xp, std::vector<M>& rv,
                   std::vector<std::uint32_t>& ri, M* out_v, std::uint32_t* out_i) {
  const std::size_t h = g.h, w = g.w, wo = g.wo, kw = g.kw, sw = g.sw, pw = g.pw;
  // Outputs whose column window lies inside the row: [lo, hi); the others are clipped.
  const std::size_t lo = std::min(wo, (pw + sw - 1) / sw);
  const std::size_t hi = std::max(lo, std::min(wo, w + pw >= kw ? (w + pw - kw) / sw + 1 : 0));
  rv.resize(h * wo);
  if constexpr (WithIndex) ri.resize(h * wo);
  for (std::size_t y = 0; y < h; ++y) {
    const M* row = xp + y * w;
    M* bv = rv.data() + y * wo;
    std::uint32_t* bi = WithIndex ? ri.data() + y * wo : nullptr;
    const auto clipped = [&](std::size_t ox) {
      const window c = window_at(g, 0, ox);
      M b = row[c.x0];
      std::size_t at = c.x0;
      for (std::size_t x = c.x0 + 1; x < c.x1; ++x) {
        if (beats(row[x], b)) {
          b = row[x];
          at = x;
        }
      }
      bv[ox] = b;
      if constexpr (WithIndex) bi[ox] = std::uint32_t(at);
    };
    for (std::size_t ox = 0; ox < lo; ++ox) clipped(ox);
    // Inside: tap k of output ox reads row[ox * sw - pw + k]; strides 1 and 2 are
    // constants to the compiler, so it vectorises their loads.
    const auto inside = [&](auto stride) {
      const std::size_t s = stride();
      for (std::size_t ox = lo; ox < hi; ++ox) {
        bv[ox] = row[ox * s - pw];
        if constexpr (WithIndex) bi[ox] = std::uint32_t(ox * s - pw);
      }
      for (std::size_t k = 1; k < kw; ++k) {
        for (std::size_t ox = lo; ox < hi; ++ox) {
          const M v = row[ox * s - pw + k];
          const bool take = beats(v, bv[ox]);
          bv[ox] = take ? v : bv[ox];
          if constexpr (WithIndex) bi[ox] = take ? std::uint32_t(ox * s - pw + k) : bi[ox];
        }
      }
    };
    if constexpr (std::is_same_v<M, float>) {
      if ((sw == 1 || sw == 2) && hi - lo >= vmath::lanes) {
        if (sw == 1) {
          row_maxima_simd<WithIndex, 1>(row, lo, hi, pw, kw, bv, bi);
        } else {
          row_maxima_simd<WithIndex, 2>(row, lo, hi, pw, kw, bv, bi);
        }
        for (std::size_t ox = hi; ox < wo; ++ox) clipped(ox);
        continue;
      }
    }
    if (sw == 1) {
      inside([] { return std::size_t(1); });
    } else if (sw == 2) {
      inside([] { return std::size_t(2); });
    } else {
      inside([&] { return sw; });
    }
    for (std::size_t ox = hi; ox < wo; ++ox) clipped(ox);
  }
  // Down each window's rows: the first of the rows' first maxima.
  for (std::size_t oy = 0; oy < g.ho; ++oy) {
    const window c = window_at(g, oy, 0);
    M* ov = out_v + oy * wo;
    std::uint32_t* oi = WithIndex ? out_i + oy * wo : nullptr;
    if constexpr (std::is_same_v<M, float>) {
      if (wo >= vmath::lanes) {
        fold_rows_simd<WithIndex>(wo, w, c.y0, c.y1, rv.data(), WithIndex ? ri.data() : nullptr, ov,
                                  oi);
        continue;
      }
    }
    const M* first = rv.data() + c.y0 * wo;
    for (std::size_t ox = 0; ox < wo; ++ox) ov[ox] = first[ox];
    if constexpr (WithIndex) {
      const std::uint32_t* fi = ri.data() + c.y0 * wo;
      for (std::size_t ox = 0; ox < wo; ++ox) oi[ox] = std::uint32_t(c.y0 * w) + fi[ox];
    }
    for (std::size_t y = c.y0 + 1; y < c.y1; ++y) {
      const M* r = rv.data() + y * wo;
      const std::uint32_t* rix = WithIndex ? ri.data() + y * wo : nullptr;
      for (std::size_t ox = 0; ox < wo; ++ox) {
        const bool take = beats(r[ox], ov[ox]);
        ov[ox] = take ? r[ox] : ov[ox];
        if constexpr (WithIndex) oi[ox] = take ? std::uint32_t(y * w) + rix[ox] : oi[ox];
      }
    }
  }
}

/// The static checks of every pooling kernel: TOut is the output's element type, TIn the
/// inputs'.
template <Policy P, class TOut, class... TIn>
constexpr void check_pool_types() {
  static_assert(kernel_element<TOut> && (kernel_element<TIn> && ...),
                "precis: pooling element types are float, double or precis number formats");
  static_assert((policy_input_v<op::pooling, P, TIn> && ...),
                "precis: pooling inputs must be the policy's storage or gradient type, or "
                "float; cast them with precis::cast first, or call with the policy they were "
                "stored under");
}

/// The checks of max_pool2d with indices (host and device tensors): y and the indices of
/// the pooled shape, planes whose indices fit 32 bits. Returns the geometry.
template <class X, class Y, class I>
pool_geometry check_max_pool_indices(const X& x, const Y& y, const I& indices,
                                     const pool2d_params& p) {
  const auto g = pool_geometry_of("precis::max_pool2d", x, p);
  check_shape("precis::max_pool2d: y", y, pooled_shape(x, g));
  check_shape("precis::max_pool2d: indices", indices, pooled_shape(x, g));
  check_argument(g.h * g.w <= std::size_t(UINT32_MAX), "precis::max_pool2d:",
                 "indices of planes of 2^32 pixels or more are not supported");
  return g;
}

/// The checks of max_pool2d_backward from indices (host and device tensors): dy and the
/// indices of the shape pooled from dx's. Returns the geometry.
template <class DX, class DY, class I>
pool_geometry check_max_pool_backward_indices(const DX& dx, const DY& dy, const I& indices,
                                              const pool2d_params& p) {
  const auto g = pool_geometry_of("precis::max_pool2d_backward", dx, p);
  check_shape("precis::max_pool2d_backward: dy", dy, pooled_shape(dx, g));
  check_shape("precis::max_pool2d_backward: indices", indices, pooled_shape(dx, g));
  return g;
}

/// One plane of max pooling's backward pass: each of the `out` gradients dy[o] added at the
/// plane element at[o] names, in output order, in accumulator<Acc>, each element's sum then
/// rounded once into dx (hw elements; those that receive nothing are +0). Float math with
/// float sums (every preset) adds in place from +0, straight into dx where it is float: the
/// accumulator's bits without its copy. `acc` and `sums` are the caller's scratch.
template <class M, class Acc, class TG, class TDX>
void scatter_max_gradients(const std::uint32_t* at, const TG* dy, std::size_t out, TDX* dx,
                           std::size_t hw, std::vector<accumulator<Acc>>& acc,
                           std::vector<typename accumulator<Acc>::value_type>& sums) {
  if constexpr (std::is_same_v<M, float> && std::is_same_v<Acc, float>) {
    float* s = nullptr;
    if constexpr (std::is_same_v<TDX, float>) {
      s = dx;
    } else {
      sums.resize(hw);
      s = sums.data();
    }
    std::fill(s, s + hw, 0.0f);
    for (std::size_t o = 0; o < out; ++o) s[at[o]] += load<float>(dy[o]);
    if constexpr (!std::is_same_v<TDX, float>) store_block(s, dx, hw);
  } else {
    acc.assign(hw, accumulator<Acc>{});
    for (std::size_t o = 0; o < out; ++o) accumulate(acc[at[o]], load<M>(dy[o]));
    sums.resize(hw);
    for (std::size_t i = 0; i < hw; ++i) sums[i] = acc[i].value();
    store_block(sums.data(), dx, hw);
  }
}

/// Bilinear upsampling's taps along one axis: output coordinate `dst` of `out` reads input
/// coordinates i0 and i1 of `in` with weights 1 - w1 and w1, from the source coordinate
/// PyTorch's area_pixel_compute_source_index gives. One function for the host's kernels and
/// the device's, over 64-bit or 32-bit indices (the same values where both hold them).
template <class M, class I>
PRECIS_HOST_DEVICE constexpr void bilinear_taps(I dst, I in, I out, bool align_corners, I& i0, I& i1, M& w1) {
  M s = M(0);
  if (align_corners) {
    if (out > 1) s = M(dst) * M(in - 1) / M(out - 1);
  } else {
    s = (M(dst) + M(0.5)) * M(in) / M(out) - M(0.5);
    if (s < M(0)) s = M(0);
  }
  i0 = I(s) < in - 1 ? I(s) : in - 1;
  i1 = i0 + 1 < in - 1 ? i0 + 1 : in - 1;
  w1 = s - M(i0);
}

/// The first output along an axis whose lower tap (bilinear_taps' i0) is at least `tap`, or
/// `outs` where none is, by bisection.
template <class M, class I>
PRECIS_HOST_DEVICE constexpr I bilinear_first_output(I tap, I in, I outs, bool align_corners) {
  I a = 0, b = outs;
  while (a < b) {
    const I mid = a + (b - a) / 2;
    I i0 = 0, i1 = 0;
    M w1 = M(0);
    bilinear_taps(mid, in, outs, align_corners, i0, i1, w1);
    if (i0 < tap) {
      a = mid + 1;
    } else {
      b = mid;
    }
  }
  return a;
}
/// The outputs along one axis that read input coordinate t through either tap: [lo, hi).
/// The lower tap never decreases along the outputs (each step of bilinear_taps' source is
/// monotonic), and the upper is the lower's successor or the last coordinate, so these are
/// the outputs whose lower tap is t - 1 or t: lo is the first whose lower tap is at least
/// t - 1, hi the first whose lower tap is at least t + 1, found by bisection. The device's
/// gradient kernel gathers over them; the host tests check them against every output's taps.
template <class M, class I>
PRECIS_HOST_DEVICE constexpr void bilinear_readers(I t, I in, I outs, bool align_corners, I& lo, I& hi) {
  lo = bilinear_first_output<M>(t == 0 ? I(0) : I(t - 1), in, outs, align_corners);
  hi = bilinear_first_output<M>(I(t + 1), in, outs, align_corners);
}

template <class X, class Y>
void check_resample(std::string_view name, const X& x, const Y& y) {
  check_shape(std::string(name) + ": y", y,
              std::array<std::size_t, 4>{std::size_t(x.shape()[0]), std::size_t(x.shape()[1]),
                                         std::size_t(y.shape()[2]), std::size_t(y.shape()[3])});
  if (x.size() == 0 || y.size() == 0) {
    throw error(std::string(name) + ": empty input " + shape_string(x.shape()) + " or output " +
                shape_string(y.shape()));
  }
}

}  // namespace detail

/// y = max over each window of x: x [N, C, H, W], y [N, C, Ho, Wo].
template <Policy P, class TX, class TY>
void max_pool2d(const cpu_context& ctx, const host_tensor<TX, 4>& x, host_tensor<TY, 4>& y,
                const pool2d_params& p = {}) {
  detail::check_pool_types<P, TY, TX>();
  using M = detail::math_t<op::pooling, P, TX>;
  const auto g = detail::pool_geometry_of("precis::max_pool2d", x, p);
  check_shape("precis::max_pool2d: y", y, detail::pooled_shape(x, g));
  detail::for_rows(ctx, g.planes, g.h * g.w, [&](std::size_t b, std::size_t e) {
    std::vector<M> plane, rows, out(g.ho * g.wo);
    std::vector<std::uint32_t> unused;
    for (std::size_t pl = b; pl < e; ++pl) {
      const M* xp = detail::plane_as<M>(x.data() + pl * g.h * g.w, g.h * g.w, plane);
      detail::window_maxima<false>(g, xp, rows, unused, out.data(), nullptr);
      detail::store_block(out.data(), y.data() + pl * g.ho * g.wo, g.ho * g.wo);
    }
  });
}

/// dx of y = max_pool2d(x): each dy goes to its window's first maximum in x.
template <Policy P, class TX, class TG, class TDX>
void max_pool2d_backward(const cpu_context& ctx, const host_tensor<TX, 4>& x,
                         const host_tensor<TG, 4>& dy, host_tensor<TDX, 4>& dx,
                         const pool2d_params& p = {}) {
  detail::check_pool_types<P, TDX, TX, TG>();
  using M = detail::math_t<op::pooling, P, TX, TG>;
  const auto g = detail::pool_geometry_of("precis::max_pool2d_backward", x, p);
  check_shape("precis::max_pool2d_backward: dy", dy, detail::pooled_shape(x, g));
  check_shape("precis::max_pool2d_backward: dx", dx, detail::shape_array<4>(x));
  using Acc = detail::accumulate_t<op::pooling, P>;
  detail::check_argument(g.h * g.w <= std::size_t(UINT32_MAX), "precis::max_pool2d_backward:",
                         "planes of 2^32 pixels or more are not supported");
  const std::size_t hw = g.h * g.w, out = g.ho * g.wo;
  detail::for_rows(ctx, g.planes, hw, [&](std::size_t b, std::size_t e) {
    std::vector<M> plane, rows, maxima(out);
    std::vector<std::uint32_t> row_at, at(out);
    std::vector<accumulator<Acc>> acc;
    std::vector<typename accumulator<Acc>::value_type> sums;
    for (std::size_t pl = b; pl < e; ++pl) {
      const M* xp = detail::plane_as<M>(x.data() + pl * hw, hw, plane);
      detail::window_maxima<true>(g, xp, rows, row_at, maxima.data(), at.data());
      detail::scatter_max_gradients<M, Acc>(at.data(), dy.data() + pl * out, out,
                                            dx.data() + pl * hw, hw, acc, sums);
    }
  });
}

/// y = max over each window of x, and `indices` (y's shape): the index in its plane
/// (row * W + column, as PyTorch's max_pool2d_with_indices gives) of each window's first
/// maximum, the one y holds. A training pass keeps them for the backward pass below, which
/// then needs neither x nor a second search of the windows.
template <Policy P, class TX, class TY>
void max_pool2d(const cpu_context& ctx, const host_tensor<TX, 4>& x, host_tensor<TY, 4>& y,
                host_tensor<std::uint32_t, 4>& indices, const pool2d_params& p = {}) {
  detail::check_pool_types<P, TY, TX>();
  using M = detail::math_t<op::pooling, P, TX>;
  const auto g = detail::check_max_pool_indices(x, y, indices, p);
  detail::for_rows(ctx, g.planes, g.h * g.w, [&](std::size_t b, std::size_t e) {
    std::vector<M> plane, rows, out(g.ho * g.wo);
    std::vector<std::uint32_t> row_at;
    for (std::size_t pl = b; pl < e; ++pl) {
      const M* xp = detail::plane_as<M>(x.data() + pl * g.h * g.w, g.h * g.w, plane);
      detail::window_maxima<true>(g, xp, rows, row_at, out.data(),
                                  indices.data() + pl * g.ho * g.wo);
      detail::store_block(out.data(), y.data() + pl * g.ho * g.wo, g.ho * g.wo);
    }
  });
}

/// dx of y = max_pool2d(x) from the indices the forward pass gave: each dy goes to the
/// element its index names, the gradients reaching one element summed in output order in
/// the accumulate type and rounded once: the bits of the backward pass from x. dx's shape is
/// x's. The indices are trusted to be max_pool2d's for these parameters: each is checked to
/// lie in its plane before anything is written, not in its window (one outside its window
/// takes its gradient there; the device overload gives it none).
template <Policy P, class TG, class TDX>
void max_pool2d_backward(const cpu_context& ctx, const host_tensor<std::uint32_t, 4>& indices,
                         const host_tensor<TG, 4>& dy, host_tensor<TDX, 4>& dx,
                         const pool2d_params& p = {}) {
  detail::check_pool_types<P, TDX, TG>();
  using M = detail::math_t<op::pooling, P, TG>;
  using Acc = detail::accumulate_t<op::pooling, P>;
  const auto g = detail::check_max_pool_backward_indices(dx, dy, indices, p);
  const std::size_t hw = g.h * g.w, out = g.ho * g.wo;
  std::atomic<bool> bad{false};
  detail::for_rows(ctx, g.planes, out, [&](std::size_t b, std::size_t e) {
    std::uint32_t top = 0;
    for (std::size_t i = b * out; i < e * out; ++i) top = std::max(top, indices.data()[i]);
    if (std::size_t(top) >= hw) bad = true;
  });
  if (bad) {
    throw error("precis::max_pool2d_backward: an index lies outside its plane of " +
                std::to_string(g.h) + " x " + std::to_string(g.w) +
                " elements (indices come from max_pool2d on an input of dx's shape)");
  }
  detail::for_rows(ctx, g.planes, hw, [&](std::size_t b, std::size_t e) {
    std::vector<accumulator<Acc>> acc;
    std::vector<typename accumulator<Acc>::value_type> sums;
    for (std::size_t pl = b; pl < e; ++pl) {
      detail::scatter_max_gradients<M, Acc>(indices.data() + pl * out, dy.data() + pl * out, out,
                                            dx.data() + pl * hw, hw, acc, sums);
    }
  });
}

/// y = mean over each window of x (divided by the full window when count_include_pad).
template <Policy P, class TX, class TY>
void avg_pool2d(const cpu_context& ctx, const host_tensor<TX, 4>& x, host_tensor<TY, 4>& y,
                const pool2d_params& p = {}) {
  detail::check_pool_types<P, TY, TX>();
  using M = detail::math_t<op::pooling, P, TX>;
  const auto g = detail::pool_geometry_of("precis::avg_pool2d", x, p);
  check_shape("precis::avg_pool2d: y", y, detail::pooled_shape(x, g));
  detail::for_planes(ctx, g.planes, g.h * g.w, [&](std::size_t pl) {
    const TX* xp = x.data() + pl * g.h * g.w;
    TY* yp = y.data() + pl * g.ho * g.wo;
    for (std::size_t oy = 0; oy < g.ho; ++oy) {
      for (std::size_t ox = 0; ox < g.wo; ++ox) {
        const auto w = detail::window_at(g, oy, ox);
        accumulator<detail::accumulate_t<op::pooling, P>> acc;
        for (std::size_t yy = w.y0; yy < w.y1; ++yy) {
          for (std::size_t xx = w.x0; xx < w.x1; ++xx) {
            detail::accumulate(acc, detail::load<M>(xp[yy * g.w + xx]));
          }
        }
        const std::size_t count = p.count_include_pad ? g.kh * g.kw : (w.y1 - w.y0) * (w.x1 - w.x0);
        yp[oy * g.wo + ox] = round_to<TY>(M(acc.value()) / M(count));
      }
    }
  });
}

/// dx of y = avg_pool2d(x): each dy spread evenly over its window.
template <Policy P, class TG, class TDX>
void avg_pool2d_backward(const cpu_context& ctx, const host_tensor<TG, 4>& dy,
                         host_tensor<TDX, 4>& dx, const pool2d_params& p = {}) {
  detail::check_pool_types<P, TDX, TG>();
  using M = detail::math_t<op::pooling, P, TG>;
  const auto g = detail::pool_geometry_of("precis::avg_pool2d_backward", dx, p);
  check_shape("precis::avg_pool2d_backward: dy", dy, detail::pooled_shape(dx, g));
  detail::for_planes(ctx, g.planes, g.h * g.w, [&](std::size_t pl) {
    const TG* dyp = dy.data() + pl * g.ho * g.wo;
    std::vector<accumulator<detail::accumulate_t<op::pooling, P>>> acc(g.h * g.w);
    for (std::size_t oy = 0; oy < g.ho; ++oy) {
      for (std::size_t ox = 0; ox < g.wo; ++ox) {
        const auto w = detail::window_at(g, oy, ox);
        const std::size_t count = p.count_include_pad ? g.kh * g.kw : (w.y1 - w.y0) * (w.x1 - w.x0);
        const M share = detail::load<M>(dyp[oy * g.wo + ox]) / M(count);
        for (std::size_t yy = w.y0; yy < w.y1; ++yy) {
          for (std::size_t xx = w.x0; xx < w.x1; ++xx) detail::accumulate(acc[yy * g.w + xx], share);
        }
      }
    }
    TDX* dxp = dx.data() + pl * g.h * g.w;
    for (std::size_t i = 0; i < g.h * g.w; ++i) dxp[i] = round_to<TDX>(acc[i].value());
  });
}

/// Nearest-neighbour upsampling (PyTorch's `nearest`): y [N, C, Ho, Wo] from x [N, C, H, W],
/// y[oy, ox] = x[floor(oy H / Ho), floor(ox W / Wo)]. Sizes come from y's shape.
template <Policy P, class TX, class TY>
void upsample_nearest2d(const cpu_context& ctx, const host_tensor<TX, 4>& x, host_tensor<TY, 4>& y) {
  detail::check_pool_types<P, TY, TX>();
  using M = detail::math_t<op::pooling, P, TX>;
  detail::check_resample("precis::upsample_nearest2d", x, y);
  const std::size_t h = x.shape()[2], w = x.shape()[3], ho = y.shape()[2], wo = y.shape()[3];
  detail::for_rows(ctx, x.shape()[0] * x.shape()[1], ho * wo, [&](std::size_t b, std::size_t e) {
    std::vector<std::size_t> source(wo);  // the input column of each output column
    for (std::size_t ox = 0; ox < wo; ++ox) source[ox] = ox * w / wo;
    std::vector<M> row(wo);
    for (std::size_t pl = b; pl < e; ++pl) {
      const TX* xp = x.data() + pl * h * w;
      TY* yp = y.data() + pl * ho * wo;
      for (std::size_t oy = 0; oy < ho; ++oy) {
        const std::size_t iy = oy * h / ho;
        TY* out = yp + oy * wo;
        if (oy > 0 && iy == (oy - 1) * h / ho) {  // the row above's values again
          std::copy_n(out - wo, wo, out);
          continue;
        }
        for (std::size_t ox = 0; ox < wo; ++ox) row[ox] = detail::load<M>(xp[iy * w + source[ox]]);
        detail::store_block(row.data(), out, wo);
      }
    }
  });
}

/// dx of y = upsample_nearest2d(x): the sum of dy over the outputs each input fed.
template <Policy P, class TG, class TDX>
void upsample_nearest2d_backward(const cpu_context& ctx, const host_tensor<TG, 4>& dy,
                                 host_tensor<TDX, 4>& dx) {
  detail::check_pool_types<P, TDX, TG>();
  using M = detail::math_t<op::pooling, P, TG>;
  detail::check_resample("precis::upsample_nearest2d_backward", dx, dy);
  const std::size_t h = dx.shape()[2], w = dx.shape()[3], ho = dy.shape()[2], wo = dy.shape()[3];
  using A = accumulator<detail::accumulate_t<op::pooling, P>>;
  detail::for_rows(ctx, dx.shape()[0] * dx.shape()[1], ho * wo, [&](std::size_t b, std::size_t e) {
    std::vector<std::size_t> source(wo);  // the input column of each output column
    for (std::size_t ox = 0; ox < wo; ++ox) source[ox] = ox * w / wo;
    std::vector<A> acc(w);
    std::vector<typename A::value_type> sums(w);
    for (std::size_t pl = b; pl < e; ++pl) {
      const TG* dyp = dy.data() + pl * ho * wo;
      TDX* dxp = dx.data() + pl * h * w;
      for (std::size_t iy = 0; iy < h; ++iy) {
        // The output rows oy with oy * h / ho == iy: oy * h >= iy * ho, below the next's.
        const std::size_t oy0 = std::min(ho, (iy * ho + h - 1) / h);
        const std::size_t oy1 = std::min(ho, ((iy + 1) * ho + h - 1) / h);
        std::fill(acc.begin(), acc.end(), A{});
        for (std::size_t oy = oy0; oy < oy1; ++oy) {  // each sum in (oy, ox) order
          for (std::size_t ox = 0; ox < wo; ++ox) {
            detail::accumulate(acc[source[ox]], detail::load<M>(dyp[oy * wo + ox]));
          }
        }
        for (std::size_t i = 0; i < w; ++i) sums[i] = acc[i].value();
        detail::store_block(sums.data(), dxp + iy * w, w);
      }
    }
  });
}

/// Bilinear upsampling (PyTorch's `bilinear`, align_corners as given): y's shape gives the
/// output size; each output is the weighted sum of its four input neighbours, in math type.
template <Policy P, class TX, class TY>
void upsample_bilinear2d(const cpu_context& ctx, const host_tensor<TX, 4>& x, host_tensor<TY, 4>& y,
                         bool align_corners = false) {
  detail::check_pool_types<P, TY, TX>();
  using M = detail::math_t<op::pooling, P, TX>;
  detail::check_resample("precis::upsample_bilinear2d", x, y);
  const std::size_t h = x.shape()[2], w = x.shape()[3], ho = y.shape()[2], wo = y.shape()[3];
  detail::for_planes(ctx, x.shape()[0] * x.shape()[1], ho * wo, [&](std::size_t pl) {
    const TX* xp = x.data() + pl * h * w;
    TY* yp = y.data() + pl * ho * wo;
    for (std::size_t oy = 0; oy < ho; ++oy) {
      std::size_t y0, y1;
      M fy;
      detail::bilinear_taps(oy, h, ho, align_corners, y0, y1, fy);
      for (std::size_t ox = 0; ox < wo; ++ox) {
        std::size_t x0, x1;
        M fx;
        detail::bilinear_taps(ox, w, wo, align_corners, x0, x1, fx);
        const auto at = [&](std::size_t yy, std::size_t xx) { return detail::load<M>(xp[yy * w + xx]); };
        const M top = detail::add((M(1) - fx) * at(y0, x0), fx * at(y0, x1));
        const M bottom = detail::add((M(1) - fx) * at(y1, x0), fx * at(y1, x1));
        const M v = detail::add((M(1) - fy) * top, fy * bottom);
        yp[oy * wo + ox] = round_to<TY>(v);
      }
    }
  });
}

/// dx of y = upsample_bilinear2d(x): each dy spread to its four neighbours with the
/// forward weights, summed per input element in the accumulate type.
template <Policy P, class TG, class TDX>
void upsample_bilinear2d_backward(const cpu_context& ctx, const host_tensor<TG, 4>& dy,
                                  host_tensor<TDX, 4>& dx, bool align_corners = false) {
  detail::check_pool_types<P, TDX, TG>();
  using M = detail::math_t<op::pooling, P, TG>;
  detail::check_resample("precis::upsample_bilinear2d_backward", dx, dy);
  const std::size_t h = dx.shape()[2], w = dx.shape()[3], ho = dy.shape()[2], wo = dy.shape()[3];
  detail::for_planes(ctx, dx.shape()[0] * dx.shape()[1], ho * wo, [&](std::size_t pl) {
    const TG* dyp = dy.data() + pl * ho * wo;
    std::vector<accumulator<detail::accumulate_t<op::pooling, P>>> acc(h * w);
    for (std::size_t oy = 0; oy < ho; ++oy) {
      std::size_t y0, y1;
      M fy;
      detail::bilinear_taps(oy, h, ho, align_corners, y0, y1, fy);
      for (std::size_t ox = 0; ox < wo; ++ox) {
        std::size_t x0, x1;
        M fx;
        detail::bilinear_taps(ox, w, wo, align_corners, x0, x1, fx);
        const M g = detail::load<M>(dyp[oy * wo + ox]);
        detail::accumulate(acc[y0 * w + x0], (M(1) - fy) * (M(1) - fx) * g);
        detail::accumulate(acc[y0 * w + x1], (M(1) - fy) * fx * g);
        detail::accumulate(acc[y1 * w + x0], fy * (M(1) - fx) * g);
        detail::accumulate(acc[y1 * w + x1], fy * fx * g);
      }
    }
    TDX* dxp = dx.data() + pl * h * w;
    for (std::size_t i = 0; i < h * w; ++i) dxp[i] = round_to<TDX>(acc[i].value());
  });
}

}  // namespace precis
