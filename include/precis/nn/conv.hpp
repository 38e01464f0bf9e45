// precis/nn/conv.hpp: 2-D convolution and transposed convolution layers on [N, C, H, W].
//
//     nn::conv2d<stem>(3, 64, 7, {.stride = {2, 2}, .padding = {3, 3}}, nn::no_bias)
//     nn::conv2d(64, 64, 3, {.padding = {1, 1}, .groups = 64})   // depthwise, tags::conv2d
//     nn::conv_transpose2d<up>(64, 32, 2, {.stride = {2, 2}})    // doubles H and W
//
// Both run under their tags' policies resolved for op::conv, through kernels/conv.hpp:
// products exact in float, sums in float, each output rounded once; the bias is added to
// the float sum before that rounding (conv_transpose2d has no fused-bias kernel, so its
// sums are kept in float and the bias added there). Backward: dx, dW and db each rounded
// once to the gradient type and added to the float gradients.
//
// The kernels take only float math with float sums; policies with double math (float64
// gradient checks) or an unsafe narrower accumulator run direct loops here instead, with
// the same rounding points: products and sums in the policy's math and accumulate types,
// each output rounded once. Every output element is one sum in a fixed order, so results
// do not depend on the thread count on either path. On a device context (precis/nn/cuda.hpp)
// the layers call the device kernels of the same names; there they take no bias yet.
//
// Layouts are PyTorch's: conv2d's weight is [out, in / groups, kh, kw], conv_transpose2d's
// [in, out / groups, kh, kw]. Parameters start uniform in +-1/sqrt(fan_in), with fan_in =
// weight.shape[1] * kh * kw as PyTorch computes it (for the transposed layer that is
// out / groups * kh * kw).
#pragma once

#include <precis/kernels/conv.hpp>
#include <precis/nn/module.hpp>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

namespace precis::nn {

template <Layer Tag, Policy P, class Ctx>
class conv2d_layer;
template <Layer Tag, Policy P, class Ctx>
class conv_transpose2d_layer;

namespace detail {

/// The layer L, built only on rank-4 tensors: nn::build reports any other rank here.
template <std::size_t R, class L>
struct conv_on_images {
  static_assert(R == 4,
                "precis: nn::conv2d and nn::conv_transpose2d take [N, C, H, W] tensors (rank 4); "
                "build with nn::build<T, 4>, or reshape to rank 4 before the layer");
  using type = L;
};

}  // namespace detail

/// Blueprint of a 2-D convolution (see nn::conv2d).
template <Layer Tag>
struct conv2d_spec {
  std::size_t in, out;
  std::array<std::size_t, 2> kernel;
  conv2d_params params{};
  bias_mode bias = with_bias;

  template <class Map, class Ctx, class In, class G, std::size_t R>
  using module_type =
      typename detail::conv_on_images<R, conv2d_layer<Tag, policy_for_t<Tag, Map>, Ctx>>::type;
};

/// Blueprint of a 2-D transposed convolution (see nn::conv_transpose2d).
template <Layer Tag>
struct conv_transpose2d_spec {
  std::size_t in, out;
  std::array<std::size_t, 2> kernel;
  conv2d_params params{};
  bias_mode bias = with_bias;

