// A small layer written outside the library (y = x * x, its backward pass not the derivative:
// only compilation matters), for the compile-fail tests of what nn::build checks on a layer.
// Each test defines one switch before including this header and builds a model with the
// layer (build_model()):
//   USER_LAYER_OWN_POLICY        module_type gives the layer fp32, not the map's policy
//   USER_LAYER_NO_MODULE_TYPE    the node has no module_type
//   USER_LAYER_NO_CONSTRUCTOR    the layer is not made from its node
//   USER_LAYER_FORWARD_BY_VALUE  forward returns its output by value
//   USER_LAYER_NO_BACKWARD       no backward
//   USER_LAYER_NO_OUTPUT_SHAPE   no output_shape
//   USER_LAYER_NO_OWN_BYTES      no own_bytes
#pragma once

#include <precis/precis.hpp>

#include <cstddef>
#include <string>
#include <string_view>

namespace user {

using namespace precis;

template <Layer Tag, Policy P, std::size_t R, class Ctx>
class square_layer;

template <Layer Tag>
struct square_spec {
#ifndef USER_LAYER_NO_MODULE_TYPE
  template <class Map, class Ctx, class In, class G, std::size_t R>
#ifdef USER_LAYER_OWN_POLICY
  using module_type = square_layer<Tag, presets::fp32, R, Ctx>;  // not the map's
#else
  using module_type = square_layer<Tag, policy_for_t<Tag, Map>, R, Ctx>;
#endif
#endif
};

struct square_tag : nn::tags::positional_tag<op::elementwise> {};

template <Layer Tag, Policy P, std::size_t R, class Ctx>
class square_layer : public nn::layer_base<Tag, P, op::elementwise, R, R, Ctx> {
  using S = typename nn::layer_base<Tag, P, op::elementwise, R, R, Ctx>::input_type;
  using tensor = nn::tensor_t<Ctx, S, R>;

 public:
  static constexpr std::string_view kind = "square";
#ifdef USER_LAYER_NO_CONSTRUCTOR
  explicit square_layer(int) {}
#else
  explicit square_layer(const square_spec<Tag>&) {}
#endif
#ifndef USER_LAYER_NO_OUTPUT_SHAPE
  nn::shape_t<R> output_shape(const nn::shape_t<R>& in, std::string_view) const { return in; }
#endif
#ifdef USER_LAYER_FORWARD_BY_VALUE
  tensor forward(nn::context_ref_t<Ctx> ctx, const tensor& x, nn::mode = nn::mode::train) {
#else
  const tensor& forward(nn::context_ref_t<Ctx> ctx, const tensor& x, nn::mode = nn::mode::train) {
#endif
    nn::ensure(y_, nn::shape_of<R>(x));
    precis::mul<P>(ctx, x, x, y_);
    return y_;
  }
#ifndef USER_LAYER_NO_BACKWARD
  const tensor& backward(nn::context_ref_t<Ctx> ctx, const tensor& dy) {
    nn::ensure(dx_, nn::shape_of<R>(dy));
    precis::mul<P>(ctx, dy, dy, dx_);
    return dx_;
  }
#endif
  std::string shape() const { return "-"; }
#ifndef USER_LAYER_NO_OWN_BYTES
  std::size_t own_bytes() const { return nn::bytes_of(y_) + nn::bytes_of(dx_); }
#endif

 private:
  tensor y_, dx_;
};

/// A model of a linear layer and the square layer under bf16_mixed.
inline void build_model() {
  auto model = nn::build<bfloat16, 2>(presets::bf16_mixed{}, nn::seq(nn::linear(4, 4), square_spec<square_tag>{}));
  (void)model;
}

}  // namespace user
