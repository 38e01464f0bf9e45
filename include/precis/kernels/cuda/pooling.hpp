/// @file
/// Max and average pooling, nearest and bilinear upsampling on device tensors, forward and
/// backward, with the calls of kernels/pooling.hpp (a cuda_context in place of the cpu_context)
/// and a trailing image_layout: NCHW as on the host, or channels-last (NHWC), read in place
/// with the same bits.
///
/// Forward passes give each output element to one thread, which computes it as the host
/// does (the window read in row order, the first maximum winning, NaN winning; sums in the
/// accumulate type; one rounding). Backward passes gather rather than scatter: each input
/// element's thread visits the outputs that read it, in the host's raster order, and adds
/// their shares in the accumulate type -- no atomics, so the result does not depend on
/// scheduling and the additions come in the host's order. Shapes and windows are checked on
/// the host, with the host's messages, before anything is launched. Pooling and nearest
/// upsampling place elements by multiplications in 32 bits (kernels/common.hpp's pool_index,
/// nearest_index) where both tensors have fewer than 2^32 elements, else by 64-bit division:
/// the same elements and bits either way. Compiled by nvcc only.
#pragma once

#include <precis/config.hpp>
#include <precis/kernels/cuda/common.hpp>
#include <precis/kernels/cuda/elementwise.hpp>
#include <precis/kernels/pooling.hpp>
#include <precis/numeric/detail/unfused.hpp>