  template <class Map, class Ctx, class In, class G, std::size_t R>
  using module_type = typename detail::conv_on_images<
      R, conv_transpose2d_layer<Tag, policy_for_t<Tag, Map>, Ctx>>::type;
};

/// A convolution with tag `Tag` from `in` to `out` channels with a square kernel (a
/// blueprint node). `params`: stride, padding, dilation, groups (PyTorch's Conv2d).
template <Layer Tag = tags::conv2d>
constexpr conv2d_spec<Tag> conv2d(std::size_t in, std::size_t out, std::size_t kernel,
                                  conv2d_params params = {}, bias_mode bias = with_bias) {
  return {in, out, {kernel, kernel}, params, bias};
}
/// As above with a kernel of {kh, kw}.
template <Layer Tag = tags::conv2d>
constexpr conv2d_spec<Tag> conv2d(std::size_t in, std::size_t out,
                                  std::array<std::size_t, 2> kernel, conv2d_params params = {},
                                  bias_mode bias = with_bias) {
  return {in, out, kernel, params, bias};
}

/// A transposed convolution with tag `Tag` from `in` to `out` channels with a square kernel
/// (a blueprint node). `params` as PyTorch's ConvTranspose2d, output_padding included (less
/// than the stride).
template <Layer Tag = tags::conv_transpose2d>
constexpr conv_transpose2d_spec<Tag> conv_transpose2d(std::size_t in, std::size_t out,
                                                      std::size_t kernel, conv2d_params params = {},
                                                      bias_mode bias = with_bias) {
  return {in, out, {kernel, kernel}, params, bias};
}
/// As above with a kernel of {kh, kw}.
template <Layer Tag = tags::conv_transpose2d>
constexpr conv_transpose2d_spec<Tag> conv_transpose2d(std::size_t in, std::size_t out,
                                                      std::array<std::size_t, 2> kernel,
                                                      conv2d_params params = {},
                                                      bias_mode bias = with_bias) {
  return {in, out, kernel, params, bias};
}

namespace detail {

/// True when kernels/conv.hpp takes P for storage S and gradients G (float math, float
/// sums); otherwise the layers run the direct loops below.
template <Policy P, class S, class G>
inline constexpr bool conv_kernels_take_v = (precis::detail::float_engine_v<op::conv, P, S, S> &&
                                             precis::detail::float_engine_v<op::conv, P, G, S>);

/// Extent of a convolution's kernel along axis a, dilation included.
inline std::size_t kernel_span(const std::array<std::size_t, 2>& k, const conv2d_params& p,
                               std::size_t a) {
  return p.dilation[a] * (k[a] - 1) + 1;
}

/// Output size of a convolution along axis a for input size `in`; 0 when nothing fits.
inline std::size_t conv_out(std::size_t in, const std::array<std::size_t, 2>& k,
                            const conv2d_params& p, std::size_t a) {
  const std::size_t span = kernel_span(k, p, a), padded = in + 2 * p.padding[a];
  return in == 0 || padded < span ? 0 : (padded - span) / p.stride[a] + 1;
}
/// The smallest input size a convolution takes along axis a.
inline std::size_t conv_min_in(const std::array<std::size_t, 2>& k, const conv2d_params& p,
                               std::size_t a) {
  const std::size_t span = kernel_span(k, p, a);
  return span > 2 * p.padding[a] + 1 ? span - 2 * p.padding[a] : 1;
}

/// Output size of a transposed convolution along axis a; 0 when the padding leaves none.
inline std::size_t transpose_out(std::size_t in, const std::array<std::size_t, 2>& k,
                                 const conv2d_params& p, std::size_t a) {
  if (in == 0) return 0;
  const std::size_t full = (in - 1) * p.stride[a] + kernel_span(k, p, a) + p.output_padding[a];
  return full <= 2 * p.padding[a] ? 0 : full - 2 * p.padding[a];
}
/// The smallest input size a transposed convolution takes along axis a.
inline std::size_t transpose_min_in(const std::array<std::size_t, 2>& k, const conv2d_params& p,
                                    std::size_t a) {
  const std::size_t reach = kernel_span(k, p, a) + p.output_padding[a], pad = 2 * p.padding[a];
  return reach > pad ? 1 : (pad - reach) / p.stride[a] + 2;
}

/// "[N > 0, 3, H >= 5, W >= 5]": the inputs a spatial layer takes.
inline std::string image_shape_string(const std::string& channels, std::size_t min_h,
                                      std::size_t min_w) {
  return "[N > 0, " + channels + ", H >= " + std::to_string(min_h) +
         ", W >= " + std::to_string(min_w) + "]";
}

/// "3x3 s2 p1 d2 g4 op1": a convolution's geometry for describe, defaults left out.
inline std::string conv_geometry_string(const std::array<std::size_t, 2>& k,
                                        const conv2d_params& p) {
  const auto pair = [](const std::array<std::size_t, 2>& v) {
    return v[0] == v[1] ? std::to_string(v[0]) : std::to_string(v[0]) + "x" + std::to_string(v[1]);
  };
  std::string s = std::to_string(k[0]) + "x" + std::to_string(k[1]);
  if (p.stride != std::array<std::size_t, 2>{1, 1}) s += " s" + pair(p.stride);
  if (p.padding != std::array<std::size_t, 2>{0, 0}) s += " p" + pair(p.padding);
  if (p.dilation != std::array<std::size_t, 2>{1, 1}) s += " d" + pair(p.dilation);
  if (p.groups != 1) s += " g" + std::to_string(p.groups);
  if (p.output_padding != std::array<std::size_t, 2>{0, 0}) s += " op" + pair(p.output_padding);
  return s;
}

/// Refuses, naming the layer, what the kernels would refuse on every call.
inline void check_conv_arguments(std::string_view layer, std::size_t in, std::size_t out,
                                 const std::array<std::size_t, 2>& k, const conv2d_params& p) {
  const std::string n = "precis::nn::" + std::string(layer) + ": ";
  if (in == 0 || out == 0 || k[0] == 0 || k[1] == 0) {
    throw error(n + "needs in > 0, out > 0 and a kernel of at least 1x1");
  }
  if (p.groups == 0 || p.stride[0] == 0 || p.stride[1] == 0 || p.dilation[0] == 0 ||
      p.dilation[1] == 0) {
    throw error(n + "stride, dilation and groups must be at least 1");
  }
  if (in % p.groups != 0 || out % p.groups != 0) {
    throw error(n + "groups = " + std::to_string(p.groups) + " must divide the input channels (" +
                std::to_string(in) + ") and the output channels (" + std::to_string(out) + ")");
  }
}

// Direct loops over a kernels/conv.hpp geometry g (x [n, c, h, w], w [co, c / groups, kh, kw],
// y [n, co, ho, wo]) for the policies the kernels do not take. Each output element is one
// running sum in accumulate_t<op::conv, P> of products in math_t<op::conv, P>, rounded once.

/// y = conv(x, w) (+ bias, added to the sum before the rounding; bias may be nullptr).
template <Policy P, class TX, class TW, class TB, class TY>
void direct_conv_forward(const cpu_context& ctx, const precis::detail::conv_geometry& g,
                         const TX* x, const TW* w, const TB* bias, TY* y) {
  using M = precis::detail::math_t<op::conv, P, TX, TW>;
  using Acc = precis::detail::accumulate_t<op::conv, P>;
  const std::size_t cg = g.cg(), cog = g.cog(), pixels = g.pixels(), hw = g.h * g.w;
  precis::detail::for_rows(ctx, g.n * g.co, pixels * g.taps(), [&](std::size_t b, std::size_t e) {
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
                precis::detail::accumulate(
                    acc, precis::detail::load<M>(
                             xg[c * hw + (iy - g.p.padding[0]) * g.w + ix - g.p.padding[1]]) *
                             precis::detail::load<M>(wo[(c * g.kh + ky) * g.kw + kx]));
              }
            }
          }
          M v = static_cast<M>(acc.value());
          if (bias != nullptr) v += precis::detail::load<M>(bias[o]);
          y[plane * pixels + oy * g.wo + ox] = round_to<TY>(v);
        }
      }
    }
  });
}

