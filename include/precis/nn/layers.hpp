// precis/nn/layers.hpp: layers templated on a policy, with forward and backward passes
// on [batch, features] host tensors.
//
// A layer `L<P>` stores its activations in P's storage type and its activation gradients
// in P's gradient type; it runs under P as the rule set resolves it for the layer's
// operation kind, and that resolved policy is the layer's template argument (a
// layer_norm<bf16_mixed> is a basic_layer_norm of a policy computing in float). Parameters are nn::parameter: float masters, a working copy in the
// storage type refreshed once per step, float gradients (see parameter.hpp).
//
// Each layer owns its outputs and its input gradient, resized to the batch on use, and
// keeps the address of its last input for the backward pass: the input must stay alive
// and unchanged until backward() (nn::chain arranges that).
#pragma once

#include <precis/kernels/elementwise.hpp>
#include <precis/kernels/gemm.hpp>
#include <precis/kernels/norm.hpp>
#include <precis/kernels/reduce.hpp>
#include <precis/nn/parameter.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace precis::nn {

/// The types every layer under policy P and operation kind Op names. P is the policy the
/// layer runs under, already resolved by the rule set for Op (the public names
/// nn::linear<P>, nn::layer_norm<P>, ... resolve it), so the layer's type spells the types
/// its kernels use: nn::layer_norm<presets::bf16_mixed> is
/// basic_layer_norm<policy<bfloat16, float, float, float, bfloat16, recipe::none>>.
template <Policy P, op_kind Op>
struct layer_base {
  static_assert(!is_float8_v<typename P::storage_type> && !is_float8_v<typename P::gradient_type>,
                "precis: nn layers store activations in 16- or 32-bit types; float8 belongs in "
                "the matrix products of a kernel-level recipe (precis::lt_matmul), not in "
                "nn's storage");
  /// The (resolved) policy the layer runs under.
  using policy_type = P;
  /// The operation kind, which selects the rule set's row.
  using operation = Op;
  using input_type = typename P::storage_type;
  using output_type = typename P::storage_type;
  using input_grad_type = typename P::gradient_type;
  using output_grad_type = typename P::gradient_type;
  using master_type = typename P::master_type;
  /// Statistics (norm means and variances) are kept in float, or double under a double policy.
  using statistics_type = std::conditional_t<std::is_same_v<master_type, double>, double, float>;

  template <class F>
  void for_each_parameter(F&&) {}
  template <class F>
  void for_each_parameter(F&&) const {}
  template <class Archive>
  void visit_state(Archive&, const std::string&) {}
  std::string validate() const { return {}; }
};

namespace detail {

template <class Layer>
std::string parameter_problems(const Layer& l) {
  std::string out;
  l.for_each_parameter([&](std::string_view, const auto& p) {
    if (!p.problem().empty()) out += (out.empty() ? "" : "; ") + p.problem();
  });
  return out;
}

template <class Archive, class Layer>
void visit_parameters(Archive& a, const std::string& prefix, Layer& l) {
  l.for_each_parameter([&](std::string_view name, auto& p) { p.visit_state(a, prefix + std::string(name)); });
}

/// Saves or loads a float statistics vector; a wrong length is reported in `problem`.
template <class Archive, class T>
void visit_statistics(Archive& a, const std::string& name, host_tensor<T, 1>& t, std::string& problem) {
  std::vector<float> v(t.begin(), t.end());
  a.floats(name, v);
  if (v.size() != t.size()) {
    problem = name + " has " + std::to_string(v.size()) + " values, the model has " + std::to_string(t.size());
    return;
  }
  std::copy(v.begin(), v.end(), t.begin());
}

}  // namespace detail

/// y = x W^T + b with W [out, in] (PyTorch's layout), initialised uniformly in
/// +-1/sqrt(in) as PyTorch does. One product with a bias epilogue forward; backward
/// dx = dy W, dW = dy^T x, db = column sums of dy, each rounded once to the gradient type.
template <Policy P>
class basic_linear : public layer_base<P, op::matmul> {
  using base = layer_base<P, op::matmul>;
  using S = typename base::input_type;
  using G = typename base::input_grad_type;
  using M = typename base::master_type;

 public:
  static constexpr std::string_view name = "linear";

