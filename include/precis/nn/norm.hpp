/// @file
/// Layer normalisation over the last axis and batch normalisation over the channels (axis 1) of
/// tensors of any rank.
///
///     nn::layer_norm<norm1>(768)      nn::batch_norm(64)
///
/// Both run under their tags' policies resolved for op::layer_norm / op::batch_norm: the
/// rule set makes them compute and sum in float (or wider) whatever the storage type.
/// gamma starts at 1, beta at 0. Batch norm keeps float running statistics (PyTorch's
/// momentum rule and unbiased running variance), saved in checkpoints; it uses the batch's
/// statistics in training and the running ones in evaluation.
#pragma once

#include <precis/kernels/norm.hpp>
#include <precis/nn/layout.hpp>
#include <precis/nn/module.hpp>

#include <array>
#include <cstddef>
#include <string>
#include <string_view>

namespace precis::nn {

template <Layer Tag, Policy P, std::size_t R, class Ctx>
class layer_norm_layer;
template <Layer Tag, Policy P, std::size_t R, class Ctx>
class batch_norm_layer;

/// Blueprint of a layer norm over a last axis of `features`.
template <Layer Tag>
struct layer_norm_spec {
  /// Size of the normalised last axis (and of gamma and beta).
  std::size_t features;
  /// Added to the variance before its square root: y = (x - mean) / sqrt(var + eps).
  double eps = 1e-5;
  /// The layer it builds into for policy map Map on context Ctx, on tensors of rank R (In
  /// and G, the types that reach it, are not used: build casts them to its own).
  template <class Map, class Ctx, class In, class G, std::size_t R>
  using module_type = layer_norm_layer<Tag, policy_for_t<Tag, Map>, R, Ctx>;
};
/// Blueprint of a batch norm over `channels` on axis 1.
template <Layer Tag>
struct batch_norm_spec {
  /// Number of channels: the size of axis 1 (and of gamma, beta and the running statistics).
  std::size_t channels;
  /// Weight of the new batch in the running statistics, PyTorch's rule: running =
  /// (1 - momentum) running + momentum batch statistic. In [0, 1].
  double momentum = 0.1;
  /// Added to the variance before its square root.
  double eps = 1e-5;
  /// The layer it builds into for policy map Map on context Ctx, on tensors of rank R (In
  /// and G, the types that reach it, are not used: build casts them to its own).
  template <class Map, class Ctx, class In, class G, std::size_t R>
  using module_type = batch_norm_layer<Tag, policy_for_t<Tag, Map>, R, Ctx>;
};

/// Layer normalisation over a last axis of `features` values.
template <Layer Tag = tags::layer_norm>
constexpr layer_norm_spec<Tag> layer_norm(std::size_t features, double eps = 1e-5) {
  return {features, eps};
}
/// Batch normalisation of `channels` channels (axis 1 of [N, C] or [N, C, H, W]).
template <Layer Tag = tags::batch_norm>
constexpr batch_norm_spec<Tag> batch_norm(std::size_t channels, double momentum = 0.1, double eps = 1e-5) {
  return {channels, momentum, eps};
}

namespace detail {

/// What the norm layers share: the per-feature scale gamma (starting at 1) and shift beta
/// (starting at 0), their gradients, and the output and input-gradient buffers.
template <Layer Tag, Policy P, op_kind Op, std::size_t R, class Ctx>
class affine_norm : public layer_base<Tag, P, Op, R, R, Ctx> {
  using base = layer_base<Tag, P, Op, R, R, Ctx>;

 protected:
  using S = typename base::input_type;
  using G = typename base::input_grad_type;
  using M = typename base::master_type;
  using St = typename base::statistics_type;
  using io = context_traits<Ctx>;
  template <class T, std::size_t N = R>
  using tensor = tensor_t<Ctx, T, N>;