/// dx of y = conv(x, w) from dy, each element gathered from the outputs it fed (+ bias per
/// channel of dx: the transposed convolution is this pass; bias may be nullptr).
template <Policy P, class TG, class TW, class TB, class TX>
void direct_conv_backward_data(const cpu_context& ctx, const precis::detail::conv_geometry& g,
                               const TG* dy, const TW* w, const TB* bias, TX* dx) {
  using M = precis::detail::math_t<op::conv, P, TG, TW>;
  using Acc = precis::detail::accumulate_t<op::conv, P>;
  const std::size_t cg = g.cg(), cog = g.cog(), pixels = g.pixels(), hw = g.h * g.w;
  precis::detail::for_rows(
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
                    precis::detail::accumulate(acc,
                                               precis::detail::load<M>(dyo[oy * g.wo + ox]) *
                                                   precis::detail::load<M>(wo[ky * g.kw + kx]));
                  }
                }
              }
              M v = static_cast<M>(acc.value());
              if (bias != nullptr) v += precis::detail::load<M>(bias[ch]);
              dx[plane * hw + iy * g.w + ix] = round_to<TX>(v);
            }
          }
        }
      });
}

/// dw of y = conv(x, w) from x and dy: each weight one sum over images and output pixels.
template <Policy P, class TX, class TG, class TW>
void direct_conv_backward_weights(const cpu_context& ctx, const precis::detail::conv_geometry& g,
                                  const TX* x, const TG* dy, TW* dw) {
  using M = precis::detail::math_t<op::conv, P, TX, TG>;
  using Acc = precis::detail::accumulate_t<op::conv, P>;
  const std::size_t cg = g.cg(), cog = g.cog(), pixels = g.pixels(), hw = g.h * g.w;
  const std::size_t taps = g.taps();
  precis::detail::for_rows(ctx, g.co * taps, g.n * pixels, [&](std::size_t b, std::size_t e) {
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
            precis::detail::accumulate(
                acc,
                precis::detail::load<M>(dyo[oy * g.wo + ox]) *
                    precis::detail::load<M>(xc[(iy - g.p.padding[0]) * g.w + ix - g.p.padding[1]]));
          }
        }
      }
      dw[idx] = round_to<TW>(static_cast<M>(acc.value()));
    }
  });
}

