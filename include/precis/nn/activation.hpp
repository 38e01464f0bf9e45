/// @file
/// Elementwise activations on tensors of any rank.
///
///     nn::relu()  nn::gelu<mlp_act>()  nn::sigmoid()  nn::tanh()
///
/// Each runs under its tag's policy resolved for op::elementwise: f(x) in the compute
/// type's opmath (float for 16-bit formats), rounded once to the storage type; backward
/// gives dx = dy f'(x), rounded once to the gradient type, with f'(x) recomputed from the
/// forward input; GELU on the host with float inputs and gradients (the fp32 policies)
/// keeps f'(x) from a training forward pass instead, computed there with f(x) for about
/// 1.4 times f(x)'s cost (the same bits either way).
#pragma once

#include <precis/kernels/elementwise.hpp>
#include <precis/nn/module.hpp>

#include <string>
#include <string_view>
#include <type_traits>
#include <variant>

namespace precis::nn {

namespace detail {

// An activation: its name and the kernels' elementwise functors for f(x) and dy f'(x).
template <template <class> class Fn, template <class> class Grad>
struct activation_functions {
  template <class M>
  using fn = Fn<M>;
  template <class M>
  using grad = Grad<M>;
};
struct relu_kernel : activation_functions<precis::detail::relu_fn, precis::detail::relu_grad_fn> {
  static constexpr std::string_view name = "relu";
};
struct gelu_kernel : activation_functions<precis::detail::gelu_erf_fn, precis::detail::gelu_erf_grad_fn> {
  static constexpr std::string_view name = "gelu";
};
struct sigmoid_kernel : activation_functions<precis::detail::sigmoid_fn, precis::detail::sigmoid_grad_fn> {
  static constexpr std::string_view name = "sigmoid";
};
struct tanh_kernel : activation_functions<precis::detail::tanh_fn, precis::detail::tanh_grad_fn> {
  static constexpr std::string_view name = "tanh";
};

}  // namespace detail

template <Layer Tag, Policy P, class Kernel, std::size_t R, class Ctx>
class activation_layer;

/// Blueprint of an activation (see nn::relu and the others).
template <Layer Tag, class Kernel>
struct activation_spec {
  /// The layer it builds into for policy map Map on context Ctx, reading tensors of rank R
  /// (In and G, the types that reach it, are not used: build casts them to its own).
  template <class Map, class Ctx, class In, class G, std::size_t R>
  using module_type = activation_layer<Tag, policy_for_t<Tag, Map>, Kernel, R, Ctx>;
};

/// max(x, 0).
template <Layer Tag = tags::relu>
constexpr activation_spec<Tag, detail::relu_kernel> relu() {
  return {};
}
/// x Phi(x), the exact (erf) GELU.
template <Layer Tag = tags::gelu>
constexpr activation_spec<Tag, detail::gelu_kernel> gelu() {
  return {};
}
/// 1 / (1 + exp(-x)).
template <Layer Tag = tags::sigmoid>
constexpr activation_spec<Tag, detail::sigmoid_kernel> sigmoid() {
  return {};
}
/// tanh(x).
template <Layer Tag = tags::tanh>
constexpr activation_spec<Tag, detail::tanh_kernel> tanh() {
  return {};
}

/// An elementwise activation built for tag Tag under the resolved policy P.
template <Layer Tag, Policy P, class Kernel, std::size_t R, class Ctx>
class activation_layer : public layer_base<Tag, P, op::elementwise, R, R, Ctx> {
  using base = layer_base<Tag, P, op::elementwise, R, R, Ctx>;
  using S = typename base::input_type;
  using G = typename base::input_grad_type;
  using io = context_traits<Ctx>;
  template <class T>
  using tensor = tensor_t<Ctx, T, R>;

 public:
  /// Its kind in nn::describe: "relu", "gelu", "sigmoid" or "tanh".
  static constexpr std::string_view kind = Kernel::name;

  activation_layer() = default;
  /// The layer of a blueprint (nn::relu and the others); it has no parameters.
  explicit activation_layer(const activation_spec<Tag, Kernel>&) {}

  /// The shape of the output: the input's.
  shape_t<R> output_shape(const shape_t<R>& in, std::string_view) const { return in; }