  basic_linear(std::size_t in, std::size_t out, uniform_init init = {})
      : in_(in), out_(out), weight_({out, in}), bias_({out}) {
    if (in == 0 || out == 0) throw error("precis::nn::linear: needs in > 0 and out > 0");
    const double bound = init.bound > 0.0 ? init.bound : 1.0 / std::sqrt(double(in));
    detail::fill_uniform(weight_, init.seed, 0, bound);
    detail::fill_uniform(bias_, init.seed, 1, bound);
  }

  const host_tensor<S, 2>& forward(const cpu_context& ctx, const host_tensor<S, 2>& x, mode = mode::train) {
    detail::check_features(name, x, in_);
    detail::ensure_shape(y_, std::size_t(x.shape()[0]), out_);
    gemm<P>(ctx, x, weight_.value(), bias_.value(), y_, gemm_options{.trans_b = true});
    x_.set(x);
    return y_;
  }

  const host_tensor<G, 2>& backward(const cpu_context& ctx, const host_tensor<G, 2>& dy) {
    const auto& x = x_.get(name);
    check_same_shape("precis::nn::linear: dy and the output", dy, y_);
    detail::ensure_shape(dx_, std::size_t(x.shape()[0]), in_);
    gemm<P>(ctx, dy, weight_.value(), dx_);
    detail::ensure_shape(dw_, out_, in_);
    gemm<P>(ctx, dy, x, dw_, gemm_options{.trans_a = true});
    detail::ensure_shape(db_, out_);
    sum<P>(ctx, dy, 0, db_);
    weight_.accumulate(dw_);
    bias_.accumulate(db_);
    return dx_;
  }

  parameter<S, M, 2>& weight() { return weight_; }
  parameter<S, M, 1>& bias() { return bias_; }
  std::string shape() const { return std::to_string(in_) + "->" + std::to_string(out_); }
  std::size_t activation_bytes() const {
    return detail::tensor_bytes(y_) + detail::tensor_bytes(dx_) + detail::tensor_bytes(dw_) +
           detail::tensor_bytes(db_);
  }

  template <class F>
  void for_each_parameter(F&& f) {
    f("weight", weight_);
    f("bias", bias_);
  }
  template <class F>
  void for_each_parameter(F&& f) const {
    f("weight", weight_);
    f("bias", bias_);
  }
  template <class Archive>
  void visit_state(Archive& a, const std::string& prefix) {
    detail::visit_parameters(a, prefix, *this);
  }
  std::string validate() const { return detail::parameter_problems(*this); }

 private:
  std::size_t in_, out_;
  parameter<S, M, 2> weight_;
  parameter<S, M, 1> bias_;
  host_tensor<S, 2> y_;
  host_tensor<G, 2> dx_, dw_;
  host_tensor<G, 1> db_;
  detail::saved_input<S> x_;
};

/// The linear layer under P as the rule set resolves it for matrix products.
template <Policy P>
using linear = basic_linear<kernel_policy_t<op::matmul, P>>;

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

/// An elementwise activation under the resolved policy P (Kernel: one of the
/// detail::*_kernel adaptors above; use the aliases below); the backward pass reads the
/// forward input.
template <Policy P, class Kernel>
class activation : public layer_base<P, op::elementwise> {
  using base = layer_base<P, op::elementwise>;
  using S = typename base::input_type;
  using G = typename base::input_grad_type;

 public:
  static constexpr std::string_view name = Kernel::name;

  const host_tensor<S, 2>& forward(const cpu_context& ctx, const host_tensor<S, 2>& x, mode = mode::train) {
    detail::ensure_shape(y_, std::size_t(x.shape()[0]), std::size_t(x.shape()[1]));
    precis::detail::unary<P, Kernel::template fn>("precis::nn::" + std::string(name), ctx, x, y_);
    x_.set(x);
    return y_;
  }
  const host_tensor<G, 2>& backward(const cpu_context& ctx, const host_tensor<G, 2>& dy) {
    const auto& x = x_.get(name);
    detail::ensure_shape(dx_, std::size_t(x.shape()[0]), std::size_t(x.shape()[1]));
    precis::detail::unary_backward<P, Kernel::template grad>("precis::nn::" + std::string(name), ctx, dy, x, dx_);
    return dx_;
  }
  std::string shape() const { return "-"; }
  std::size_t activation_bytes() const { return detail::tensor_bytes(y_) + detail::tensor_bytes(dx_); }

 private:
  host_tensor<S, 2> y_;
  host_tensor<G, 2> dx_;
  detail::saved_input<S> x_;
};