/// What both convolution layers share: the weight and optional bias, their gradients, the
/// output and input-gradient buffers, initialisation, decay and checkpoint rules.
template <Layer Tag, Policy P, class Ctx>
class conv_base : public layer_base<Tag, P, op::conv, 4, 4, Ctx> {
  using base = layer_base<Tag, P, op::conv, 4, 4, Ctx>;

 protected:
  using S = typename base::input_type;
  using G = typename base::input_grad_type;
  using M = typename base::master_type;
  template <class T, std::size_t N = 4>
  using tensor = tensor_t<Ctx, T, N>;
  static constexpr bool on_host = std::is_same_v<Ctx, cpu_context>;
  /// Whether the kernels run this layer (always off the host), else the direct loops.
  static constexpr bool kernels = !on_host || conv_kernels_take_v<P, S, G>;

  conv_base(std::string_view layer, std::size_t in, std::size_t out,
            const std::array<std::size_t, 2>& kernel, const conv2d_params& p, bias_mode bias,
            const shape_t<4>& weight_shape)
      : in_(in),
        out_(out),
        kernel_(kernel),
        params_(p),
        bias_on_(bias == with_bias),
        fan_in_(weight_shape[1] * kernel[0] * kernel[1]),
        weight_(weight_shape),
        bias_({bias_on_ ? out : 0}) {
    // The device kernels have neither a fused bias nor its gradient.
    if (!on_host && bias_on_) {
      throw error("precis::nn::" + std::string(layer) + ": off the host a convolution takes no " +
                  "bias yet; build it with nn::no_bias (a batch norm after it gives the shift)");
    }
  }

  /// Adds dw (the caller's) and, with a bias, db from dy to the parameters' gradients.
  void accumulate_parameters(context_ref_t<Ctx> ctx, const tensor<G>& dy) {
    weight_.accumulate(ctx, dw_);
    if constexpr (on_host) {
      if (bias_on_) {
        ensure(db_, shape_t<1>{out_});
        precis::conv2d_backward_bias<P>(ctx, dy, db_);
        bias_.accumulate(ctx, db_);
      }
    }
  }
  std::string describe_shape() const {
    return std::to_string(in_) + "->" + std::to_string(out_) + " " +
           conv_geometry_string(kernel_, params_) + (bias_on_ ? "" : " no bias");
  }
  std::size_t buffer_bytes() const {
    return bytes_of(y_) + bytes_of(dx_) + bytes_of(dw_) + bytes_of(db_);
  }