#if defined(__CUDACC__)

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace precis {

namespace detail::cuda {

/// Where a kernel's planes (one image's channel) lie: NCHW, each plane contiguous (pixel
/// stride 1, plane p at p * pixels); channels-last ([N, H, W, C]), plane n * C + c starts at
/// n * pixels * C + c with pixel stride C. Threads take elements in the tensor's own order
/// (channels fastest when channels-last, so that neighbouring threads read neighbouring
/// channels), and each element's value is computed exactly as in NCHW: the same bits.
struct plane_map {
  std::size_t channels = 1;
  bool last = false;
  /// Element i of a tensor of planes of `pixels` each, in this layout: its plane and its
  /// pixel within the plane.
  __device__ void split(std::size_t i, std::size_t pixels, std::size_t& plane, std::size_t& pixel) const {
    if (!last) {
      plane = i / pixels;
      pixel = i % pixels;
    } else {
      const std::size_t c = i % channels, rest = i / channels;
      plane = rest / pixels * channels + c;
      pixel = rest % pixels;
    }
  }
  /// The offset of plane `plane`'s first pixel in a tensor of planes of `pixels` each.
  __device__ std::size_t base(std::size_t plane, std::size_t pixels) const {
    return last ? plane / channels * pixels * channels + plane % channels : plane * pixels;
  }
  /// The distance between neighbouring pixels of a plane.
  __device__ std::size_t stride() const { return last ? channels : 1; }
};

/// The window of output (oy, ox) clipped to the input (the host's window_at).
__device__ inline window device_window(const pool_geometry& g, std::size_t oy, std::size_t ox) {
  const std::size_t ty = oy * g.sh, tx = ox * g.sw;
  return {ty < g.ph ? 0 : ty - g.ph, ty + g.kh - g.ph < g.h ? ty + g.kh - g.ph : g.h,
          tx < g.pw ? 0 : tx - g.pw, tx + g.kw - g.pw < g.w ? tx + g.kw - g.pw : g.w};
}

/// Index in the plane of the window's first maximum, NaN winning (the host's argmax_in).
template <class M, class T>
__device__ std::size_t device_argmax(const T* x, std::size_t width, const window& w, std::size_t stride) {
  std::size_t best = w.y0 * width + w.x0;
  M bv = device_load<M>(x[best * stride]);
  for (std::size_t y = w.y0; y < w.y1; ++y) {
    for (std::size_t xx = w.x0; xx < w.x1; ++xx) {
      const M v = device_load<M>(x[(y * width + xx) * stride]);
      if (::isnan(bv)) return best;
      if (v > bv || ::isnan(v)) {
        bv = v;
        best = y * width + xx;
      }
    }
  }
  return best;
}

/// The outputs along one axis whose windows hold input index i: [lo, hi).
__device__ inline void outputs_reading(std::size_t i, std::size_t pad, std::size_t k, std::size_t s,
                                       std::size_t outs, std::size_t& lo, std::size_t& hi) {
  // o * s - pad <= i < o * s - pad + k
  const std::size_t top = i + pad;  // o * s <= top and o * s > top - k
  lo = top + 1 > k ? (top + 1 - k + s - 1) / s : 0;
  hi = top / s + 1;
  if (hi > outs) hi = outs;
}

/// The 64-bit counterpart of plane_index (kernels/common.hpp) over a geometry with planes of
/// h x w in and ho x wo out, by divisions: for tensors the 32-bit indexers do not fit, with
/// the same interface and values.
template <class Geometry>
struct wide_planes {
  using index_type = std::size_t;
  Geometry g;
  plane_map pm;
  /// Output element i: its plane's first input element, its row and column.
  __device__ void output(std::size_t i, std::size_t& x_first, std::size_t& oy, std::size_t& ox) const {
    std::size_t pl = 0, o = 0;
    pm.split(i, g.ho * g.wo, pl, o);
    x_first = pm.base(pl, g.h * g.w);
    oy = o / g.wo;
    ox = o % g.wo;
  }
  /// Input element i: its plane's first input and output elements, its pixel, row and
  /// column.
  __device__ void locate_input(std::size_t i, std::size_t& x_first, std::size_t& o_first, std::size_t& at,
                               std::size_t& iy, std::size_t& ix) const {
    std::size_t pl = 0;
    pm.split(i, g.h * g.w, pl, at);
    x_first = pm.base(pl, g.h * g.w);
    o_first = pm.base(pl, g.ho * g.wo);
    iy = at / g.w;
    ix = at % g.w;
  }
  /// The offset of output pixel (oy, ox) from its plane's first element.
  __device__ std::size_t out_at(std::size_t oy, std::size_t ox) const { return (oy * g.wo + ox) * pm.stride(); }
  __device__ std::size_t stride() const { return pm.stride(); }
};

/// Pooling's index arithmetic in 64 bits (divisions), for tensors that pool_index (kernels/
/// common.hpp: multiplications, 32 bits) does not fit; the same interface and values.
struct wide_pool_index : wide_planes<pool_geometry> {
  /// Input element i: its plane's first input and output elements, its pixel, and the
  /// outputs [oy0, oy1) x [ox0, ox1) whose windows hold it.
  __device__ void input(std::size_t i, std::size_t& x_first, std::size_t& o_first, std::size_t& at,
                        std::size_t& oy0, std::size_t& oy1, std::size_t& ox0, std::size_t& ox1) const {
    std::size_t iy = 0, ix = 0;
    locate_input(i, x_first, o_first, at, iy, ix);
    outputs_reading(iy, g.ph, g.kh, g.sh, g.ho, oy0, oy1);
    outputs_reading(ix, g.pw, g.kw, g.sw, g.wo, ox0, ox1);
  }
};

/// Runs launch(ix) with a pool_index where pooling of geometry g over planes laid out as pm
/// fits one, else with a wide_pool_index: the same elements, order and bits either way.
template <class Launch>
void with_pool_index(const pool_geometry& g, const plane_map& pm, Launch&& launch) {
  if (pool_index::fits(g.planes, g.h, g.w, g.ho, g.wo, pm.channels, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw)) {
    launch(pool_index::make(g.h, g.w, g.ho, g.wo, pm.channels, pm.last, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw));
  } else {
    launch(wide_pool_index{{g, pm}});
  }
}

template <class M, class X, class Y, class Ix>
__global__ void max_pool_kernel(const X* x, Y* y, pool_geometry g, Ix ix) {
  using I = typename Ix::index_type;
  const std::size_t n = g.planes * g.ho * g.wo;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    I first = 0, oy = 0, ox = 0;
    ix.output(I(i), first, oy, ox);
    const X* xp = x + first;
    const std::size_t best = device_argmax<M>(xp, g.w, device_window(g, oy, ox), ix.stride());
    y[i] = round_to<Y>(device_load<M>(xp[best * ix.stride()]));
  }
}

/// The sum in Acc of the shares of outputs [oy0, oy1) x [ox0, ox1) (those whose windows
/// hold an element), in raster order (the host's order of additions): share(oy, ox, v) sets
/// v to output (oy, ox)'s share and returns true, or returns false where that output gives
/// none.
template <class M, class Acc, class I, class Share>
__device__ typename accumulator<Acc>::value_type gather_windows(I oy0, I oy1, I ox0, I ox1, Share share) {
  accumulator<Acc> acc;
  M v;
  for (I oy = oy0; oy < oy1; ++oy) {
    for (I ox = ox0; ox < ox1; ++ox) {
      if (share(std::size_t(oy), std::size_t(ox), v)) acc.add(static_cast<typename accumulator<Acc>::value_type>(v));
    }
  }
  return acc.value();
}

template <class M, class Acc, class X, class G, class DX, class Ix>
__global__ void max_pool_backward_kernel(const X* x, const G* dy, DX* dx, pool_geometry g, Ix ix) {
  using I = typename Ix::index_type;
  const std::size_t n = g.planes * g.h * g.w;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    I x_first = 0, o_first = 0, at = 0, oy0 = 0, oy1 = 0, ox0 = 0, ox1 = 0;
    ix.input(I(i), x_first, o_first, at, oy0, oy1, ox0, ox1);
    const X* xp = x + x_first;
    const G* dyp = dy + o_first;
    dx[i] = round_to<DX>(gather_windows<M, Acc>(oy0, oy1, ox0, ox1, [&](std::size_t oy, std::size_t ox, M& v) {
      if (device_argmax<M>(xp, g.w, device_window(g, oy, ox), ix.stride()) != at) return false;
      v = device_load<M>(dyp[(oy * g.wo + ox) * ix.stride()]);
      return true;
    }));
  }
}

