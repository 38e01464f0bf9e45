/// @file
/// 2-D convolution and transposed convolution layers on [N, C, H, W] images, or
/// [N, H, W, C] in a model built channels-last (nn/layout.hpp).
///
///     nn::conv2d<stem>(3, 64, 7, {.stride = {2, 2}, .padding = {3, 3}}, nn::no_bias)
///     nn::conv2d(64, 64, 3, {.padding = {1, 1}, .groups = 64})   // depthwise, tags::conv2d
///     nn::conv_transpose2d<up>(64, 32, 2, {.stride = {2, 2}})    // doubles H and W
///
/// Both run under their tags' policies resolved for op::conv, through kernels/conv.hpp:
/// products exact in float, sums in float, each output rounded once; the bias is added to
/// the float sum before that rounding (conv_transpose2d has no fused-bias kernel, so its
/// sums are kept in float and the bias added there). Backward: dx, dW and db each rounded
/// once to the gradient type and added to the float gradients.
///
/// Under a double policy (float64 gradient checks) the kernels run in double; an unsafe
/// accumulator narrower than float is refused by the kernels, as everywhere. Every output
/// element is one sum in a fixed order, so results do not depend on the thread count. On a
/// device context (precis/nn/cuda.hpp) the layers call the device kernels of the same
/// names. cuDNN rounds a convolution's output to its type, so on the device a layer with a
/// bias runs its product on float copies of x and the weight, on TF32 tensor cores where
/// the GPU has them (exact products: the 8- and 16-bit formats' values are TF32 values and
/// their products fit a float; see precis::detail::widened_conv_policy), adds the bias to
/// the float sums and rounds once, as the host does; its bias gradient is the device's
/// deterministic per-channel sum.
///
/// Layouts are PyTorch's: conv2d's weight is [out, in / groups, kh, kw], conv_transpose2d's
/// [in, out / groups, kh, kw]. Parameters start uniform in +-1/sqrt(fan_in), with fan_in =
/// weight.shape[1] * kh * kw as PyTorch computes it (for the transposed layer that is
/// out / groups * kh * kw).
#pragma once

#include <precis/kernels/conv.hpp>
#include <precis/nn/layout.hpp>
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
  /// Number of input channels (axis 1 of x).
  std::size_t in, out;
  /// @var out
  /// Number of output channels (axis 1 of y).

  /// Kernel size {kh, kw}.
  std::array<std::size_t, 2> kernel;
  /// Stride, padding, dilation and groups, as PyTorch's Conv2d (no output_padding).
  conv2d_params params{};
  /// Whether the layer adds a bias.
  bias_mode bias = with_bias;

  /// The layer it builds into for policy map Map on context Ctx (In and G, the types that
  /// reach it, are not used: build casts them to its own). A rank R other than 4 fails to
  /// compile, with a message.
  template <class Map, class Ctx, class In, class G, std::size_t R>
  using module_type =
      typename detail::conv_on_images<R, conv2d_layer<Tag, policy_for_t<Tag, Map>, Ctx>>::type;
};

/// Blueprint of a 2-D transposed convolution (see nn::conv_transpose2d).
template <Layer Tag>
struct conv_transpose2d_spec {
  /// Number of input channels (axis 1 of x).
  std::size_t in, out;
  /// @var out
  /// Number of output channels (axis 1 of y).

  /// Kernel size {kh, kw}.
  std::array<std::size_t, 2> kernel;
  /// Stride, padding, dilation, groups and output_padding, as PyTorch's ConvTranspose2d.
  conv2d_params params{};
  /// Whether the layer adds a bias.
  bias_mode bias = with_bias;

  /// The layer it builds into for policy map Map on context Ctx (In and G, the types that
  /// reach it, are not used: build casts them to its own). A rank R other than 4 fails to
  /// compile, with a message.
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

/// "[N > 0, 3, H >= 5, W >= 5]" (or "[N > 0, H >= 5, W >= 5, 3]" channels-last): the
/// inputs a spatial layer takes.
inline std::string image_shape_string(const std::string& channels, std::size_t min_h, std::size_t min_w,
                                      image_layout layout) {
  return image_string(layout, "N > 0", channels, "H >= " + std::to_string(min_h), "W >= " + std::to_string(min_w));
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
    // The layout is the whole model's, so that the modules around a convolution (norms,
    // pooling, upsampling, concatenation) read what it writes.
    if (p.layout != image_layout::nchw) {
      throw error("precis::nn::" + std::string(layer) + ": the image layout is the model's, not a layer's: " +
                  "build channels-last with nn::build_options::layout = image_layout::nhwc");
    }
  }