 public:
  /// Draws weight and bias uniform in +-1/sqrt(fan_in), fan_in = weight.shape[1] * kh * kw.
  void reset(std::uint64_t seed) {
    const double bound = 1.0 / std::sqrt(double(fan_in_));
    fill_uniform(weight_, seed, 0, bound);
    fill_uniform(bias_, seed, 1, bound);
  }

  parameter<S, M, 4, Ctx>& weight() { return weight_; }
  parameter<S, M, 1, Ctx>& bias() { return bias_; }
  template <class Self, class F>
  static void for_each_parameter(Self& self, F&& f) {
    f("weight", self.weight_);
    if (self.bias_on_) f("bias", self.bias_);
  }
  /// Weight decay applies to the weight, not the bias.
  static constexpr bool decays(std::string_view parameter) { return parameter == "weight"; }
  template <class Archive>
  void visit_state(Archive& a, const std::string& prefix) {
    visit_parameters(a, prefix, *this);
  }
  std::string validate() const { return parameter_problems(*this); }

 protected:
  std::size_t in_, out_;
  std::array<std::size_t, 2> kernel_;
  conv2d_params params_;
  bool bias_on_;
  std::size_t fan_in_;
  parameter<S, M, 4, Ctx> weight_;
  parameter<S, M, 1, Ctx> bias_;
  tensor<S> y_;
  tensor<G> dx_;
  tensor<G> dw_;
  tensor<G, 1> db_;
  saved<tensor<S>> x_;
};

}  // namespace detail

/// The 2-D convolution built for tag Tag under the resolved policy P: x [N, in, H, W] ->
/// y [N, out, Ho, Wo], Ho = (H + 2 pad - dilation (kh - 1) - 1) / stride + 1.
template <Layer Tag, Policy P, class Ctx>
class conv2d_layer : public detail::conv_base<Tag, P, Ctx> {
  using base = detail::conv_base<Tag, P, Ctx>;
  using typename base::G;
  using typename base::S;
  template <class T, std::size_t N = 4>
  using tensor = tensor_t<Ctx, T, N>;

 public:
  static constexpr std::string_view kind = "conv2d";

  explicit conv2d_layer(const conv2d_spec<Tag>& s)
      : base(kind, s.in, s.out, s.kernel, s.params, s.bias,
             weight_shape(s.in, s.out, s.kernel, s.params)) {}

  shape_t<4> output_shape(const shape_t<4>& in, std::string_view path) const {
    const std::size_t ho = detail::conv_out(in[2], this->kernel_, this->params_, 0);
    const std::size_t wo = detail::conv_out(in[3], this->kernel_, this->params_, 1);
    if (in[0] == 0 || in[1] != this->in_ || ho == 0 || wo == 0) {
      detail::bad_shape(
          path, kind,
          detail::image_shape_string(std::to_string(this->in_),
                                     detail::conv_min_in(this->kernel_, this->params_, 0),
                                     detail::conv_min_in(this->kernel_, this->params_, 1)),
          shape_string(in));
    }
    return {in[0], this->out_, ho, wo};
  }

  const tensor<S>& forward(context_ref_t<Ctx> ctx, const tensor<S>& x, mode = mode::train) {
    detail::ensure(this->y_, output_shape(detail::shape_of<4>(x), path_name<Tag>()));
    const auto& w = this->weight_.value();
    if constexpr (!base::on_host) {
      precis::conv2d<P>(ctx, x, w, this->y_, this->params_);
    } else if constexpr (base::kernels) {
      if (this->bias_on_) {
        precis::conv2d<P>(ctx, x, w, this->bias_.value(), this->y_, this->params_);
      } else {
        precis::conv2d<P>(ctx, x, w, this->y_, this->params_);
      }
    } else {
      const auto g = precis::detail::conv_geometry_of("precis::nn::conv2d", x, w, this->params_);
      const S* bias = this->bias_on_ ? this->bias_.value().data() : nullptr;
      detail::direct_conv_forward<P>(ctx, g, x.data(), w.data(), bias, this->y_.data());
    }
    this->x_.set(x);
    return this->y_;
  }

