/// @file
/// The learned vectors a Vision Transformer adds to its patch tokens.
///
///     nn::class_token(768)                 [N, T, D] -> [N, T + 1, D], a learned token first
///     nn::position_embedding(197, 768)     [N, T, D] + a learned [T, D] table
///
/// Both run under their tag's policy (default nn::tags::embedding, op::elementwise): the
/// values are the parameter's working copy in the storage type; the addition is done in the
/// policy's opmath type and rounded once. Their gradients are sums over the batch, kept in
/// the reduction rule's accumulate type (float at least), rounded once to the gradient type
/// and then added to the master-type gradient, as every parameter's are. They start uniform
/// in +-0.02 (the ViT recipes draw N(0, 0.02^2) or a truncation of it; the scale is what
/// matters) and take no weight decay.
#pragma once

#include <precis/kernels/elementwise.hpp>
#include <precis/kernels/reduce.hpp>
#include <precis/nn/module.hpp>

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>

namespace precis::nn {

namespace detail {
/// The bound of the embeddings' uniform initial values.
inline constexpr double embedding_init_bound = 0.02;
}  // namespace detail

template <Layer Tag, Policy P, std::size_t R, class Ctx>
class class_token_layer;
template <Layer Tag, Policy P, std::size_t R, class Ctx>
class position_embedding_layer;

/// Blueprint of nn::class_token.
template <Layer Tag>
struct class_token_spec {
  /// Width D of the tokens, and of the learned token.
  std::size_t dim;
  /// The layer it builds into for policy map Map on context Ctx, on tensors of rank R, which
  /// must be 3 (In and G, the types that reach it, are not used: build casts them to its own).
  template <class Map, class Ctx, class In, class G, std::size_t R>
  using module_type = class_token_layer<Tag, policy_for_t<Tag, Map>, R, Ctx>;
};
/// Blueprint of nn::position_embedding.
template <Layer Tag>
struct position_embedding_spec {
  /// Number of tokens T of every item: the table's rows.
  std::size_t tokens, dim;
  /// @var dim
  /// Width D of the tokens: the table's columns.

  /// The layer it builds into for policy map Map on context Ctx, on tensors of rank R, which
  /// must be 3 (In and G, the types that reach it, are not used: build casts them to its own).
  template <class Map, class Ctx, class In, class G, std::size_t R>
  using module_type = position_embedding_layer<Tag, policy_for_t<Tag, Map>, R, Ctx>;
};

/// A learned token of `dim` values put before every item's tokens (a blueprint node).
template <Layer Tag = tags::embedding>
constexpr class_token_spec<Tag> class_token(std::size_t dim) {
  return {dim};
}
/// A learned [tokens, dim] table added to every item (a blueprint node).
template <Layer Tag = tags::embedding>
constexpr position_embedding_spec<Tag> position_embedding(std::size_t tokens, std::size_t dim) {
  return {tokens, dim};
}

namespace detail {

/// The copy plans of nn::class_token for n items of t tokens of width d (device launches,
/// checked on the host against the layer): the learned token put first in every item (from
/// the token), the items' tokens after it (from x, to the output past its first token), and
/// backward the output gradient without its first token (from dy past its first token).
inline precis::detail::copy_plan<2> class_token_first(std::size_t n, std::size_t t, std::size_t d) {
  return {{n, d}, {0, 1}, {(t + 1) * d, 1}};
}
/// @copydoc class_token_first
inline precis::detail::copy_plan<2> class_token_rest(std::size_t n, std::size_t t, std::size_t d) {
  return {{n, t * d}, {t * d, 1}, {(t + 1) * d, 1}};
}
/// @copydoc class_token_first
inline precis::detail::copy_plan<2> class_token_backward(std::size_t n, std::size_t t, std::size_t d) {
  return {{n, t * d}, {(t + 1) * d, 1}, {t * d, 1}};
}

/// out[j] = sum over the N items of f(n, j), in the reduction rule's types, rounded once
/// to the gradient type G: the batch sum every embedding's gradient is.
template <Policy P, class G, class F>
void batch_sum(const cpu_context& ctx, std::size_t items, std::size_t width, G* out, F value) {
  using M = precis::detail::math_t<op::reduction, P, G>;
  using Acc = precis::detail::accumulate_t<op::reduction, P>;
  precis::detail::sum_rows<M, Acc>(ctx, items, width, out, [&](std::size_t i) {
    return precis::detail::load<M>(value(i / width, i % width));
  });
}

}  // namespace detail

/// The learned class token, built for Tag under the resolved policy P (see nn::class_token).
template <Layer Tag, Policy P, std::size_t R, class Ctx>
class class_token_layer : public layer_base<Tag, P, op::elementwise, R, R, Ctx> {
  static_assert(R == 3, "precis: nn::class_token takes [N, T, D] token sequences (rank 3)");
  using base = layer_base<Tag, P, op::elementwise, R, R, Ctx>;
  using S = typename base::input_type;
  using G = typename base::input_grad_type;
  using M = typename base::master_type;
  template <class T, std::size_t N = 3>
  using tensor = tensor_t<Ctx, T, N>;
  using io = context_traits<Ctx>;
  static constexpr bool on_host = std::is_same_v<Ctx, cpu_context>;