  affine_norm(std::string_view layer, std::size_t features)
      : features_(features), gamma_({features}), beta_({features}) {
    if (features == 0) throw error("precis::nn::" + std::string(layer) + ": needs features > 0");
    reset_affine();
  }
  void reset_affine() {
    io::fill(gamma_.master(), M(1));
    io::fill(beta_.master(), M(0));
    if constexpr (std::is_same_v<Ctx, cpu_context>) {
      gamma_.refresh();
      beta_.refresh();
    }
  }
  /// The buffers of a pass of this shape; `own_output` false where the output goes to a
  /// buffer of the next layer's (a fused ReLU: nn::sequence).
  void size_buffers(const shape_t<R>& shape, bool own_output = true) {
    if (own_output) ensure(y_, shape);
  }
  /// The backward pass's buffers for an input of this shape, sized by backward(): nn::repeat
  /// lends them from block to block between backward passes (for_each_gradient_buffer).
  void size_gradients(const shape_t<R>& shape) {
    ensure(dx_, shape);
    ensure(dgamma_, shape_t<1>{features_});
    ensure(dbeta_, shape_t<1>{features_});
  }
  void accumulate_affine(context_ref_t<Ctx> ctx) {
    gamma_.accumulate(ctx, dgamma_);
    beta_.accumulate(ctx, dbeta_);
  }
  std::size_t buffer_bytes() const {
    return bytes_of(y_) + bytes_of(dx_) + bytes_of(dgamma_) + bytes_of(dbeta_);
  }

 public:
  /// The buffers of the last passes, for precis::diagnostics (see nn/module.hpp).
  template <class Self, class F>
  static void for_each_observed(Self& self, F&& f) {
    f("", std::type_identity<Tag>{}, self.x_.peek(), self.y_, self.dx_);
  }
  /// Its backward pass's buffers (see nn/module.hpp): dx, and gamma's and beta's gradients
  /// before they are added to the parameters'.
  template <class Self, class F>
  static void for_each_gradient_buffer(Self& self, F&& f) {
    f(self.dx_);
    f(self.dgamma_);
    f(self.dbeta_);
  }
  parameter<S, M, 1, Ctx>& gamma() { return gamma_; }
  parameter<S, M, 1, Ctx>& beta() { return beta_; }
  std::string shape() const { return std::to_string(features_); }
  template <class Self, class F>
  static void for_each_parameter(Self& self, F&& f) {
    f("gamma", self.gamma_);
    f("beta", self.beta_);
  }
  /// Norm parameters take no weight decay.
  static constexpr bool decays(std::string_view) { return false; }

 protected:
  std::size_t features_;
  parameter<S, M, 1, Ctx> gamma_, beta_;
  tensor<S> y_;
  tensor<G> dx_;
  tensor<G, 1> dgamma_, dbeta_;
  saved<tensor<S>> x_;
};

}  // namespace detail

/// Layer normalisation over the last axis, built for Tag under the resolved policy P.
template <Layer Tag, Policy P, std::size_t R, class Ctx>
class layer_norm_layer : public detail::affine_norm<Tag, P, op::layer_norm, R, Ctx> {
  static_assert(R >= 1, "precis: nn::layer_norm works on the last axis of a tensor of rank >= 1");
  using base = detail::affine_norm<Tag, P, op::layer_norm, R, Ctx>;
  using typename base::S;
  using typename base::G;
  using typename base::St;
  template <class T, std::size_t N = R>
  using tensor = tensor_t<Ctx, T, N>;

 public:
  /// Its kind in nn::describe: "layer_norm".
  static constexpr std::string_view kind = "layer_norm";

  /// The layer of a blueprint, gamma 1 and beta 0. Throws precis::error when features is 0
  /// or eps is negative or not finite.
  explicit layer_norm_layer(const layer_norm_spec<Tag>& s) : base(kind, s.features), eps_(s.eps) {
    precis::detail::check_eps("precis::nn::layer_norm", s.eps);
  }

  /// Sets gamma back to 1 and beta to 0 (nothing is drawn: the seed is not used).
  void reset(std::uint64_t) { this->reset_affine(); }

  /// The shape of the output: the input's. Throws precis::error (naming the layer's `path`)
  /// when the last axis is not `features` long.
  shape_t<R> output_shape(const shape_t<R>& in, std::string_view path) const {
    if (in[R - 1] != this->features_) {
      bad_shape(path, kind, "[..., " + std::to_string(this->features_) + "]", shape_string(in));
    }
    return in;
  }