  const tensor<G>& backward(context_ref_t<Ctx> ctx, const tensor<G>& dy) {
    const auto& x = this->x_.get(kind);
    check_same_shape("precis::nn::conv2d: dy and the output", dy, this->y_);
    const auto& w = this->weight_.value();
    detail::ensure(this->dx_, detail::shape_of<4>(x));
    detail::ensure(this->dw_, detail::shape_of<4>(w));
    if constexpr (base::kernels) {
      precis::conv2d_backward_data<P>(ctx, dy, w, this->dx_, this->params_);
      precis::conv2d_backward_weights<P>(ctx, x, dy, this->dw_, this->params_);
    } else {
      const auto g = precis::detail::conv_geometry_of("precis::nn::conv2d", x, w, this->params_);
      detail::direct_conv_backward_data<P>(ctx, g, dy.data(), w.data(),
                                           static_cast<const S*>(nullptr), this->dx_.data());
      detail::direct_conv_backward_weights<P>(ctx, g, x.data(), dy.data(), this->dw_.data());
    }
    this->accumulate_parameters(ctx, dy);
    return this->dx_;
  }

  std::string shape() const { return this->describe_shape(); }
  std::size_t own_bytes() const { return this->buffer_bytes(); }

 private:
  static shape_t<4> weight_shape(std::size_t in, std::size_t out,
                                 const std::array<std::size_t, 2>& k, const conv2d_params& p) {
    detail::check_conv_arguments(kind, in, out, k, p);
    if (p.output_padding != std::array<std::size_t, 2>{0, 0}) {
      throw error("precis::nn::conv2d: output_padding belongs to nn::conv_transpose2d");
    }
    return {out, in / p.groups, k[0], k[1]};
  }
};

/// The 2-D transposed convolution built for tag Tag under the resolved policy P: x [N, in,
/// H, W] -> y [N, out, Ho, Wo], Ho = (H - 1) stride - 2 pad + dilation (kh - 1) + 1 +
/// output_padding. It is the adjoint of a conv2d from out to in channels with this weight.
template <Layer Tag, Policy P, class Ctx>
class conv_transpose2d_layer : public detail::conv_base<Tag, P, Ctx> {
  using base = detail::conv_base<Tag, P, Ctx>;
  using typename base::G;
  using typename base::S;
  template <class T, std::size_t N = 4>
  using tensor = tensor_t<Ctx, T, N>;

 public:
  static constexpr std::string_view kind = "conv_transpose2d";

  explicit conv_transpose2d_layer(const conv_transpose2d_spec<Tag>& s)
      : base(kind, s.in, s.out, s.kernel, s.params, s.bias,
             weight_shape(s.in, s.out, s.kernel, s.params)) {}

  shape_t<4> output_shape(const shape_t<4>& in, std::string_view path) const {
    const std::size_t ho = detail::transpose_out(in[2], this->kernel_, this->params_, 0);
    const std::size_t wo = detail::transpose_out(in[3], this->kernel_, this->params_, 1);
    if (in[0] == 0 || in[1] != this->in_ || ho == 0 || wo == 0) {
      detail::bad_shape(
          path, kind,
          detail::image_shape_string(std::to_string(this->in_),
                                     detail::transpose_min_in(this->kernel_, this->params_, 0),
                                     detail::transpose_min_in(this->kernel_, this->params_, 1)),
          shape_string(in));
    }
    return {in[0], this->out_, ho, wo};
  }