/// Max pooling that also writes each window's first maximum's index in its plane (pixel
/// index, the same in either layout) at the output's position.
template <class M, class X, class Y, class Ix>
__global__ void max_pool_indices_kernel(const X* x, Y* y, std::uint32_t* at, pool_geometry g, Ix ix) {
  using I = typename Ix::index_type;
  const std::size_t n = g.planes * g.ho * g.wo;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    I first = 0, oy = 0, ox = 0;
    ix.output(I(i), first, oy, ox);
    const X* xp = x + first;
    const std::size_t best = device_argmax<M>(xp, g.w, device_window(g, oy, ox), ix.stride());
    y[i] = round_to<Y>(device_load<M>(xp[best * ix.stride()]));
    at[i] = std::uint32_t(best);
  }
}

template <class M, class Acc, class G, class DX, class Ix>
__global__ void max_pool_backward_indices_kernel(const std::uint32_t* at, const G* dy, DX* dx, pool_geometry g,
                                                 Ix ix) {
  using I = typename Ix::index_type;
  const std::size_t n = g.planes * g.h * g.w;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    I x_first = 0, o_first = 0, e = 0, oy0 = 0, oy1 = 0, ox0 = 0, ox1 = 0;
    ix.input(I(i), x_first, o_first, e, oy0, oy1, ox0, ox1);
    const std::uint32_t* atp = at + o_first;
    const G* dyp = dy + o_first;
    dx[i] = round_to<DX>(gather_windows<M, Acc>(oy0, oy1, ox0, ox1, [&](std::size_t oy, std::size_t ox, M& v) {
      const std::size_t o = (oy * g.wo + ox) * ix.stride();
      if (atp[o] != e) return false;
      v = device_load<M>(dyp[o]);
      return true;
    }));
  }
}

__device__ inline std::size_t window_count(const pool_geometry& g, const window& w,
                                           bool include_pad) {
  return include_pad ? g.kh * g.kw : (w.y1 - w.y0) * (w.x1 - w.x0);
}

template <class M, class Acc, class X, class Y, class Ix>
__global__ void avg_pool_kernel(const X* x, Y* y, pool_geometry g, bool include_pad, Ix ix) {
  using I = typename Ix::index_type;
  const std::size_t n = g.planes * g.ho * g.wo;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    I first = 0, oy = 0, ox = 0;
    ix.output(I(i), first, oy, ox);
    const X* xp = x + first;
    const window w = device_window(g, oy, ox);
    accumulator<Acc> acc;
    for (std::size_t yy = w.y0; yy < w.y1; ++yy) {
      for (std::size_t xx = w.x0; xx < w.x1; ++xx) {
        acc.add(static_cast<typename accumulator<Acc>::value_type>(
            device_load<M>(xp[(yy * g.w + xx) * ix.stride()])));
      }
    }
    y[i] = round_to<Y>(M(acc.value()) / M(window_count(g, w, include_pad)));
  }
}

