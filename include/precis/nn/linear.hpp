// precis/nn/linear.hpp: the linear layer over the last axis of a tensor of any rank.
//
//     nn::linear<fc2>(1024, 256)            // blueprint: tag fc2, 1024 -> 256 features, bias
//     nn::linear(64, 10, nn::no_bias)       // default tag nn::tags::linear
//
// y = x W^T + b with W [out, in] (PyTorch's layout), for x [..., in]: the leading axes are
// rows of one product (op::matmul under the layer's policy: products exact in float, sums
// in float in k order, rounded once). Backward: dx = dy W, dW = dy^T x, db = the column
// sums of dy, each rounded once to the gradient type and added to the float gradients.
// Parameters start uniform in +-1/sqrt(in), as PyTorch's.
#pragma once

#include <precis/kernels/gemm.hpp>
#include <precis/kernels/reduce.hpp>
#include <precis/nn/module.hpp>

#include <cmath>
#include <cstddef>
#include <string>

namespace precis::nn {

template <Layer Tag, Policy P, std::size_t R, class Ctx>
class linear_layer;

/// Blueprint of a linear layer (see nn::linear).
template <Layer Tag>
struct linear_spec {
  std::size_t in, out;
  bias_mode bias = with_bias;

  template <class Map, class Ctx, class In, class G, std::size_t R>
  using module_type = linear_layer<Tag, policy_for_t<Tag, Map>, R, Ctx>;
};

/// A linear layer with tag `Tag` from `in` to `out` features (a blueprint node).
template <Layer Tag = tags::linear>
constexpr linear_spec<Tag> linear(std::size_t in, std::size_t out, bias_mode bias = with_bias) {
  return {in, out, bias};
}

/// The linear layer built for tag Tag under the resolved policy P on rank-R tensors.
template <Layer Tag, Policy P, std::size_t R, class Ctx>
class linear_layer : public layer_base<Tag, P, op::matmul, R, R, Ctx> {
  static_assert(R >= 1, "precis: nn::linear works on the last axis of a tensor of rank >= 1");
  static_assert(std::is_same_v<Ctx, cpu_context>,
                "precis: nn::linear runs on host tensors so far; build the model for cpu_context");
  using base = layer_base<Tag, P, op::matmul, R, R, Ctx>;
  using S = typename base::input_type;
  using G = typename base::input_grad_type;
  using M = typename base::master_type;

 public:
  static constexpr std::string_view kind = "linear";

  explicit linear_layer(const linear_spec<Tag>& s)
      : in_(s.in), out_(s.out), bias_on_(s.bias == with_bias), weight_({s.out, s.in}), bias_({bias_on_ ? s.out : 0}) {
    if (s.in == 0 || s.out == 0) throw error("precis::nn::linear: needs in > 0 and out > 0");
  }

  void reset(std::uint64_t seed) {
    const double bound = 1.0 / std::sqrt(double(in_));
    detail::fill_uniform(weight_, seed, 0, bound);
    detail::fill_uniform(bias_, seed, 1, bound);
  }

  shape_t<R> output_shape(const shape_t<R>& in, std::string_view path) const {
    if (in[R - 1] != in_ || detail::elements(in) == 0) {
      detail::bad_shape(path, kind, "[..., " + std::to_string(in_) + "] with no empty axis", shape_string(in));
    }
    shape_t<R> out = in;
    out[R - 1] = out_;
    return out;
  }

  const host_tensor<S, R>& forward(const cpu_context& ctx, const host_tensor<S, R>& x, mode = mode::train) {
    const auto out = output_shape(detail::shape_of<R>(x), name_for_errors());
    detail::ensure(y_, out);
    const std::size_t rows = x.size() / in_;
    const S* bias = bias_on_ ? bias_.value().data() : nullptr;
    precis::detail::gemm_raw<op::matmul, P>(ctx, rows, out_, in_, x.data(), in_, 1, weight_.value().data(), 1, in_,
                                            y_.data(), out_, bias, gemm_options{});
    x_.set(x);
    return y_;
  }

  const host_tensor<G, R>& backward(const cpu_context& ctx, const host_tensor<G, R>& dy) {
    const auto& x = x_.get(kind);
    check_same_shape("precis::nn::linear: dy and the output", dy, y_);
    const std::size_t rows = x.size() / in_;
    detail::ensure(dx_, detail::shape_of<R>(x));
    // dx (rows x in) = dy (rows x out) W (out x in).
    precis::detail::gemm_raw<op::matmul, P>(ctx, rows, in_, out_, dy.data(), out_, 1, weight_.value().data(), in_, 1,
                                            dx_.data(), in_, static_cast<const G*>(nullptr), gemm_options{});
    // dW (out x in) = dy^T (out x rows) x (rows x in).
    detail::ensure(dw_, shape_t<2>{out_, in_});
    precis::detail::gemm_raw<op::matmul, P>(ctx, out_, in_, rows, dy.data(), 1, out_, x.data(), in_, 1, dw_.data(), in_,
                                            static_cast<const G*>(nullptr), gemm_options{});
    weight_.accumulate(dw_);
    if (bias_on_) {
      detail::ensure(db_, shape_t<1>{out_});
      using Mt = precis::detail::math_t<op::reduction, P, G>;
      using Red = precis::detail::sum_reducer<Mt, precis::detail::accumulate_t<op::reduction, P>,
                                              precis::detail::reduce_result_t<P, G>>;
      precis::detail::reduce_axis<Red, Mt>(ctx, dy.data(), 1, rows, out_, db_.data());
      bias_.accumulate(db_);
    }
    return dx_;
  }

  parameter<S, M, 2>& weight() { return weight_; }
  parameter<S, M, 1>& bias() { return bias_; }
  std::string shape() const { return std::to_string(in_) + "->" + std::to_string(out_) + (bias_on_ ? "" : " no bias"); }
  std::size_t own_bytes() const {
    return detail::bytes_of(y_) + detail::bytes_of(dx_) + detail::bytes_of(dw_) + detail::bytes_of(db_);
  }

  template <class Self, class F>
  static void for_each_parameter(Self& self, F&& f) {
    f("weight", self.weight_);
    if (self.bias_on_) f("bias", self.bias_);
  }
  /// Weight decay applies to the weight, not the bias.
  static constexpr bool decays(std::string_view parameter) { return parameter == "weight"; }
  template <class Archive>
  void visit_state(Archive& a, const std::string& prefix) {
    detail::visit_parameters(a, prefix, *this);
  }
  std::string validate() const { return detail::parameter_problems(*this); }

 private:
  static std::string_view name_for_errors() { return path_name<Tag>(); }

  std::size_t in_, out_;
  bool bias_on_;
  parameter<S, M, 2> weight_;
  parameter<S, M, 1> bias_;
  host_tensor<S, R> y_;
  host_tensor<G, R> dx_;
  host_tensor<G, 2> dw_;
  host_tensor<G, 1> db_;
  detail::saved<host_tensor<S, R>> x_;
};

}  // namespace precis::nn
