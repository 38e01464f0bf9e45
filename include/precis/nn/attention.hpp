/// @file
/// Softmax over the last axis, and multi-head self-attention as one layer made of tagged pieces.
///
///     nn::softmax()                                      any rank, op::softmax
///     nn::attention(768, 12)                             default tags (nn::tags::attention_*)
///     nn::attention<qkv, scores, attn_softmax, context, proj>(768, 12)
///
/// Attention on x [N, T, D] with H heads of dh = D / H values:
///
///     qkv     = x Wqkv^T + bqkv          [N, T, 3D]   linear, QkvTag's policy
///     q, k, v = the three thirds, split into heads   [N*H, T, dh]
///     scores  = q k^T / sqrt(dh)         [N*H, T, T]  batched product, ScoresTag's policy
///     probs   = softmax(scores)          [N*H, T, T]  SoftmaxTag's policy (float math by rule)
///     context = probs v                  [N*H, T, dh] batched product, ContextTag's policy
///     y       = merge(context) Wout^T + bout [N, T, D] linear, OutTag's policy
///
/// The layout of qkv's 3D outputs is PyTorch's (nn.MultiheadAttention's in_proj, timm's
/// qkv): q, then k, then v, each head-major (head h holds values h*dh .. h*dh + dh - 1).
/// Each piece stores its output in its own policy's storage type and its input gradient in
/// its gradient type; where two neighbouring pieces store different types, the layer
/// converts between them with precis::cast (each value rounded once, nearest-even), as
/// nn::build does between layers: q and k reach the scores product in its storage type, v
/// and the probabilities reach the context product in its storage type, and so on back.
/// 1/sqrt(dh) is the products' alpha, a float (exact for the usual powers of two; under a
/// double policy, 1/sqrt(dh) rounded to float, in forward and backward alike).
/// Parameters: "qkv.weight" [3D, D], "qkv.bias", "out.weight" [D, D], "out.bias"; linear
/// initialisation (uniform +-1/sqrt(D)).
#pragma once

#include <precis/kernels/cast.hpp>
#include <precis/kernels/gemm.hpp>
#include <precis/kernels/softmax.hpp>
#include <precis/nn/linear.hpp>
#include <precis/nn/module.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>

namespace precis::nn {

namespace tags {
/// Default tag of attention's input projection (q, k and v).
struct attention_qkv : positional_tag<op::matmul> {
  /// The piece's name in nn::describe's rows.
  static constexpr std::string_view name = "qkv";
};
/// Default tag of attention's scores product q k^T.
struct attention_scores : positional_tag<op::matmul> {
  /// The piece's name in nn::describe's rows.
  static constexpr std::string_view name = "scores";
};
/// Default tag of attention's softmax over the scores.
struct attention_softmax : positional_tag<op::softmax> {
  /// The piece's name in nn::describe's rows.
  static constexpr std::string_view name = "softmax";
};
/// Default tag of attention's context product probabilities x v.
struct attention_context : positional_tag<op::matmul> {
  /// The piece's name in nn::describe's rows.
  static constexpr std::string_view name = "context";
};
/// Default tag of attention's output projection.
struct attention_out : positional_tag<op::matmul> {
  /// The piece's name in nn::describe's rows.
  static constexpr std::string_view name = "out";
};
}  // namespace tags

// ---------------------------------------------------------------------------------------
// softmax

template <Layer Tag, Policy P, std::size_t R, class Ctx>
class softmax_layer;

/// Blueprint of nn::softmax.
template <Layer Tag>
struct softmax_spec {
  /// The layer it builds into for policy map Map on context Ctx, reading tensors of rank R
  /// (In and G, the types that reach it, are not used: build casts them to its own).
  template <class Map, class Ctx, class In, class G, std::size_t R>
  using module_type = softmax_layer<Tag, policy_for_t<Tag, Map>, R, Ctx>;
};

/// Softmax over the last axis (a blueprint node).
template <Layer Tag = tags::softmax>
constexpr softmax_spec<Tag> softmax() {
  return {};
}

/// Softmax over the last axis of a rank-R tensor under the resolved policy P: max
/// subtracted, exp and sums in float at least (the rule set for op::softmax), each output
/// rounded once to the storage type. Backward reads its own output: dx = y (dy - sum(dy y)).
template <Layer Tag, Policy P, std::size_t R, class Ctx>
class softmax_layer : public layer_base<Tag, P, op::softmax, R, R, Ctx> {
  static_assert(R >= 1, "precis: nn::softmax works on the last axis of a tensor of rank >= 1");
  using base = layer_base<Tag, P, op::softmax, R, R, Ctx>;
  using S = typename base::input_type;
  using G = typename base::input_grad_type;
  template <class T>
  using tensor = tensor_t<Ctx, T, R>;

