/// @file
/// 2-D convolution (NCHW or channels-last NHWC images; stride, padding, dilation, groups), forward,
/// backward-data and backward-weights, and the transposed convolution, on host tensors.
///
/// Semantics (op::conv under the policy, as gemm's): inputs in their tensors' element types
/// (the policy's storage or gradient type, or float; float rounded to tfloat32 first under
/// a tfloat32 compute type), exact products summed in float in a fixed order, each output
/// rounded once. A convolution is a product with an implicit im2col matrix: the inputs are
/// converted to float once (float inputs are read in place), the im2col panels are built
/// while packing (never stored whole), and gemm's float engine does the sums. Backward-data
/// sums the per-tap float partial products of the column matrix into a float image
/// (col2im) and rounds once.
/// Double policies (math and sums in double, as float64 gradient checks want) run direct
/// loops, one running sum per output element. A narrower-than-float accumulator is not
/// taken here (static_assert); gemm has the plain-loop path for it.
///
/// Hardware products (products::hardware, float accumulation) run as oneDNN convolutions
/// where precis::onednn is linked: bfloat16 inputs on the CPU's bfloat16 dot-product
/// instructions where it has them (cpu_products_engine() says; subnormals flushed), float
/// inputs on oneDNN's float kernels (products fused into the sums, subnormals kept); oneDNN's
/// summation order, each output still rounded once; the same bits for a given machine and
/// thread count. oneDNN picks its layouts (channels-last or blocked); NCHW images are
/// transposed to and from them per call, in scratch memory kept by the context, while
/// channels-last images (conv2d_params::layout) are the layout its bfloat16 convolutions
/// read and write, so nothing is moved (its float convolutions prefer blocked layouts, and
/// are reordered from either). The exact kernels take channels-last images through NCHW
/// copies in the context's scratch: the same sums, so the same bits as NCHW.
///
/// Shapes are checked before anything is written (precis::error names expected and actual
/// shapes); exact products are the same bits for every thread count.
#pragma once

#include <precis/kernels/common.hpp>
#include <precis/kernels/context.hpp>
#include <precis/kernels/cpu/gemm_kernel.hpp>
#include <precis/kernels/cpu/support.hpp>
#include <precis/kernels/cpu/transpose.hpp>
#include <precis/kernels/gemm.hpp>
#include <precis/tensor/host_tensor.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace precis {

/// The shape of n images of c channels, h x w pixels each, in `layout`: [n, c, h, w] or
/// [n, h, w, c].
inline std::array<std::size_t, 4> image_shape(image_layout layout, std::size_t n, std::size_t c,
                                              std::size_t h, std::size_t w) {
  if (layout == image_layout::nhwc) return {n, h, w, c};
  return {n, c, h, w};
}

/// Geometry of a 2-D convolution, PyTorch's Conv2d arguments: output size
/// (in + 2 pad - dilation (k - 1) - 1) / stride + 1 per axis; `groups` splits channels
/// into independent convolutions (groups == channels: depthwise). `output_padding` belongs
/// to conv_transpose2d and its backward passes (PyTorch's ConvTranspose2d argument: rows
/// and columns added at the bottom and right of its output, each less than the stride, so
/// that a stride-s convolution's several input sizes can all be produced; PyTorch also
/// accepts values up to the dilation, which precis refuses because the transposed
/// convolution would then no longer be the adjoint of a convolution of x's size); the
/// convolutions reject a nonzero value. `layout` says how the images are laid out.
struct conv2d_params {
  std::array<std::size_t, 2> stride{1, 1};          ///< step between outputs {rows, columns}
  std::array<std::size_t, 2> padding{0, 0};         ///< zeros added per side {rows, columns}
  std::array<std::size_t, 2> dilation{1, 1};        ///< spacing of kernel taps {rows, columns}
  std::size_t groups = 1;                           ///< channel groups (divides C and Co)
  std::array<std::size_t, 2> output_padding{0, 0};  ///< conv_transpose2d only (see above)
  image_layout layout = image_layout::nchw;         ///< how x, y and their gradients lie
  /// Names the contents of the weights passed with these parameters, for an engine that
  /// moves weights into a layout of its own (oneDNN's hardware products): a forward (or a
  /// transposed convolution's forward) or backward-data call keeps the moved weights in
  /// the context, and a later call with the same weight tensor (same address) and the same
  /// nonzero value uses them without moving them again. The caller promises that the
  /// values at that address have not changed while the value stayed the same. 0 (the
  /// default): moved in every call. nn's convolutions pass their weight's
  /// parameter::version() when evaluating (mode::eval).
  std::uint64_t weights_version = 0;
  /// On the device: take only algorithms whose products are exact for inputs that are
  /// values of the 8- and 16-bit formats, refusing FFT and Winograd ones, whose transformed
  /// operands a TF32 product would round. Set for the float copies of a 16-bit convolution
  /// with a bias (detail::widened_conv_policy); the host's algorithms transform nothing.
  bool exact_products = false;
};

namespace detail {

/// The policy of a convolution on float copies of narrower values: a 16-bit convolution
/// with a bias on the device, whose sums stay in float until the bias is added. Float
/// tensors with TF32 products (tensor cores, where the GPU has them: sm_80 on), which are
/// exact here: every value of the 8- and 16-bit formats is a TF32 value (at most 10
/// fraction bits, float's exponent range), so the conversion to TF32 changes none, and the
/// product of two fits a float's 24 bits. It is presets::tf32's policy; the calls that use
/// it for such copies also set conv2d_params::exact_products, which refuses the algorithms
/// that transform their operands.
using widened_conv_policy = policy<float, tfloat32, float, float>;

/// All sizes of one convolution, from x [N, C, H, W] (or [N, H, W, C]) and w [Co, C / groups,
/// KH, KW].
struct conv_geometry {
  std::size_t n, c, h, w, co, kh, kw, ho, wo, groups;
  conv2d_params p;
  std::size_t cg() const { return c / groups; }
  std::size_t cog() const { return co / groups; }
  std::size_t taps() const { return cg() * kh * kw; }  // the product's depth
  std::size_t pixels() const { return ho * wo; }
  bool channels_last() const { return p.layout == image_layout::nhwc; }
  std::array<std::size_t, 4> x_shape() const { return image_shape(p.layout, n, c, h, w); }
  std::array<std::size_t, 4> y_shape() const { return image_shape(p.layout, n, co, ho, wo); }
};

/// Computes the geometry and checks x and w; throws precis::error naming shapes.
template <class X, class W>
conv_geometry conv_geometry_of(std::string_view name, const X& x, const W& w,
                               const conv2d_params& p) {
  conv_geometry g{};
  const bool last = p.layout == image_layout::nhwc;
  g.n = std::size_t(x.shape()[0]);
  g.c = std::size_t(x.shape()[last ? 3 : 1]);
  g.h = std::size_t(x.shape()[last ? 1 : 2]);
  g.w = std::size_t(x.shape()[last ? 2 : 3]);
  g.co = std::size_t(w.shape()[0]);
  g.kh = std::size_t(w.shape()[2]);
  g.kw = std::size_t(w.shape()[3]);
  g.groups = p.groups;
  g.p = p;
  const std::string n(name);
  check_argument(p.groups >= 1 && p.stride[0] >= 1 && p.stride[1] >= 1 && p.dilation[0] >= 1 &&
                     p.dilation[1] >= 1,
                 n + ":", "stride, dilation and groups must be at least 1");
  check_argument(p.output_padding[0] == 0 && p.output_padding[1] == 0, n + ":",
                 "output_padding is an argument of conv_transpose2d only");
  if (g.c % p.groups != 0 || g.co % p.groups != 0) {
    throw error(n + ": groups = " + std::to_string(p.groups) + " must divide the input channels (" +
                std::to_string(g.c) + ") and the output channels (" + std::to_string(g.co) + ")");
  }
  check_shape(n + ": w", w, std::array<std::size_t, 4>{g.co, g.c / p.groups, g.kh, g.kw});
  const auto out = [&](std::size_t in, std::size_t k, std::size_t a) -> std::size_t {
    const std::size_t span = p.dilation[a] * (k - 1) + 1, padded = in + 2 * p.padding[a];
    if (k == 0 || padded < span) {
      throw error(n + ": kernel " + shape_string(std::array<std::size_t, 2>{g.kh, g.kw}) +
                  " with dilation does not fit input " +
                  shape_string(std::array<std::size_t, 2>{g.h, g.w}) + " plus padding");
    }
    return (padded - span) / p.stride[a] + 1;
  };
  g.ho = out(g.h, g.kh, 0);
  g.wo = out(g.w, g.kw, 1);
  return g;
}

/// A tensor's elements as floats: the tensor itself when it holds floats and nothing is to
/// be rounded, else a converted copy (rounded to tfloat32 when TF32).
class float_operand {
 public:
  explicit float_operand(const float* borrowed) : p_(borrowed) {}
  explicit float_operand(float_buffer owned) : owned_(std::move(owned)), p_(owned_->get()) {}
  const float* get() const { return p_; }