  /// y = (x - mean) / sqrt(var + eps) * gamma + beta over each row of the last axis (var
  /// biased), computed in float or wider; keeps the address of x and each row's mean and
  /// 1 / sqrt(var + eps) for backward(). The mode makes no difference. Throws precis::error
  /// for an input of another shape, before any buffer changes.
  const tensor<S>& forward(context_ref_t<Ctx> ctx, const tensor<S>& x, mode = mode::train) {
    const auto shape = output_shape(shape_of<R>(x), path_name<Tag>());
    this->size_buffers(shape);
    shape_t<R - 1> rows{};
    for (std::size_t i = 0; i + 1 < R; ++i) rows[i] = shape[i];
    ensure(mean_, rows);
    ensure(rstd_, rows);
    precis::layer_norm<P>(ctx, x, this->gamma_.value(), this->beta_.value(), this->y_, mean_, rstd_, eps_);
    this->x_.set(x);
    return this->y_;
  }
  /// Adds dgamma and dbeta to the parameters' gradients and returns dx, from the
  /// statistics of the last forward pass. Throws precis::error without a forward pass or
  /// when dy's shape is not x's.
  const tensor<G>& backward(context_ref_t<Ctx> ctx, const tensor<G>& dy) {
    const auto& x = this->x_.get(kind);
    this->size_gradients(shape_of<R>(x));
    layer_norm_backward<P>(ctx, dy, x, this->gamma_.value(), mean_, rstd_, this->dx_, this->dgamma_, this->dbeta_);
    this->accumulate_affine(ctx);
    return this->dx_;
  }
  /// Bytes of its output, gradient and per-row statistics buffers.
  std::size_t own_bytes() const { return this->buffer_bytes() + bytes_of(mean_) + bytes_of(rstd_); }

 private:
  double eps_;
  tensor<St, R - 1> mean_, rstd_;
};

/// Batch normalisation over axis 1 (axis 3 of the [N, H, W, C] images of a model built
/// channels-last, nn/layout.hpp: the kernels read them in place; the host's with NCHW's
/// bits), built for Tag under the resolved policy P.
template <Layer Tag, Policy P, std::size_t R, class Ctx>
class batch_norm_layer : public detail::affine_norm<Tag, P, op::batch_norm, R, Ctx> {
  static_assert(R >= 2, "precis: nn::batch_norm normalises axis 1 of [N, C, ...] tensors");
  using base = detail::affine_norm<Tag, P, op::batch_norm, R, Ctx>;
  using typename base::S;
  using typename base::G;
  using typename base::St;
  template <class T, std::size_t N = R>
  using tensor = tensor_t<Ctx, T, N>;

 public:
  /// Its kind in nn::describe: "batch_norm".
  static constexpr std::string_view kind = "batch_norm";

  /// The layer of a blueprint, gamma 1, beta 0, running mean 0 and running variance 1.
  /// Throws precis::error when channels is 0, momentum is outside [0, 1] or eps is negative
  /// or not finite.
  explicit batch_norm_layer(const batch_norm_spec<Tag>& s)
      : base(kind, s.channels),
        momentum_(s.momentum),
        eps_(s.eps),
        running_mean_(shape_t<1>{s.channels}),
        running_var_(shape_t<1>{s.channels}) {
    if (!(s.momentum >= 0.0 && s.momentum <= 1.0)) throw error("precis::nn::batch_norm: momentum must be in [0, 1]");
    precis::detail::check_eps("precis::nn::batch_norm", s.eps);
    reset_statistics();
  }

  /// Sets gamma back to 1, beta to 0 and the running statistics to mean 0 and variance 1
  /// (nothing is drawn: the seed is not used).
  void reset(std::uint64_t) {
    this->reset_affine();
    reset_statistics();
  }

  /// The shape of the output: the input's. Throws precis::error (naming the layer's `path`)
  /// when axis 1 is not `channels` long or an axis is empty, and in mode::train when a channel
  /// would have one value (no batch variance): nn::model::forward asks so for every batch norm
  /// before any layer runs.
  shape_t<R> output_shape(const shape_t<R>& in, std::string_view path, mode m = mode::eval) const {
    if (in[channel_axis()] != this->features_ || detail::elements(in) == 0) {
      const std::string c = std::to_string(this->features_);
      bad_shape(path, kind,
                        (channel_axis() == 1 ? "[N, " + c + ", ...]" : "[N, H, W, " + c + "]") + " with no empty axis",
                        shape_string(in));
    }
    if (m == mode::train &&
        !precis::detail::batch_norm_trains_on(detail::elements(in) / this->features_)) {
      throw error(
          "precis::nn: layer " + path_or_root(path) + " (" + std::string(kind) +
          ") expects more than one value per channel in training mode, got an input of shape " +
          shape_string(in));
    }
    return in;
  }