 public:
  /// Takes images in `layout` (nn::build calls it with build_options::layout).
  void set_layout(image_layout layout, std::string_view) { params_.layout = layout; }

 protected:
  /// The output shape for input shape `in` (both in the layer's layout), from the output
  /// size along an axis, out(size, axis) (0: nothing fits), and the least input size that
  /// gives one, min_in(axis); throws precis::error naming the layer `kind` at `path`, with the
  /// inputs it takes, for an empty batch, other than `in_` channels or an image too small.
  template <class Out, class MinIn>
  shape_t<4> image_output(const shape_t<4>& in, std::string_view path, std::string_view kind, Out&& out,
                          MinIn&& min_in) const {
    const auto s = nchw_shape(in, params_.layout);
    const std::size_t ho = out(s[2], 0), wo = out(s[3], 1);
    if (s[0] == 0 || s[1] != in_ || ho == 0 || wo == 0) {
      bad_shape(path, kind, image_shape_string(std::to_string(in_), min_in(0), min_in(1), params_.layout),
                shape_string(in));
    }
    return layout_shape({s[0], out_, ho, wo}, params_.layout);
  }

  /// Adds dw (the caller's) and, with a bias, db from dy to the parameters' gradients.
  void accumulate_parameters(context_ref_t<Ctx> ctx, const tensor<G>& dy) {
    weight_.accumulate(ctx, dw_);
    if (bias_on_) {
      ensure(db_, shape_t<1>{out_});
      precis::conv2d_backward_bias<P>(ctx, dy, db_, params_.layout);
      bias_.accumulate(ctx, db_);
    }
  }
  /// y = round(sums + bias) with sums = run(policy, x, w, sums, p) in the math type (the
  /// transposed layer's forward pass; conv2d's kernels have a bias overload of their own): the
  /// product without rounding, then the bias and one rounding. `policy` is a
  /// std::type_identity of the policy the product runs under: P with the parameters p (the
  /// sums in the layer's buffer), or off the host with 16-bit x, where x and the weight are
  /// first converted to float copies (cuDNN's output has the inputs' type), under
  /// precis::detail::widened_conv_policy with exact_products set (TF32 tensor cores, exact
  /// products on those values). The copies and the sums are then stream-ordered scratch of
  /// the call: held as buffers they would keep three float images per layer between steps
  /// (over 400 MiB for each of DBNet's heads' transposed convolutions at 640 x 640, batch 16).
  template <class Run>
  void forward_biased(context_ref_t<Ctx> ctx, const tensor<S>& x, const shape_t<4>& out, const conv2d_params& p,
                      Run&& run) {
    using io = context_traits<Ctx>;
    const auto& w = weight_.value();
    if constexpr (on_host || std::is_same_v<S, math_type>) {
      ensure(sums_, out);
      run(std::type_identity<P>{}, x, w, sums_, p);
      io::add_channel_bias(ctx, sums_, bias_.value(), y_, params_.layout);
    } else {
      tensor<float> xf(shape_of<4>(x), ctx.stream()), wf(shape_of<4>(w), ctx.stream()), sums(out, ctx.stream());
      io::cast(ctx, x, xf);
      io::cast(ctx, w, wf);
      conv2d_params exact = p;
      exact.exact_products = true;
      run(std::type_identity<precis::detail::widened_conv_policy>{}, xf, wf, sums, exact);
      io::add_channel_bias(ctx, sums, bias_.value(), y_, params_.layout);
    }
  }
  /// backward() of the layer named `kind`: dx and dw = both(x, dy, w, dx, dw), or, where
  /// !input_gradient, dw = weights(x, dy, dw) alone (the input-gradient buffer is then
  /// emptied); then the parameters' gradients.
  template <class Both, class Weights>
  void run_backward(context_ref_t<Ctx> ctx, const tensor<G>& dy, bool input_gradient,
                    std::string_view kind, Both&& both, Weights&& weights) {
    const auto& x = x_.get(kind);
    check_same_shape("precis::nn::" + std::string(kind) + ": dy and the output", dy, y_);
    const auto& w = weight_.value();
    ensure(dw_, shape_of<4>(w));
    if (input_gradient) {
      ensure(dx_, shape_of<4>(x));
      both(x, dy, w, dx_, dw_);
    } else {
      ensure(dx_, shape_t<4>{});
      weights(x, dy, dw_);
    }
    accumulate_parameters(ctx, dy);
  }
  /// The kernel parameters of a forward pass. When evaluating they carry the weight's
  /// version, so that an engine which moves the weights into a layout of its own (oneDNN's
  /// hardware products) keeps them moved until the weights change
  /// (conv2d_params::weights_version). Training passes move them in every call: the weights
  /// change every step, and their moved copy would be memory held for nothing.
  conv2d_params forward_params(mode m) const {
    conv2d_params p = params_;
    if (m == mode::eval) p.weights_version = weight_.version();
    return p;
  }
  std::string describe_shape() const {
    return std::to_string(in_) + "->" + std::to_string(out_) + " " + conv_geometry_string(kernel_, params_) +
           (bias_on_ ? "" : " no bias") + (params_.layout == image_layout::nhwc ? " nhwc" : "");
  }
  std::size_t buffer_bytes() const {
    return bytes_of(y_) + bytes_of(dx_) + bytes_of(dw_) + bytes_of(db_) + bytes_of(sums_);
  }
  // The kernels' math type: float, or double under a double policy.
  using math_type = precis::detail::math_t<op::conv, P, S, S>;