 private:
  std::optional<float_buffer> owned_;
  const float* p_;
};

template <bool TF32, class T>
float_operand to_float(const cpu_context& ctx, const T* src, std::size_t n) {
  if constexpr (std::is_same_v<T, float> && !TF32) {
    return float_operand(src);
  } else {
    float_buffer out(ctx, n);
    float* o = out.get();
    parallel_for(ctx, n, elements_per_thread, [&](std::size_t b, std::size_t e) {
      load_block(src + b, o + b, e - b);
      if constexpr (TF32 && std::is_same_v<T, float>) {
        for (std::size_t i = b; i < e; ++i) o[i] = round_tf32(o[i]);
      }
    });
    return float_operand(std::move(out));
  }
}

/// The im2col matrix of one group, col[t, n*P + q] = x[n, group channel ch, oy*s - pad +
/// ky*d, ox*s - pad + kx*d] (zero in the padding) for tap t = (ch, ky, kx) and output pixel
/// q = (oy, ox) of image n, read from the float images without being stored. Offsets of
/// every tap are tabled once, so reading an element takes two additions and a bounds check
/// (no divisions).
class im2col_reader {
 public:
  /// `x`: the group's first channel of image 0; images are `image_stride` floats apart.
  im2col_reader(const conv_geometry& g, const float* x, std::size_t image_stride)
      : g_(&g), x_(x), image_stride_(image_stride), taps_(g.taps()) {
    for (std::size_t t = 0; t < taps_.size(); ++t) {
      const std::size_t kx = t % g.kw, ky = (t / g.kw) % g.kh, ch = t / (g.kw * g.kh);
      taps_[t] = {ch * g.h * g.w, std::ptrdiff_t(ky * g.p.dilation[0]),
                  std::ptrdiff_t(kx * g.p.dilation[1])};
    }
  }

  /// Where output pixel j = n*P + q reads from: its image and the input position of tap
  /// (0, 0, 0), which may lie in the padding (negative).
  struct pixel {
    const float* image;
    std::ptrdiff_t y0, x0;
  };
  pixel at(std::size_t j) const {
    const std::size_t P = g_->pixels(), q = j % P;
    return {x_ + (j / P) * image_stride_,
            std::ptrdiff_t((q / g_->wo) * g_->p.stride[0]) - std::ptrdiff_t(g_->p.padding[0]),
            std::ptrdiff_t((q % g_->wo) * g_->p.stride[1]) - std::ptrdiff_t(g_->p.padding[1])};
  }

  /// col[t, pixel]
  float operator()(std::size_t t, const pixel& px) const {
    const tap& tp = taps_[t];
    const std::ptrdiff_t iy = px.y0 + tp.dy, ix = px.x0 + tp.dx;
    if (std::size_t(iy) >= g_->h || std::size_t(ix) >= g_->w) return 0.0F;  // negative wraps
    return px.image[tp.offset + std::size_t(iy) * g_->w + std::size_t(ix)];
  }

  /// col[t, j + i] for the `count` pixels j, j + 1, ... of one output row that start at
  /// `px` (pixel j), written to out[i * step]: the same values as operator(), with the
  /// bounds worked out once for the run instead of once per element. The columns a tap
  /// reads inside the image are a range of i, so a run is zeros, a copy of an input row
  /// (every stride-th element of it) and zeros.
  void run(std::size_t t, const pixel& px, std::size_t count, float* out, std::size_t step) const {
    const tap& tp = taps_[t];
    const std::ptrdiff_t iy = px.y0 + tp.dy, ix = px.x0 + tp.dx;
    std::size_t lo = count, hi = count;  // the run's elements inside the image: [lo, hi)
    if (std::size_t(iy) < g_->h) {
      const auto s = std::ptrdiff_t(g_->p.stride[1]), w = std::ptrdiff_t(g_->w);
      // ix + i s >= 0 from i = lo; ix + i s < w below i = hi. A run lies on one output row,
      // so only the padding's columns fall outside: each loop steps a few times at most
      // (cheaper than the divisions that would give lo and hi directly).
      lo = 0;
      while (lo < count && ix + std::ptrdiff_t(lo) * s < 0) ++lo;
      hi = count;
      while (hi > lo && ix + std::ptrdiff_t(hi - 1) * s >= w) --hi;
    }
    std::size_t i = 0;
    for (; i < lo; ++i) out[i * step] = 0.0F;
    if (lo < hi) {
      const float* src = px.image + tp.offset + std::size_t(iy) * g_->w;
      const std::size_t s = g_->p.stride[1];
      const std::size_t x0 = std::size_t(ix + std::ptrdiff_t(lo * s));  // the column of i = lo
      if (step == 1 && s == 1) {
        // Runs are short (a pixel panel's are at most MR long): vector moves, no memmove call.
        vmath::map(src + x0, out + lo, hi - lo, [](vmath::vf v) { return v; });
      } else {
        for (std::size_t c = x0; i < hi; ++i, c += s) out[i * step] = src[c];
      }
      i = hi;
    }
    for (; i < count; ++i) out[i * step] = 0.0F;
  }

  /// Output pixels per row.
  std::size_t row_pixels() const { return g_->wo; }

  /// Splits the `count` consecutive pixels from j0 into runs of one output row each (see
  /// run()): calls f(first, length, pixel) for each, first counted from j0.
  template <class F>
  void for_each_run(std::size_t j0, std::size_t count, F&& f) const {
    const std::size_t wo = g_->wo;
    for (std::size_t i = 0; i < count;) {
      const std::size_t len = std::min(count - i, wo - (j0 + i) % wo);
      f(i, len, at(j0 + i));
      i += len;
    }
  }