  const tensor<S>& forward(context_ref_t<Ctx> ctx, const tensor<S>& x, mode = mode::train) {
    const auto out = output_shape(detail::shape_of<4>(x), path_name<Tag>());
    detail::ensure(this->y_, out);
    const auto& w = this->weight_.value();
    if constexpr (!base::on_host) {
      precis::conv_transpose2d<P>(ctx, x, w, this->y_, this->params_);
    } else if constexpr (base::kernels) {
      if (this->bias_on_) {
        // The kernel has no bias: its float sums are kept, the bias added, then one rounding.
        detail::ensure(sums_, out);
        precis::conv_transpose2d<P>(ctx, x, w, sums_, this->params_);
        add_bias(ctx);
      } else {
        precis::conv_transpose2d<P>(ctx, x, w, this->y_, this->params_);
      }
    } else {
      const auto g = precis::detail::transpose_geometry("precis::nn::conv_transpose2d", x, w,
                                                        this->y_, this->params_);
      const S* bias = this->bias_on_ ? this->bias_.value().data() : nullptr;
      detail::direct_conv_backward_data<P>(ctx, g, x.data(), w.data(), bias, this->y_.data());
    }
    this->x_.set(x);
    return this->y_;
  }

  const tensor<G>& backward(context_ref_t<Ctx> ctx, const tensor<G>& dy) {
    const auto& x = this->x_.get(kind);
    check_same_shape("precis::nn::conv_transpose2d: dy and the output", dy, this->y_);
    const auto& w = this->weight_.value();
    detail::ensure(this->dx_, detail::shape_of<4>(x));
    detail::ensure(this->dw_, detail::shape_of<4>(w));
    if constexpr (base::kernels) {
      precis::conv_transpose2d_backward_data<P>(ctx, dy, w, this->dx_, this->params_);
      precis::conv_transpose2d_backward_weights<P>(ctx, x, dy, this->dw_, this->params_);
    } else {
      // The convolution dy -> dx with this weight; its weight gradient pairs dy with x.
      const auto g = precis::detail::transpose_geometry("precis::nn::conv_transpose2d", x, w, dy,
                                                        this->params_);
      detail::direct_conv_forward<P>(ctx, g, dy.data(), w.data(), static_cast<const S*>(nullptr),
                                     this->dx_.data());
      detail::direct_conv_backward_weights<P>(ctx, g, dy.data(), x.data(), this->dw_.data());
    }
    this->accumulate_parameters(ctx, dy);
    return this->dx_;
  }

  std::string shape() const { return this->describe_shape(); }
  std::size_t own_bytes() const { return this->buffer_bytes() + detail::bytes_of(sums_); }

 private:
  static shape_t<4> weight_shape(std::size_t in, std::size_t out,
                                 const std::array<std::size_t, 2>& k, const conv2d_params& p) {
    detail::check_conv_arguments(kind, in, out, k, p);
    for (std::size_t a = 0; a < 2; ++a) {
      if (p.output_padding[a] >= p.stride[a]) {
        throw error("precis::nn::conv_transpose2d: output_padding " +
                    std::to_string(p.output_padding[a]) + " must be less than the stride (" +
                    std::to_string(p.stride[a]) + ")");
      }
    }
    return {in, out / p.groups, k[0], k[1]};
  }

  // y = sums + bias per channel, in float (the kernels' math), rounded once to S.
  void add_bias(const cpu_context& ctx) {
    const std::size_t channels = this->out_;
    const std::size_t pixels = std::size_t(sums_.shape()[2]) * std::size_t(sums_.shape()[3]);
    const S* b = this->bias_.value().data();
    precis::detail::for_rows(
        ctx, std::size_t(sums_.shape()[0]) * channels, pixels, [&](std::size_t lo, std::size_t hi) {
          for (std::size_t plane = lo; plane < hi; ++plane) {
            const float shift = precis::detail::load<float>(b[plane % channels]);
            const float* sums = sums_.data() + plane * pixels;
            S* y = this->y_.data() + plane * pixels;
            for (std::size_t q = 0; q < pixels; ++q) y[q] = round_to<S>(sums[q] + shift);
          }
        });
  }

  tensor<float> sums_;  // the float sums before the bias (host, kernels' path, with a bias)
};

}  // namespace precis::nn