template <class M, class Acc, class G, class DX, class Ix>
__global__ void avg_pool_backward_kernel(const G* dy, DX* dx, pool_geometry g, bool include_pad, Ix ix) {
  using I = typename Ix::index_type;
  const std::size_t n = g.planes * g.h * g.w;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    I x_first = 0, o_first = 0, at = 0, oy0 = 0, oy1 = 0, ox0 = 0, ox1 = 0;
    ix.input(I(i), x_first, o_first, at, oy0, oy1, ox0, ox1);
    const G* dyp = dy + o_first;
    dx[i] = round_to<DX>(gather_windows<M, Acc>(oy0, oy1, ox0, ox1, [&](std::size_t oy, std::size_t ox, M& v) {
      const std::size_t count = window_count(g, device_window(g, oy, ox), include_pad);
      v = device_load<M>(dyp[(oy * g.wo + ox) * ix.stride()]) / M(count);
      return true;
    }));
  }
}

/// Sizes of a resampling: planes, input h x w, output ho x wo.
struct resample_geometry {
  std::size_t planes, h, w, ho, wo;
};

template <class XT, class YT>
resample_geometry resample_geometry_of(const XT& small, const YT& large) {
  return {small.shape()[0] * small.shape()[1], small.shape()[2], small.shape()[3], large.shape()[2],
          large.shape()[3]};
}

/// A 4-d tensor's shape read as NCHW: the host's checks and geometry take it, the kernels
/// read the layout through plane_map. For a channels-last tensor [N, H, W, C] it is
/// [N, C, H, W], and the checks' messages say "channels-last, as [N, C, H, W]" in their name.
struct nchw_view {
  std::array<std::size_t, 4> dims;
  std::size_t elements;
  const std::array<std::size_t, 4>& shape() const { return dims; }
  std::size_t size() const { return elements; }
  static constexpr std::size_t dimension() { return 4; }
};
template <class T>
nchw_view as_nchw(const device_tensor<T, 4>& t, image_layout layout) {
  const auto& s = t.shape();
  if (layout == image_layout::nhwc) return {{s[0], s[3], s[1], s[2]}, t.size()};
  return {{s[0], s[1], s[2], s[3]}, t.size()};
}
/// The plane map of a tensor read as `v` in `layout`.
inline plane_map plane_map_of(const nchw_view& v, image_layout layout) {
  return {v.dims[1], layout == image_layout::nhwc};
}
/// `name`, with " (channels-last, as [N, C, H, W])" in NHWC: the name the checks' messages
/// carry.
inline std::string layout_name(std::string_view name, image_layout layout) {
  return std::string(name) + (layout == image_layout::nhwc ? " (channels-last, as [N, C, H, W])" : "");
}

/// Nearest upsampling's index arithmetic in 64 bits (divisions), for tensors nearest_index
/// (kernels/common.hpp) does not fit; the same interface and values.
struct wide_nearest_index : wide_planes<resample_geometry> {
  /// The offset in the input of output element i's source (row oy h / ho, column ox w / wo).
  __device__ std::size_t source(std::size_t i) const {
    std::size_t x_first = 0, oy = 0, ox = 0;
    output(i, x_first, oy, ox);
    return x_first + (oy * g.h / g.ho * g.w + ox * g.w / g.wo) * pm.stride();
  }
  /// For input element i: its plane's first output element, and the output rows [oy0, oy1)
  /// and columns [ox0, ox1) whose source it is.
  __device__ void outputs(std::size_t i, std::size_t& base, std::size_t& oy0, std::size_t& oy1, std::size_t& ox0,
                          std::size_t& ox1) const {
    std::size_t x_first = 0, at = 0, iy = 0, ix = 0;
    locate_input(i, x_first, base, at, iy, ix);
    // The outputs o with o * in / outs == i: [ceil(i outs / in), ceil((i + 1) outs / in)).
    oy0 = (iy * g.ho + g.h - 1) / g.h;
    oy1 = ((iy + 1) * g.ho + g.h - 1) / g.h;
    ox0 = (ix * g.wo + g.w - 1) / g.w;
    ox1 = ((ix + 1) * g.wo + g.w - 1) / g.w;
    if (oy1 > g.ho) oy1 = g.ho;
    if (ox1 > g.wo) ox1 = g.wo;
  }
};

/// Bilinear upsampling's index arithmetic in 64 bits (divisions), for tensors resample_index
/// (kernels/common.hpp) does not fit; the same interface and values.
struct wide_resample_index : wide_planes<resample_geometry> {};