 private:
  struct tap {
    std::size_t offset;      // channel ch's first element
    std::ptrdiff_t dy, dx;   // ky * dilation, kx * dilation
  };
  const conv_geometry* g_;
  const float* x_;
  std::size_t image_stride_;
  std::vector<tap> taps_;
};

/// Packs the im2col matrix's transpose (rows: pixels of every image, depth: taps) into
/// R-wide panels for gemm_serial: out[k * R + r] = col[t0 + k, j0 + r].
template <std::size_t R>
struct im2col_pixel_packer {
  const im2col_reader* col;
  void operator()(std::size_t j0, std::size_t rows, std::size_t t0, std::size_t kc,
                  float* out) const {
    // The panel's pixels as runs along output rows (at most R of them). Rows shorter than a
    // panel (deep layers' 7 x 7 outputs) would give several short runs per tap: their
    // panels are read element by element, as fast there.
    const bool by_element = col->row_pixels() < R;
    im2col_reader::pixel px[R];
    struct span {
      std::size_t first, length;
      im2col_reader::pixel px;
    };
    span runs[R];
    std::size_t count = 0;
    if (by_element) {
      for (std::size_t r = 0; r < rows; ++r) px[r] = col->at(j0 + r);
    } else {
      col->for_each_run(j0, rows, [&](std::size_t first, std::size_t length,
                                      const im2col_reader::pixel& p) {
        runs[count++] = {first, length, p};
      });
    }
    for (std::size_t k = 0; k < kc; ++k) {
      float* o = out + k * R;
      if (by_element) {
        for (std::size_t r = 0; r < rows; ++r) o[r] = (*col)(t0 + k, px[r]);
      } else {
        for (std::size_t i = 0; i < count; ++i) {
          col->run(t0 + k, runs[i].px, runs[i].length, o + runs[i].first, 1);
        }
      }
      for (std::size_t r = rows; r < R; ++r) o[r] = 0.0F;
    }
  }
};

/// Packs the im2col matrix (rows: taps, depth: pixels of every image) into R-wide panels
/// for gemm_serial: out[k * R + c] = col[t0 + c, j0 + k].
template <std::size_t R>
struct im2col_tap_packer {
  const im2col_reader* col;
  void operator()(std::size_t t0, std::size_t cols, std::size_t j0, std::size_t kc,
                  float* out) const {
    // Each tap's values over a run of pixels along an output row are one strided copy.
    col->for_each_run(j0, kc,
                      [&](std::size_t first, std::size_t length, const im2col_reader::pixel& px) {
                        float* o = out + first * R;
                        for (std::size_t c = 0; c < cols; ++c)
                          col->run(t0 + c, px, length, o + c, R);
                        for (std::size_t c = cols; c < R; ++c) {
                          for (std::size_t k = 0; k < length; ++k) o[k * R + c] = 0.0F;
                        }
                      });
  }
};

/// y[n, g*Cog + i, q] = sum_t w[g*Cog + i, t] col(xf[n, g])[t, q] (+ bias), rounded once to
/// TY. Per group, one product whose rows are the output pixels of every image of the batch
/// (the im2col matrix's transpose, built while packing) and whose columns are the group's
/// output channels (the weights, converted to float, and rounded to tfloat32 when TF32, as
/// they are packed). Pixels are the rows because rows pad to MR and columns to the wider
/// NR: the few pixels of deep layers (7 x 7 per image) would waste a quarter of an NR panel,
/// while channel counts are multiples of NR in practice.
template <bool TF32, class TW, class TY, class TBias>
void conv_forward_float(const cpu_context& ctx, const conv_geometry& g, const float* xf,
                        const TW* w, const TBias* bias, TY* y) {
  const std::size_t P = g.pixels(), T = g.taps(), Cog = g.cog();
  std::vector<float> bias_f(Cog, 0.0F);
  for (std::size_t gr = 0; gr < g.groups; ++gr) {
    if (bias != nullptr) load_block(bias + gr * Cog, bias_f.data(), Cog);
    const im2col_reader col(g, xf + gr * g.cg() * g.h * g.w, g.c * g.h * g.w);
    im2col_pixel_packer<gemm_mr> pa{&col};
    // Element (channel i, tap t) at w[(gr*Cog + i) * T + t].
    strided_packer<TW, gemm_nr, TF32 && std::is_same_v<TW, float>> pb{w + gr * Cog * T, T, 1};
    // Rows j0 .. j0 + rows are consecutive pixels (j = n*P + q: pixel q of image n), so a
    // channel's values in them are runs of consecutive elements of y, one per image.
    const auto write = [&](std::size_t j0, std::size_t rows, std::size_t i0, std::size_t cols,
                           const float* acc, std::size_t ld) {
      float v[block_size];
      for (std::size_t r = 0; r < rows;) {
        const std::size_t j = j0 + r, q = j % P;
        const std::size_t run = std::min({rows - r, P - q, block_size});
        TY* out = y + ((j / P) * g.co + gr * Cog + i0) * P + q;
        for (std::size_t c = 0; c < cols; ++c) {
          const float b = bias_f[i0 + c], *a = acc + r * ld + c;
          for (std::size_t k = 0; k < run; ++k) v[k] = a[k * ld] + b;
          store_block(v, out + c * P, run);
        }
        r += run;
      }
    };
    gemm_float(ctx, g.n * P, Cog, T, pa, pb, write);
  }
}

/// dx[n, g] = col2im(W_g^T dy[n, g]): the column matrix in float, then each image element
/// summed over its (tap, pixel) terms in float in a fixed order (taps in order; a tap
/// reaches an element from at most one pixel), rounded once to TX. Per group, one product
/// over as many images as fit a 64 MiB column buffer: rows are taps, columns the pixels of
/// those images, so that a tap's values over an image's pixels are contiguous and col2im
/// adds them to the image's rows as vectors. col2im runs over (image, channel) planes,
/// which are independent, in parallel.
template <class TX>
void conv_backward_data_float(const cpu_context& ctx, const conv_geometry& g, const float* dyf,
                              const float* wf, TX* dx) {
  constexpr std::size_t NR = gemm_nr;
  const std::size_t P = g.pixels(), T = g.taps(), Cog = g.cog(), Cg = g.cg(), HW = g.h * g.w;
  const std::size_t KK = g.kh * g.kw;
  const std::size_t chunk =
      std::clamp<std::size_t>((std::size_t(1) << 24) / std::max<std::size_t>(1, P * T), 1, g.n);
  float_buffer col(ctx, chunk * P * T);  // every element is written by the product
  for (std::size_t gr = 0; gr < g.groups; ++gr) {
    for (std::size_t n0 = 0; n0 < g.n; n0 += chunk) {
      const std::size_t images = std::min(chunk, g.n - n0), NP = images * P;
      // A = W_g^T (T x Cog): element (t, i) at wf[(gr*Cog + i) * T + t].
      strided_packer<float, gemm_mr, false> pa{wf + gr * Cog * T, 1, T};
      // B = dy_g (Cog x NP): element (i, n*P + q) at dyf[((n0 + n)*Co + gr*Cog + i) * P + q].
      const auto pb = [&](std::size_t j0, std::size_t cols, std::size_t k0, std::size_t kc,
                          float* out) {
        if (j0 / P == (j0 + cols - 1) / P) {
          // The columns are consecutive pixels of one image: each k's are one run of dy.
          const float* src = dyf + ((n0 + j0 / P) * g.co + gr * Cog + k0) * P + j0 % P;
          for (std::size_t k = 0; k < kc; ++k, src += P) {
            float* o = out + k * NR;
            vmath::map(src, o, cols, [](vmath::vf v) { return v; });
            std::fill(o + cols, o + NR, 0.0F);
          }
          return;
        }
        std::size_t base[NR];
        for (std::size_t c = 0; c < cols; ++c) {
          const std::size_t j = j0 + c;
          base[c] = ((n0 + j / P) * g.co + gr * Cog + k0) * P + j % P;
        }
        for (std::size_t k = 0; k < kc; ++k) {
          float* o = out + k * NR;
          for (std::size_t c = 0; c < cols; ++c) o[c] = dyf[base[c] + k * P];
          for (std::size_t c = cols; c < NR; ++c) o[c] = 0.0F;
        }
      };
      const auto write = [&](std::size_t t, std::size_t j0, const float* acc, std::size_t len) {
        std::copy(acc, acc + len, col.get() + t * NP + j0);
      };
      gemm_float(ctx, T, NP, Cog, pa, pb, write);
      // The output columns ox that tap offset `k` (kx * dilation) puts inside the image:
      // ix = ox * stride + k - pad in [0, extent).
      const auto valid = [](std::size_t k, std::size_t stride, std::size_t pad, std::size_t extent,
                            std::size_t outs) {
        const std::size_t lo = k >= pad ? 0 : (pad - k + stride - 1) / stride;
        const std::size_t hi =
            extent + pad > k ? std::min(outs, (extent + pad - k + stride - 1) / stride) : 0;
        return std::array<std::size_t, 2>{lo, std::max(lo, hi)};
      };
      for_rows(ctx, images * Cg, P * KK, [&](std::size_t b, std::size_t e) {
        std::vector<float> img(HW);
        for (std::size_t plane = b; plane < e; ++plane) {
          const std::size_t n = plane / Cg, ch = plane % Cg;
          std::fill(img.begin(), img.end(), 0.0F);
          for (std::size_t ky = 0; ky < g.kh; ++ky) {
            const auto [oy0, oy1] =
                valid(ky * g.p.dilation[0], g.p.stride[0], g.p.padding[0], g.h, g.ho);
            for (std::size_t kx = 0; kx < g.kw; ++kx) {
              const std::size_t dx0 = kx * g.p.dilation[1];
              const auto [ox0, ox1] = valid(dx0, g.p.stride[1], g.p.padding[1], g.w, g.wo);
              const float* src = col.get() + (ch * KK + ky * g.kw + kx) * NP + n * P;
              for (std::size_t oy = oy0; oy < oy1; ++oy) {
                const std::size_t iy = oy * g.p.stride[0] + ky * g.p.dilation[0] - g.p.padding[0];
                float* row = img.data() + iy * g.w;
                const float* s = src + oy * g.wo;
                if (g.p.stride[1] == 1) {
                  float* r = row + (ox0 + dx0 - g.p.padding[1]);  // ix of ox0
                  for (std::size_t i = 0; i < ox1 - ox0; ++i) r[i] += s[ox0 + i];
                } else {
                  for (std::size_t ox = ox0; ox < ox1; ++ox) {
                    row[ox * g.p.stride[1] + dx0 - g.p.padding[1]] += s[ox];
                  }
                }
              }
            }
          }
          store_block(img.data(), dx + ((n0 + n) * g.c + gr * Cg + ch) * HW, HW);
        }
      });
    }
  }
}

/// dw[g*Cog + i, t] = sum over images n and pixels q of dy[n, g*Cog + i, q] col(x[n, g])[t, q]:
/// one product of depth N * P per group, rounded once to TW.
template <class TW>
void conv_backward_weights_float(const cpu_context& ctx, const conv_geometry& g, const float* xf,
                                 const float* dyf, TW* dw) {
  const std::size_t P = g.pixels(), T = g.taps(), Cog = g.cog();
  for (std::size_t gr = 0; gr < g.groups; ++gr) {
    // A (Cog x N*P): element (i, n*P + q) at dyf[(n*Co + gr*Cog + i) * P + q].
    const auto pa = [&](std::size_t i0, std::size_t rows, std::size_t k0, std::size_t kc,
                        float* out) {
      for (std::size_t r = rows; r < gemm_mr; ++r) {
        for (std::size_t k = 0; k < kc; ++k) out[k * gemm_mr + r] = 0.0F;
      }
      // Depth k0 .. k0 + kc as runs of pixels of one image each: row r of a run is a run of
      // dy's channel i0 + r.
      for (std::size_t k = 0; k < kc;) {
        const std::size_t n = (k0 + k) / P, q = (k0 + k) % P, len = std::min(kc - k, P - q);
        const float* src = dyf + (n * g.co + gr * Cog + i0) * P + q;
        float* o = out + k * gemm_mr;
        for (std::size_t r = 0; r < rows; ++r, src += P) {
          for (std::size_t i = 0; i < len; ++i) o[i * gemm_mr + r] = src[i];
        }
        k += len;
      }
    };
    // B (N*P x T) packed as its transpose: element (t, n*P + q) = col(x[n, gr])[t, q].
    const im2col_reader col(g, xf + gr * g.cg() * g.h * g.w, g.c * g.h * g.w);
    im2col_tap_packer<gemm_nr> pb{&col};
    TW* out = dw + gr * Cog * T;
    const auto write = [&](std::size_t i, std::size_t j0, const float* acc, std::size_t len) {
      store_block(acc, out + i * T + j0, len);
    };
    gemm_float(ctx, Cog, T, g.n * P, pa, pb, write);
  }
}

// Direct loops over a geometry g (x [n, c, h, w], w [co, c / groups, kh, kw], y [n, co,
// ho, wo]) for double policies, which a gradient check in float64 needs and no model
// trains with for speed. Each output element is one running sum in accumulate_t<op::conv,
// P> of products in math_t<op::conv, P>, rounded once.

/// y = conv(x, w) (+ bias, added to the sum before the rounding; bias may be nullptr).
template <Policy P, class TX, class TW, class TB, class TY>
void direct_conv_forward(const cpu_context& ctx, const conv_geometry& g,
                         const TX* x, const TW* w, const TB* bias, TY* y) {
  using M = math_t<op::conv, P, TX, TW>;
  using Acc = accumulate_t<op::conv, P>;
  const std::size_t cg = g.cg(), cog = g.cog(), pixels = g.pixels(), hw = g.h * g.w;
  for_rows(ctx, g.n * g.co, pixels * g.taps(), [&](std::size_t b, std::size_t e) {
    for (std::size_t plane = b; plane < e; ++plane) {
      const std::size_t n = plane / g.co, o = plane % g.co;
      const TX* xg = x + (n * g.c + (o / cog) * cg) * hw;
      const TW* wo = w + o * g.taps();
      for (std::size_t oy = 0; oy < g.ho; ++oy) {
        for (std::size_t ox = 0; ox < g.wo; ++ox) {
          accumulator<Acc> acc;
          for (std::size_t c = 0; c < cg; ++c) {
            for (std::size_t ky = 0; ky < g.kh; ++ky) {
              const std::size_t iy = oy * g.p.stride[0] + ky * g.p.dilation[0];
              if (iy < g.p.padding[0] || iy - g.p.padding[0] >= g.h) continue;
              for (std::size_t kx = 0; kx < g.kw; ++kx) {
                const std::size_t ix = ox * g.p.stride[1] + kx * g.p.dilation[1];
                if (ix < g.p.padding[1] || ix - g.p.padding[1] >= g.w) continue;
                accumulate(
                    acc, load<M>(
                             xg[c * hw + (iy - g.p.padding[0]) * g.w + ix - g.p.padding[1]]) *
                             load<M>(wo[(c * g.kh + ky) * g.kw + kx]));
              }
            }
          }
          M v = static_cast<M>(acc.value());
          if (bias != nullptr) v += load<M>(bias[o]);
          y[plane * pixels + oy * g.wo + ox] = round_to<TY>(v);
        }
      }
    }
  });
}

/// dx of y = conv(x, w) from dy, each element gathered from the outputs it fed (+ bias per
/// channel of dx: the transposed convolution is this pass; bias may be nullptr).
template <Policy P, class TG, class TW, class TB, class TX>
void direct_conv_backward_data(const cpu_context& ctx, const conv_geometry& g,
                               const TG* dy, const TW* w, const TB* bias, TX* dx) {
  using M = math_t<op::conv, P, TG, TW>;
  using Acc = accumulate_t<op::conv, P>;
  const std::size_t cg = g.cg(), cog = g.cog(), pixels = g.pixels(), hw = g.h * g.w;
  for_rows(
      ctx, g.n * g.c, hw * cog * g.kh * g.kw, [&](std::size_t b, std::size_t e) {
        for (std::size_t plane = b; plane < e; ++plane) {
          const std::size_t n = plane / g.c, ch = plane % g.c, gr = ch / cg, c = ch % cg;
          for (std::size_t iy = 0; iy < g.h; ++iy) {
            for (std::size_t ix = 0; ix < g.w; ++ix) {
              accumulator<Acc> acc;
              for (std::size_t i = 0; i < cog; ++i) {
                const std::size_t o = gr * cog + i;
                const TG* dyo = dy + (n * g.co + o) * pixels;
                const TW* wo = w + (o * cg + c) * g.kh * g.kw;
                for (std::size_t ky = 0; ky < g.kh; ++ky) {
                  // Output row oy reads row iy through tap ky when oy * stride = iy + pad - ky * d.
                  const std::size_t ty = iy + g.p.padding[0], dky = ky * g.p.dilation[0];
                  if (ty < dky || (ty - dky) % g.p.stride[0] != 0) continue;
                  const std::size_t oy = (ty - dky) / g.p.stride[0];
                  if (oy >= g.ho) continue;
                  for (std::size_t kx = 0; kx < g.kw; ++kx) {
                    const std::size_t tx = ix + g.p.padding[1], dkx = kx * g.p.dilation[1];
                    if (tx < dkx || (tx - dkx) % g.p.stride[1] != 0) continue;
                    const std::size_t ox = (tx - dkx) / g.p.stride[1];
                    if (ox >= g.wo) continue;
                    accumulate(acc,
                                               load<M>(dyo[oy * g.wo + ox]) *
                                                   load<M>(wo[ky * g.kw + kx]));
                  }
                }
              }
              M v = static_cast<M>(acc.value());
              if (bias != nullptr) v += load<M>(bias[ch]);
              dx[plane * hw + iy * g.w + ix] = round_to<TX>(v);
            }
          }
        }
      });
}

/// dw of y = conv(x, w) from x and dy: each weight one sum over images and output pixels.
template <Policy P, class TX, class TG, class TW>
void direct_conv_backward_weights(const cpu_context& ctx, const conv_geometry& g,
                                  const TX* x, const TG* dy, TW* dw) {
  using M = math_t<op::conv, P, TX, TG>;
  using Acc = accumulate_t<op::conv, P>;
  const std::size_t cg = g.cg(), cog = g.cog(), pixels = g.pixels(), hw = g.h * g.w;
  const std::size_t taps = g.taps();
  for_rows(ctx, g.co * taps, g.n * pixels, [&](std::size_t b, std::size_t e) {
    for (std::size_t idx = b; idx < e; ++idx) {
      const std::size_t o = idx / taps, t = idx % taps;
      const std::size_t c = t / (g.kh * g.kw), ky = (t / g.kw) % g.kh, kx = t % g.kw;
      const std::size_t ch = (o / cog) * cg + c;
      accumulator<Acc> acc;
      for (std::size_t n = 0; n < g.n; ++n) {
        const TX* xc = x + (n * g.c + ch) * hw;
        const TG* dyo = dy + (n * g.co + o) * pixels;
        for (std::size_t oy = 0; oy < g.ho; ++oy) {
          const std::size_t iy = oy * g.p.stride[0] + ky * g.p.dilation[0];
          if (iy < g.p.padding[0] || iy - g.p.padding[0] >= g.h) continue;
          for (std::size_t ox = 0; ox < g.wo; ++ox) {
            const std::size_t ix = ox * g.p.stride[1] + kx * g.p.dilation[1];
            if (ix < g.p.padding[1] || ix - g.p.padding[1] >= g.w) continue;
            accumulate(
                acc,
                load<M>(dyo[oy * g.wo + ox]) *
                    load<M>(xc[(iy - g.p.padding[0]) * g.w + ix - g.p.padding[1]]));
          }
        }
      }
      dw[idx] = round_to<TW>(static_cast<M>(acc.value()));
    }
  });
}

/// True when P computes a convolution of TA and TB in double with a double accumulator
/// (the direct loops above).
template <Policy P, class TA, class TB>
inline constexpr bool double_conv_v =
    std::is_same_v<math_t<op::conv, P, TA, TB>, double> && std::is_same_v<accumulate_t<op::conv, P>, double>;

/// The static checks of every convolution.
template <Policy P, class TX, class TW, class TY>
constexpr void check_conv_types() {
  static_assert(kernel_element<TX> && kernel_element<TW> && kernel_element<TY>,
                "precis: conv element types are float, double or precis number formats");
  static_assert(policy_input_v<op::conv, P, TX> && policy_input_v<op::conv, P, TW>,
                "precis: conv inputs must be the policy's storage or gradient type, or float; "
                "cast them with precis::cast first, or call with the policy they were "
                "stored under");
  static_assert(float_engine_v<op::conv, P, TX, TW> || double_conv_v<P, TX, TW>,
                "precis: conv computes in float with a float accumulator (or in double under a "
                "double policy); for an unsafe narrow accumulator use gemm on an explicit im2col "
                "matrix");
}

template <Policy P>
inline constexpr bool conv_tf32_v = tf32_inputs_v<op::conv, P>;

/// Scratch of the context for n values of T (uninitialised; aligned as float_buffer).
template <class T>
class scratch_values {
 public:
  scratch_values(const cpu_context& ctx, std::size_t n)
      : buf_(ctx, (n * sizeof(T) + sizeof(float) - 1) / sizeof(float)) {}
  T* get() const { return reinterpret_cast<T*>(buf_.get()); }

