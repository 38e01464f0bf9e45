/// @file
/// The linear layer over the last axis of a tensor of any rank.
///
///     nn::linear<fc2>(1024, 256)            // blueprint: tag fc2, 1024 -> 256 features, bias
///     nn::linear(64, 10, nn::no_bias)       // default tag nn::tags::linear
///
/// y = x W^T + b with W [out, in] (PyTorch's layout), for x [..., in]: the leading axes are
/// rows of one product (op::matmul under the layer's policy: products exact in float, sums
/// in float in k order, rounded once). Backward: dx = dy W, dW = dy^T x, db = the column
/// sums of dy, each rounded once to the gradient type and added to the float gradients.
/// Parameters start uniform in +-1/sqrt(in), as PyTorch's.
///
/// Under a float8 policy (presets::fp8_hybrid: storage float8_e4m3, gradients float8_e5m2,
/// a scaling recipe) the layer passes activations and gradients in the policy's compute
/// type (bfloat16) and float8 lives inside its products, as Transformer Engine's linear
/// layers do it. Each of its three product inputs has its own recipe (precis::
/// delayed_scaling or current_scaling, as the policy's Fp8Recipe says): the input x and
/// the weight W are cast to float8_e4m3 in the forward pass, the output gradient dy to
/// float8_e5m2 in the backward pass, each as q = saturate(v * scale). The products of the
/// float8 values are exact in float and summed in float (on the CPU: the float kernel on
/// the exactly converted values), multiplied by the inverse scales (1 / (s_a s_b), rounded
/// once to float) and rounded once to bfloat16, with the bias added before that rounding:
///   y = x_q W_q^T / (s_x s_w) + b,  dx = dy_q W_q / (s_dy s_w),  dW = dy_q^T x_q / (s_dy s_x)
/// and db = the column sums of dy in bfloat16 (not quantised). A delayed recipe casts with
/// the scale from past steps and then records this tensor's amax (training passes only; an
/// evaluation pass does not change the recipes); a current recipe measures the amax first.
/// The recipes' state is saved in checkpoints beside the parameters.
#pragma once

#include <precis/kernels/cast.hpp>
#include <precis/kernels/gemm.hpp>
#include <precis/kernels/reduce.hpp>
#include <precis/nn/module.hpp>
#include <precis/scaling/fp8.hpp>

#include <cmath>
#include <cstddef>
#include <string>
#include <type_traits>

namespace precis::nn {

template <Layer Tag, Policy P, std::size_t R, class Ctx>
class linear_layer;

/// Blueprint of a linear layer (see nn::linear).
template <Layer Tag>
struct linear_spec {
  /// Number of input features (the last axis of x).
  std::size_t in, out;
  /// @var out
  /// Number of output features (the last axis of y).

  /// Whether the layer adds a bias.
  bias_mode bias = with_bias;