 public:
  /// The buffers of the last passes, for precis::diagnostics (see nn/module.hpp).
  template <class Self, class F>
  static void for_each_observed(Self& self, F&& f) {
    f("", std::type_identity<Tag>{}, self.x_.peek(), self.y_, self.dx_);
  }
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
  tensor<math_type> sums_;  // with a bias where no kernel fuses it (but 16-bit on the device): the sums before the bias
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
  /// Its kind in nn::describe: "conv2d".
  static constexpr std::string_view kind = "conv2d";

  /// The layer of a blueprint, its parameters zero until reset() draws them. Throws
  /// precis::error for empty channels or kernel, a zero stride, dilation or groups, groups
  /// that do not divide both channel counts, an output_padding, or a layout in `params`
  /// (the layout is the model's: nn::build_options::layout).
  explicit conv2d_layer(const conv2d_spec<Tag>& s)
      : base(kind, s.in, s.out, s.kernel, s.params, s.bias,
             weight_shape(s.in, s.out, s.kernel, s.params)) {}

  /// The shape of the output, [N, out, Ho, Wo] (see the class comment). Throws
  /// precis::error (naming the layer's `path`) for an empty batch, other than `in` input
  /// channels, or an image smaller than the dilated kernel after padding.
  shape_t<4> output_shape(const shape_t<4>& in, std::string_view path) const {
    return this->image_output(
        in, path, kind, [&](std::size_t n, std::size_t a) { return detail::conv_out(n, this->kernel_, this->params_, a); },
        [&](std::size_t a) { return detail::conv_min_in(this->kernel_, this->params_, a); });
  }

  /// The convolution of x with the weight, plus the bias (see the file comment); keeps the
  /// address of x for backward(). In mode::eval an engine that keeps the weight in a layout
  /// of its own may reuse it until the weight changes. Throws precis::error for an input of
  /// another shape.
  const tensor<S>& forward(context_ref_t<Ctx> ctx, const tensor<S>& x, mode m = mode::train) {
    ensure(this->y_, output_shape(shape_of<4>(x), path_name<Tag>()));
    const auto& w = this->weight_.value();
    const conv2d_params p = this->forward_params(m);
    if (!this->bias_on_) {
      precis::conv2d<P>(ctx, x, w, this->y_, p);
    } else {
      // The kernels' bias overload: fused on the host; on the device, the sums in float
      // (16-bit operands widened, as forward_biased does for the transposed layer) and one
      // rounding after the bias.
      precis::conv2d<P>(ctx, x, w, this->bias_.value(), this->y_, p);
    }
    this->x_.set(x);
    return this->y_;
  }

  /// Adds dW (and db) to the parameters' gradients and returns dx, each rounded once to the
  /// gradient type. Throws precis::error without a forward pass or when dy's shape is not
  /// the last output's.
  const tensor<G>& backward(context_ref_t<Ctx> ctx, const tensor<G>& dy) {
    backward_impl(ctx, dy, true);
    return this->dx_;
  }
  /// backward() without the input gradient (see nn::backward_parameters): no
  /// backward-data pass; the input-gradient buffer is emptied.
  void backward_parameters(context_ref_t<Ctx> ctx, const tensor<G>& dy) {
    backward_impl(ctx, dy, false);
  }

 private:
  void backward_impl(context_ref_t<Ctx> ctx, const tensor<G>& dy, bool input_gradient) {
    this->run_backward(
        ctx, dy, input_gradient, kind,
        [&](const auto& x, const tensor<G>& d, const auto& w, tensor<G>& dx, tensor<G>& dw) {
          if constexpr (base::on_host) {
            precis::conv2d_backward<P>(ctx, x, d, w, dx, dw, this->params_);
          } else {
            precis::conv2d_backward_data<P>(ctx, d, w, dx, this->params_);
            precis::conv2d_backward_weights<P>(ctx, x, d, dw, this->params_);
          }
        },
        [&](const auto& x, const tensor<G>& d, tensor<G>& dw) {
          precis::conv2d_backward_weights<P>(ctx, x, d, dw, this->params_);
        });
  }