/// Runs launch(ix) with Fast (nearest_index or resample_index) over the planes of `small`
/// (the input) and `large` (the output) where they fit 32-bit indices, else with Wide: the
/// same elements, order and bits either way.
template <class Fast, class Wide, class Launch>
void with_resample_index(const nchw_view& small, const nchw_view& large, image_layout layout, Launch&& launch) {
  const auto& s = small.shape();
  const auto& l = large.shape();
  if (Fast::fits(s[0] * s[1], s[2], s[3], l[2], l[3], s[1])) {
    launch(Fast::make(s[2], s[3], l[2], l[3], s[1], layout == image_layout::nhwc));
  } else {
    launch(Wide{{resample_geometry_of(small, large), plane_map_of(small, layout)}});
  }
}

template <class M, class X, class Y, class Ix>
__global__ void nearest_kernel(const X* x, Y* y, Ix ix, std::size_t n) {
  using I = typename Ix::index_type;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    y[i] = round_to<Y>(device_load<M>(x[ix.source(I(i))]));
  }
}

template <class M, class Acc, class G, class DX, class Ix>
__global__ void nearest_backward_kernel(const G* dy, DX* dx, Ix ix, std::size_t n) {
  using I = typename Ix::index_type;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    I base = 0, oy0 = 0, oy1 = 0, ox0 = 0, ox1 = 0;
    ix.outputs(I(i), base, oy0, oy1, ox0, ox1);
    accumulator<Acc> acc;
    for (I oy = oy0; oy < oy1; ++oy) {
      for (I ox = ox0; ox < ox1; ++ox) {
        acc.add(static_cast<typename accumulator<Acc>::value_type>(device_load<M>(dy[base + ix.out_at(oy, ox)])));
      }
    }
    dx[i] = round_to<DX>(acc.value());
  }
}

template <class M, class X, class Y, class Ix>
__global__ void bilinear_kernel(const X* x, Y* y, resample_geometry g, bool align_corners, Ix ix) {
  using I = typename Ix::index_type;
  const std::size_t n = g.planes * g.ho * g.wo;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    I first = 0, oy = 0, ox = 0;
    ix.output(I(i), first, oy, ox);
    const X* xp = x + first;
    const I h = I(g.h), w = I(g.w);
    I y0 = 0, y1 = 0, x0 = 0, x1 = 0;
    M fy, fx;
    ::precis::detail::bilinear_taps(oy, h, I(g.ho), align_corners, y0, y1, fy);
    ::precis::detail::bilinear_taps(ox, w, I(g.wo), align_corners, x0, x1, fx);
    const auto at = [&](I yy, I xx) { return device_load<M>(xp[(yy * w + xx) * ix.stride()]); };
    // The host's sums (precis::detail::add): no product fused into them, the host's bits.
    const M top = ::precis::detail::add((M(1) - fx) * at(y0, x0), fx * at(y0, x1));
    const M bottom = ::precis::detail::add((M(1) - fx) * at(y1, x0), fx * at(y1, x1));
    y[i] = round_to<Y>(::precis::detail::add((M(1) - fy) * top, fy * bottom));
  }
}

template <class M, class Acc, class G, class DX, class Ix>
__global__ void bilinear_backward_kernel(const G* dy, DX* dx, resample_geometry g, bool align, Ix ix) {
  using V = typename accumulator<Acc>::value_type;
  using I = typename Ix::index_type;
  const std::size_t n = g.planes * g.h * g.w;
  const I h = I(g.h), w = I(g.w), ho = I(g.ho), wo = I(g.wo);
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    I x_first = 0, o_first = 0, at = 0, iy = 0, jx = 0;
    ix.locate_input(I(i), x_first, o_first, at, iy, jx);
    const G* dyp = dy + o_first;
    I oy0 = 0, oy1 = 0, ox0 = 0, ox1 = 0;
    ::precis::detail::bilinear_readers<M>(iy, h, ho, align, oy0, oy1);
    ::precis::detail::bilinear_readers<M>(jx, w, wo, align, ox0, ox1);
    accumulator<Acc> acc;
    for (I oy = oy0; oy < oy1; ++oy) {
      I y0 = 0, y1 = 0;
      M fy;
      ::precis::detail::bilinear_taps(oy, h, ho, align, y0, y1, fy);
      for (I ox = ox0; ox < ox1; ++ox) {
        I x0 = 0, x1 = 0;
        M fx;
        ::precis::detail::bilinear_taps(ox, w, wo, align, x0, x1, fx);
        const M gv = device_load<M>(dyp[ix.out_at(oy, ox)]);
        // The host adds the four taps in this order; a tap that is this element counts.
        if (y0 == iy && x0 == jx) acc.add(V((M(1) - fy) * (M(1) - fx) * gv));
        if (y0 == iy && x1 == jx) acc.add(V((M(1) - fy) * fx * gv));
        if (y1 == iy && x0 == jx) acc.add(V(fy * (M(1) - fx) * gv));
        if (y1 == iy && x1 == jx) acc.add(V(fy * fx * gv));
      }
    }
    dx[i] = round_to<DX>(acc.value());
  }
}