 private:
  float_buffer buf_;
};

/// g for NCHW images: what the exact kernels run on the NCHW copies of channels-last ones.
inline conv_geometry nchw_of(conv_geometry g) {
  g.p.layout = image_layout::nchw;
  return g;
}

/// Copies of `images` NHWC images of c channels, `pixels` each, as NCHW (and, below, of
/// NCHW ones as NHWC), the images split over the context's threads.
template <class T>
void images_to_nchw(const cpu_context& ctx, const T* src, T* dst, std::size_t images, std::size_t c,
                    std::size_t pixels) {
  parallel_for(ctx, images, 1, [&](std::size_t b, std::size_t e) {
    transpose_images(src + b * c * pixels, dst + b * c * pixels, e - b, pixels, c);
  });
}
template <class T>
void images_to_nhwc(const cpu_context& ctx, const T* src, T* dst, std::size_t images, std::size_t c,
                    std::size_t pixels) {
  parallel_for(ctx, images, 1, [&](std::size_t b, std::size_t e) {
    transpose_images(src + b * c * pixels, dst + b * c * pixels, e - b, c, pixels);
  });
}

/// The exact forward pass y = conv(x, w) (+ bias; may be nullptr) in g's layout.
template <Policy P, class TX, class TW, class TB, class TY>
void exact_conv_forward(const cpu_context& ctx, const conv_geometry& g, const TX* x, const TW* w,
                        const TB* bias, TY* y) {
  if (g.channels_last()) {
    const scratch_values<TX> xc(ctx, g.n * g.c * g.h * g.w);
    const scratch_values<TY> yc(ctx, g.n * g.co * g.pixels());
    images_to_nchw(ctx, x, xc.get(), g.n, g.c, g.h * g.w);
    exact_conv_forward<P>(ctx, nchw_of(g), xc.get(), w, bias, yc.get());
    images_to_nhwc(ctx, yc.get(), y, g.n, g.co, g.pixels());
  } else if constexpr (double_conv_v<P, TX, TW>) {
    direct_conv_forward<P>(ctx, g, x, w, bias, y);
  } else {
    constexpr bool tf32 = conv_tf32_v<P>;
    const auto xf = to_float<tf32>(ctx, x, g.n * g.c * g.h * g.w);
    conv_forward_float<tf32>(ctx, g, xf.get(), w, bias, y);
  }
}

/// The exact backward-data pass dx = conv^T(dy, w) in g's layout (also the transposed
/// convolution's forward pass).
template <Policy P, class TG, class TW, class TX>
void exact_conv_backward_data(const cpu_context& ctx, const conv_geometry& g, const TG* dy,
                              const TW* w, TX* dx) {
  if (g.channels_last()) {
    const scratch_values<TG> dyc(ctx, g.n * g.co * g.pixels());
    const scratch_values<TX> dxc(ctx, g.n * g.c * g.h * g.w);
    images_to_nchw(ctx, dy, dyc.get(), g.n, g.co, g.pixels());
    exact_conv_backward_data<P>(ctx, nchw_of(g), dyc.get(), w, dxc.get());
    images_to_nhwc(ctx, dxc.get(), dx, g.n, g.c, g.h * g.w);
  } else if constexpr (double_conv_v<P, TG, TW>) {
    direct_conv_backward_data<P>(ctx, g, dy, w, static_cast<const TX*>(nullptr), dx);
  } else {
    constexpr bool tf32 = conv_tf32_v<P>;
    const auto dyf = to_float<tf32>(ctx, dy, g.n * g.co * g.pixels());
    const auto wf = to_float<tf32>(ctx, w, g.co * g.taps());
    conv_backward_data_float(ctx, g, dyf.get(), wf.get(), dx);
  }
}

/// The exact backward-weights pass dw from x and dy in g's layout.
template <Policy P, class TX, class TG, class TW>
void exact_conv_backward_weights(const cpu_context& ctx, const conv_geometry& g, const TX* x,
                                 const TG* dy, TW* dw) {
  if (g.channels_last()) {
    const scratch_values<TX> xc(ctx, g.n * g.c * g.h * g.w);
    const scratch_values<TG> dyc(ctx, g.n * g.co * g.pixels());
    images_to_nchw(ctx, x, xc.get(), g.n, g.c, g.h * g.w);
    images_to_nchw(ctx, dy, dyc.get(), g.n, g.co, g.pixels());
    exact_conv_backward_weights<P>(ctx, nchw_of(g), xc.get(), dyc.get(), dw);
  } else if constexpr (double_conv_v<P, TX, TG>) {
    direct_conv_backward_weights<P>(ctx, g, x, dy, dw);
  } else {
    constexpr bool tf32 = conv_tf32_v<P>;
    const auto xf = to_float<tf32>(ctx, x, g.n * g.c * g.h * g.w);
    const auto dyf = to_float<tf32>(ctx, dy, g.n * g.co * g.pixels());
    conv_backward_weights_float(ctx, g, xf.get(), dyf.get(), dw);
  }
}

template <std::size_t N>
std::array<std::size_t, N> dims(std::array<std::size_t, N> a) {
  return a;
}

/// True when a convolution of TA and TB inputs under P uses the hardware's products.
template <Policy P, class TA, class TB>
inline constexpr bool hardware_conv_v = hardware_products_v<op::conv, P, TA, TB>;

#if PRECIS_HAS_ONEDNN
/// oneDNN's description of geometry g (symmetric padding: oneDNN's output size, like
/// precis's, rounds down).
inline onednn_conv_key onednn_key(const conv_geometry& g, onednn_conv_kind kind, int out_type,
                                  bool bias) {
  const auto i = [](std::size_t v) { return std::int64_t(v); };
  onednn_conv_key key = {i(g.n),
                         i(g.c),
                         i(g.h),
                         i(g.w),
                         i(g.co),
                         i(g.kh),
                         i(g.kw),
                         i(g.ho),
                         i(g.wo),
                         i(g.groups),
                         i(g.p.stride[0]),
                         i(g.p.stride[1]),
                         i(g.p.padding[0]),
                         i(g.p.padding[1]),
                         i(g.p.padding[0]),
                         i(g.p.padding[1]),
                         i(g.p.dilation[0]) - 1,
                         i(g.p.dilation[1]) - 1,
                         kind,
                         out_type,
                         bias,
                         1};
  key.channels_last = g.channels_last();
  return key;
}

/// The pixels a 1x1 convolution without padding reads (x[., ., i sy, j sx]), as images of
/// g.ho x g.wo: xs [n, c, ho, wo] (or [n, ho, wo, c] for channels-last images, whose
/// pixels are copied whole).
template <class T>
void gather_strided_pixels(const cpu_context& ctx, const conv_geometry& g, const T* x, T* xs) {
  const std::size_t sy = g.p.stride[0], sx = g.p.stride[1], h = g.h, w = g.w, ho = g.ho, wo = g.wo;
  if (g.channels_last()) {
    const std::size_t c = g.c;
    parallel_for(ctx, g.n * ho, std::max<std::size_t>(1, elements_per_thread / (wo * c)),
                 [&](std::size_t r0, std::size_t r1) {
                   for (std::size_t r = r0; r < r1; ++r) {
                     const std::size_t n = r / ho, i = r % ho;
                     const T* src = x + (n * h + i * sy) * w * c;
                     T* dst = xs + r * wo * c;
                     for (std::size_t j = 0; j < wo; ++j) {
                       std::memcpy(static_cast<void*>(dst + j * c), src + j * sx * c,
                                   c * sizeof(T));
                     }
                   }
                 });
    return;
  }
  // Where sx is 2, pairs of values are read as one integer twice as wide and its low half
  // kept (little-endian), which compilers vectorise (AVX-512: VPMOVDW); the pairs stop
  // before the row's end.
  const std::size_t pairs = sx == 2 ? std::min(wo, w / 2) : 0;
  using U = std::conditional_t<sizeof(T) == 2, std::uint16_t, std::uint32_t>;
  using U2 = std::conditional_t<sizeof(T) == 2, std::uint32_t, std::uint64_t>;
  static_assert(sizeof(T) == sizeof(U) && std::endian::native == std::endian::little);
  parallel_for(ctx, g.n * g.c, std::max<std::size_t>(1, elements_per_thread / (ho * wo)),
               [&](std::size_t p0, std::size_t p1) {
                 // Sizes as locals of the loop: the stores (memcpy, which may alias anything)
                 // would otherwise have them reloaded from g or the closure every iteration,
                 // and the loop would not vectorise.
                 const std::size_t n_pairs = pairs, rows = ho, cols = wo, step = sx;
                 for (std::size_t p = p0; p < p1; ++p) {
                   for (std::size_t i = 0; i < rows; ++i) {
                     const T* src = x + (p * h + i * sy) * w;
                     T* dst = xs + (p * rows + i) * cols;
                     for (std::size_t j = 0; j < n_pairs; ++j) {
                       U2 pair;
                       std::memcpy(&pair, src + 2 * j, sizeof pair);
                       const U low = U(pair);
                       std::memcpy(static_cast<void*>(dst + j), &low, sizeof low);
                     }
                     for (std::size_t j = n_pairs; j < cols; ++j) dst[j] = src[j * step];
                   }
                 }
               });
}

/// For a strided 1x1 convolution without padding, which reads only the pixels its stride
/// lands on (a quarter of x at stride 2, as in ResNet's downsampling shortcuts): the
/// stride-1 geometry on those pixels. The forward and weight-gradient passes gather them
/// (gather_strided_pixels) and run that: the same sums, with the move to oneDNN's layout
/// and the primitive seeing only the pixels used (channels-last images too: the same
/// primitive then runs for both layouts, so they give the same bits).
inline std::optional<conv_geometry> sampled_1x1(const conv_geometry& g) {
  if (g.kh != 1 || g.kw != 1 || g.p.padding[0] != 0 || g.p.padding[1] != 0 ||
      (g.p.stride[0] == 1 && g.p.stride[1] == 1) || g.n * g.c * g.pixels() == 0) {
    return std::nullopt;
  }
  conv_geometry dense = g;
  dense.h = g.ho;
  dense.w = g.wo;
  dense.p.stride = {1, 1};
  dense.p.dilation = {1, 1};
  return dense;
}

/// Runs f(xs) with xs the pixels of x that g (see sampled_1x1) reads, gathered into a
/// buffer of the context's.
template <class T, class F>
bool with_sampled_pixels(const cpu_context& ctx, const conv_geometry& g, const T* x, F&& f) {
  static_assert(sizeof(float) % sizeof(T) == 0);
  float_buffer buf(ctx, (g.n * g.c * g.pixels() * sizeof(T) + sizeof(float) - 1) / sizeof(float));
  T* xs = reinterpret_cast<T*>(buf.get());
  gather_strided_pixels(ctx, g, x, xs);
  return f(static_cast<const T*>(xs));
}

/// g for the float copies of float16 operands (to_float; see onednn_float_operand on why the
/// copy gives float16 the float path's semantics): the weights are a new copy every call, so
/// nothing is kept for them.
inline conv_geometry float_copy_geometry(conv_geometry g) {
  g.p.weights_version = 0;
  return g;
}

/// Geometry g's forward pass through oneDNN (see onednn_conv); false where it does not run.
template <class TIn, class TY, class TBias>
bool onednn_conv_forward(const cpu_context& ctx, const conv_geometry& g, const TIn* x, const TIn* w,
                         const TBias* bias, TY* y) {
  if (const auto dense = sampled_1x1(g)) {
    if (!onednn_has_products<TIn>()) return false;  // nothing gathered for the exact kernel
    return with_sampled_pixels(
        ctx, g, x, [&](const TIn* xs) { return onednn_conv_forward(ctx, *dense, xs, w, bias, y); });
  }
  if constexpr (std::is_same_v<TIn, float16>) {
    const auto xf = to_float<false>(ctx, x, g.n * g.c * g.h * g.w);
    const auto wf = to_float<false>(ctx, w, g.co * g.taps());
    return onednn_conv_forward(ctx, float_copy_geometry(g), xf.get(), wf.get(), bias, y);
  } else {
    // oneDNN takes a float bias; another type is converted (Co values) first.
    std::vector<float> converted;
    const float* bias_f = nullptr;
    if constexpr (std::is_same_v<TBias, float>) {
      bias_f = bias;
    } else if (bias != nullptr) {
      converted.resize(g.co);
      load_block(bias, converted.data(), g.co);
      bias_f = converted.data();
    }
    constexpr bool direct = onednn_io_type_v<TY>;
    const auto key = onednn_key(g, onednn_conv_kind::forward,
                                direct ? onednn_type<TY>() : onednn_type<float>(), bias != nullptr);
    return onednn_conv(
        ctx, key, x, w, bias_f, y, direct, g.p.weights_version,
        [&](std::size_t b, std::size_t len, const float* v) { store_block(v, y + b, len); });
  }
}

/// Geometry g's backward-data pass (dy, w -> dx) through oneDNN.
template <class TIn, class TX>
bool onednn_conv_backward_data(const cpu_context& ctx, const conv_geometry& g, const TIn* dy,
                               const TIn* w, TX* dx) {
  if constexpr (std::is_same_v<TIn, float16>) {
    const auto dyf = to_float<false>(ctx, dy, g.n * g.co * g.pixels());
    const auto wf = to_float<false>(ctx, w, g.co * g.taps());
    return onednn_conv_backward_data(ctx, float_copy_geometry(g), dyf.get(), wf.get(), dx);
  } else {
    constexpr bool direct = onednn_io_type_v<TX>;
    const auto key = onednn_key(g, onednn_conv_kind::backward_data,
                                direct ? onednn_type<TX>() : onednn_type<float>(), false);
    return onednn_conv(
        ctx, key, dy, w, nullptr, dx, direct, g.p.weights_version,
        [&](std::size_t b, std::size_t len, const float* v) { store_block(v, dx + b, len); });
  }
}

/// Geometry g's backward-weights pass (x, dy -> dw) through oneDNN.
template <class TIn, class TW>
bool onednn_conv_backward_weights(const cpu_context& ctx, const conv_geometry& g, const TIn* x,
                                  const TIn* dy, TW* dw) {
  if (const auto dense = sampled_1x1(g)) {
    if (!onednn_has_products<TIn>()) return false;
    return with_sampled_pixels(ctx, g, x, [&](const TIn* xs) {
      return onednn_conv_backward_weights(ctx, *dense, xs, dy, dw);
    });
  }
  if constexpr (std::is_same_v<TIn, float16>) {
    const auto xf = to_float<false>(ctx, x, g.n * g.c * g.h * g.w);
    const auto dyf = to_float<false>(ctx, dy, g.n * g.co * g.pixels());
    return onednn_conv_backward_weights(ctx, g, xf.get(), dyf.get(), dw);
  } else {
    const auto key = onednn_key(g, onednn_conv_kind::backward_weights, onednn_type<float>(), false);
    return onednn_conv(
        ctx, key, x, dy, nullptr, dw, std::is_same_v<TW, float>, std::uint64_t(0),
        [&](std::size_t b, std::size_t len, const float* v) { store_block(v, dw + b, len); });
  }
}

/// Both backward passes of geometry g (NCHW images, hardware products) with the output
/// gradient moved to channels-last once (conv2d_backward, conv_transpose2d_backward):
///   conv2d:           dx = backward_data(g, dy, w),  dw = backward_weights(g, x, dy)
///   conv_transpose2d: dx = forward(g, dy, w),        dw = backward_weights(g, dy, x)
/// where in the second g is the convolution dy -> x. The images are transposed to NHWC
/// here, split over the context's threads, and oneDNN runs the channels-last primitives,
/// which are the ones the NCHW calls run: the same bits as the two calls. bfloat16 on AMX
/// only, whose primitives (brgconv) take NHWC: float primitives, and oneDNN's AVX-512
/// bfloat16 ones without AMX, take 16-channel blocks, which precis's transposes reach from
/// NCHW as directly as from NHWC (the separate calls are then faster). Returns false,
/// having written nothing, where either pass would not run on oneDNN (strided 1x1
/// convolutions, which gather their pixels, included); dw is then the caller's to compute,
/// and so is dx.
template <class TIn, class TDX, class TDW>
bool onednn_backward_pair(const cpu_context& ctx, const conv_geometry& g, bool transposed,
                          const TIn* x, const TIn* dy, const TIn* w, TDX* dx, TDW* dw) {
  if constexpr (!std::is_same_v<TIn, bfloat16>) {
    return false;
  } else {
    if (g.channels_last() || !onednn_has_products<TIn>() || sampled_1x1(g)) return false;
    if (onednn_isa() != dnnl::cpu_isa::avx512_core_amx) return false;
    if (g.n == 0 || g.c == 0 || g.co == 0 || g.h == 0 || g.w == 0) return false;
    conv_geometry last = g;
    last.p.layout = image_layout::nhwc;
    // In conv2d's terms: the image the weights are read against (x) and its output gradient
    // (dy), each [n, channels, pixels].
    const std::size_t x_size = g.n * g.c * g.h * g.w, y_size = g.n * g.co * g.pixels();
    const TIn* img = transposed ? dy : x;   // [n, c, h, w] in g
    const TIn* grad = transposed ? x : dy;  // [n, co, ho, wo] in g
    const scratch_values<TIn> img_l(ctx, x_size), grad_l(ctx, y_size);
    const std::size_t out_size = transposed ? y_size : x_size;  // dx's elements
    const scratch_values<TDX> dx_l(ctx, out_size);
    images_to_nhwc(ctx, img, img_l.get(), g.n, g.c, g.h * g.w);
    images_to_nhwc(ctx, grad, grad_l.get(), g.n, g.co, g.pixels());
    const bool data_ran = transposed
                              ? onednn_conv_forward(ctx, last, img_l.get(), w,
                                                    static_cast<const float*>(nullptr), dx_l.get())
                              : onednn_conv_backward_data(ctx, last, grad_l.get(), w, dx_l.get());
    if (!data_ran) return false;
    if (!onednn_conv_backward_weights(ctx, last, img_l.get(), grad_l.get(), dw)) return false;
    // dx back to NCHW: for conv2d it is x-shaped, for the transposed convolution y-shaped.
    images_to_nchw(ctx, dx_l.get(), dx, g.n, transposed ? g.co : g.c,
                   transposed ? g.pixels() : g.h * g.w);
    return true;
  }
}
#endif

}  // namespace detail