  /// y = (x - mean) / sqrt(var + eps) * gamma + beta per channel (axis 1), computed in float
  /// or wider. In mode::train the mean and biased variance are the batch's, over every axis
  /// but 1, and the running statistics are updated (see `momentum`); the address of x and
  /// the batch statistics are kept for backward(). In mode::eval the running statistics
  /// are used and nothing is updated. Throws precis::error for an input of another shape or
  /// with fewer than two values per channel in training, before any buffer changes.
  const tensor<S>& forward(context_ref_t<Ctx> ctx, const tensor<S>& x, mode m = mode::train) {
    this->size_buffers(checked_batch(x, m));
    normalise(ctx, x, m, this->y_, fused_activation::none);
    return this->y_;
  }
  /// Whether nn::sequence runs this layer and `Next`, the layer after it, as one pass
  /// (forward_relu, backward_relu): on the device, where Next is a ReLU (nn::relu) of this
  /// layer's context that reads and gives this layer's output and gradient types and computes
  /// in a type that holds them exactly, so that the pair gives the two layers' bits. The host
  /// keeps the two layers apart, so that precis::diagnostics' monitor reads each one's
  /// buffers.
  template <class Next>
  static constexpr bool fuses_with = [] {
    if constexpr (std::is_same_v<Ctx, cpu_context>) {
      return false;
    } else if constexpr (requires {
                           Next::kind;
                           typename Next::policy_type;
                           typename Next::context_type;
                         }) {
      using Np = typename Next::policy_type;
      using Mf = precis::detail::math_t<op::elementwise, Np, S>;
      using Mb = precis::detail::math_t<op::elementwise, Np, G, S>;
      return Next::kind == std::string_view("relu") && std::is_same_v<typename Next::context_type, Ctx> &&
             std::is_same_v<typename Next::input_type, S> && std::is_same_v<typename Next::output_type, S> &&
             std::is_same_v<typename Next::input_grad_type, G> && std::is_same_v<typename Next::output_grad_type, G> &&
             at_least_as_wide_v<Mf, S> && at_least_as_wide_v<Mb, S> && at_least_as_wide_v<Mb, G> &&
             at_least_as_wide_v<precis::detail::math_t<op::batch_norm, P, S, S, S>, S> &&
             at_least_as_wide_v<precis::detail::math_t<op::batch_norm, P, G, S, S>, G>;
    } else {
      return false;
    }
  }();
  /// relu(forward(x, m)) into `next`'s output buffer (its fused_output(), sized to x's shape),
  /// in the passes of forward() (fused_activation::relu): what nn::sequence runs where
  /// fuses_with<Next> holds. Keeps what backward_relu() needs; this layer's own output buffer
  /// is not written. Throws precis::error as forward() does, before `next` is touched.
  template <class Next>
  const tensor<S>& forward_relu(context_ref_t<Ctx> ctx, const tensor<S>& x, mode m, Next& next) {
    const auto shape = checked_batch(x, m);
    this->size_buffers(shape, false);
    auto& z = next.fused_output(shape);
    normalise(ctx, x, m, z, fused_activation::relu);
    return z;
  }
  /// The input gradient of relu(forward(x)) from dz and z, the output of the last
  /// forward_relu() (batch_norm_relu_backward): backward() of the ReLU's gradient, adding
  /// dgamma and dbeta to the parameters' gradients. Throws precis::error as backward() does.
  const tensor<G>& backward_relu(context_ref_t<Ctx> ctx, const tensor<G>& dz, const tensor<S>& z) {
    this->size_gradients(shape_of<R>(trained_input()));
    batch_norm_relu_backward<P>(ctx, dz, z, trained_input(), this->gamma_.value(), save_mean_, save_rstd_, this->dx_,
                                this->dgamma_, this->dbeta_, layout_);
    this->accumulate_affine(ctx);
    return this->dx_;
  }
  /// Backward of the last forward pass, which must have been in training mode (the batch
  /// statistics' gradient; evaluation mode's running statistics are not differentiated):
  /// adds dgamma and dbeta to the parameters' gradients and returns dx. Throws
  /// precis::error after an evaluation-mode forward pass or without a forward pass.
  const tensor<G>& backward(context_ref_t<Ctx> ctx, const tensor<G>& dy) {
    this->size_gradients(shape_of<R>(trained_input()));
    batch_norm_backward<P>(ctx, dy, trained_input(), this->gamma_.value(), save_mean_, save_rstd_, this->dx_,
                           this->dgamma_, this->dbeta_, layout_);
    this->accumulate_affine(ctx);
    return this->dx_;
  }
  /// Takes images in `layout` (nn::build calls it with build_options::layout): for
  /// [N, H, W, C] the channels are axis 3. Other ranks keep axis 1.
  void set_layout(image_layout layout, std::string_view) {
    if constexpr (R == 4) layout_ = layout;
  }