template <class Kernel, class... Args>
void launch_over(cuda_context& ctx, std::size_t n, std::string_view name, Kernel kernel,
                 Args... args) {
  if (n == 0) return;
  kernel<<<grid_for(n), 256, 0, ctx.stream()>>>(args...);
  check(cudaGetLastError(), name);
}

}  // namespace detail::cuda

// Each call takes `layout`: image_layout::nchw ([N, C, H, W], the host's), or nhwc ([N, H,
// W, C] in and out, and for max pooling's indices; each index is still a pixel's position in
// its plane). Both give the same bits; see plane_map.

/// y = max over each window of x on the device (see the host max_pool2d).
template <Policy P, class TX, class TY>
void max_pool2d(cuda_context& ctx, const device_tensor<TX, 4>& x, device_tensor<TY, 4>& y,
                const pool2d_params& p = {}, image_layout layout = image_layout::nchw) {
  detail::check_pool_types<P, TY, TX>();
  using M = detail::math_t<op::pooling, P, TX>;
  const std::string name = detail::cuda::layout_name("precis::max_pool2d", layout);
  const auto xv = detail::cuda::as_nchw(x, layout);
  const auto g = detail::pool_geometry_of(name, xv, p);
  check_shape(name + ": y", detail::cuda::as_nchw(y, layout), detail::pooled_shape(xv, g));
  detail::cuda::with_pool_index(g, detail::cuda::plane_map_of(xv, layout), [&](auto ix) {
    detail::cuda::launch_over(ctx, y.size(), "precis::max_pool2d",
                              detail::cuda::max_pool_kernel<M, TX, TY, decltype(ix)>, x.data(), y.data(), g, ix);
  });
}

/// dx of y = max_pool2d(x) on the device: each dy goes to its window's first maximum.
template <Policy P, class TX, class TG, class TDX>
void max_pool2d_backward(cuda_context& ctx, const device_tensor<TX, 4>& x, const device_tensor<TG, 4>& dy,
                         device_tensor<TDX, 4>& dx, const pool2d_params& p = {},
                         image_layout layout = image_layout::nchw) {
  detail::check_pool_types<P, TDX, TX, TG>();
  using M = detail::math_t<op::pooling, P, TX, TG>;
  using Acc = detail::accumulate_t<op::pooling, P>;
  const std::string name = detail::cuda::layout_name("precis::max_pool2d_backward", layout);
  const auto xv = detail::cuda::as_nchw(x, layout);
  const auto g = detail::pool_geometry_of(name, xv, p);
  check_shape(name + ": dy", detail::cuda::as_nchw(dy, layout), detail::pooled_shape(xv, g));
  check_shape(name + ": dx", dx, x.shape());
  detail::cuda::with_pool_index(g, detail::cuda::plane_map_of(xv, layout), [&](auto ix) {
    detail::cuda::launch_over(ctx, dx.size(), "precis::max_pool2d_backward",
                              detail::cuda::max_pool_backward_kernel<M, Acc, TX, TG, TDX, decltype(ix)>, x.data(),
                              dy.data(), dx.data(), g, ix);
  });
}

/// y = max over each window of x on the device, and each window's first maximum's index in
/// its plane (see the host max_pool2d with indices).
template <Policy P, class TX, class TY>
void max_pool2d(cuda_context& ctx, const device_tensor<TX, 4>& x, device_tensor<TY, 4>& y,
                device_tensor<std::uint32_t, 4>& indices, const pool2d_params& p = {},
                image_layout layout = image_layout::nchw) {
  detail::check_pool_types<P, TY, TX>();
  using M = detail::math_t<op::pooling, P, TX>;
  const auto xv = detail::cuda::as_nchw(x, layout);
  const auto g = detail::check_max_pool_indices(xv, detail::cuda::as_nchw(y, layout),
                                                detail::cuda::as_nchw(indices, layout), p);
  detail::cuda::with_pool_index(g, detail::cuda::plane_map_of(xv, layout), [&](auto ix) {
    detail::cuda::launch_over(ctx, y.size(), "precis::max_pool2d",
                              detail::cuda::max_pool_indices_kernel<M, TX, TY, decltype(ix)>, x.data(), y.data(),
                              indices.data(), g, ix);
  });
}