/// y = conv2d(x, w): x [N, C, H, W], w [Co, C / groups, KH, KW], y [N, Co, Ho, Wo]
/// (x [N, H, W, C] and y [N, Ho, Wo, Co] where p.layout is image_layout::nhwc).
template <Policy P, class TX, class TW, class TY>
void conv2d(const cpu_context& ctx, const host_tensor<TX, 4>& x, const host_tensor<TW, 4>& w,
            host_tensor<TY, 4>& y, const conv2d_params& p = {}) {
  detail::check_conv_types<P, TX, TW, TY>();
  const auto g = detail::conv_geometry_of("precis::conv2d", x, w, p);
  check_shape("precis::conv2d: y", y, g.y_shape());
#if PRECIS_HAS_ONEDNN
  if constexpr (detail::hardware_conv_v<P, TX, TW>) {
    if (detail::onednn_conv_forward(ctx, g, x.data(), w.data(), static_cast<const float*>(nullptr),
                                    y.data())) {
      return;
    }
  }
#endif
  detail::exact_conv_forward<P>(ctx, g, x.data(), w.data(), static_cast<const TY*>(nullptr),
                                y.data());
}

/// As conv2d, plus bias [Co] added to every pixel of its channel before the one rounding.
template <Policy P, class TX, class TW, class TBias, class TY>
void conv2d(const cpu_context& ctx, const host_tensor<TX, 4>& x, const host_tensor<TW, 4>& w,
            const host_tensor<TBias, 1>& bias, host_tensor<TY, 4>& y, const conv2d_params& p = {}) {
  detail::check_conv_types<P, TX, TW, TY>();
  const auto g = detail::conv_geometry_of("precis::conv2d", x, w, p);
  check_shape("precis::conv2d: bias", bias, detail::dims<1>({g.co}));
  check_shape("precis::conv2d: y", y, g.y_shape());
#if PRECIS_HAS_ONEDNN
  if constexpr (detail::hardware_conv_v<P, TX, TW>) {
    if (detail::onednn_conv_forward(ctx, g, x.data(), w.data(), bias.data(), y.data())) return;
  }
#endif
  detail::exact_conv_forward<P>(ctx, g, x.data(), w.data(), bias.data(), y.data());
}