 public:
  /// Its kind in nn::describe: "class_token".
  static constexpr std::string_view kind = "class_token";

  /// The layer of a blueprint, its token zero until reset() draws it. Throws precis::error
  /// when dim is 0.
  explicit class_token_layer(const class_token_spec<Tag>& s) : dim_(s.dim), token_({s.dim}) {
    if (s.dim == 0) throw error("precis::nn::class_token: needs dim > 0");
  }

  /// Draws the token uniformly in +-0.02 from `seed`.
  void reset(std::uint64_t seed) {
    fill_uniform(token_, seed, 0, detail::embedding_init_bound);
  }

  /// The shape of the output: [N, T + 1, dim] for an input [N, T, dim]. Throws
  /// precis::error (naming the layer's `path`) when the last axis is not `dim` long.
  shape_t<3> output_shape(const shape_t<3>& in, std::string_view path) const {
    if (in[2] != dim_)
      bad_shape(path, kind, "[N, T, " + std::to_string(dim_) + "]", shape_string(in));
    return {in[0], in[1] + 1, in[2]};
  }

  /// Each item's tokens with the learned token (its working copy) put first: a copy, no
  /// arithmetic. Throws precis::error for an input of another shape.
  const tensor<S>& forward(context_ref_t<Ctx> ctx, const tensor<S>& x, mode = mode::train) {
    const auto out = output_shape(shape_of<3>(x), path_name<Tag>());
    ensure(y_, out);
    const std::size_t t = out[1] - 1, d = dim_;
    const S* tok = token_.value().data();
    if constexpr (on_host) {
      for (std::size_t n = 0; n < out[0]; ++n) {
        std::copy_n(tok, d, y_.data() + n * (t + 1) * d);
        std::copy_n(x.data() + n * t * d, t * d, y_.data() + (n * (t + 1) + 1) * d);
      }
    } else {
      io::strided_copy("precis::nn::class_token", ctx, tok, y_.data(), detail::class_token_first(out[0], t, d));
      io::strided_copy("precis::nn::class_token", ctx, x.data(), y_.data() + d, detail::class_token_rest(out[0], t, d));
    }
    x_.set(x);
    return y_;
  }
  /// Adds the batch sum of dy's first token to the token's gradient and returns dx, dy
  /// without its first token. Throws precis::error when dy's shape is not the last
  /// output's.
  const tensor<G>& backward(context_ref_t<Ctx> ctx, const tensor<G>& dy) {
    check_same_shape("precis::nn::class_token: dy and the output", dy, y_);
    const std::size_t items = std::size_t(dy.shape()[0]), t = std::size_t(dy.shape()[1]) - 1,
                      d = dim_;
    ensure(dx_, shape_t<3>{items, t, d});
    ensure(dtoken_, shape_t<1>{d});
    const G* g = dy.data();
    if constexpr (on_host) {
      for (std::size_t n = 0; n < items; ++n) {
        std::copy_n(dy.data() + (n * (t + 1) + 1) * d, t * d, dx_.data() + n * t * d);
      }
      detail::batch_sum<P>(ctx, items, d, dtoken_.data(),
                           [&](std::size_t n, std::size_t j) { return g[n * (t + 1) * d + j]; });
    } else {
      io::strided_copy("precis::nn::class_token", ctx, g + d, dx_.data(), detail::class_token_backward(items, t, d));
      // The batch sum in the device's fixed order (kernels/cuda/reduce.hpp).
      precis::detail::column_sums<P>(ctx, g, items, d, dtoken_.data(), (t + 1) * d);
    }
    token_.accumulate(ctx, dtoken_);
    return dx_;
  }

  /// The learned token [dim].
  parameter<S, M, 1, Ctx>& token() { return token_; }
  /// Its shape column in nn::describe: dim, as "768".
  std::string shape() const { return std::to_string(dim_); }
  /// Bytes of its output, input-gradient and token-gradient buffers.
  std::size_t own_bytes() const {
    return bytes_of(y_) + bytes_of(dx_) + bytes_of(dtoken_);
  }
  /// The buffers of the last passes, for precis::diagnostics (see nn/module.hpp).
  template <class Self, class F>
  static void for_each_observed(Self& self, F&& f) {
    f("", std::type_identity<Tag>{}, self.x_.peek(), self.y_, self.dx_);
  }
  /// Calls f("token", token()).
  template <class Self, class F>
  static void for_each_parameter(Self& self, F&& f) {
    f("token", self.token_);
  }
  /// Embeddings take no weight decay.
  static constexpr bool decays(std::string_view) { return false; }