  /// The running mean of each channel [channels], in the statistics type (float, or
  /// double under a double policy).
  const tensor<St, 1>& running_mean() const { return running_mean_; }
  /// The running (unbiased) variance of each channel [channels].
  const tensor<St, 1>& running_var() const { return running_var_; }
  /// Bytes of its output, gradient and batch-statistics buffers (not the running
  /// statistics).
  std::size_t own_bytes() const {
    return this->buffer_bytes() + bytes_of(save_mean_) + bytes_of(save_rstd_);
  }
  /// Saves or loads the running statistics ("running_mean", "running_var") under `prefix`
  /// (see precis::save_checkpoint; nn::model saves gamma and beta before them).
  template <class Archive>
  void visit_state(Archive& a, const std::string& prefix) {
    visit_statistics(a, prefix + "running_mean", running_mean_);
    visit_statistics(a, prefix + "running_var", running_var_);
  }
  /// Empty, or what loading its running statistics found wrong.
  std::string validate() const { return problem_; }

 private:
  using io = context_traits<Ctx>;
  std::size_t channel_axis() const { return layout_ == image_layout::nhwc ? R - 1 : 1; }
  // x's shape, once every refusal of forward() and forward_relu() has been checked (the
  // shape, and in training two values per channel), so that a refused batch resizes no
  // buffer of this layer or of the ReLU it runs with.
  shape_t<R> checked_batch(const tensor<S>& x, mode m) const {
    return output_shape(shape_of<R>(x), path_name<Tag>(), m);
  }
  // forward() and forward_relu(): the batch's statistics (kept, with the address of x) or
  // the running ones, and the output in `out`.
  void normalise(context_ref_t<Ctx> ctx, const tensor<S>& x, mode m, tensor<S>& out, fused_activation act) {
    if (m == mode::train) {
      ensure(save_mean_, shape_t<1>{this->features_});
      ensure(save_rstd_, shape_t<1>{this->features_});
      batch_norm_train<P>(ctx, x, this->gamma_.value(), this->beta_.value(), running_mean_, running_var_, out,
                          save_mean_, save_rstd_, momentum_, eps_, layout_, act);
      this->x_.set(x);
    } else {
      batch_norm_infer<P>(ctx, x, this->gamma_.value(), this->beta_.value(), running_mean_, running_var_, out, eps_,
                          layout_, act);
    }
    last_train_ = m == mode::train;
  }
  // The input of the last forward pass, which backward() and backward_relu() differentiate;
  // throws precis::error after an evaluation-mode pass or without one.
  const tensor<S>& trained_input() const {
    if (!last_train_) {
      throw error("precis::nn::batch_norm: backward() after an evaluation-mode forward(); the backward pass "
                  "differentiates the batch statistics of a training-mode forward (mode::train)");
    }
    return this->x_.get(kind);
  }
  void reset_statistics() {
    io::fill(running_mean_, St(0));
    io::fill(running_var_, St(1));
  }
  template <class Archive>
  void visit_statistics(Archive& a, const std::string& name, tensor<St, 1>& t) {
    const auto held = io::download(t);
    std::vector<float> v(held.begin(), held.end());
    a.floats(name, v);
    if (v.size() != t.size()) {
      problem_ = name + " has " + std::to_string(v.size()) + " values, the model has " + std::to_string(t.size());
      return;
    }
    io::upload(t, std::vector<St>(v.begin(), v.end()));
  }

  double momentum_, eps_;
  bool last_train_ = false;
  tensor<St, 1> running_mean_, running_var_;
  tensor<St, 1> save_mean_, save_rstd_;
  std::string problem_;
  image_layout layout_ = image_layout::nchw;
};

}  // namespace precis::nn