 public:
  /// Its kind in nn::describe: "softmax".
  static constexpr std::string_view kind = "softmax";

  softmax_layer() = default;
  /// The layer of a blueprint (nn::softmax); it has no parameters.
  explicit softmax_layer(const softmax_spec<Tag>&) {}

  /// The shape of the output: the input's. Throws precis::error (naming the layer's `path`)
  /// when the last axis is empty.
  shape_t<R> output_shape(const shape_t<R>& in, std::string_view path) const {
    if (in[R - 1] == 0) bad_shape(path, kind, "[..., K] with K > 0", shape_string(in));
    return in;
  }
  /// The softmax of each row of x's last axis (see the class comment), kept for backward().
  /// Throws precis::error when the last axis is empty.
  const tensor<S>& forward(context_ref_t<Ctx> ctx, const tensor<S>& x, mode = mode::train) {
    ensure(y_, output_shape(shape_of<R>(x), path_name<Tag>()));
    precis::softmax<P>(ctx, x, y_);
    x_.set(x);
    return y_;
  }
  /// dx = y (dy - sum(dy y)) over each row, from the output of the last forward pass,
  /// rounded once to the gradient type. Throws precis::error when dy's shape is not that
  /// output's.
  const tensor<G>& backward(context_ref_t<Ctx> ctx, const tensor<G>& dy) {
    check_same_shape("precis::nn::softmax: dy and the output", dy, y_);
    ensure(dx_, shape_of<R>(dy));
    precis::softmax_backward<P>(ctx, dy, y_, dx_);
    return dx_;
  }
  /// Its shape column in nn::describe: "-" (it has no parameters).
  std::string shape() const { return "-"; }
  /// Bytes of its output and input-gradient buffers.
  std::size_t own_bytes() const { return bytes_of(y_) + bytes_of(dx_); }
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
  tensor<S> y_;
  tensor<G> dx_;
  saved<tensor<S>> x_;
};

// ---------------------------------------------------------------------------------------
// attention

template <Layer QkvTag, Layer ScoresTag, Layer SoftmaxTag, Layer ContextTag, Layer OutTag,
          class Map, class Ctx>
class attention_layer;

/// Blueprint of nn::attention.
template <Layer QkvTag, Layer ScoresTag, Layer SoftmaxTag, Layer ContextTag, Layer OutTag>
struct attention_spec {
  /// Width D of the tokens, in and out.
  std::size_t dim, heads;
  /// @var heads
  /// Number of heads H; it divides dim.