/// max(x, 0).
template <Policy P>
using relu = activation<kernel_policy_t<op::elementwise, P>, detail::relu_kernel>;
/// x Phi(x), the exact (erf) GELU.
template <Policy P>
using gelu = activation<kernel_policy_t<op::elementwise, P>, detail::gelu_kernel>;
/// 1 / (1 + exp(-x)).
template <Policy P>
using sigmoid = activation<kernel_policy_t<op::elementwise, P>, detail::sigmoid_kernel>;
/// tanh(x).
template <Policy P>
using tanh = activation<kernel_policy_t<op::elementwise, P>, detail::tanh_kernel>;

namespace detail {

/// What the norm layers share: a feature count, the per-feature scale gamma (starting at
/// 1) and shift beta (starting at 0), their gradients, and the input and output buffers.
template <Policy P, op_kind Op>
class affine_norm : public layer_base<P, Op> {
  using base = layer_base<P, Op>;

 protected:
  using S = typename base::input_type;
  using G = typename base::input_grad_type;
  using M = typename base::master_type;
  using St = typename base::statistics_type;

  affine_norm(std::string_view layer, std::size_t features)
      : features_(features), gamma_({features}), beta_({features}) {
    if (features == 0) throw error("precis::nn::" + std::string(layer) + ": needs features > 0");
    gamma_.master().fill(M(1));
    gamma_.refresh();
    beta_.refresh();
  }
  /// Sizes the outputs and the gradient buffers for a batch of `rows`.
  void size_buffers(std::size_t rows) {
    ensure_shape(y_, rows, features_);
    ensure_shape(dx_, rows, features_);
    ensure_shape(dgamma_, features_);
    ensure_shape(dbeta_, features_);
  }
  /// Adds this backward pass's gamma and beta gradients to the parameters.
  void accumulate_affine() {
    gamma_.accumulate(dgamma_);
    beta_.accumulate(dbeta_);
  }
  std::size_t buffer_bytes() const {
    return tensor_bytes(y_) + tensor_bytes(dx_) + tensor_bytes(dgamma_) + tensor_bytes(dbeta_);
  }

 public:
  parameter<S, M, 1>& gamma() { return gamma_; }
  parameter<S, M, 1>& beta() { return beta_; }
  std::string shape() const { return std::to_string(features_); }
  template <class F>
  void for_each_parameter(F&& f) {
    f("gamma", gamma_);
    f("beta", beta_);
  }
  template <class F>
  void for_each_parameter(F&& f) const {
    f("gamma", gamma_);
    f("beta", beta_);
  }

 protected:
  std::size_t features_;
  parameter<S, M, 1> gamma_, beta_;
  host_tensor<S, 2> y_;
  host_tensor<G, 2> dx_;
  host_tensor<G, 1> dgamma_, dbeta_;
  saved_input<S> x_;
};

}  // namespace detail

/// Layer normalisation over the features: (x - mean) / sqrt(var + eps) * gamma + beta, with
/// statistics in float (rule::fp32_operation); gamma starts at 1, beta at 0.
template <Policy P>
class basic_layer_norm : public detail::affine_norm<P, op::layer_norm> {
  using base = detail::affine_norm<P, op::layer_norm>;
  using typename base::S;
  using typename base::G;
  using typename base::St;

 public:
  static constexpr std::string_view name = "layer_norm";

  explicit basic_layer_norm(std::size_t features, double eps = 1e-5) : base(name, features), eps_(eps) {}

  const host_tensor<S, 2>& forward(const cpu_context& ctx, const host_tensor<S, 2>& x, mode = mode::train) {
    detail::check_features(name, x, this->features_);
    const std::size_t rows = std::size_t(x.shape()[0]);
    this->size_buffers(rows);
    detail::ensure_shape(mean_, rows);
    detail::ensure_shape(rstd_, rows);
    precis::layer_norm<P>(ctx, x, this->gamma_.value(), this->beta_.value(), this->y_, mean_, rstd_, eps_);
    this->x_.set(x);
    return this->y_;
  }
  const host_tensor<G, 2>& backward(const cpu_context& ctx, const host_tensor<G, 2>& dy) {
    const auto& x = this->x_.get(name);
    layer_norm_backward<P>(ctx, dy, x, this->gamma_.value(), mean_, rstd_, this->dx_, this->dgamma_, this->dbeta_);
    this->accumulate_affine();
    return this->dx_;
  }

  std::size_t activation_bytes() const {
    return this->buffer_bytes() + detail::tensor_bytes(mean_) + detail::tensor_bytes(rstd_);
  }
  template <class Archive>
  void visit_state(Archive& a, const std::string& prefix) {
    detail::visit_parameters(a, prefix, *this);
  }
  std::string validate() const { return detail::parameter_problems(*this); }