  /// The layer it builds into for policy map Map on context Ctx, on tensors of rank R (In
  /// and G, the types that reach it, are not used: build casts them to its own).
  template <class Map, class Ctx, class In, class G, std::size_t R>
  using module_type = linear_layer<Tag, policy_for_t<Tag, Map>, R, Ctx>;
};

/// A linear layer with tag `Tag` from `in` to `out` features (a blueprint node).
template <Layer Tag = tags::linear>
constexpr linear_spec<Tag> linear(std::size_t in, std::size_t out, bias_mode bias = with_bias) {
  return {in, out, bias};
}

namespace detail {

/// The scaling recipe object for float8 `Format` that policy recipe tag `R` names. Its
/// reducer is chosen at run time (one process unless model.set_amax_reducer says otherwise).
template <class Format, class R>
struct recipe_object;
template <class Format>
struct recipe_object<Format, recipe::delayed> {
  using type = delayed_scaling<Format, reducer_ref>;
};
template <class Format>
struct recipe_object<Format, recipe::current> {
  using type = current_scaling<Format, reducer_ref>;
};

/// Casts `x` to the float8 tensor `q` under `r` and returns the scale it used. A delayed
/// recipe casts with its scale and then records the amax when `record` is set; a current
/// recipe takes this tensor's amax first (always: that is what current scaling is).
template <class Recipe, class T, class F, std::size_t N>
float quantize(const cpu_context& ctx, Recipe& r, const host_tensor<T, N>& x, host_tensor<F, N>& q, bool record) {
  ensure(q, shape_of<N>(x));
  if constexpr (std::is_same_v<Recipe, current_scaling<F, reducer_ref>>) {
    r.update(precis::amax_of(ctx, x));
    const float s = r.scale();
    precis::scaled_cast(ctx, x, s, q);
    return s;
  } else {
    const float s = r.scale();
    const float a = precis::scaled_cast(ctx, x, s, q);
    if (record) r.update(a);
    return s;
  }
}

/// 1 / (a b), rounded once to float: the factor that takes a product of two scaled
/// operands back to the values' scale.
inline float inverse_scales(float a, float b) { return static_cast<float>(1.0 / (double(a) * double(b))); }

/// The float8 state of a linear layer under policy P: one recipe per product input and the
/// quantised tensors the backward pass reuses.
template <Policy P, std::size_t R>
struct float8_linear_state {
  using forward_format = typename P::storage_type;
  using backward_format = typename P::gradient_type;
  static_assert(is_float8_v<forward_format> && is_float8_v<backward_format>,
                "precis: nn::linear takes float8 in both passes (storage float8_e4m3 and "
                "gradients float8_e5m2, as presets::fp8_hybrid) or in neither");
  using forward_recipe = typename recipe_object<forward_format, typename P::fp8_recipe>::type;
  using backward_recipe = typename recipe_object<backward_format, typename P::fp8_recipe>::type;

  forward_recipe input, weight;
  backward_recipe grad_output;
  float input_scale = 1.0f, weight_scale = 1.0f;  // the scales the saved tensors were cast with
  host_tensor<forward_format, R> xq;
  host_tensor<forward_format, 2> wq;
  host_tensor<backward_format, R> dyq;
  bool have_forward = false;

  std::size_t own_bytes() const { return bytes_of(xq) + bytes_of(wq) + bytes_of(dyq); }
  /// Points the three recipes at `r` for their amaxes.
  void set_reducer(reducer_ref r) {
    input.set_reducer(r);
    weight.set_reducer(r);
    grad_output.set_reducer(r);
  }

  template <class Archive>
  void visit_state(Archive& a, const std::string& prefix) {
    visit_recipe(a, prefix + "fp8.input.", input);
    visit_recipe(a, prefix + "fp8.weight.", weight);
    visit_recipe(a, prefix + "fp8.grad_output.", grad_output);
  }
  std::string validate() const {
    std::string out;
    auto check = [&](std::string_view name, const std::string& problem) {
      if (!problem.empty()) out += (out.empty() ? "" : "; ") + std::string(name) + " recipe: " + problem;
    };
    check("fp8.input", input.validate());
    check("fp8.weight", weight.validate());
    check("fp8.grad_output", grad_output.validate());
    return out;
  }
};

/// No float8 state: the layer's products take its storage type.
struct no_float8_state {
  std::size_t own_bytes() const { return 0; }
};

/// The float8 state of a linear layer: none without float8, the host's on the CPU, and the
/// context's own elsewhere (context_traits<Ctx>::float8_linear_state: on cuda_context, device
/// recipes and cuBLASLt's float8 products, nn/cuda_float8.hpp).
template <bool Float8, Policy P, std::size_t R, class Ctx>
struct float8_state_of {
  using type = no_float8_state;
};
template <Policy P, std::size_t R>
struct float8_state_of<true, P, R, cpu_context> {
  using type = float8_linear_state<P, R>;
};
template <Policy P, std::size_t R, class Ctx>
  requires(!std::is_same_v<Ctx, cpu_context>)
struct float8_state_of<true, P, R, Ctx> {
  using type = typename context_traits<Ctx>::template float8_linear_state<P, R>;
};

}  // namespace detail

/// The linear layer built for tag Tag under the resolved policy P on rank-R tensors.
template <Layer Tag, Policy P, std::size_t R, class Ctx>
class linear_layer : public layer_base<Tag, P, op::matmul, R, R, Ctx, true> {
  static_assert(R >= 1, "precis: nn::linear works on the last axis of a tensor of rank >= 1");
  static_assert(std::is_same_v<Ctx, cpu_context> || !float8_products_v<P> ||
                    requires { context_traits<Ctx>::float8_linear; },
                "precis: nn::linear's float8 products need a context that runs them (the host, or "
                "cuda_context through precis/nn/cuda.hpp); map the layer to a bfloat16 or float16 policy");
  using base = layer_base<Tag, P, op::matmul, R, R, Ctx, true>;
  using S = typename base::input_type;
  using G = typename base::input_grad_type;
  using M = typename base::master_type;
  template <class T, std::size_t N = R>
  using tensor = tensor_t<Ctx, T, N>;