  /// y = f(x) elementwise, rounded once to the storage type; keeps the address of x for
  /// backward() (and, for GELU on float gradients on the host, f'(x) of a training pass).
  const tensor<S>& forward(context_ref_t<Ctx> ctx, const tensor<S>& x, mode m = mode::train) {
    ensure(y_, shape_of<R>(x));
    derivative_of_input_ = false;
    if constexpr (keeps_derivative) {
      if (m == mode::train) {
        ensure(d_, shape_of<R>(x));
        precis::detail::unary_with_derivative<P, Kernel::template fn>(kernel_name(), ctx, x, y_,
                                                                      d_);
        derivative_of_input_ = true;
      }
    }
    if (!derivative_of_input_) {
      io::template unary<P, Kernel::template fn>(kernel_name(), ctx, x, y_);
    }
    x_.set(x);
    return y_;
  }
  /// dx = dy f'(x) for the input of the last forward pass, rounded once to the gradient
  /// type. Throws precis::error without a forward pass or when dy's shape is not x's.
  const tensor<G>& backward(context_ref_t<Ctx> ctx, const tensor<G>& dy) {
    const auto& x = x_.get(kind);
    ensure(dx_, shape_of<R>(x));
    if constexpr (keeps_derivative) {
      if (derivative_of_input_) {
        precis::check_same_shape(kernel_name() + ": dy and x", dy, x);
        precis::mul<P>(ctx, dy, d_, dx_);  // the bits unary_backward gives
        return dx_;
      }
    }
    io::template unary_backward<P, Kernel::template grad>(kernel_name(), ctx, dy, x, dx_);
    return dx_;
  }
  /// Its output buffer, sized to `shape`, for a layer before it that writes f of its own
  /// output there in the same pass (batch norm's fused ReLU: see nn::sequence). That pass
  /// replaces this layer's forward() and backward(); backward() until the next forward()
  /// throws precis::error.
  tensor<S>& fused_output(const shape_t<R>& shape) {
    ensure(y_, shape);
    x_ = {};
    return y_;
  }
  /// The buffer fused_output() gave, as the last fused pass left it.
  const tensor<S>& fused_output() const { return y_; }
  /// Its shape column in nn::describe: "-" (it has no parameters).
  std::string shape() const { return "-"; }
  /// Bytes of its output and input-gradient buffers, and of the kept f'(x) where it keeps
  /// one.
  std::size_t own_bytes() const {
    std::size_t bytes = bytes_of(y_) + bytes_of(dx_);
    if constexpr (keeps_derivative) bytes += bytes_of(d_);
    return bytes;
  }
  /// The buffers of the last passes, for precis::diagnostics (see nn/module.hpp).
  template <class Self, class F>
  static void for_each_observed(Self& self, F&& f) {
    f("", std::type_identity<Tag>{}, self.x_.peek(), self.y_, self.dx_);
  }
  /// Its backward pass's buffer (see nn/module.hpp): dx.
  template <class Self, class F>
  static void for_each_gradient_buffer(Self& self, F&& f) {
    f(self.dx_);
  }

 private:
  /// On the host, where f's float math gives f'(x) in the same pass as f(x) for less than
  /// the two passes cost (GELU on inputs of more than 16 bits, whose values are not read
  /// from tables; see precis::gelu_with_derivative) and the gradient is float: a training
  /// forward pass keeps f'(x) in d_ (one more buffer of the input's size), and backward is
  /// dx = dy f'(x), one product, the bits recomputing f'(x) from x gives. A backward pass
  /// after an eval-mode forward pass recomputes from x.
  static constexpr bool keeps_derivative =
      std::is_same_v<Ctx, cpu_context> && std::is_same_v<G, float> &&
      !precis::detail::tabulated_input_v<S> &&
      precis::detail::derivative_form_v<P, Kernel::template fn, S> &&
      std::is_same_v<precis::detail::math_t<op::elementwise, P, G, S>, float>;
  using derivative_tensor = std::conditional_t<keeps_derivative, tensor<float>, std::monostate>;

  static std::string kernel_name() { return "precis::nn::" + std::string(kind); }

  tensor<S> y_;
  tensor<G> dx_;
  [[no_unique_address]] derivative_tensor d_{};  // f'(x) of the last training forward pass
  saved<tensor<S>> x_;
  bool derivative_of_input_ = false;  // d_ holds f' of the last forward pass's input
};

}  // namespace precis::nn