/// dx of y = max_pool2d(x) on the device from the forward pass's indices (see the host
/// overload). Each dx element gathers, in the host's order, the outputs whose windows hold
/// it and whose index names it; the indices are not checked here (one naming no element of
/// its window gives no gradient).
template <Policy P, class TG, class TDX>
void max_pool2d_backward(cuda_context& ctx, const device_tensor<std::uint32_t, 4>& indices,
                         const device_tensor<TG, 4>& dy, device_tensor<TDX, 4>& dx, const pool2d_params& p = {},
                         image_layout layout = image_layout::nchw) {
  detail::check_pool_types<P, TDX, TG>();
  using M = detail::math_t<op::pooling, P, TG>;
  using Acc = detail::accumulate_t<op::pooling, P>;
  const auto dxv = detail::cuda::as_nchw(dx, layout);
  const auto g = detail::check_max_pool_backward_indices(dxv, detail::cuda::as_nchw(dy, layout),
                                                         detail::cuda::as_nchw(indices, layout), p);
  detail::cuda::with_pool_index(g, detail::cuda::plane_map_of(dxv, layout), [&](auto ix) {
    detail::cuda::launch_over(ctx, dx.size(), "precis::max_pool2d_backward",
                              detail::cuda::max_pool_backward_indices_kernel<M, Acc, TG, TDX, decltype(ix)>,
                              indices.data(), dy.data(), dx.data(), g, ix);
  });
}

/// y = mean over each window of x on the device (see the host avg_pool2d).
template <Policy P, class TX, class TY>
void avg_pool2d(cuda_context& ctx, const device_tensor<TX, 4>& x, device_tensor<TY, 4>& y,
                const pool2d_params& p = {}, image_layout layout = image_layout::nchw) {
  detail::check_pool_types<P, TY, TX>();
  using M = detail::math_t<op::pooling, P, TX>;
  using Acc = detail::accumulate_t<op::pooling, P>;
  const std::string name = detail::cuda::layout_name("precis::avg_pool2d", layout);
  const auto xv = detail::cuda::as_nchw(x, layout);
  const auto g = detail::pool_geometry_of(name, xv, p);
  check_shape(name + ": y", detail::cuda::as_nchw(y, layout), detail::pooled_shape(xv, g));
  detail::cuda::with_pool_index(g, detail::cuda::plane_map_of(xv, layout), [&](auto ix) {
    detail::cuda::launch_over(ctx, y.size(), "precis::avg_pool2d",
                              detail::cuda::avg_pool_kernel<M, Acc, TX, TY, decltype(ix)>, x.data(), y.data(), g,
                              p.count_include_pad, ix);
  });
}

/// dx of y = avg_pool2d(x) on the device: each dy spread evenly over its window.
template <Policy P, class TG, class TDX>
void avg_pool2d_backward(cuda_context& ctx, const device_tensor<TG, 4>& dy, device_tensor<TDX, 4>& dx,
                         const pool2d_params& p = {}, image_layout layout = image_layout::nchw) {
  detail::check_pool_types<P, TDX, TG>();
  using M = detail::math_t<op::pooling, P, TG>;
  using Acc = detail::accumulate_t<op::pooling, P>;
  const std::string name = detail::cuda::layout_name("precis::avg_pool2d_backward", layout);
  const auto dxv = detail::cuda::as_nchw(dx, layout);
  const auto g = detail::pool_geometry_of(name, dxv, p);
  check_shape(name + ": dy", detail::cuda::as_nchw(dy, layout), detail::pooled_shape(dxv, g));
  detail::cuda::with_pool_index(g, detail::cuda::plane_map_of(dxv, layout), [&](auto ix) {
    detail::cuda::launch_over(ctx, dx.size(), "precis::avg_pool2d_backward",
                              detail::cuda::avg_pool_backward_kernel<M, Acc, TG, TDX, decltype(ix)>, dy.data(),
                              dx.data(), g, p.count_include_pad, ix);
  });
}