 private:
  std::size_t dim_;
  parameter<S, M, 1, Ctx> token_;
  tensor<S> y_;
  tensor<G> dx_;
  saved<tensor<S>> x_;
  tensor<G, 1> dtoken_;
};

/// The learned position embedding, built for Tag under the resolved policy P (see
/// nn::position_embedding). Its input gradient is dy itself (no copy).
template <Layer Tag, Policy P, std::size_t R, class Ctx>
class position_embedding_layer : public layer_base<Tag, P, op::elementwise, R, R, Ctx> {
  static_assert(R == 3, "precis: nn::position_embedding takes [N, T, D] token sequences (rank 3)");
  using base = layer_base<Tag, P, op::elementwise, R, R, Ctx>;
  using S = typename base::input_type;
  using G = typename base::input_grad_type;
  using M = typename base::master_type;
  template <class T, std::size_t N = 3>
  using tensor = tensor_t<Ctx, T, N>;

 public:
  /// Its kind in nn::describe: "position_embedding".
  static constexpr std::string_view kind = "position_embedding";

  /// The layer of a blueprint, its table zero until reset() draws it. Throws precis::error
  /// when tokens or dim is 0.
  explicit position_embedding_layer(const position_embedding_spec<Tag>& s)
      : tokens_(s.tokens), dim_(s.dim), table_({s.tokens, s.dim}) {
    if (s.tokens == 0 || s.dim == 0)
      throw error("precis::nn::position_embedding: needs tokens > 0 and dim > 0");
  }

  /// Draws the table uniformly in +-0.02 from `seed`.
  void reset(std::uint64_t seed) {
    fill_uniform(table_, seed, 0, detail::embedding_init_bound);
  }

  /// The shape of the output: the input's, [N, tokens, dim]. Throws precis::error (naming
  /// the layer's `path`) for other token or width axes.
  shape_t<3> output_shape(const shape_t<3>& in, std::string_view path) const {
    if (in[1] != tokens_ || in[2] != dim_) {
      bad_shape(path, kind,
                        "[N, " + std::to_string(tokens_) + ", " + std::to_string(dim_) + "]",
                        shape_string(in));
    }
    return in;
  }

  /// y = x + the table (its working copy) for every item, added in the policy's opmath type
  /// and rounded once. Throws precis::error for an input of another shape.
  const tensor<S>& forward(context_ref_t<Ctx> ctx, const tensor<S>& x, mode = mode::train) {
    ensure(y_, output_shape(shape_of<3>(x), path_name<Tag>()));
    precis::add<P>(ctx, x, table_.value(), y_);
    x_.set(x);
    return y_;
  }
  /// Adds the batch sum of dy to the table's gradient and returns dy itself as dx (the
  /// caller's tensor). Throws precis::error when dy's shape is not the last output's.
  const tensor<G>& backward(context_ref_t<Ctx> ctx, const tensor<G>& dy) {
    check_same_shape("precis::nn::position_embedding: dy and the output", dy, y_);
    ensure(dtable_, shape_t<2>{tokens_, dim_});
    const std::size_t width = tokens_ * dim_;
    const G* g = dy.data();
    if constexpr (std::is_same_v<Ctx, cpu_context>) {
      detail::batch_sum<P>(ctx, std::size_t(dy.shape()[0]), width, dtable_.data(),
                           [&](std::size_t n, std::size_t j) { return g[n * width + j]; });
    } else {
      // The batch sum in the device's fixed order (kernels/cuda/reduce.hpp).
      precis::detail::column_sums<P>(ctx, g, std::size_t(dy.shape()[0]), width, dtable_.data());
    }
    table_.accumulate(ctx, dtable_);
    return dy;
  }

  /// The learned table [tokens, dim].
  parameter<S, M, 2, Ctx>& table() { return table_; }
  /// Its shape column in nn::describe: tokens x dim, as "197x768".
  std::string shape() const { return std::to_string(tokens_) + "x" + std::to_string(dim_); }
  /// Bytes of its output and table-gradient buffers (it keeps no input gradient).
  std::size_t own_bytes() const { return bytes_of(y_) + bytes_of(dtable_); }
  /// The buffers of the last passes, for precis::diagnostics (see nn/module.hpp).
  template <class Self, class F>
  static void for_each_observed(Self& self, F&& f) {
    f("", std::type_identity<Tag>{}, self.x_.peek(), self.y_, self.dtable_);
  }
  /// Calls f("table", table()).
  template <class Self, class F>
  static void for_each_parameter(Self& self, F&& f) {
    f("table", self.table_);
  }
  /// Embeddings take no weight decay.
  static constexpr bool decays(std::string_view) { return false; }

 private:
  std::size_t tokens_, dim_;
  parameter<S, M, 2, Ctx> table_;
  tensor<S> y_;
  tensor<G, 2> dtable_;
  saved<tensor<S>> x_;
};

}  // namespace precis::nn
