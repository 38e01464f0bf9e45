/// @file
/// The layers that change no values' meaning: the cast nn::build inserts where neighbouring layers
/// store different types, and the identity (a residual's plain shortcut).
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
  /// The context its kernels run on.
  using context_type = Ctx;
  /// Element type of the input forward() reads: what the layer before stores.
  using input_type = In;
  /// Element type of the output forward() returns: what the layer after reads.
  using output_type = Out;
  /// Element type of the input gradient backward() returns: what the layer before reads.
  using input_grad_type = GIn;
  /// Element type of the output gradient backward() reads: what the layer after gives.
  using output_grad_type = GOut;
  /// Rank of the input.
  static constexpr std::size_t input_rank = R;
  /// Rank of the output: the input's.
  static constexpr std::size_t output_rank = R;
  /// Its kind as describe prints it.
  static constexpr std::string_view kind = "cast";

  /// Its component of a path: "" (named by its position).
  std::string_view name() const { return ""; }
  /// The input's shape.
  shape_t<R> output_shape(const shape_t<R>& in, std::string_view) const { return in; }

  /// x converted to Out, each value rounded once (nearest-even).
  const tensor_t<Ctx, Out, R>& forward(context_ref_t<Ctx> ctx, const tensor_t<Ctx, In, R>& x, mode = mode::train) {
    ensure(y_, shape_of<R>(x));
    context_traits<Ctx>::cast(ctx, x, y_);
    return y_;
  }
  /// dy converted to GIn, each value rounded once (nearest-even).
  const tensor_t<Ctx, GIn, R>& backward(context_ref_t<Ctx> ctx, const tensor_t<Ctx, GOut, R>& dy) {
    ensure(dx_, shape_of<R>(dy));
    context_traits<Ctx>::cast(ctx, dy, dx_);
    return dx_;
  }
  /// Its shape for describe: the conversion, as "float->bfloat16".
  std::string shape() const { return std::string(type_name_v<In>) + "->" + std::string(type_name_v<Out>); }
  /// Bytes of its output and input-gradient buffers.
  std::size_t own_bytes() const { return bytes_of(y_) + bytes_of(dx_); }
  /// Its backward pass's buffer (see nn/module.hpp): dx.
  template <class Self, class F>
  static void for_each_gradient_buffer(Self& self, F&& f) {
    f(self.dx_);
  }

 private:
  tensor_t<Ctx, Out, R> y_;
  tensor_t<Ctx, GIn, R> dx_;
};

template <class T, class G, std::size_t R, class Ctx>
class identity_layer;

/// Blueprint of the identity (nn::identity()).
struct identity_spec {
  /// The layer nn::build makes of it on Ctx, for input element type In, gradient G, rank R.
  template <class Map, class Ctx, class In, class G, std::size_t R>
  using module_type = identity_layer<In, G, R, Ctx>;
};

/// The identity: a residual's plain shortcut.
constexpr identity_spec identity() { return {}; }

/// Gives its input back and passes gradients through, with no copy.
template <class T, class G, std::size_t R, class Ctx = cpu_context>
class identity_layer : public data_layer_base<T, G, R, R, Ctx> {
 public:
  /// Its kind as describe prints it.
  static constexpr std::string_view kind = "identity";
  identity_layer() = default;
  /// Makes the layer from its blueprint (which has no settings).
  explicit identity_layer(const identity_spec&) {}
  /// The input's shape.
  shape_t<R> output_shape(const shape_t<R>& in, std::string_view) const { return in; }
  /// x itself.
  const tensor_t<Ctx, T, R>& forward(context_ref_t<Ctx>, const tensor_t<Ctx, T, R>& x, mode = mode::train) {
    return x;
  }
  /// dy itself.
  const tensor_t<Ctx, G, R>& backward(context_ref_t<Ctx>, const tensor_t<Ctx, G, R>& dy) { return dy; }
  /// Its shape for describe: "-" (no settings).
  std::string shape() const { return "-"; }
  /// Bytes of the buffers it holds: 0 (it holds none).
  std::size_t own_bytes() const { return 0; }
};

}  // namespace precis::nn