/// dx = dL/dx of y = conv2d(x, w) from dy (x's shape is dx's shape; both in p.layout).
template <Policy P, class TG, class TW, class TX>
void conv2d_backward_data(const cpu_context& ctx, const host_tensor<TG, 4>& dy,
                          const host_tensor<TW, 4>& w, host_tensor<TX, 4>& dx,
                          const conv2d_params& p = {}) {
  detail::check_conv_types<P, TG, TW, TX>();
  const auto g = detail::conv_geometry_of("precis::conv2d_backward_data", dx, w, p);
  check_shape("precis::conv2d_backward_data: dy", dy, g.y_shape());
#if PRECIS_HAS_ONEDNN
  if constexpr (detail::hardware_conv_v<P, TG, TW>) {
    if (detail::onednn_conv_backward_data(ctx, g, dy.data(), w.data(), dx.data())) return;
  }
#endif
  detail::exact_conv_backward_data<P>(ctx, g, dy.data(), w.data(), dx.data());
}

/// dw = dL/dw of y = conv2d(x, w) from x and dy, summed over the batch in float.
template <Policy P, class TX, class TG, class TW>
void conv2d_backward_weights(const cpu_context& ctx, const host_tensor<TX, 4>& x,
                             const host_tensor<TG, 4>& dy, host_tensor<TW, 4>& dw,
                             const conv2d_params& p = {}) {
  detail::check_conv_types<P, TX, TG, TW>();
  const auto g = detail::conv_geometry_of("precis::conv2d_backward_weights", x, dw, p);
  check_shape("precis::conv2d_backward_weights: dy", dy, g.y_shape());
#if PRECIS_HAS_ONEDNN
  if constexpr (detail::hardware_conv_v<P, TX, TG>) {
    if (detail::onednn_conv_backward_weights(ctx, g, x.data(), dy.data(), dw.data())) return;
  }
#endif
  detail::exact_conv_backward_weights<P>(ctx, g, x.data(), dy.data(), dw.data());
}