 public:
  /// Its kind in nn::describe: "linear".
  static constexpr std::string_view kind = "linear";
  /// True when the products take float8 inputs (a float8 policy).
  static constexpr bool float8 = float8_products_v<P>;
  /// The recipes and quantised tensors of the float8 products (detail::no_float8_state
  /// when there are none).
  using float8_state = typename detail::float8_state_of<float8, P, R, Ctx>::type;

  /// The layer of a blueprint, its parameters zero until reset() draws them. Throws
  /// precis::error when in or out is 0.
  explicit linear_layer(const linear_spec<Tag>& s)
      : in_(s.in), out_(s.out), bias_on_(s.bias == with_bias), weight_({s.out, s.in}), bias_({bias_on_ ? s.out : 0}) {
    if (s.in == 0 || s.out == 0) throw error("precis::nn::linear: needs in > 0 and out > 0");
  }

  /// Draws the weight and the bias uniformly in +-1/sqrt(in) from `seed` (each from its
  /// own stream).
  void reset(std::uint64_t seed) {
    const double bound = 1.0 / std::sqrt(double(in_));
    fill_uniform(weight_, seed, 0, bound);
    fill_uniform(bias_, seed, 1, bound);
  }

  /// The shape of the output: the input's with `out` in the last axis. Throws
  /// precis::error (naming the layer's `path`) for another last axis or an empty axis, and
  /// under float8 on the device for rows, in or out features not a multiple of 16.
  shape_t<R> output_shape(const shape_t<R>& in, std::string_view path) const {
    if (in[R - 1] != in_ || detail::elements(in) == 0) {
      bad_shape(path, kind, "[..., " + std::to_string(in_) + "] with no empty axis", shape_string(in));
    }
    if constexpr (float8 && !std::is_same_v<Ctx, cpu_context>) {
      // cuBLASLt's float8 products: refused here, in the shape pass before anything is queued.
      if ((detail::elements(in) / in_) % 16 != 0 || in_ % 16 != 0 || out_ % 16 != 0) {
        bad_shape(path, kind,
                  "[..., " + std::to_string(in_) + "] with rows (all axes but the last), in (" + std::to_string(in_) +
                      ") and out (" + std::to_string(out_) +
                      ") features multiples of 16, for cuBLASLt's float8 products (or map the layer to a bfloat16 "
                      "policy)",
                  shape_string(in));
      }
    }
    shape_t<R> out = in;
    out[R - 1] = out_;
    return out;
  }

  /// y = x W^T + b over the last axis (see the file comment); keeps the address of x for
  /// backward(). Under a float8 policy, x and W are cast to float8 first, and a training
  /// pass (`m`) records their amaxes in delayed recipes. Throws precis::error for an input
  /// of another shape.
  const tensor<S>& forward(context_ref_t<Ctx> ctx, const tensor<S>& x, mode m = mode::train) {
    const auto out = output_shape(shape_of<R>(x), name_for_errors());
    ensure(y_, out);
    const std::size_t rows = x.size() / in_;
    const S* bias = bias_on_ ? bias_.value().data() : nullptr;  // cuBLASLt's epilogue on the device
    if constexpr (float8 && !std::is_same_v<Ctx, cpu_context>) {
      fp8_.forward(ctx, x.data(), weight_.value().data(), y_.data(), bias, rows, in_, out_, m == mode::train);
    } else if constexpr (float8) {
      auto& f = fp8_;
      const bool record = m == mode::train;
      f.input_scale = detail::quantize(ctx, f.input, x, f.xq, record);
      f.weight_scale = detail::quantize(ctx, f.weight, weight_.value(), f.wq, record);
      gemm_options o;
      o.alpha = detail::inverse_scales(f.input_scale, f.weight_scale);
      precis::detail::gemm_raw<op::matmul, P>(ctx, rows, out_, in_, f.xq.data(), in_, 1, f.wq.data(), 1, in_,
                                              y_.data(), out_, bias, o);
      f.have_forward = true;
    } else {
      precis::detail::gemm_raw<op::matmul, P>(ctx, rows, out_, in_, x.data(), in_, 1,
                                              weight_.value().data(), 1, in_, y_.data(), out_, bias,
                                              gemm_options{});
    }
    x_.set(x);
    return y_;
  }

