// precis/nn/cast.hpp: the layers that change no values' meaning: the cast nn::build inserts
// where neighbouring layers store different types, and the identity (a residual's plain
// shortcut).
#pragma once

#include <precis/kernels/cast.hpp>
#include <precis/nn/module.hpp>

#include <string>
#include <string_view>

namespace precis::nn {

/// Converts activations In -> Out forward and gradients GOut -> GIn backward, each value
/// rounded once (nearest-even). nn::build inserts one wherever the layer before stores
/// another type than the layer after reads, so every narrowing shows in the model's type.
template <class In, class Out, class GIn, class GOut, std::size_t R, class Ctx = cpu_context>
class cast_layer {
 public:
  using context_type = Ctx;
  using input_type = In;
  using output_type = Out;
  using input_grad_type = GIn;
  using output_grad_type = GOut;
  static constexpr std::size_t input_rank = R;
  static constexpr std::size_t output_rank = R;
  static constexpr std::string_view kind = "cast";

  std::string_view name() const { return ""; }
  shape_t<R> output_shape(const shape_t<R>& in, std::string_view) const { return in; }

  const host_tensor<Out, R>& forward(const cpu_context& ctx, const host_tensor<In, R>& x, mode = mode::train) {
    detail::ensure(y_, detail::shape_of<R>(x));
    precis::cast(ctx, x, y_);
    return y_;
  }
  const host_tensor<GIn, R>& backward(const cpu_context& ctx, const host_tensor<GOut, R>& dy) {
    detail::ensure(dx_, detail::shape_of<R>(dy));
    precis::cast(ctx, dy, dx_);
    return dx_;
  }
  std::string shape() const { return std::string(type_name_v<In>) + "->" + std::string(type_name_v<Out>); }
  std::size_t own_bytes() const { return detail::bytes_of(y_) + detail::bytes_of(dx_); }

 private:
  host_tensor<Out, R> y_;
  host_tensor<GIn, R> dx_;
};

template <class T, class G, std::size_t R, class Ctx>
class identity_layer;

/// Blueprint of the identity (nn::identity()).
struct identity_spec {
  template <class Map, class Ctx, class In, class G, std::size_t R>
  using module_type = identity_layer<In, G, R, Ctx>;
};

/// The identity: a residual's plain shortcut.
constexpr identity_spec identity() { return {}; }

/// Gives its input back and passes gradients through, with no copy.
template <class T, class G, std::size_t R, class Ctx = cpu_context>
class identity_layer : public data_layer_base<T, G, R, R, Ctx> {
 public:
  static constexpr std::string_view kind = "identity";
  identity_layer() = default;
  explicit identity_layer(const identity_spec&) {}
  shape_t<R> output_shape(const shape_t<R>& in, std::string_view) const { return in; }
  const host_tensor<T, R>& forward(const cpu_context&, const host_tensor<T, R>& x, mode = mode::train) { return x; }
  const host_tensor<G, R>& backward(const cpu_context&, const host_tensor<G, R>& dy) { return dy; }
  std::string shape() const { return "-"; }
  std::size_t own_bytes() const { return 0; }
};

}  // namespace precis::nn