/// dx and dw of y = conv2d(x, w) from dy in one call: conv2d_backward_data's dx and
/// conv2d_backward_weights's dw, the same bits. Where bfloat16 hardware products run on AMX
/// with NCHW images, dy and x go to oneDNN's channels-last layout once for both passes
/// (separately, dy is moved twice). Every shape is checked before anything is written.
template <Policy P, class TX, class TG, class TW, class TDX, class TDW>
void conv2d_backward(const cpu_context& ctx, const host_tensor<TX, 4>& x,
                     const host_tensor<TG, 4>& dy, const host_tensor<TW, 4>& w,
                     host_tensor<TDX, 4>& dx, host_tensor<TDW, 4>& dw,
                     const conv2d_params& p = {}) {
  detail::check_conv_types<P, TG, TW, TDX>();
  detail::check_conv_types<P, TX, TG, TDW>();
  const auto g = detail::conv_geometry_of("precis::conv2d_backward", x, w, p);
  check_shape("precis::conv2d_backward: dy", dy, g.y_shape());
  check_shape("precis::conv2d_backward: dx", dx, g.x_shape());
  check_shape("precis::conv2d_backward: dw", dw, detail::shape_array<4>(w));
#if PRECIS_HAS_ONEDNN
  if constexpr (std::is_same_v<TX, TG> && std::is_same_v<TG, TW> &&
                detail::hardware_conv_v<P, TG, TW>) {
    if (detail::onednn_backward_pair(ctx, g, false, x.data(), dy.data(), w.data(), dx.data(),
                                     dw.data())) {
      return;
    }
  }
#endif
  conv2d_backward_data<P>(ctx, dy, w, dx, p);
  conv2d_backward_weights<P>(ctx, x, dy, dw, p);
}