  /// Adds dW = dy^T x and db (the column sums of dy) to the parameters' gradients and
  /// returns dx = dy W in the gradient type. Throws precis::error without a forward pass or
  /// when dy's shape is not the last output's.
  const tensor<G>& backward(context_ref_t<Ctx> ctx, const tensor<G>& dy) {
    backward_impl(ctx, dy, true);
    return dx_;
  }
  /// backward() without the input gradient (see nn::backward_parameters): no dx product;
  /// the input-gradient buffer is emptied.
  void backward_parameters(context_ref_t<Ctx> ctx, const tensor<G>& dy) {
    backward_impl(ctx, dy, false);
  }

 private:
  void backward_impl(context_ref_t<Ctx> ctx, const tensor<G>& dy, bool input_gradient) {
    if constexpr (float8 && !std::is_same_v<Ctx, cpu_context>) {
      check_same_shape("precis::nn::linear: dy and the output", dy, y_);
      const std::size_t rows = dy.size() / out_;
      ensure(dx_, input_gradient ? shape_of<R>(x_.get(kind)) : shape_t<R>{});
      ensure(dw_, shape_t<2>{out_, in_});
      fp8_.backward(ctx, dy.data(), input_gradient ? dx_.data() : static_cast<G*>(nullptr), dw_.data(), rows, in_,
                    out_);
      weight_.accumulate(ctx, dw_);
    } else if constexpr (float8) {
      backward_float8(ctx, dy, input_gradient);
    } else {
      backward_exact(ctx, dy, input_gradient);
    }
    if (bias_on_) {
      ensure(db_, shape_t<1>{out_});
      // The column sums of dy: in row order on the host, in a fixed two-pass order on the
      // device (kernels/cuda/reduce.hpp), never one thread per column over every row.
      precis::detail::column_sums<P>(ctx, dy.data(), dy.size() / out_, out_, db_.data());
      bias_.accumulate(ctx, db_);
    }
  }

 public:
  /// The weight W [out, in].
  parameter<S, M, 2, Ctx>& weight() { return weight_; }
  /// The bias b [out]; empty (size 0) for a layer built with nn::no_bias.
  parameter<S, M, 1, Ctx>& bias() { return bias_; }
  /// The float8 recipes and the tensors last cast with them (float8 policies).
  const float8_state& float8_products() const { return fp8_; }
  /// Points the float8 recipes at `r` for their amaxes (nothing without float8).
  void set_amax_reducer(reducer_ref r) {
    if constexpr (float8) fp8_.set_reducer(r);
  }
  /// Its shape column in nn::describe: in and out, as "1024->256", or "64->10 no bias".
  std::string shape() const { return std::to_string(in_) + "->" + std::to_string(out_) + (bias_on_ ? "" : " no bias"); }
  /// Bytes of its output, input-gradient and parameter-gradient buffers, and of the float8
  /// tensors it keeps (not the parameters: see nn::parameter::bytes).
  std::size_t own_bytes() const {
    return bytes_of(y_) + bytes_of(dx_) + bytes_of(dw_) + bytes_of(db_) +
           fp8_.own_bytes();
  }
  /// The buffers of the last passes, for precis::diagnostics (see nn/module.hpp).
  template <class Self, class F>
  static void for_each_observed(Self& self, F&& f) {
    f("", std::type_identity<Tag>{}, self.x_.peek(), self.y_, self.dx_);
  }
  /// Its backward pass's buffers (see nn/module.hpp): dx, and the weight's and bias's
  /// gradients before they are added to the parameters'.
  template <class Self, class F>
  static void for_each_gradient_buffer(Self& self, F&& f) {
    f(self.dx_);
    f(self.dw_);
    f(self.db_);
  }

