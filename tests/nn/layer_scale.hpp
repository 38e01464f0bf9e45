// A layer written outside the library with nn's public pieces only: a learned per-feature
// scale (LayerScale), y = x * gamma. docs/writing-layers.md quotes it; test_user_layer.cpp
// checks it on the host and test_cuda_nn_layers on the device against the host.
#pragma once

#include <precis/nn/nn.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

namespace user {

using namespace precis;

template <Layer Tag, Policy P, std::size_t R, class Ctx>
class layer_scale_layer;

/// The blueprint node: what nn::build turns into a layer.
template <Layer Tag>
struct layer_scale_spec {
  std::size_t dim;  // the features: the input's last axis
  double init;      // every scale's initial value
  template <class Map, class Ctx, class In, class G, std::size_t R>
  using module_type = layer_scale_layer<Tag, policy_for_t<Tag, Map>, R, Ctx>;
};

/// The default tag: an elementwise layer, named by its position in paths.
struct layer_scale_tag : nn::tags::positional_tag<op::elementwise> {};

/// y = x * gamma, gamma one learned value per feature (the last axis).
template <Layer Tag = layer_scale_tag>
constexpr layer_scale_spec<Tag> layer_scale(std::size_t dim, double init = 0.1) {
  return {dim, init};
}

template <Layer Tag, Policy P, std::size_t R, class Ctx>
class layer_scale_layer : public nn::layer_base<Tag, P, op::elementwise, R, R, Ctx> {
  using base = nn::layer_base<Tag, P, op::elementwise, R, R, Ctx>;
  using S = typename base::input_type;       // activations
  using G = typename base::input_grad_type;  // their gradients
  using M = typename base::master_type;      // master weights and parameter gradients
  template <class T, std::size_t N = R>
  using tensor = nn::tensor_t<Ctx, T, N>;

 public:
  static constexpr std::string_view kind = "layer_scale";

  explicit layer_scale_layer(const layer_scale_spec<Tag>& s) : dim_(s.dim), init_(s.init), gamma_({s.dim}) {
    if (s.dim == 0) throw error("layer_scale: needs dim > 0");
  }
  void reset(std::uint64_t) { nn::context_traits<Ctx>::fill(gamma_.master(), M(init_)); }

  nn::shape_t<R> output_shape(const nn::shape_t<R>& in, std::string_view path) const {
    if (in[R - 1] != dim_) nn::bad_shape(path, kind, "[..., " + std::to_string(dim_) + "]", shape_string(in));
    return in;
  }

  const tensor<S>& forward(nn::context_ref_t<Ctx> ctx, const tensor<S>& x, nn::mode = nn::mode::train) {
    nn::ensure(y_, output_shape(nn::shape_of<R>(x), nn::path_name<Tag>()));
    precis::mul<P>(ctx, x, gamma_.value(), y_);  // gamma broadcast along the last axis
    x_.set(x);
    return y_;
  }
  const tensor<G>& backward(nn::context_ref_t<Ctx> ctx, const tensor<G>& dy) {
    const auto& x = x_.get(kind);
    nn::ensure(dx_, nn::shape_of<R>(x));
    nn::ensure(dgamma_, nn::shape_t<1>{dim_});
    precis::mul_backward<P>(ctx, dy, x, gamma_.value(), dx_, dgamma_);
    gamma_.accumulate(ctx, dgamma_);
    return dx_;
  }

  template <class Self, class F>
  static void for_each_parameter(Self& self, F&& f) {
    f("gamma", self.gamma_);
  }
  static constexpr bool decays(std::string_view) { return false; }
  template <class Self, class F>
  static void for_each_observed(Self& self, F&& f) {
    f("", std::type_identity<Tag>{}, self.x_.peek(), self.y_, self.dx_);
  }
  template <class Self, class F>
  static void for_each_gradient_buffer(Self& self, F&& f) {
    f(self.dx_);
    f(self.dgamma_);
  }
  std::string shape() const { return std::to_string(dim_); }
  std::size_t own_bytes() const { return nn::bytes_of(y_) + nn::bytes_of(dx_) + nn::bytes_of(dgamma_); }

 private:
  std::size_t dim_;
  double init_;
  nn::parameter<S, M, 1, Ctx> gamma_;
  tensor<S> y_;
  tensor<G> dx_;
  tensor<G, 1> dgamma_;
  nn::saved<tensor<S>> x_;
};

}  // namespace user