/// Nearest-neighbour upsampling on the device (see the host upsample_nearest2d).
template <Policy P, class TX, class TY>
void upsample_nearest2d(cuda_context& ctx, const device_tensor<TX, 4>& x, device_tensor<TY, 4>& y,
                        image_layout layout = image_layout::nchw) {
  detail::check_pool_types<P, TY, TX>();
  using M = detail::math_t<op::pooling, P, TX>;
  const auto xv = detail::cuda::as_nchw(x, layout), yv = detail::cuda::as_nchw(y, layout);
  detail::check_resample(detail::cuda::layout_name("precis::upsample_nearest2d", layout), xv, yv);
  using namespace detail::cuda;
  with_resample_index<detail::nearest_index, wide_nearest_index>(xv, yv, layout, [&](auto ix) {
    launch_over(ctx, y.size(), "precis::upsample_nearest2d", nearest_kernel<M, TX, TY, decltype(ix)>, x.data(),
                y.data(), ix, y.size());
  });
}

/// dx of y = upsample_nearest2d(x) on the device: the sum of dy over the outputs each
/// input fed.
template <Policy P, class TG, class TDX>
void upsample_nearest2d_backward(cuda_context& ctx, const device_tensor<TG, 4>& dy, device_tensor<TDX, 4>& dx,
                                 image_layout layout = image_layout::nchw) {
  detail::check_pool_types<P, TDX, TG>();
  using M = detail::math_t<op::pooling, P, TG>;
  using Acc = detail::accumulate_t<op::pooling, P>;
  const auto dxv = detail::cuda::as_nchw(dx, layout), dyv = detail::cuda::as_nchw(dy, layout);
  detail::check_resample(detail::cuda::layout_name("precis::upsample_nearest2d_backward", layout), dxv, dyv);
  using namespace detail::cuda;
  with_resample_index<detail::nearest_index, wide_nearest_index>(dxv, dyv, layout, [&](auto ix) {
    launch_over(ctx, dx.size(), "precis::upsample_nearest2d_backward",
                nearest_backward_kernel<M, Acc, TG, TDX, decltype(ix)>, dy.data(), dx.data(), ix, dx.size());
  });
}

/// Bilinear upsampling on the device (see the host upsample_bilinear2d).
template <Policy P, class TX, class TY>
void upsample_bilinear2d(cuda_context& ctx, const device_tensor<TX, 4>& x, device_tensor<TY, 4>& y,
                         bool align_corners = false, image_layout layout = image_layout::nchw) {
  detail::check_pool_types<P, TY, TX>();
  using M = detail::math_t<op::pooling, P, TX>;
  const auto xv = detail::cuda::as_nchw(x, layout), yv = detail::cuda::as_nchw(y, layout);
  detail::check_resample(detail::cuda::layout_name("precis::upsample_bilinear2d", layout), xv, yv);
  using namespace detail::cuda;
  with_resample_index<detail::resample_index, wide_resample_index>(xv, yv, layout, [&](auto ix) {
    launch_over(ctx, y.size(), "precis::upsample_bilinear2d", bilinear_kernel<M, TX, TY, decltype(ix)>, x.data(),
                y.data(), resample_geometry_of(xv, yv), align_corners, ix);
  });
}

/// dx of y = upsample_bilinear2d(x) on the device: each dy spread to its four neighbours
/// with the forward weights, summed per input element in the accumulate type.
template <Policy P, class TG, class TDX>
void upsample_bilinear2d_backward(cuda_context& ctx, const device_tensor<TG, 4>& dy, device_tensor<TDX, 4>& dx,
                                  bool align_corners = false, image_layout layout = image_layout::nchw) {
  detail::check_pool_types<P, TDX, TG>();
  using M = detail::math_t<op::pooling, P, TG>;
  using Acc = detail::accumulate_t<op::pooling, P>;
  const auto dxv = detail::cuda::as_nchw(dx, layout), dyv = detail::cuda::as_nchw(dy, layout);
  detail::check_resample(detail::cuda::layout_name("precis::upsample_bilinear2d_backward", layout), dxv, dyv);
  using namespace detail::cuda;
  with_resample_index<detail::resample_index, wide_resample_index>(dxv, dyv, layout, [&](auto ix) {
    launch_over(ctx, dx.size(), "precis::upsample_bilinear2d_backward",
                bilinear_backward_kernel<M, Acc, TG, TDX, decltype(ix)>, dy.data(), dx.data(),
                resample_geometry_of(dxv, dyv), align_corners, ix);
  });
}

}  // namespace precis

#endif