/// db = dL/dbias of y = conv2d(x, w, bias) from dy [N, Co, Ho, Wo] ([N, Ho, Wo, Co] for
/// `layout` nhwc): per channel, the sum over images and then pixels, in that order, in the
/// accumulate type of op::reduction under P (as precis::sum), rounded once to TB; the same
/// bits in either layout. (gemm's bias gradient is `sum<P>(ctx, dc, 0, db)`.)
template <Policy P, kernel_element TG, kernel_element TB>
void conv2d_backward_bias(const cpu_context& ctx, const host_tensor<TG, 4>& dy,
                          host_tensor<TB, 1>& db, image_layout layout = image_layout::nchw) {
  const bool last = layout == image_layout::nhwc;
  const std::size_t n = std::size_t(dy.shape()[0]), co = std::size_t(dy.shape()[last ? 3 : 1]);
  const std::size_t pixels = last ? std::size_t(dy.shape()[1]) * std::size_t(dy.shape()[2])
                                  : std::size_t(dy.shape()[2]) * std::size_t(dy.shape()[3]);
  check_shape("precis::conv2d_backward_bias: db", db, detail::dims<1>({co}));
  using M = detail::math_t<op::reduction, P, TG>;
  using Acc = detail::accumulate_t<op::reduction, P>;
  // A channel's values: one plane per image (NCHW), or every co-th value (NHWC).
  const std::size_t image = co * pixels, step = last ? co : 1, plane_at = last ? 1 : pixels;
  detail::for_rows(ctx, co, n * pixels, [&](std::size_t b, std::size_t e) {
    std::array<M, detail::block_size> buf;
    std::array<TG, detail::block_size> gathered;
    for (std::size_t c = b; c < e; ++c) {
      accumulator<Acc> acc;
      for (std::size_t i = 0; i < n; ++i) {
        const TG* plane = dy.data() + i * image + c * plane_at;
        for (std::size_t q = 0; q < pixels; q += detail::block_size) {
          const std::size_t len = std::min(detail::block_size, pixels - q);
          const TG* src = plane + q;
          if (step != 1) {
            for (std::size_t k = 0; k < len; ++k) gathered[k] = plane[(q + k) * step];
            src = gathered.data();
          }
          detail::load_block(src, buf.data(), len);
          for (std::size_t k = 0; k < len; ++k) detail::accumulate(acc, buf[k]);
        }
      }
      db.data()[c] = round_to<TB>(acc.value());
    }
  });
}

namespace detail {

/// The parameters of the convolution a transposed convolution is the adjoint of: the same,
/// without output_padding (the extra output rows are inputs the convolution's last stride
/// step does not reach, which the input size already says).
inline conv2d_params adjoint_params(conv2d_params p) {
  p.output_padding = {0, 0};
  return p;
}

/// The geometry of the convolution y -> x that the transposed convolution x -> y (with w,
/// p) is the adjoint of. Checks x, w, p and y's shape; throws precis::error naming shapes.
template <class X, class W, class Y>
conv_geometry transpose_geometry(std::string_view what, const X& x, const W& w, const Y& y,
                                 const conv2d_params& p) {
  const std::string name(what);
  check_argument(p.groups >= 1 && p.stride[0] >= 1 && p.stride[1] >= 1 && p.dilation[0] >= 1 &&
                     p.dilation[1] >= 1,
                 name + ":", "stride, dilation and groups must be at least 1");
  const bool last = p.layout == image_layout::nhwc;
  const std::size_t n = std::size_t(x.shape()[0]), ci = std::size_t(x.shape()[last ? 3 : 1]);
  const std::size_t xh = std::size_t(x.shape()[last ? 1 : 2]);
  const std::size_t xw = std::size_t(x.shape()[last ? 2 : 3]);
  const std::size_t kh = std::size_t(w.shape()[2]), kw = std::size_t(w.shape()[3]);
  check_shape(name + ": w", w, dims<4>({ci, std::size_t(w.shape()[1]), kh, kw}));
  const std::size_t co = std::size_t(w.shape()[1]) * p.groups;
  // Below the stride, the extra rows are ones the adjoint convolution's last step does not
  // reach, so it maps y back to x's size and the backward passes are that convolution.
  // (PyTorch also allows output_padding up to the dilation; then the adjoint would have
  // more outputs than x has rows.)
  for (std::size_t a = 0; a < 2; ++a) {
    if (p.output_padding[a] >= p.stride[a]) {
      throw error(name + ": output_padding " + std::to_string(p.output_padding[a]) +
                  " must be less than the stride (" + std::to_string(p.stride[a]) + ")");
    }
  }
  const auto out = [&](std::size_t in, std::size_t k, std::size_t a) {
    const std::size_t full =
        (in - 1) * p.stride[a] + p.dilation[a] * (k - 1) + 1 + p.output_padding[a];
    if (in == 0 || k == 0 || full <= 2 * p.padding[a]) {
      throw error(name + ": padding leaves no output for input " + shape_string(x.shape()) +
                  " and kernel " + shape_string(w.shape()));
    }
    return full - 2 * p.padding[a];
  };
  const std::size_t ho = out(xh, kh, 0);
  const std::size_t wo = out(xw, kw, 1);
  check_shape(name + ": y", y, image_shape(p.layout, n, co, ho, wo));
  // The forward convolution this is the adjoint of: y (co channels) -> x (ci channels).
  conv_geometry g{};
  g.n = n;
  g.c = co;
  g.h = ho;
  g.w = wo;
  g.co = ci;
  g.kh = kh;
  g.kw = kw;
  g.groups = p.groups;
  g.p = adjoint_params(p);
  g.ho = xh;
  g.wo = xw;
  if (ci % p.groups != 0) {
    throw error(name + ": groups = " + std::to_string(p.groups) + " must divide the channels " +
                std::to_string(ci) + " of x " + shape_string(x.shape()));
  }
  return g;
}

}  // namespace detail

/// Transposed convolution (PyTorch's ConvTranspose2d): x [N, Ci, H, W], w [Ci, Co / groups,
/// KH, KW], y [N, Co, Ho, Wo] with Ho = (H - 1) stride - 2 pad + dilation (KH - 1) + 1 +
/// output_padding (x [N, H, W, Ci] and y [N, Ho, Wo, Co] where p.layout is nhwc). It is the
/// backward-data of the convolution y -> x with weight w, so it shares that code and its
/// semantics.
template <Policy P, class TX, class TW, class TY>
void conv_transpose2d(const cpu_context& ctx, const host_tensor<TX, 4>& x,
                      const host_tensor<TW, 4>& w, host_tensor<TY, 4>& y,
                      const conv2d_params& p = {}) {
  detail::check_conv_types<P, TX, TW, TY>();
  const auto g = detail::transpose_geometry("precis::conv_transpose2d", x, w, y, p);
#if PRECIS_HAS_ONEDNN
  if constexpr (detail::hardware_conv_v<P, TX, TW>) {
    if (detail::onednn_conv_backward_data(ctx, g, x.data(), w.data(), y.data())) return;
  }
#endif
  detail::exact_conv_backward_data<P>(ctx, g, x.data(), w.data(), y.data());
}

/// dx of y = conv_transpose2d(x, w) (same `p`, output_padding included): the forward
/// convolution of dy with w.
template <Policy P, class TG, class TW, class TX>
void conv_transpose2d_backward_data(const cpu_context& ctx, const host_tensor<TG, 4>& dy,
                                    const host_tensor<TW, 4>& w, host_tensor<TX, 4>& dx,
                                    const conv2d_params& p = {}) {
  conv2d<P>(ctx, dy, w, dx, detail::adjoint_params(p));
}

/// dx and dw of y = conv_transpose2d(x, w) (same `p`) in one call:
/// conv_transpose2d_backward_data's dx and conv_transpose2d_backward_weights's dw, the same
/// bits (moving dy and x to oneDNN's layout once for both where conv2d_backward does). Every shape is checked before anything is written.
template <Policy P, class TX, class TG, class TW, class TDX, class TDW>
void conv_transpose2d_backward(const cpu_context& ctx, const host_tensor<TX, 4>& x,
                               const host_tensor<TG, 4>& dy, const host_tensor<TW, 4>& w,
                               host_tensor<TDX, 4>& dx, host_tensor<TDW, 4>& dw,
                               const conv2d_params& p = {}) {
  detail::check_conv_types<P, TG, TW, TDX>();
  detail::check_conv_types<P, TG, TX, TDW>();
  // The convolution dy -> x (transpose_geometry checks x, w, p and dy's shape).
  [[maybe_unused]] const auto g =
      detail::transpose_geometry("precis::conv_transpose2d_backward", x, w, dy, p);
  check_shape("precis::conv_transpose2d_backward: dx", dx, detail::shape_array<4>(x));
  check_shape("precis::conv_transpose2d_backward: dw", dw, detail::shape_array<4>(w));
#if PRECIS_HAS_ONEDNN
  if constexpr (std::is_same_v<TX, TG> && std::is_same_v<TG, TW> &&
                detail::hardware_conv_v<P, TG, TW>) {
    if (detail::onednn_backward_pair(ctx, g, true, x.data(), dy.data(), w.data(), dx.data(),
                                     dw.data())) {
      return;
    }
  }
#endif
  conv_transpose2d_backward_data<P>(ctx, dy, w, dx, p);
  conv_transpose2d_backward_weights<P>(ctx, x, dy, dw, p);
}

/// dw of y = conv_transpose2d(x, w) (same `p`): the weight gradient of the convolution
/// dy -> x.
template <Policy P, class TX, class TG, class TW>
void conv_transpose2d_backward_weights(const cpu_context& ctx, const host_tensor<TX, 4>& x,
                                       const host_tensor<TG, 4>& dy, host_tensor<TW, 4>& dw,
                                       const conv2d_params& p = {}) {
  conv2d_backward_weights<P>(ctx, dy, x, dw, detail::adjoint_params(p));
}

}  // namespace precis