 private:
  double eps_;
  host_tensor<St, 1> mean_, rstd_;
};

/// Layer normalisation under P resolved for norms (float compute and sums by rule).
template <Policy P>
using layer_norm = basic_layer_norm<kernel_policy_t<op::layer_norm, P>>;

/// Batch normalisation over the batch for each feature: batch statistics in training
/// (running statistics updated with `momentum`, PyTorch's rule, kept in float and saved in
/// checkpoints), running statistics in evaluation.
template <Policy P>
class basic_batch_norm : public detail::affine_norm<P, op::batch_norm> {
  using base = detail::affine_norm<P, op::batch_norm>;
  using typename base::S;
  using typename base::G;
  using typename base::St;

 public:
  static constexpr std::string_view name = "batch_norm";

  explicit basic_batch_norm(std::size_t features, double momentum = 0.1, double eps = 1e-5)
      : base(name, features),
        momentum_(momentum),
        eps_(eps),
        running_mean_(std::array<std::size_t, 1>{features}),
        running_var_(std::array<std::size_t, 1>{features}) {
    if (!(momentum >= 0.0 && momentum <= 1.0)) throw error("precis::nn::batch_norm: momentum must be in [0, 1]");
    running_mean_.fill(St(0));
    running_var_.fill(St(1));
  }

  const host_tensor<S, 2>& forward(const cpu_context& ctx, const host_tensor<S, 2>& x, mode m = mode::train) {
    detail::check_features(name, x, this->features_);
    this->size_buffers(std::size_t(x.shape()[0]));
    if (m == mode::train) {
      detail::ensure_shape(save_mean_, this->features_);
      detail::ensure_shape(save_rstd_, this->features_);
      batch_norm_train<P>(ctx, x, this->gamma_.value(), this->beta_.value(), running_mean_, running_var_, this->y_,
                          save_mean_, save_rstd_, momentum_, eps_);
      this->x_.set(x);
    } else {
      batch_norm_infer<P>(ctx, x, this->gamma_.value(), this->beta_.value(), running_mean_, running_var_, this->y_,
                          eps_);
    }
    return this->y_;
  }
  /// Backward of the last training-mode forward pass.
  const host_tensor<G, 2>& backward(const cpu_context& ctx, const host_tensor<G, 2>& dy) {
    const auto& x = this->x_.get(name);
    batch_norm_backward<P>(ctx, dy, x, this->gamma_.value(), save_mean_, save_rstd_, this->dx_, this->dgamma_,
                           this->dbeta_);
    this->accumulate_affine();
    return this->dx_;
  }

  const host_tensor<St, 1>& running_mean() const { return running_mean_; }
  const host_tensor<St, 1>& running_var() const { return running_var_; }
  std::size_t activation_bytes() const {
    return this->buffer_bytes() + detail::tensor_bytes(save_mean_) + detail::tensor_bytes(save_rstd_);
  }
  template <class Archive>
  void visit_state(Archive& a, const std::string& prefix) {
    detail::visit_parameters(a, prefix, *this);
    detail::visit_statistics(a, prefix + "running_mean", running_mean_, problem_);
    detail::visit_statistics(a, prefix + "running_var", running_var_, problem_);
  }
  std::string validate() const {
    const std::string p = detail::parameter_problems(*this);
    return problem_.empty() ? p : p.empty() ? problem_ : p + "; " + problem_;
  }

 private:
  double momentum_, eps_;
  host_tensor<St, 1> running_mean_, running_var_;
  host_tensor<St, 1> save_mean_, save_rstd_;
  std::string problem_;
};

/// Batch normalisation under P resolved for norms (float compute and sums by rule).
template <Policy P>
using batch_norm = basic_batch_norm<kernel_policy_t<op::batch_norm, P>>;

/// Inverted dropout: in training each element is kept with probability 1 - p and scaled
/// by 1 / (1 - p) (rounded once to the storage type), or zeroed; in evaluation it is the
/// identity. The mask comes from a counter hash of (seed, forward-call count, element), so
/// a run is reproducible and a resumed run draws the same masks: the seed and the call
/// count are saved in checkpoints.
template <Policy P>
class basic_dropout : public layer_base<P, op::elementwise> {
  using base = layer_base<P, op::elementwise>;
  using S = typename base::input_type;
  using G = typename base::input_grad_type;