  /// The layer it builds into for policy map Map on context Ctx (In, G and R, what reaches
  /// it, are not used: it reads rank 3, and build casts the types to its own).
  template <class Map, class Ctx, class In, class G, std::size_t R>
  using module_type = attention_layer<QkvTag, ScoresTag, SoftmaxTag, ContextTag, OutTag, Map, Ctx>;
};

/// Multi-head self-attention on [N, T, dim] with `heads` heads (dim a multiple of heads),
/// each piece under its own tag's policy (a blueprint node; see the file comment).
template <Layer QkvTag = tags::attention_qkv, Layer ScoresTag = tags::attention_scores,
          Layer SoftmaxTag = tags::attention_softmax, Layer ContextTag = tags::attention_context,
          Layer OutTag = tags::attention_out>
constexpr attention_spec<QkvTag, ScoresTag, SoftmaxTag, ContextTag, OutTag> attention(
    std::size_t dim, std::size_t heads) {
  return {dim, heads};
}

namespace detail {

/// `x` as a tensor of the buffer's element type: x itself when it already is one, else
/// `buffer` holding x cast to that type (each value rounded once).
template <class Ctx, class X, class Buffer>
const Buffer& as_type(Ctx&& ctx, const X& x, Buffer& buffer) {
  if constexpr (std::is_same_v<X, Buffer>) {
    return x;
  } else {
    ensure(buffer, shape_of<std::tuple_size_v<std::remove_cvref_t<decltype(x.shape())>>>(x));
    precis::cast(ctx, x, buffer);
    return buffer;
  }
}

/// The geometry of one attention call: items, tokens, width and heads.
struct heads_geometry {
  std::size_t n, t, d, h;
  std::size_t dh() const { return d / h; }
  shape_t<3> per_head() const { return {n * h, t, d / h}; }
  shape_t<3> square() const { return {n * h, t, t}; }
};

/// What stands in for the fused-attention engine in a layer that runs the pieces.
struct no_fused_attention {};

/// Whether attention on context Ctx with these pieces' policies runs scores, softmax and
/// context as one fused kernel (see attention_layer::fused): the context offers one
/// (context_traits<Ctx>::fused_attention: cuDNN's, on a cuda_context whose target links
/// precis::cudnn_frontend); q, k, v, the probabilities, the context and every gradient
/// between them are one 16-bit type (bfloat16 or float16), as the fused kernel reads and
/// writes them; both products accumulate in float and are the hardware's (products::hardware:
/// a fused kernel sums in its own order and keeps the scores in registers, the way tensor
/// cores sum). Any other map keeps the five pieces.
template <class Ctx, class Qkv, class Scores, class Softmax, class Context>
consteval bool fuses_attention() {
  if constexpr (!requires { context_traits<Ctx>::fused_attention; }) {
    return false;
  } else {
    using S = typename Scores::storage_type;
    constexpr bool sixteen_bit = std::is_same_v<S, bfloat16> || std::is_same_v<S, float16>;
    constexpr bool one_type =
        std::is_same_v<activation_type_t<Qkv>, S> && std::is_same_v<activation_grad_type_t<Qkv>, S> &&
        std::is_same_v<typename Scores::gradient_type, S> && std::is_same_v<typename Softmax::storage_type, S> &&
        std::is_same_v<typename Softmax::gradient_type, S> && std::is_same_v<typename Context::storage_type, S> &&
        std::is_same_v<typename Context::gradient_type, S>;
    constexpr bool hardware = std::is_same_v<typename Scores::products_type, products::hardware> &&
                              std::is_same_v<typename Context::products_type, products::hardware>;
    constexpr bool float_sums = std::is_same_v<precis::detail::accumulate_t<op::matmul, Scores>, float> &&
                                std::is_same_v<precis::detail::accumulate_t<op::matmul, Context>, float>;
    return context_traits<Ctx>::fused_attention && sixteen_bit && one_type && hardware && float_sums;
  }
}

template <bool Fused, class Ctx>
struct fused_engine_of {
  using type = no_fused_attention;
};
template <class Ctx>
struct fused_engine_of<true, Ctx> {
  using type = typename context_traits<Ctx>::fused_attention_engine;
};

/// The copy plan that takes one of `count` heads tensors [N*H, T, dh] out of rows [N, T,
/// count d] (its columns from the rows' first: the caller offsets the rows pointer), or,
/// `to_rows`, puts it back: over [N, H, T, dh].
inline precis::detail::copy_plan<4> heads_plan(const heads_geometry& g, std::size_t count, bool to_rows) {
  const std::size_t dh = g.dh(), width = count * g.d;
  const std::size_t rows[4] = {g.t * width, dh, width, 1};
  const std::size_t heads[4] = {g.h * g.t * dh, g.t * dh, dh, 1};
  precis::detail::copy_plan<4> plan{{g.n, g.h, g.t, dh}, {}, {}};
  for (std::size_t k = 0; k < 4; ++k) {
    plan.from[k] = to_rows ? heads[k] : rows[k];
    plan.to[k] = to_rows ? rows[k] : heads[k];
  }
  return plan;
}

/// `x` as a tensor of the buffer's element type after as_type(ctx, x, buffer) has run: x
/// itself, or the buffer that holds its cast (the backward pass reads what the forward pass
/// converted).
template <class X, class Buffer>
const Buffer& as_cast(const X& x, const Buffer& buffer) {
  if constexpr (std::is_same_v<X, Buffer>) {
    return x;
  } else {
    return buffer;
  }
}

/// Calls f(row offset, head offset) for every run of dh values that one head holds in the
/// `width`-wide rows of [N, T, width] and in [N*H, T, dh]. Images are shared among the
/// context's threads.
template <class F>
void for_each_head_run(const cpu_context& ctx, const heads_geometry& g, std::size_t width, F&& f) {
  const std::size_t dh = g.dh();
  const std::size_t per_image = g.t * g.h * dh;
  precis::detail::parallel_for(
      ctx, g.n,
      std::max<std::size_t>(1, (std::size_t(1) << 15) / std::max<std::size_t>(1, per_image)),
      [&](std::size_t n0, std::size_t n1) {
        for (std::size_t n = n0; n < n1; ++n) {
          for (std::size_t h = 0; h < g.h; ++h) {
            for (std::size_t t = 0; t < g.t; ++t)
              f((n * g.t + t) * width + h * dh, ((n * g.h + h) * g.t + t) * dh);
          }
        }
      });
}

/// Copies n elements, inline: a head's run is a few dozen bytes (64 at width 64 and 4 heads
/// in float, 128 at width 192 and 3 heads in bfloat16), for which a call to memmove costs
/// more than the copy, and an element loop over 2-byte formats more still. Whole 64- and
/// 8-byte pieces are fixed-size copies, which compile to vector and integer moves.
template <class U>
void copy_run(const U* from, std::size_t n, U* to) {
  static_assert(std::is_trivially_copyable_v<U>, "precis: heads are copied as bytes");
  const auto* s = reinterpret_cast<const unsigned char*>(from);
  auto* d = reinterpret_cast<unsigned char*>(to);
  const std::size_t bytes = n * sizeof(U);
  std::size_t i = 0;
  for (; i + 64 <= bytes; i += 64) std::memcpy(d + i, s + i, 64);
  for (; i + 8 <= bytes; i += 8) std::memcpy(d + i, s + i, 8);
  for (; i < bytes; ++i) d[i] = s[i];
}

/// heads[0], heads[1], ... [N*H, T, dh] = the heads of rows [N, T, count d] (count: how
/// many heads tensors; the i-th from column i d on: qkv's q, k and v), in one pass.
template <class U, class... Heads>
void split_heads(const cpu_context& ctx, const heads_geometry& g, const U* rows, Heads*... heads) {
  const std::size_t dh = g.dh(), d = g.d;
  for_each_head_run(ctx, g, sizeof...(Heads) * d, [&](std::size_t r, std::size_t e) {
    std::size_t column = 0;
    ((copy_run(rows + r + column, dh, heads + e), column += d), ...);
  });
}

/// The heads tensors put back into rows [N, T, count d], as split_heads took them out.
template <class U, class... Heads>
void merge_heads(const cpu_context& ctx, const heads_geometry& g, U* rows, const Heads*... heads) {
  const std::size_t dh = g.dh(), d = g.d;
  for_each_head_run(ctx, g, sizeof...(Heads) * d, [&](std::size_t r, std::size_t e) {
    std::size_t column = 0;
    ((copy_run(heads + e, dh, rows + r + column), column += d), ...);
  });
}

}  // namespace detail

/// Multi-head self-attention (see nn::attention and the file comment), its five pieces'
/// policies resolved from `Map` by their tags. For describe and the model, the layer's tag
/// and policy are the qkv piece's; the others are member types (`scores_policy`, ...).
/// Named by its position in paths (its tags name its pieces, not the layer): wrap it in
/// nn::named to give it a name.
template <Layer QkvTag, Layer ScoresTag, Layer SoftmaxTag, Layer ContextTag, Layer OutTag,
          class Map, class Ctx>
class attention_layer
    : public layer_base<QkvTag, policy_for_t<QkvTag, Map>, op::matmul, 3, 3, Ctx, true> {
  static_assert(
      std::is_same_v<typename ScoresTag::op, op::matmul> &&
          std::is_same_v<typename ContextTag::op, op::matmul> &&
          std::is_same_v<typename OutTag::op, op::matmul>,
      "precis: nn::attention's scores, context and out tags must be precis::layer<op::matmul> "
      "(they are matrix products); see nn::tags::attention_scores");
  static_assert(std::is_same_v<typename SoftmaxTag::op, op::softmax>,
                "precis: nn::attention's softmax tag must be precis::layer<op::softmax>; see "
                "nn::tags::attention_softmax");

 public:
  /// Policy of the input projection, resolved from Map by QkvTag (the layer's `policy_type`).
  using qkv_policy = policy_for_t<QkvTag, Map>;
  /// Policy of the scores product q k^T, resolved by ScoresTag.
  using scores_policy = policy_for_t<ScoresTag, Map>;
  /// Policy of the softmax over the scores, resolved by SoftmaxTag.
  using softmax_policy = policy_for_t<SoftmaxTag, Map>;
  /// Policy of the context product (probabilities times v), resolved by ContextTag.
  using context_policy = policy_for_t<ContextTag, Map>;
  /// Policy of the output projection, resolved by OutTag.
  using out_policy = policy_for_t<OutTag, Map>;
  /// Every piece's policy: qkv, scores, softmax, context, out.
  using policy_types =
      std::tuple<qkv_policy, scores_policy, softmax_policy, context_policy, out_policy>;
  /// Every piece's tag, in the order of policy_types (describe prints a row for each).
  using piece_tags = std::tuple<QkvTag, ScoresTag, SoftmaxTag, ContextTag, OutTag>;
  /// Whether the scores, softmax and context pieces run as one fused kernel (cuDNN's flash
  /// attention on a cuda_context whose target links precis::cudnn_frontend): where the
  /// context offers one, the three pieces and their gradients are one 16-bit type, and both
  /// products accumulate in float with products::hardware (see docs/cuda.md, "Fused
  /// attention"). nn::describe notes it on those pieces' rows. A map that gives the scores or
  /// context tag products::exact, float or another type keeps the pieces.
  static constexpr bool fused =
      detail::fuses_attention<Ctx, qkv_policy, scores_policy, softmax_policy, context_policy>();

 private:
  using base = layer_base<QkvTag, qkv_policy, op::matmul, 3, 3, Ctx, true>;
  // The qkv and out projections are linear layers (float8 products allowed); the scores
  // and context products multiply activations by activations and keep 16- or 32-bit inputs.
  static_assert(!float8_products_v<scores_policy> && !float8_products_v<softmax_policy> &&
                    !float8_products_v<context_policy>,
                "precis: attention's scores and context products take 16- or 32-bit inputs; give "
                "their tags a bfloat16 or float16 policy in the map (float8 applies to the qkv and "
                "out projections)");

  using Sq = activation_type_t<qkv_policy>;
  using Gq = activation_grad_type_t<qkv_policy>;
  using Ss = typename scores_policy::storage_type;
  using Gs = typename scores_policy::gradient_type;
  using Sm = typename softmax_policy::storage_type;
  using Gm = typename softmax_policy::gradient_type;
  using Sc = typename context_policy::storage_type;
  using Gc = typename context_policy::gradient_type;
  using So = activation_type_t<out_policy>;
  using Go = activation_grad_type_t<out_policy>;
  using qkv_linear = linear_layer<QkvTag, qkv_policy, 3, Ctx>;
  using out_linear = linear_layer<OutTag, out_policy, 3, Ctx>;
  template <class T>
  using tensor = tensor_t<Ctx, T, 3>;

 public:
  /// Its kind in nn::describe: "attention".
  static constexpr std::string_view kind = "attention";
  /// Element type of the output forward() returns: the output projection's activation type.
  using output_type = So;
  /// Element type of the gradient backward() reads: the output projection's.
  using output_grad_type = Go;

  /// The layer of a blueprint, its projections zero until reset() draws them. Throws
  /// precis::error unless dim > 0 and heads > 0 divides it.
  explicit attention_layer(
      const attention_spec<QkvTag, ScoresTag, SoftmaxTag, ContextTag, OutTag>& s)
      : dim_(s.dim),
        heads_(s.heads),
        qkv_(check(s)),
        out_(linear_spec<OutTag>{s.dim, s.dim, with_bias}) {}

  /// Its component of a path: "", its position (see the class comment).
  std::string_view name() const { return ""; }

  /// Draws both projections from `seed` (each from its own stream).
  void reset(std::uint64_t seed) {
    qkv_.reset(detail::seed_for(seed, "qkv"));
    out_.reset(detail::seed_for(seed, "out"));
  }

  /// The shape of the output: the input's, [N, T, dim]. Throws precis::error (naming the
  /// layer's `path`) for another last axis or an empty axis.
  shape_t<3> output_shape(const shape_t<3>& in, std::string_view path) const {
    if (in[2] != dim_ || detail::elements(in) == 0) {
      bad_shape(path, kind, "[N, T, " + std::to_string(dim_) + "] with no empty axis",
                        shape_string(in));
    }
    return in;
  }

  /// y [N, T, dim] from x [N, T, dim] through the five pieces (see the file comment),
  /// keeping every piece's output for backward(); `m` goes to the projections (an
  /// evaluation pass leaves their float8 recipes unchanged). Throws precis::error for an
  /// input of another shape.
  const tensor<So>& forward(context_ref_t<Ctx> ctx, const tensor<Sq>& x, mode m = mode::train) {
    const auto in = output_shape(shape_of<3>(x), kind);
    if constexpr (fused) {  // before anything runs
      context_traits<Ctx>::fused_attention_engine::check_geometry(std::int64_t(dim_ / heads_), std::int64_t(in[1]),
                                                                  m == mode::train, "precis::nn::attention");
    }
    g_ = {in[0], in[1], dim_, heads_};
    const auto& qkv = qkv_.forward(ctx, x, m);
    if constexpr (fused) {
      // Scores, softmax and context in one kernel, reading q, k and v in qkv's rows and
      // writing the context with its heads merged; each row's log-sum-exp kept for backward.
      qkv_out_ = &qkv;
      ensure(merged_, in);
      ensure(stats_, shape_t<3>{g_.n * g_.h, g_.t, 1});
      engine_.forward(ctx, fused_shape(), qkv.data(), merged_.data(), stats_.data());
      return out_.forward(ctx, detail::as_type(ctx, merged_, merged_o_), m);
    }
    ensure(q_, g_.per_head());
    ensure(k_, g_.per_head());
    ensure(v_, g_.per_head());
    split(ctx, qkv.data(), q_.data(), k_.data(), v_.data());
    const auto& q = detail::as_type(ctx, q_, q_s_);
    const auto& k = detail::as_type(ctx, k_, k_s_);
    ensure(scores_, g_.square());
    gemm_options o;
    o.trans_b = true;
    o.alpha = alpha();
    gemm<scores_policy>(ctx, q, k, scores_, o);
    const auto& s = detail::as_type(ctx, scores_, scores_m_);
    ensure(probs_, g_.square());
    precis::softmax<softmax_policy>(ctx, s, probs_);
    const auto& p = detail::as_type(ctx, probs_, probs_c_);
    const auto& v = detail::as_type(ctx, v_, v_c_);
    ensure(context_, g_.per_head());
    gemm<context_policy>(ctx, p, v, context_);
    ensure(merged_, in);
    merge(ctx, merged_.data(), context_.data());
    return out_.forward(ctx, detail::as_type(ctx, merged_, merged_o_), m);
  }

  /// Backpropagates dy through the five pieces: adds the projections' weight and bias
  /// gradients to their parameters and returns dx in the input projection's gradient type.
  /// Throws precis::error without a forward pass or when dy's shape is not the last
  /// output's.
  const tensor<Gq>& backward(context_ref_t<Ctx> ctx, const tensor<Go>& dy) {
    if (g_.n == 0) {
      throw error(
          "precis::nn::attention: backward() called without a forward() since the layer was made");
    }
    check_shape("precis::nn::attention: dy", dy, shape_t<3>{g_.n, g_.t, g_.d});
    const auto& dmerged = out_.backward(ctx, dy);
    if constexpr (fused) {
      // dq, dk and dv straight into qkv's gradient rows.
      const auto& dout = detail::as_type(ctx, dmerged, dcontext_c_);
      ensure(dqkv_, shape_t<3>{g_.n, g_.t, 3 * dim_});
      engine_.backward(ctx, fused_shape(), qkv_out_->data(), merged_.data(), dout.data(), stats_.data(),
                       dqkv_.data());
      return qkv_.backward(ctx, dqkv_);
    }
    // Context: dp = dc v^T, dv = p^T dc.
    ensure(dcontext_, g_.per_head());
    split(ctx, dmerged.data(), dcontext_.data());
    const auto& dc = detail::as_type(ctx, dcontext_, dcontext_c_);
    const auto& p = detail::as_cast(probs_, probs_c_);
    const auto& v = detail::as_cast(v_, v_c_);
    ensure(dprobs_, g_.square());
    gemm_options o;
    o.trans_b = true;
    gemm<context_policy>(ctx, dc, v, dprobs_, o);
    ensure(dv_, g_.per_head());
    o = {};
    o.trans_a = true;
    gemm<context_policy>(ctx, p, dc, dv_, o);
    // Softmax.
    const auto& dp = detail::as_type(ctx, dprobs_, dprobs_m_);
    ensure(dscores_, g_.square());
    precis::softmax_backward<softmax_policy>(ctx, dp, probs_, dscores_);
    // Scores: dq = alpha ds k, dk = alpha ds^T q.
    const auto& ds = detail::as_type(ctx, dscores_, dscores_s_);
    const auto& q = detail::as_cast(q_, q_s_);
    const auto& k = detail::as_cast(k_, k_s_);
    ensure(dq_, g_.per_head());
    ensure(dk_, g_.per_head());
    o = {};
    o.alpha = alpha();
    gemm<scores_policy>(ctx, ds, k, dq_, o);
    o.trans_a = true;
    gemm<scores_policy>(ctx, ds, q, dk_, o);
    // Back into qkv's rows, in its gradient type.
    ensure(dqkv_, shape_t<3>{g_.n, g_.t, 3 * dim_});
    const auto& dq = detail::as_type(ctx, dq_, dq_q_);
    const auto& dk = detail::as_type(ctx, dk_, dk_q_);
    const auto& dv = detail::as_type(ctx, dv_, dv_q_);
    merge(ctx, dqkv_.data(), dq.data(), dk.data(), dv.data());
    return qkv_.backward(ctx, dqkv_);
  }

  /// The fused-attention engine (its plans), in a layer that is fused.
  const auto& engine() const
    requires fused
  {
    return engine_;
  }
  /// The input projection: a linear layer from dim to 3 dim features (q, k, v).
  qkv_linear& qkv() { return qkv_; }
  /// The output projection: a linear layer from dim to dim features.
  out_linear& out() { return out_; }
  /// Its shape column in nn::describe: dim and heads, as "768, 12 heads".
  std::string shape() const {
    return std::to_string(dim_) + ", " + std::to_string(heads_) + " heads";
  }
  /// Bytes of the buffers it holds: the projections', and every piece's outputs,
  /// gradients and casts between types.
  std::size_t own_bytes() const {
    std::size_t n = qkv_.own_bytes() + out_.own_bytes();
    const auto add = [&n](const auto&... t) { ((n += bytes_of(t)), ...); };
    add(q_, k_, v_, q_s_, k_s_, v_c_, scores_, scores_m_, probs_, probs_c_, context_, merged_,
        merged_o_, stats_);
    add(dcontext_, dcontext_c_, dprobs_, dprobs_m_, dv_, dscores_, dscores_s_, dq_, dk_, dq_q_,
        dk_q_, dv_q_, dqkv_);
    return n;
  }
  /// The buffers of the last passes, one piece at a time, for precis::diagnostics (see
  /// nn/module.hpp): each product's first input, its output and the gradients it gives, in
  /// its own types.
  template <class Self, class F>
  static void for_each_observed(Self& self, F&& f) {
    qkv_linear::for_each_observed(
        self.qkv_, [&](std::string_view, auto tag, const auto* x, const auto& y, const auto& dx) {
          f("qkv", tag, x, y, dx);
        });
    f("scores", std::type_identity<ScoresTag>{}, &self.q_, self.scores_, self.dq_, self.dk_);
    f("softmax", std::type_identity<SoftmaxTag>{}, &self.scores_, self.probs_, self.dscores_);
    f("context", std::type_identity<ContextTag>{}, &self.probs_, self.context_, self.dprobs_,
      self.dv_);
    out_linear::for_each_observed(
        self.out_, [&](std::string_view, auto tag, const auto* x, const auto& y, const auto& dx) {
          f("out", tag, x, y, dx);
        });
  }

  /// Its backward pass's buffers (see nn/module.hpp): every piece's gradients and their
  /// casts, and the projections'.
  template <class Self, class F>
  static void for_each_gradient_buffer(Self& self, F&& f) {
    qkv_linear::for_each_gradient_buffer(self.qkv_, f);
    out_linear::for_each_gradient_buffer(self.out_, f);
    const auto each = [&f](auto&... t) { (f(t), ...); };
    each(self.dcontext_, self.dcontext_c_, self.dprobs_, self.dprobs_m_, self.dv_, self.dscores_, self.dscores_s_,
         self.dq_, self.dk_, self.dq_q_, self.dk_q_, self.dv_q_, self.dqkv_);
  }

  /// Calls f(name, parameter) for "qkv.weight", "qkv.bias", "out.weight" and "out.bias".
  template <class Self, class F>
  static void for_each_parameter(Self& self, F&& f) {
    qkv_linear::for_each_parameter(self.qkv_, [&](std::string_view n, auto& p) {
      f(n == "weight" ? "qkv.weight" : "qkv.bias", p);
    });
    out_linear::for_each_parameter(self.out_, [&](std::string_view n, auto& p) {
      f(n == "weight" ? "out.weight" : "out.bias", p);
    });
  }
  /// Weight decay applies to the projections' weights, not their biases.
  static constexpr bool decays(std::string_view parameter) {
    return parameter == "qkv.weight" || parameter == "out.weight";
  }

 private:
  static linear_spec<QkvTag> check(
      const attention_spec<QkvTag, ScoresTag, SoftmaxTag, ContextTag, OutTag>& s) {
    if (s.dim == 0 || s.heads == 0 || s.dim % s.heads != 0) {
      throw error(
          "precis::nn::attention: needs dim > 0 and a number of heads that divides it, got dim " +
          std::to_string(s.dim) + " and " + std::to_string(s.heads) + " heads");
    }
    return {s.dim, 3 * s.dim, with_bias};
  }
  float alpha() const { return static_cast<float>(1.0 / std::sqrt(double(g_.dh()))); }
  // The fused kernel's geometry for the last forward pass (used only where fused).
  auto fused_shape() const {
    return typename context_traits<Ctx>::fused_attention_shape{
        std::int64_t(g_.n), std::int64_t(g_.h), std::int64_t(g_.t), std::int64_t(g_.dh()), std::is_same_v<Ss, float16>,
        alpha()};
  }

  // Rows [N, T, count d] <-> count heads tensors [N*H, T, dh] (q, k, v: count 3): on the
  // host detail::split_heads / merge_heads, on the device one strided copy per heads
  // tensor.
  template <class U, class... Heads>
  void split(context_ref_t<Ctx> ctx, const U* rows, Heads*... heads) const {
    if constexpr (std::is_same_v<Ctx, cpu_context>) {
      detail::split_heads(ctx, g_, rows, heads...);
    } else {
      std::size_t column = 0;
      ((copy_heads(ctx, rows + column, heads, sizeof...(Heads), false), column += g_.d), ...);
    }
  }
  template <class U, class... Heads>
  void merge(context_ref_t<Ctx> ctx, U* rows, const Heads*... heads) const {
    if constexpr (std::is_same_v<Ctx, cpu_context>) {
      detail::merge_heads(ctx, g_, rows, heads...);
    } else {
      std::size_t column = 0;
      ((copy_heads(ctx, heads, rows + column, sizeof...(Heads), true), column += g_.d), ...);
    }
  }
  // One heads tensor out of (or, `to_rows`, into) rows `count` d wide.
  template <class From, class To>
  void copy_heads(context_ref_t<Ctx> ctx, const From* from, To* to, std::size_t count, bool to_rows) const {
    context_traits<Ctx>::strided_copy("precis::nn::attention (heads)", ctx, from, to,
                                      detail::heads_plan(g_, count, to_rows));
  }

  std::size_t dim_, heads_;
  detail::heads_geometry g_{};
  qkv_linear qkv_;
  out_linear out_;
  // Forward: each piece's output, and (suffix) its cast to the next piece's storage type,
  // empty when the two types are the same.
  tensor<Sq> q_, k_, v_;
  tensor<Ss> q_s_, k_s_, scores_;
  tensor<Sm> scores_m_, probs_;
  tensor<Sc> v_c_, probs_c_, context_, merged_;
  tensor<So> merged_o_;
  // Backward, likewise in gradient types.
  tensor<Go> dcontext_;
  tensor<Gc> dcontext_c_, dprobs_, dv_;
  tensor<Gm> dprobs_m_, dscores_;
  tensor<Gs> dscores_s_, dq_, dk_;
  tensor<Gq> dq_q_, dk_q_, dv_q_, dqkv_;
  // Fused: the engine (its plans), each row's log-sum-exp from forward, and qkv's output
  // (the input projection's buffer, kept by it until its next forward pass).
  [[no_unique_address]] typename detail::fused_engine_of<fused, Ctx>::type engine_{};
  tensor<float> stats_;
  const tensor<Sq>* qkv_out_ = nullptr;
};

}  // namespace precis::nn