 public:
  /// Its shape column in nn::describe: channels and geometry, defaults left out, as
  /// "3->64 7x7 s2 p3 no bias", with " nhwc" in a channels-last model.
  std::string shape() const { return this->describe_shape(); }
  /// Bytes of its output, input-gradient and parameter-gradient buffers.
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
  /// Its kind in nn::describe: "conv_transpose2d".
  static constexpr std::string_view kind = "conv_transpose2d";

  /// The layer of a blueprint, its parameters zero until reset() draws them. Throws
  /// precis::error for empty channels or kernel, a zero stride, dilation or groups, groups
  /// that do not divide both channel counts, an output_padding not less than the stride, or
  /// a layout in `params` (the layout is the model's: nn::build_options::layout).
  explicit conv_transpose2d_layer(const conv_transpose2d_spec<Tag>& s)
      : base(kind, s.in, s.out, s.kernel, s.params, s.bias,
             weight_shape(s.in, s.out, s.kernel, s.params)) {}

  /// The shape of the output, [N, out, Ho, Wo] (see the class comment). Throws
  /// precis::error (naming the layer's `path`) for an empty batch, other than `in` input
  /// channels, or an image the padding leaves no output of.
  shape_t<4> output_shape(const shape_t<4>& in, std::string_view path) const {
    return this->image_output(
        in, path, kind,
        [&](std::size_t n, std::size_t a) { return detail::transpose_out(n, this->kernel_, this->params_, a); },
        [&](std::size_t a) { return detail::transpose_min_in(this->kernel_, this->params_, a); });
  }

  /// The transposed convolution of x with the weight, plus the bias (added to the sums
  /// before their one rounding); keeps the address of x for backward(). Throws
  /// precis::error for an input of another shape.
  const tensor<S>& forward(context_ref_t<Ctx> ctx, const tensor<S>& x, mode m = mode::train) {
    const auto out = output_shape(shape_of<4>(x), path_name<Tag>());
    ensure(this->y_, out);
    const auto& w = this->weight_.value();
    const conv2d_params p = this->forward_params(m);
    if (this->bias_on_) {
      // The kernel has no bias: its sums are kept in its math type (float, or double under
      // a double policy), the bias added, then one rounding.
      this->forward_biased(ctx, x, out, p, [&](auto q, const auto& xs, const auto& ws, auto& sums, const conv2d_params& pq) {
        precis::conv_transpose2d<typename decltype(q)::type>(ctx, xs, ws, sums, pq);
      });
    } else {
      precis::conv_transpose2d<P>(ctx, x, w, this->y_, p);
    }
    this->x_.set(x);
    return this->y_;
  }

  /// Adds dW (and db) to the parameters' gradients and returns dx, each rounded once to the
  /// gradient type. Throws precis::error without a forward pass or when dy's shape is not
  /// the last output's.
  const tensor<G>& backward(context_ref_t<Ctx> ctx, const tensor<G>& dy) {
    backward_impl(ctx, dy, true);
    return this->dx_;
  }
  /// backward() without the input gradient (see nn::backward_parameters): no
  /// backward-data pass; the input-gradient buffer is emptied.
  void backward_parameters(context_ref_t<Ctx> ctx, const tensor<G>& dy) {
    backward_impl(ctx, dy, false);
  }

 private:
  void backward_impl(context_ref_t<Ctx> ctx, const tensor<G>& dy, bool input_gradient) {
    this->run_backward(
        ctx, dy, input_gradient, kind,
        [&](const auto& x, const tensor<G>& d, const auto& w, tensor<G>& dx, tensor<G>& dw) {
          if constexpr (base::on_host) {
            precis::conv_transpose2d_backward<P>(ctx, x, d, w, dx, dw, this->params_);
          } else {
            precis::conv_transpose2d_backward_data<P>(ctx, d, w, dx, this->params_);
            precis::conv_transpose2d_backward_weights<P>(ctx, x, d, dw, this->params_);
          }
        },
        [&](const auto& x, const tensor<G>& d, tensor<G>& dw) {
          precis::conv_transpose2d_backward_weights<P>(ctx, x, d, dw, this->params_);
        });
  }

 public:
  /// Its shape column in nn::describe: channels and geometry, defaults left out, as
  /// "64->32 2x2 s2".
  std::string shape() const { return this->describe_shape(); }
  /// Bytes of its output, input-gradient and parameter-gradient buffers, and of the sums
  /// it keeps in the math type before adding a bias.
  std::size_t own_bytes() const { return this->buffer_bytes(); }

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

};

}  // namespace precis::nn