  /// Calls f(name, parameter) for "weight" and, where the layer has one, "bias".
  template <class Self, class F>
  static void for_each_parameter(Self& self, F&& f) {
    f("weight", self.weight_);
    if (self.bias_on_) f("bias", self.bias_);
  }
  /// Weight decay applies to the weight, not the bias.
  static constexpr bool decays(std::string_view parameter) { return parameter == "weight"; }
  /// Under a float8 policy, saves or loads its recipes' state under `prefix` ("fp8.input.",
  /// "fp8.weight.", "fp8.grad_output."; see precis::save_checkpoint; nn::model saves the
  /// parameters before it); nothing otherwise.
  template <class Archive>
  void visit_state(Archive& a, const std::string& prefix) {
    if constexpr (float8) fp8_.visit_state(a, prefix);
  }
  /// Empty, or what loading its float8 recipes found wrong.
  std::string validate() const {
    if constexpr (float8) {
      return fp8_.validate();
    } else {
      return {};
    }
  }

 private:
  static std::string_view name_for_errors() { return path_name<Tag>(); }

  void backward_exact(context_ref_t<Ctx> ctx, const tensor<G>& dy, bool input_gradient) {
    const auto& x = x_.get(kind);
    check_same_shape("precis::nn::linear: dy and the output", dy, y_);
    const std::size_t rows = x.size() / in_;
    if (input_gradient) {
      ensure(dx_, shape_of<R>(x));
      // dx (rows x in) = dy (rows x out) W (out x in).
      precis::detail::gemm_raw<op::matmul, P>(ctx, rows, in_, out_, dy.data(), out_, 1,
                                              weight_.value().data(), in_, 1, dx_.data(), in_,
                                              static_cast<const G*>(nullptr), gemm_options{});
    } else {
      ensure(dx_, shape_t<R>{});
    }
    // dW (out x in) = dy^T (out x rows) x (rows x in).
    ensure(dw_, shape_t<2>{out_, in_});
    precis::detail::gemm_raw<op::matmul, P>(ctx, out_, in_, rows, dy.data(), 1, out_, x.data(), in_, 1, dw_.data(), in_,
                                            static_cast<const G*>(nullptr), gemm_options{});
    weight_.accumulate(ctx, dw_);
  }

  void backward_float8(const cpu_context& ctx, const host_tensor<G, R>& dy, bool input_gradient) {
    auto& f = fp8_;
    if (!f.have_forward) {
      throw error("precis::nn::linear: backward() called without a forward() since the layer was made or copied");
    }
    check_same_shape("precis::nn::linear: dy and the output", dy, y_);
    const std::size_t rows = dy.size() / out_;
    const float sg = detail::quantize(ctx, f.grad_output, dy, f.dyq, true);
    gemm_options o;
    if (input_gradient) {
      ensure(dx_, shape_of<R>(f.xq));
      // dx (rows x in) = dy_q (rows x out) W_q (out x in) / (s_dy s_w).
      o.alpha = detail::inverse_scales(sg, f.weight_scale);
      precis::detail::gemm_raw<op::matmul, P>(ctx, rows, in_, out_, f.dyq.data(), out_, 1,
                                              f.wq.data(), in_, 1, dx_.data(), in_,
                                              static_cast<const G*>(nullptr), o);
    } else {
      ensure(dx_, shape_t<R>{});
    }
    // dW (out x in) = dy_q^T (out x rows) x_q (rows x in) / (s_dy s_x).
    ensure(dw_, shape_t<2>{out_, in_});
    o.alpha = detail::inverse_scales(sg, f.input_scale);
    precis::detail::gemm_raw<op::matmul, P>(ctx, out_, in_, rows, f.dyq.data(), 1, out_, f.xq.data(), in_, 1,
                                            dw_.data(), in_, static_cast<const G*>(nullptr), o);
    weight_.accumulate(ctx, dw_);
  }

  std::size_t in_, out_;
  bool bias_on_;
  parameter<S, M, 2, Ctx> weight_;
  parameter<S, M, 1, Ctx> bias_;
  tensor<S> y_;
  tensor<G> dx_;
  tensor<G, 2> dw_;
  tensor<G, 1> db_;
  saved<tensor<S>> x_;
  float8_state fp8_;
};

}  // namespace precis::nn