 public:
  static constexpr std::string_view name = "dropout";

  explicit basic_dropout(double p, std::uint64_t seed = 0) : p_(p), seed_(seed) {
    if (!(p >= 0.0 && p < 1.0)) throw error("precis::nn::dropout: p must be in [0, 1)");
  }

  const host_tensor<S, 2>& forward(const cpu_context&, const host_tensor<S, 2>& x, mode m = mode::train) {
    detail::ensure_shape(y_, std::size_t(x.shape()[0]), std::size_t(x.shape()[1]));
    const std::size_t n = x.size();
    train_ = m == mode::train;
    if (!train_) {
      std::copy(x.begin(), x.end(), y_.begin());
      return y_;
    }
    mask_.resize(n);
    const float keep_scale = static_cast<float>(1.0 / (1.0 - p_));
    for (std::size_t i = 0; i < n; ++i) {
      mask_[i] = detail::unit_random(seed_, calls_, i) >= p_ ? 1 : 0;
      y_.data()[i] = mask_[i] != 0 ? round_to<S>(static_cast<float>(x.data()[i]) * keep_scale) : S(0);
    }
    ++calls_;
    return y_;
  }
  const host_tensor<G, 2>& backward(const cpu_context&, const host_tensor<G, 2>& dy) {
    check_same_shape("precis::nn::dropout: dy and the output", dy, y_);
    detail::ensure_shape(dx_, std::size_t(dy.shape()[0]), std::size_t(dy.shape()[1]));
    const float keep_scale = train_ ? static_cast<float>(1.0 / (1.0 - p_)) : 1.0f;
    for (std::size_t i = 0; i < dy.size(); ++i) {
      const bool keep = !train_ || mask_[i] != 0;
      dx_.data()[i] = keep ? round_to<G>(static_cast<float>(dy.data()[i]) * keep_scale) : G(0);
    }
    return dx_;
  }
  std::string shape() const { return "p=" + std::to_string(p_).substr(0, 4); }
  std::size_t activation_bytes() const {
    return detail::tensor_bytes(y_) + detail::tensor_bytes(dx_) + mask_.size();
  }
  template <class Archive>
  void visit_state(Archive& a, const std::string& prefix) {
    a.field(prefix + "seed", seed_);
    a.field(prefix + "calls", calls_);
  }
  /// Forward calls in training mode so far.
  std::uint64_t calls() const { return calls_; }

 private:
  double p_;
  std::uint64_t seed_;
  std::uint64_t calls_ = 0;
  bool train_ = true;
  std::vector<std::uint8_t> mask_;
  host_tensor<S, 2> y_;
  host_tensor<G, 2> dx_;
};

/// Dropout under P resolved for elementwise operations.
template <Policy P>
using dropout = basic_dropout<kernel_policy_t<op::elementwise, P>>;

/// The cast nn::sequential inserts where neighbouring layers store different types:
/// forward In -> Out, backward gradients GOut -> GIn, each rounded once (nearest-even).
template <class In, class Out, class GIn, class GOut>
class cast {
 public:
  using operation = op::elementwise;
  using input_type = In;
  using output_type = Out;
  using input_grad_type = GIn;
  using output_grad_type = GOut;
  static constexpr std::string_view name = "cast";

  const host_tensor<Out, 2>& forward(const cpu_context& ctx, const host_tensor<In, 2>& x, mode = mode::train) {
    detail::ensure_shape(y_, std::size_t(x.shape()[0]), std::size_t(x.shape()[1]));
    precis::cast(ctx, x, y_);
    return y_;
  }
  const host_tensor<GIn, 2>& backward(const cpu_context& ctx, const host_tensor<GOut, 2>& dy) {
    detail::ensure_shape(dx_, std::size_t(dy.shape()[0]), std::size_t(dy.shape()[1]));
    precis::cast(ctx, dy, dx_);
    return dx_;
  }
  std::string shape() const {
    return std::string(type_name_v<In>) + "->" + std::string(type_name_v<Out>);
  }
  std::size_t activation_bytes() const { return detail::tensor_bytes(y_) + detail::tensor_bytes(dx_); }
  template <class F>
  void for_each_parameter(F&&) {}
  template <class F>
  void for_each_parameter(F&&) const {}
  template <class Archive>
  void visit_state(Archive&, const std::string&) {}
  std::string validate() const { return {}; }

 private:
  host_tensor<Out, 2> y_;
  host_tensor<GIn, 2> dx_;
};

}  // namespace precis::nn
