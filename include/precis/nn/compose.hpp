/// @file
/// Composition of blueprints, and the modules they build into.
///
///     nn::seq(a, b, c)                       a, then b, then c
///     nn::residual(body)                     body(x) + x
///     nn::residual(body, shortcut)           body(x) + shortcut(x) (a projection)
///     nn::add(a, b, ...)                     parallel branches on one input, summed
///     nn::concat(axis, a, b, ...)            parallel branches, joined along `axis`
///     nn::repeat<12>(block)                  12 blocks of one type (an array, one instantiation)
///     nn::named("encoder", node)             names a node in paths ("encoder.3.1.mlp.fc2")
///
/// Edges: nn::build resolves each node against the policy map with the element types and
/// rank that reach it. Where a layer reads another type than the one before it stores
/// (or gives another gradient type), build wraps it in nn::cast_in, and where a branch ends
/// in another type than the first branch, in nn::cast_out: the casts are in the model's
/// type. A hand-written model whose edges do not fit does not compile (nn::edge_fits).
///
/// Joins: branch outputs are added in float (double for double tensors) and rounded once
/// to the output type; in the backward pass the input gradient is the sum of the branches'
/// input gradients, likewise added in float and rounded once.
#pragma once

#include <precis/kernels/context.hpp>
#include <precis/nn/cast.hpp>
#include <precis/nn/layout.hpp>
#include <precis/nn/module.hpp>
#include <precis/policy/map.hpp>

#include <array>
#include <concepts>
#include <cstddef>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace precis::nn {

/// The check every edge of a hand-assembled model makes: the module `To` (tag `ToTag`)
/// reads what `From` (tag `FromTag`) gives, both values and gradients, at the same rank.
/// The tags and types appear in the compiler's note under the message.
template <class FromTag, class FromType, class FromGrad, class ToTag, class ToType, class ToGrad, bool RankFits>
struct edge_fits {
  static_assert(std::is_same_v<FromType, ToType> && std::is_same_v<FromGrad, ToGrad>,
                "precis: an edge joins layers of different storage or gradient types (see "
                "edge_fits<from tag, from type, from gradient, to tag, to type, to gradient> "
                "below); build the model with nn::build, which inserts the nn::cast, or put "
                "nn::cast_layer<from type, to type, from gradient, to gradient, rank> between them");
  static_assert(RankFits,
                "precis: an edge joins a layer's output to a layer that reads another rank; put "
                "a reshape (nn::flatten, nn::reshape) between them");
  /// True: the static_asserts above stop the compilation first where the edge does not fit.
  static constexpr bool value = true;
};

namespace detail {

template <class M>
struct tag_of {
  using type = M;  // modules without a tag name themselves
};
template <leaf M>
struct tag_of<M> {
  using type = typename M::tag_type;
};

template <class A, class B>
inline constexpr bool fits_v =
    edge_fits<typename tag_of<A>::type, typename A::output_type, typename A::output_grad_type,
              typename tag_of<B>::type, typename B::input_type, typename B::input_grad_type,
              A::output_rank == B::input_rank>::value;

template <class... Ms>
constexpr bool neighbours_fit() {
  if constexpr (sizeof...(Ms) < 2) {
    return true;
  } else {
    using T = std::tuple<Ms...>;
    return []<std::size_t... I>(std::index_sequence<I...>) {
      return (fits_v<std::tuple_element_t<I, T>, std::tuple_element_t<I + 1, T>> && ...);
    }(std::make_index_sequence<sizeof...(Ms) - 1>{});
  }
}

/// Elements before, along and after `axis` of a shape.
template <std::size_t R>
std::array<std::size_t, 3> split_at(const shape_t<R>& s, std::size_t axis) {
  std::size_t outer = 1, inner = 1;
  for (std::size_t i = 0; i < axis; ++i) outer *= s[i];
  for (std::size_t i = axis + 1; i < R; ++i) inner *= s[i];
  return {outer, s[axis], inner};
}

/// The copy between one part of a concatenation and the joined tensor: `d` the part's
/// (outer, width, inner) extents about the axis (split_at), `total` the joined extent along
/// it. Forward it copies the part's rows of width * inner elements into the joined rows of
/// total * inner (the destination pointer at the part's offset times inner); `back` copies
/// the other way, the part's slice of a gradient.
inline precis::detail::copy_plan<2> concat_part_plan(const std::array<std::size_t, 3>& d, std::size_t total,
                                                     bool back) {
  const std::size_t part = d[1] * d[2], joined = total * d[2];
  return back ? precis::detail::copy_plan<2>{{d[0], part}, {joined, 1}, {part, 1}}
              : precis::detail::copy_plan<2>{{d[0], part}, {part, 1}, {joined, 1}};
}

}  // namespace detail

// ---------------------------------------------------------------------------------------
// Adapters that build inserts at edges.

/// M, its input first converted by `Cast` (inserted by nn::build where M reads another type
/// than the one that reaches it).
template <class Cast, class M>
class cast_in {
  static_assert(detail::fits_v<Cast, M>);

 public:
  /// The context its kernels run on (M's).
  using context_type = typename M::context_type;
  /// Element type forward() reads: the cast's input type.
  using input_type = typename Cast::input_type;
  /// Element type of the gradient backward() returns: the cast's.
  using input_grad_type = typename Cast::input_grad_type;
  /// Element type forward() returns: M's output type.
  using output_type = typename M::output_type;
  /// Element type of the gradient backward() reads: M's.
  using output_grad_type = typename M::output_grad_type;
  /// Rank of the input (the cast keeps M's).
  static constexpr std::size_t input_rank = Cast::input_rank;
  /// Rank of the output: M's.
  static constexpr std::size_t output_rank = M::output_rank;

  /// Builds M from its blueprint `s`; the cast needs none.
  template <class Spec>
  explicit cast_in(const Spec& s) : m_(s) {}

  /// M's name: the cast takes no component of its own in paths.
  std::string_view name() const { return m_.name(); }
  /// M's output shape for an input of shape `in` (the cast keeps shapes); M throws precis::error
  /// where it cannot take `in`.
  auto output_shape(const edge_shape_t<input_type, input_rank>& in, std::string_view path,
                    mode m = mode::eval) const {
    return detail::output_shape_in(m_, in, path, m);
  }
  /// Converts x to M's input type (each value rounded once), then runs M on it; returns M's output.
  template <class X>
  decltype(auto) forward(context_ref_t<context_type> ctx, const X& x, mode m = mode::train) {
    return m_.forward(ctx, cast_.forward(ctx, x, m), m);
  }
  /// Runs M's backward pass on dy, then converts its input gradient to `input_grad_type` (each
  /// value rounded once); returns the cast's buffer.
  template <class D>
  const auto& backward(context_ref_t<context_type> ctx, const D& dy) {
    return cast_.backward(ctx, m_.backward(ctx, dy));
  }
  /// backward() without the input gradient (see nn::backward_parameters).
  template <class D>
  void backward_parameters(context_ref_t<context_type> ctx, const D& dy) {
    nn::backward_parameters(m_, ctx, dy);
  }
  /// 0: the buffers belong to the cast and to M.
  std::size_t own_bytes() const { return 0; }
  /// Calls `f("", cast)`, then `f("", M)`: both sit at this module's own path.
  template <class Self, class F>
  static void for_each_child(Self& self, F&& f) {
    f("", self.cast_);
    f("", self.m_);
  }
  /// The module after the cast.
  M& inner() { return m_; }

 private:
  Cast cast_;
  M m_;
};

/// M, its output then converted by `Cast` (inserted by nn::build where a branch ends in
/// another type than the join's).
template <class M, class Cast>
class cast_out {
  static_assert(detail::fits_v<M, Cast>);

 public:
  /// The context its kernels run on (M's).
  using context_type = typename M::context_type;
  /// Element type forward() reads: M's input type.
  using input_type = typename M::input_type;
  /// Element type of the gradient backward() returns: M's.
  using input_grad_type = typename M::input_grad_type;
  /// Element type forward() returns: the cast's output type.
  using output_type = typename Cast::output_type;
  /// Element type of the gradient backward() reads: the cast's.
  using output_grad_type = typename Cast::output_grad_type;
  /// Rank of the input: M's.
  static constexpr std::size_t input_rank = M::input_rank;
  /// Rank of the output (the cast keeps M's).
  static constexpr std::size_t output_rank = Cast::output_rank;

  /// Builds M from its blueprint `s`; the cast needs none.
  template <class Spec>
  explicit cast_out(const Spec& s) : m_(s) {}

  /// M's name: the cast takes no component of its own in paths.
  std::string_view name() const { return m_.name(); }
  /// M's output shape for an input of shape `in` (the cast keeps shapes); M throws precis::error
  /// where it cannot take `in`.
  auto output_shape(const edge_shape_t<input_type, input_rank>& in, std::string_view path,
                    mode m = mode::eval) const {
    return detail::output_shape_in(m_, in, path, m);
  }
  /// Runs M on x, then converts its output to `output_type` (each value rounded once); returns the
  /// cast's buffer.
  template <class X>
  const auto& forward(context_ref_t<context_type> ctx, const X& x, mode m = mode::train) {
    return cast_.forward(ctx, m_.forward(ctx, x, m), m);
  }
  /// Converts dy to M's output gradient type (each value rounded once), then runs M's backward pass
  /// on it; returns M's input gradient.
  template <class D>
  decltype(auto) backward(context_ref_t<context_type> ctx, const D& dy) {
    return m_.backward(ctx, cast_.backward(ctx, dy));
  }
  /// backward() without the input gradient (see nn::backward_parameters).
  template <class D>
  void backward_parameters(context_ref_t<context_type> ctx, const D& dy) {
    nn::backward_parameters(m_, ctx, cast_.backward(ctx, dy));
  }
  /// 0: the buffers belong to M and to the cast.
  std::size_t own_bytes() const { return 0; }
  /// Calls `f("", M)`, then `f("", cast)`: both sit at this module's own path.
  template <class Self, class F>
  static void for_each_child(Self& self, F&& f) {
    f("", self.m_);
    f("", self.cast_);
  }

 private:
  M m_;
  Cast cast_;
};

namespace detail {

/// What a model calls on a layer M (a leaf module reading and giving one tensor each way)
/// built from the blueprint node Spec, checked when nn::build resolves the node: each piece
/// missing or of another signature is named by a precis: message, rather than found by an
/// error deep inside a model's pass (a layer written outside the library:
/// docs/writing-layers.md).
template <class M, class Spec>
struct layer_contract {
  using Ctx = typename M::context_type;
  using X = tensor_t<Ctx, typename M::input_type, M::input_rank>;
  using Y = tensor_t<Ctx, typename M::output_type, M::output_rank>;
  using DX = tensor_t<Ctx, typename M::input_grad_type, M::input_rank>;
  using DY = tensor_t<Ctx, typename M::output_grad_type, M::output_rank>;
  using in_shape = shape_t<M::input_rank>;
  using out_shape = shape_t<M::output_rank>;
  static_assert(std::is_constructible_v<M, const Spec&>,
                "precis: a layer is made from its blueprint node: it needs a constructor taking the node "
                "(const Spec&); see docs/writing-layers.md");
  static_assert(requires(M& m, context_ref_t<Ctx> c, const X& x) {
    { m.forward(c, x, mode::train) } -> std::same_as<const Y&>;
  }, "precis: a layer needs forward(ctx, const tensor<input_type, input_rank>&, nn::mode) returning a const "
     "reference to its own output, a tensor<output_type, output_rank>; see docs/writing-layers.md");
  static_assert(requires(M& m, context_ref_t<Ctx> c, const DY& dy) {
    { m.backward(c, dy) } -> std::same_as<const DX&>;
  }, "precis: a layer needs backward(ctx, const tensor<output_grad_type, output_rank>&) returning a const "
     "reference to the input gradient, a tensor<input_grad_type, input_rank>; see docs/writing-layers.md");
  static_assert(requires(const M& m, const in_shape& in, std::string_view path) {
    { m.output_shape(in, path) } -> std::same_as<out_shape>;
  } || requires(const M& m, const in_shape& in, std::string_view path) {
    { m.output_shape(in, path, mode::train) } -> std::same_as<out_shape>;
  }, "precis: a layer needs output_shape(const shape_t<input_rank>&, std::string_view path) const (with or "
     "without a third argument, the nn::mode) returning its shape_t<output_rank>; see docs/writing-layers.md");
  static_assert(requires(const M& m) {
    { m.own_bytes() } -> std::convertible_to<std::size_t>;
    { m.shape() } -> std::convertible_to<std::string>;
    { M::kind } -> std::convertible_to<std::string_view>;
  }, "precis: a layer needs own_bytes() const (the bytes of its buffers), shape() const and a static "
     "kind (its shape and kind in nn::describe); see docs/writing-layers.md");
  static constexpr bool value = true;
};

/// Whether layer M runs under the policy the map gives its tag.
template <class M, class Map>
struct policy_from_map : std::is_same<typename M::policy_type, policy_for_t<typename M::tag_type, Map>> {};

/// The module `Spec` builds into when (In, G, R) reach it, with a cast in front where it
/// reads another type.
template <class Spec, class Map, class Ctx, class In, class G, std::size_t R>
struct resolve_spec {
  static_assert(requires { typename Spec::template module_type<Map, Ctx, In, G, R>; },
                "precis: a blueprint node needs a member template module_type<Map, Ctx, In, G, R> naming "
                "the module it builds into (nn's layer functions and combinators return such nodes; a "
                "layer of your own: docs/writing-layers.md)");
  using raw = typename Spec::template module_type<Map, Ctx, In, G, R>;
  static_assert(std::conditional_t<leaf<raw> && !is_values_v<typename raw::input_type> &&
                                       !is_values_v<typename raw::output_type>,
                                   layer_contract<raw, Spec>, std::true_type>::value);
  static_assert(std::conditional_t<has_policy<raw>, policy_from_map<raw, Map>, std::true_type>::value,
                "precis: a layer runs under the policy the map gives its tag: its policy_type must be "
                "policy_for_t<tag_type, Map> (module_type passes it to the layer); see docs/writing-layers.md");
  static_assert(raw::input_rank == R,
                "precis: a layer reads tensors of another rank than the one before it gives; put "
                "a reshape (nn::flatten, nn::reshape) between them");
  static constexpr bool fits =
      std::is_same_v<typename raw::input_type, In> && std::is_same_v<typename raw::input_grad_type, G>;
  static_assert(fits || (!is_values_v<In> && !is_values_v<typename raw::input_type>),
                "precis: a node reads a multi-tensor edge (nn::values) of other types than the one that "
                "reaches it; cast its tensors in nn::each");
  template <bool Fits, class = void>
  struct pick {
    using type = raw;
  };
  template <class V>
  struct pick<false, V> {
    using type = cast_in<cast_layer<In, typename raw::input_type, G, typename raw::input_grad_type, R, Ctx>, raw>;
  };
  using type = typename pick<fits>::type;
};
template <class Spec, class Map, class Ctx, class In, class G, std::size_t R>
using resolve_spec_t = typename resolve_spec<Spec, Map, Ctx, In, G, R>::type;

/// M with a cast after it where it ends in another type than (Out, GOut).
template <class M, class Out, class GOut>
using ending_in_t =
    std::conditional_t<std::is_same_v<typename M::output_type, Out> && std::is_same_v<typename M::output_grad_type, GOut>,
                       M,
                       cast_out<M, cast_layer<typename M::output_type, Out, typename M::output_grad_type, GOut,
                                              M::output_rank, typename M::context_type>>>;

}  // namespace detail

// ---------------------------------------------------------------------------------------
// Sequence

template <class... Ms>
class sequence;

/// Blueprint of a sequence (nn::seq).
template <class... Ss>
struct seq_spec {
  /// The nodes' blueprints, in order.
  std::tuple<Ss...> children;

  /// Resolves the nodes `Rest` one by one, each where the output of the one before reaches it,
  /// adding their modules to the nn::sequence `Done`.
  template <class Map, class Ctx, class In, class G, std::size_t R, class Done, class... Rest>
  struct fold;
  /// No node left: the sequence of the resolved modules.
  template <class Map, class Ctx, class In, class G, std::size_t R, class... Done>
  struct fold<Map, Ctx, In, G, R, sequence<Done...>> {
    /// The nn::sequence built.
    using type = sequence<Done...>;
  };
  /// Resolves node S where (In, G, R) reach it, then the rest where its output reaches them.
  template <class Map, class Ctx, class In, class G, std::size_t R, class... Done, class S, class... Rest>
  struct fold<Map, Ctx, In, G, R, sequence<Done...>, S, Rest...> {
    /// The module S builds into, with an nn::cast_in in front where it reads another type.
    using M = detail::resolve_spec_t<S, Map, Ctx, In, G, R>;
    /// The nn::sequence built.
    using type = typename fold<Map, Ctx, typename M::output_type, typename M::output_grad_type, M::output_rank,
                               sequence<Done..., M>, Rest...>::type;
  };

  /// The module this blueprint builds into where element type In, gradient type G and rank R reach
  /// it, under policy map Map on context Ctx: an nn::sequence of the nodes' modules, with an
  /// nn::cast_in wherever a node reads another type than the one before gives.
  template <class Map, class Ctx, class In, class G, std::size_t R>
  using module_type = typename fold<Map, Ctx, In, G, R, sequence<>, Ss...>::type;
};

/// Runs `nodes` in order (a blueprint node).
template <class... Ss>
constexpr seq_spec<Ss...> seq(Ss... nodes) {
  static_assert(sizeof...(Ss) > 0, "precis: nn::seq needs at least one node");
  return {std::tuple<Ss...>(nodes...)};
}

/// Modules run in order; neighbours must fit (nn::edge_fits). Children are named by their
/// own name in paths, or by their position. A child and the next run as one pass where the
/// first's `fuses_with<Next>` holds (a batch norm and its ReLU on the device:
/// batch_norm_layer::fuses_with), with the bits of the two.
template <class... Ms>
class sequence {
  static_assert(sizeof...(Ms) > 0, "precis: a sequence needs at least one module");
  static_assert(detail::neighbours_fit<Ms...>());
  using children_type = std::tuple<Ms...>;
  static constexpr std::size_t count = sizeof...(Ms);
  using first = std::tuple_element_t<0, children_type>;
  using last = std::tuple_element_t<count - 1, children_type>;

 public:
  /// The context its kernels run on (the first child's).
  using context_type = typename first::context_type;
  /// Element type forward() reads: the first child's input type.
  using input_type = typename first::input_type;
  /// Element type of the gradient backward() returns: the first child's.
  using input_grad_type = typename first::input_grad_type;
  /// Element type forward() returns: the last child's output type.
  using output_type = typename last::output_type;
  /// Element type of the gradient backward() reads: the last child's.
  using output_grad_type = typename last::output_grad_type;
  /// Rank of the input: the first child's.
  static constexpr std::size_t input_rank = first::input_rank;
  /// Rank of the output: the last child's.
  static constexpr std::size_t output_rank = last::output_rank;

  /// Builds each child from its blueprint in `s`.
  template <class... Ss>
  explicit sequence(const seq_spec<Ss...>& s)
      : sequence(s, std::make_index_sequence<sizeof...(Ss)>{}) {}
  /// From modules (a hand-assembled model).
  explicit sequence(Ms... modules) : children_(std::move(modules)...) {}

  /// "": a sequence is named by its position in paths.
  std::string_view name() const { return ""; }

  /// The shape the last child gives for an input of shape `in`, each child reading the shape the
  /// one before gives; the first child that cannot take what reaches it throws precis::error naming
  /// its path under `path`.
  edge_shape_t<output_type, output_rank> output_shape(
      const edge_shape_t<input_type, input_rank>& in, std::string_view path,
      mode m = mode::eval) const {
    return shape_from<0>(in, path, m);
  }
  /// Runs the children in order on x; returns the last child's output (a reference to its buffer,
  /// or the tuple of pointers of a multi-tensor edge).
  template <class X>
  decltype(auto) forward(context_ref_t<context_type> ctx, const X& x, mode m = mode::train) {
    return forward_from<0>(ctx, x, m);
  }
  /// Runs the children's backward passes in reverse order from dy; returns the first child's input
  /// gradient.
  template <class D>
  decltype(auto) backward(context_ref_t<context_type> ctx, const D& dy) {
    return backward_from<count - 1>(ctx, dy);
  }
  /// backward() without the input gradient: the first child leaves its own out (see
  /// nn::backward_parameters).
  template <class D>
  void backward_parameters(context_ref_t<context_type> ctx, const D& dy) {
    backward_from<count - 1, true>(ctx, dy);
  }
  /// 0: the buffers belong to the children.
  std::size_t own_bytes() const { return 0; }

  /// Calls `f(component, child)` for each child in order; the component is the child's name, or its
  /// position where it has none.
  template <class Self, class F>
  static void for_each_child(Self& self, F&& f) {
    for_each_indexed(self, f, std::make_index_sequence<count>{});
  }
  /// Child I.
  template <std::size_t I>
  auto& child() {
    return std::get<I>(children_);
  }
  /// The number of children.
  static constexpr std::size_t size() { return count; }
  /// Whether child i and child i + 1 run as one pass (see the class comment); nn::describe
  /// notes it on the first.
  static constexpr bool fuses_with_next(std::size_t i) { return i < count && fused_table()[i]; }

 private:
  template <class Spec, std::size_t... I>
  sequence(const Spec& s, std::index_sequence<I...>) : children_(Ms(std::get<I>(s.children))...) {}

  template <class Self, class F, std::size_t... I>
  static void for_each_indexed(Self& self, F& f, std::index_sequence<I...>) {
    (f(component<I>(std::get<I>(self.children_)), std::get<I>(self.children_)), ...);
  }
  template <std::size_t I, class C>
  static std::string component(const C& c) {
    return c.name().empty() ? std::to_string(I) : std::string(c.name());
  }
  template <std::size_t I, class S>
  auto shape_from(const S& in, std::string_view path, mode m) const {
    const auto& c = std::get<I>(children_);
    const auto out = detail::output_shape_in(c, in, join_path(path, component<I>(c)), m);
    if constexpr (I + 1 == count) {
      return out;
    } else {
      return shape_from<I + 1>(out, path, m);
    }
  }
  static constexpr std::array<bool, count> fused_table() {
    return []<std::size_t... I>(std::index_sequence<I...>) {
      return std::array<bool, count>{fused_at<I>()...};
    }(std::make_index_sequence<count>{});
  }
  // Whether children I and I + 1 run as one (a batch norm and the ReLU after it on the
  // device: the first's fuses_with).
  template <std::size_t I>
  static constexpr bool fused_at() {
    if constexpr (I >= count || I + 1 >= count) {
      return false;
    } else {
      using A = std::tuple_element_t<I, children_type>;
      using B = std::tuple_element_t<I + 1, children_type>;
      if constexpr (requires { A::template fuses_with<B>; }) {
        return A::template fuses_with<B>;
      } else {
        return false;
      }
    }
  }
  // Children give a tensor by reference, or a multi-tensor edge (a tuple of pointers) by
  // value: decltype(auto) passes either on as it came.
  template <std::size_t I, class X>
  decltype(auto) forward_from(context_ref_t<context_type> ctx, const X& x, mode m) {
    if constexpr (fused_at<I>()) {
      // The batch norm checks x before it sizes the ReLU's buffer: a bad batch leaves both
      // layers as they were.
      const auto& z = std::get<I>(children_).forward_relu(ctx, x, m, std::get<I + 1>(children_));
      if constexpr (I + 2 == count) {
        return z;
      } else {
        return forward_from<I + 2>(ctx, z, m);
      }
    } else if constexpr (I + 1 == count) {
      return std::get<I>(children_).forward(ctx, x, m);
    } else {
      const auto& y = std::get<I>(children_).forward(ctx, x, m);
      return forward_from<I + 1>(ctx, y, m);
    }
  }
  template <std::size_t I, bool ParametersOnly = false, class D>
  decltype(auto) backward_from(context_ref_t<context_type> ctx, const D& dy) {
    if constexpr (fused_at<I - 1>()) {  // false for I = 0 (I - 1 wraps past the children)
      // A fused pair ends at I: its first child's backward pass from the pair's output.
      const auto& dx = std::get<I - 1>(children_).backward_relu(ctx, dy, std::get<I>(children_).fused_output());
      if constexpr (I - 1 == 0 && ParametersOnly) {
        return;
      } else if constexpr (I - 1 == 0) {
        return dx;
      } else {
        return backward_from<I - 2, ParametersOnly>(ctx, dx);
      }
    } else if constexpr (I == 0 && ParametersOnly) {
      nn::backward_parameters(std::get<I>(children_), ctx, dy);
    } else if constexpr (I == 0) {
      return std::get<I>(children_).backward(ctx, dy);
    } else {
      const auto& dx = std::get<I>(children_).backward(ctx, dy);
      return backward_from<I - 1, ParametersOnly>(ctx, dx);
    }
  }

  children_type children_;
};

// ---------------------------------------------------------------------------------------
// Parallel branches

/// How parallel branches are joined.
enum class join_kind { add, concat, subtract };

template <join_kind Join, bool Residual, class... Ms>
class branches;

/// Blueprint of parallel branches (nn::add, nn::concat, nn::residual).
template <join_kind Join, bool Residual, class... Ss>
struct branches_spec {
  /// The branches' blueprints (for a residual: the body, then the shortcut).
  std::tuple<Ss...> children;
  std::size_t axis = 0;  ///< the concatenation axis
  bool channels = false;  ///< whether it is nn::channel_axis (1 in NCHW, 3 in NHWC)

  /// Resolves every branch where (In, G, R) reach it; a branch that ends in other types than the
  /// first gets an nn::cast_out to the first branch's types.
  template <class Map, class Ctx, class In, class G, std::size_t R>
  struct resolved {
    /// The module the first branch builds into; its output types are the join's.
    using first = detail::resolve_spec_t<std::tuple_element_t<0, std::tuple<Ss...>>, Map, Ctx, In, G, R>;
    /// The nn::branches module built.
    using type = branches<Join, Residual,
                          detail::ending_in_t<detail::resolve_spec_t<Ss, Map, Ctx, In, G, R>,
                                              typename first::output_type, typename first::output_grad_type>...>;
  };
  /// The module this blueprint builds into where element type In, gradient type G and rank R reach
  /// it, under policy map Map on context Ctx: an nn::branches (see resolved).
  template <class Map, class Ctx, class In, class G, std::size_t R>
  using module_type = typename resolved<Map, Ctx, In, G, R>::type;
};

/// Branches on one input, their outputs added (a blueprint node).
template <class... Ss>
constexpr branches_spec<join_kind::add, false, Ss...> add(Ss... branches) {
  static_assert(sizeof...(Ss) >= 2, "precis: nn::add joins at least two branches");
  return {std::tuple<Ss...>(branches...), 0};
}
/// Branches on one input, their outputs concatenated along `axis` (a blueprint node).
template <class... Ss>
constexpr branches_spec<join_kind::concat, false, Ss...> concat(std::size_t axis, Ss... branches) {
  static_assert(sizeof...(Ss) >= 2, "precis: nn::concat joins at least two branches");
  return {std::tuple<Ss...>(branches...), axis};
}
/// Branches on one input, their output images concatenated along their channels (a
/// blueprint node): axis 1 of [N, C, H, W], axis 3 of [N, H, W, C] in a model built
/// channels-last.
template <class... Ss>
constexpr branches_spec<join_kind::concat, false, Ss...> concat(channel_axis_t, Ss... branches) {
  static_assert(sizeof...(Ss) >= 2, "precis: nn::concat joins at least two branches");
  return {std::tuple<Ss...>(branches...), 1, true};
}
/// body(x) + x (a blueprint node). The body's layers are named in paths as if the residual
/// were not there.
template <class Body>
constexpr branches_spec<join_kind::add, true, Body, identity_spec> residual(Body body) {
  return {std::tuple<Body, identity_spec>(body, identity_spec{}), 0};
}
/// body(x) + shortcut(x): a projection shortcut, named "shortcut" in paths.
template <class Body, class Shortcut>
constexpr branches_spec<join_kind::add, true, Body, Shortcut> residual(Body body, Shortcut shortcut) {
  return {std::tuple<Body, Shortcut>(body, shortcut), 0};
}

/// Parallel branches on one input, joined by adding (`Join` add) or concatenating along an
/// axis. All branches take the same input and end in the same types (build casts them).
template <join_kind Join, bool Residual, class... Ms>
class branches {
  static_assert(Join != join_kind::subtract, "precis: parallel branches join by add or concat; for a - b use "
                                             "nn::fork(a, b) then nn::subtract()");
  using children_type = std::tuple<Ms...>;
  static constexpr std::size_t count = sizeof...(Ms);
  using first = std::tuple_element_t<0, children_type>;
  static_assert(count >= 2, "precis: parallel branches need at least two branches");
  static_assert(((std::is_same_v<typename Ms::input_type, typename first::input_type> &&
                  std::is_same_v<typename Ms::input_grad_type, typename first::input_grad_type> &&
                  Ms::input_rank == first::input_rank) &&
                 ...),
                "precis: parallel branches must read the same input type, gradient type and rank");

 public:
  /// The context its kernels run on (the first branch's).
  using context_type = typename first::context_type;
  /// Element type forward() reads: every branch's input type.
  using input_type = typename first::input_type;
  /// Element type of the gradient backward() returns: every branch's.
  using input_grad_type = typename first::input_grad_type;
  /// Element type forward() returns: every branch's output type.
  using output_type = typename first::output_type;
  /// Element type of the gradient backward() reads: every branch's.
  using output_grad_type = typename first::output_grad_type;
  /// Rank of the input: every branch's.
  static constexpr std::size_t input_rank = first::input_rank;
  /// Rank of the output: every branch's.
  static constexpr std::size_t output_rank = first::output_rank;

 private:
  using io = context_traits<context_type>;
  template <class M>
  static constexpr bool joins_v = std::is_same_v<typename M::output_type, output_type> &&
                                  std::is_same_v<typename M::output_grad_type, output_grad_type> &&
                                  M::output_rank == output_rank;
  static_assert((joins_v<Ms> && ...),
                "precis: joined branches must end in the same storage type, gradient type and rank; "
                "build the model with nn::build, which inserts nn::cast_out, or cast the branch yourself");

 public:
  /// Builds each branch from its blueprint in `s`; throws precis::error where the concatenation
  /// axis is not below the output rank.
  template <class... Ss>
  explicit branches(const branches_spec<Join, Residual, Ss...>& s)
      : branches(s, std::make_index_sequence<sizeof...(Ss)>{}) {}

  /// "": the join is named by its position in paths.
  std::string_view name() const { return ""; }

  /// The joined shape for an input of shape `in`: the branches' common shape for an add; for a
  /// concatenation, their shape with the extents along the axis summed. Throws precis::error where
  /// a branch cannot take `in`, or where the branches' shapes cannot be added (or differ outside
  /// the concatenation axis).
  shape_t<output_rank> output_shape(const shape_t<input_rank>& in, std::string_view path,
                                    mode m = mode::eval) const {
    shape_t<output_rank> out{};
    std::size_t i = 0;
    std::apply(
        [&](const auto&... c) {
          ((joined_shape(out, detail::output_shape_in(c, in, join_path(path, component(i, c)), m),
                         i, path),
            ++i),
           ...);
        },
        children_);
    return out;
  }

  /// Runs each branch on x, in order, and joins their outputs into this module's buffer: added in
  /// float (double for double tensors) and rounded once, or copied side by side along the axis.
  /// Returns that buffer.
  template <class X>
  const auto& forward(context_ref_t<context_type> ctx, const X& x, mode m = mode::train) {
    const auto outs = std::apply(
        [&](auto&... c) { return std::tuple<decltype(&c.forward(ctx, x, m))...>{&c.forward(ctx, x, m)...}; },
        children_);
    if constexpr (Join == join_kind::add) {
      ensure(y_, shape_of<output_rank>(*std::get<0>(outs)));
      std::apply([&](auto... o) { io::add_rounded(ctx, y_, *o...); }, outs);
    } else {
      shape_t<output_rank> shape = shape_of<output_rank>(*std::get<0>(outs));
      shape[axis_] = 0;
      std::apply([&](auto... o) { ((shape[axis_] += std::size_t(o->shape()[axis_])), ...); }, outs);
      ensure(y_, shape);
      std::size_t offset = 0, i = 0;
      std::apply([&](auto... o) { ((widths_[i++] = std::size_t(o->shape()[axis_])), ...); }, outs);
      std::apply([&](auto... o) { (copy_into(ctx, *o, offset), ...); }, outs);
    }
    return y_;
  }

  /// Runs each branch's backward pass on dy (an add) or on its part of dy along the axis (a
  /// concatenation); returns the sum of their input gradients, added in float (double for double
  /// tensors) and rounded once into this module's buffer.
  template <class D>
  const auto& backward(context_ref_t<context_type> ctx, const D& dy) {
    std::size_t offset = 0;
    const auto dxs = [&]<std::size_t... I>(std::index_sequence<I...>) {
      return std::tuple<decltype(&std::get<I>(children_).backward(ctx, dy))...>{
          &std::get<I>(children_).backward(ctx, slice_for(ctx, dy, I, offset))...};
    }(std::make_index_sequence<count>{});
    ensure(dx_, shape_of<input_rank>(*std::get<0>(dxs)));
    std::apply([&](auto... d) { io::add_rounded(ctx, dx_, *d...); }, dxs);
    return dx_;
  }
  /// backward() without the input gradient: no branch computes its own, none are added
  /// (see nn::backward_parameters).
  template <class D>
  void backward_parameters(context_ref_t<context_type> ctx, const D& dy) {
    std::size_t offset = 0;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (nn::backward_parameters(std::get<I>(children_), ctx, slice_for(ctx, dy, I, offset)), ...);
    }
    (std::make_index_sequence<count>{});
  }

  /// Branch I.
  template <std::size_t I>
  auto& child() {
    return std::get<I>(children_);
  }
  /// The sum of the last forward pass (stored in the first branch's output type), for
  /// precis::diagnostics.
  const auto& joined() const requires(Join == join_kind::add) { return y_; }

  /// Bytes of the joined output and the input gradient and, for a concatenation, of each branch's
  /// part of dy.
  std::size_t own_bytes() const {
    std::size_t n = bytes_of(y_) + bytes_of(dx_);
    for (const auto& s : slices_) n += bytes_of(s);
    return n;
  }
  /// Its backward pass's buffer (see nn/module.hpp): the summed input gradient.
  template <class Self, class F>
  static void for_each_gradient_buffer(Self& self, F&& f) {
    f(self.dx_);
  }
  /// Calls `f(component, branch)` for each branch in order; the component is the branch's name, or
  /// its position where it has none. In a residual the body keeps its own name (usually "", so its
  /// layers sit at the residual's path) and the shortcut is "shortcut".
  template <class Self, class F>
  static void for_each_child(Self& self, F&& f) {
    std::size_t i = 0;
    std::apply([&](auto&... c) { ((f(component(i, c), c), ++i), ...); }, self.children_);
  }
  /// Follows the model's image layout (nn::build calls it with build_options::layout) where
  /// the concatenation axis is nn::channel_axis: axis 3 for [N, H, W, C].
  void set_layout(image_layout layout, std::string_view) {
    if (channels_) axis_ = layout == image_layout::nhwc ? 3 : 1;
  }

 private:
  template <class Spec, std::size_t... I>
  branches(const Spec& s, std::index_sequence<I...>)
      : children_(Ms(std::get<I>(s.children))...), axis_(s.axis), channels_(s.channels) {
    if (axis_ >= output_rank) {
      throw error("precis::nn::concat: axis " + std::to_string(axis_) + " is out of range for tensors of rank " +
                  std::to_string(output_rank));
    }
    if (channels_ && output_rank != 4) {
      throw error("precis::nn::concat: nn::channel_axis is an axis of images ([N, C, H, W] or [N, H, W, C]); "
                  "the branches give tensors of rank " + std::to_string(output_rank));
    }
    if constexpr (Join == join_kind::concat) {
      slices_.resize(count);
      widths_.resize(count);
    }
  }

  template <class C>
  static std::string component(std::size_t i, const C& c) {
    if constexpr (Residual) {
      return i == 0 ? std::string(c.name()) : std::string("shortcut");
    } else {
      return c.name().empty() ? std::to_string(i) : std::string(c.name());
    }
  }

  void joined_shape(shape_t<output_rank>& out, const shape_t<output_rank>& s, std::size_t i,
                    std::string_view path) const {
    if (i == 0) {
      out = s;
      return;
    }
    bool fits = true;
    for (std::size_t a = 0; a < output_rank; ++a) fits = fits && (a == axis_ && Join == join_kind::concat ? true : s[a] == out[a]);
    if (!fits) {
      throw error("precis::nn: the branches joined at " + path_or_root(path) + " give shapes " + shape_string(out) +
                  " and " + shape_string(s) +
                  (Join == join_kind::add ? ", which cannot be added" : ", which differ outside the concatenation axis"));
    }
    if constexpr (Join == join_kind::concat) out[axis_] += s[axis_];
  }

  template <class Part>
  void copy_into(context_ref_t<context_type> ctx, const Part& part, std::size_t& offset) {
    const auto d = detail::split_at<output_rank>(shape_of<output_rank>(part), axis_);
    io::copy_rows("precis::nn::concat", ctx, part.data(), y_.data() + offset * d[2],
                  detail::concat_part_plan(d, std::size_t(y_.shape()[axis_]), false));
    offset += d[1];
  }

  // The gradient of branch i: dy itself for an add; its part of dy for a concatenation.
  template <class D>
  const D& slice_for(context_ref_t<context_type> ctx, const D& dy, std::size_t i, std::size_t& offset) {
    if constexpr (Join == join_kind::add) {
      return dy;
    } else {
      const std::size_t width = widths_[i];
      auto& s = slices_[i];
      shape_t<output_rank> shape = shape_of<output_rank>(dy);
      shape[axis_] = width;
      ensure(s, shape);
      const auto d = detail::split_at<output_rank>(shape, axis_);
      io::copy_rows("precis::nn::concat", ctx, dy.data() + offset * d[2], s.data(),
                    detail::concat_part_plan(d, std::size_t(dy.shape()[axis_]), true));
      offset += width;
      return s;
    }
  }
  children_type children_;
  std::size_t axis_;
  bool channels_;
  tensor_t<context_type, output_type, output_rank> y_;
  tensor_t<context_type, input_grad_type, input_rank> dx_;
  std::vector<tensor_t<context_type, output_grad_type, output_rank>> slices_;  // concat: each branch's dy
  std::vector<std::size_t> widths_;                                 // concat: each branch's width
};

// ---------------------------------------------------------------------------------------
// Repeat

template <std::size_t N, class First, class Rest>
class repeat_block;

/// Blueprint of N blocks of one blueprint (nn::repeat).
template <std::size_t N, class S>
struct repeat_spec {
  /// The blueprint every block is built from.
  S block;
  /// Resolves the blocks: the first where (In, G, R) reach it, the later ones where the first
  /// block's output reaches them.
  template <class Map, class Ctx, class In, class G, std::size_t R>
  struct resolved {
    /// The module the first block builds into.
    using first = detail::resolve_spec_t<S, Map, Ctx, In, G, R>;
    // The later blocks read what the first gives (a per-layer map may change the type a
    // block ends in): at most two block types, however many blocks. With one block there
    // is no later one to resolve (a block that changes the rank may be used once).
    /// The module a later block builds into where the output of F reaches it.
    template <class F>
    struct later {
      /// The resolved module.
      using type = typename detail::resolve_spec<S, Map, Ctx, typename F::output_type, typename F::output_grad_type,
                                                 F::output_rank>::type;
    };
    /// The module blocks 1 to N-1 build into (the first block's type where N is 1).
    using rest = typename std::conditional_t<N == 1, std::type_identity<first>, later<first>>::type;
    /// The nn::repeat_block built.
    using type = repeat_block<N, first, rest>;
  };
  /// The module this blueprint builds into where element type In, gradient type G and rank R reach
  /// it, under policy map Map on context Ctx: an nn::repeat_block (see resolved).
  template <class Map, class Ctx, class In, class G, std::size_t R>
  using module_type = typename resolved<Map, Ctx, In, G, R>::type;
};

/// N blocks built from `block`, run in order, named 0 .. N-1 in paths (a blueprint node).
/// Blocks after the first read what the block before gives; they must end in what they
/// read, so the N blocks are at most two types (the first, and an array of the rest).
template <std::size_t N, class S>
constexpr repeat_spec<N, S> repeat(S block) {
  static_assert(N > 0, "precis: nn::repeat<N> needs N > 0");
  return {block};
}

/// N modules: the first of type First, the others of one type Rest, held in an array, so
/// twelve encoder blocks are at most two instantiations.
///
/// The blocks after the first lend each other their gradient buffers (those their modules
/// name through for_each_gradient_buffer, see nn/module.hpp): block i's are dead once block
/// i - 1 has read block i's input gradient, so block i - 2 takes them. Two sets of them
/// circulate, whatever N, instead of one per block: in a ViT-B's twelve blocks most of the
/// memory a backward pass adds. A pass leaves them with blocks 1 and 2 (the first two after
/// the first block, which keeps its own); before the next backward pass they move back to the
/// last two blocks, and blocks 3 to N - 1 hold none between passes. Moving a set exchanges
/// tensors (no copy, no allocation), in the same order every pass, so each block computes
/// into the same memory at the same point of every pass, as a captured CUDA graph requires,
/// and the bits are those of blocks with buffers of their own. It applies where there are at
/// least three such blocks, they read one tensor and every one of them read the same shape in
/// the last forward pass. share_gradient_buffers(false) gives every block its own set (what
/// precis::diagnostics reads after a pass; nn::trainer does so in the steps it runs under a
/// monitor).
template <std::size_t N, class First, class Rest>
class repeat_block {
  static_assert(N == 1 || (std::is_same_v<typename Rest::output_type, typename Rest::input_type> &&
                           std::is_same_v<typename Rest::output_grad_type, typename Rest::input_grad_type> &&
                           Rest::output_rank == Rest::input_rank),
                "precis: nn::repeat<N>(block) needs a block that ends in the storage type, gradient "
                "type and rank it starts with (from its second copy on); give the block's first and last "
                "layers one policy in the map, or end the block in a cast");
  using last = std::conditional_t<N == 1, First, Rest>;

 public:
  /// The context its kernels run on (the first block's).
  using context_type = typename First::context_type;
  /// Element type forward() reads: the first block's input type.
  using input_type = typename First::input_type;
  /// Element type of the gradient backward() returns: the first block's.
  using input_grad_type = typename First::input_grad_type;
  /// Element type forward() returns: the last block's output type.
  using output_type = typename last::output_type;
  /// Element type of the gradient backward() reads: the last block's.
  using output_grad_type = typename last::output_grad_type;
  /// Rank of the input: the first block's.
  static constexpr std::size_t input_rank = First::input_rank;
  /// Rank of the output: the last block's.
  static constexpr std::size_t output_rank = last::output_rank;

  /// Builds the N blocks from `s.block`.
  template <class S>
  explicit repeat_block(const repeat_spec<N, S>& s) : first_(s.block), rest_(make_rest(s.block, std::make_index_sequence<N - 1>{})) {}

  /// "": a repeat is named by its position in paths.
  std::string_view name() const { return ""; }
  /// The shape the last block gives for an input of shape `in`, each block reading the shape the
  /// one before gives; the first block that cannot take what reaches it throws precis::error naming
  /// its path (blocks are 0 to N-1 under `path`).
  shape_t<output_rank> output_shape(const shape_t<input_rank>& in, std::string_view path,
                                    mode m = mode::eval) const {
    auto s = detail::output_shape_in(first_, in, join_path(path, "0"), m);
    if constexpr (N > 1) {
      for (std::size_t i = 0; i + 1 < N; ++i) {
        s = detail::output_shape_in(rest_[i], s, join_path(path, std::to_string(i + 1)), m);
      }
    }
    return s;
  }
  /// Runs the blocks in order on x; returns the last block's output.
  const tensor_t<context_type, output_type, output_rank>& forward(context_ref_t<context_type> ctx,
                                                                  const tensor_t<context_type, input_type, input_rank>& x,
                                                                  mode m = mode::train) {
    const auto& y0 = first_.forward(ctx, x, m);
    if constexpr (N == 1) {
      return y0;
    } else {
      const auto* y = &rest_[0].forward(ctx, y0, m);
      if constexpr (lends) uniform_ = true;
      for (std::size_t i = 1; i + 1 < N; ++i) {
        if constexpr (lends) {
          uniform_ = uniform_ && shape_of<Rest::input_rank>(*y) == shape_of<Rest::input_rank>(y0);
        }
        y = &rest_[i].forward(ctx, *y, m);
      }
      return *y;
    }
  }
  /// Runs the blocks' backward passes in reverse order from dy; returns the first block's input
  /// gradient.
  const tensor_t<context_type, input_grad_type, input_rank>& backward(
      context_ref_t<context_type> ctx, const tensor_t<context_type, output_grad_type, output_rank>& dy) {
    if constexpr (N == 1) {
      return first_.backward(ctx, dy);
    } else {
      return first_.backward(ctx, backward_rest(ctx, dy));
    }
  }
  /// backward() without the input gradient: the first block leaves its own out (see
  /// nn::backward_parameters).
  void backward_parameters(context_ref_t<context_type> ctx,
                           const tensor_t<context_type, output_grad_type, output_rank>& dy) {
    if constexpr (N == 1) {
      nn::backward_parameters(first_, ctx, dy);
    } else {
      nn::backward_parameters(first_, ctx, backward_rest(ctx, dy));
    }
  }
  /// Whether the blocks after the first lend each other their gradient buffers (see the class
  /// comment; on when built). Off, each keeps its own from its next backward pass on.
  void share_gradient_buffers(bool on) { share_ = on; }
  /// 0: the buffers belong to the blocks.
  std::size_t own_bytes() const { return 0; }
  /// Calls `f("0", first())`, then `f("i", block i)` for i = 1 to N-1.
  template <class Self, class F>
  static void for_each_child(Self& self, F&& f) {
    f(std::string("0"), self.first_);
    for (std::size_t i = 0; i + 1 < N; ++i) f(std::to_string(i + 1), self.rest_[i]);
  }
  /// The first block (block 0).
  First& first() { return first_; }
  /// Block i, for `1 <= i < N`.
  Rest& operator[](std::size_t i) { return rest_[i - 1]; }
  /// N, the number of blocks.
  static constexpr std::size_t size() { return N; }

 private:
  template <class S, std::size_t... I>
  static std::array<Rest, N - 1> make_rest(const S& s, std::index_sequence<I...>) {
    return {((void)I, Rest(s))...};
  }

  // At least three blocks after the first, reading one tensor: enough for two sets to serve
  // fewer blocks than there are.
  static constexpr bool lends = N >= 4 && !is_values_v<typename Rest::input_type>;

  // The blocks after the first, last to first (lending their buffers where they may);
  // returns rest_[0]'s input gradient.
  const auto& backward_rest(context_ref_t<context_type> ctx,
                            const tensor_t<context_type, output_grad_type, output_rank>& dy) {
    const bool lend = lends && share_ && uniform_;
    if (lend) {
      // Inside a CUDA graph's capture nothing is freed (a free there would fail, or become
      // part of the graph): a set a pass without lending left below the last two blocks
      // stays until an eager pass.
      bool capturing = false;
      if constexpr (requires { ctx.capturing(); }) capturing = ctx.capturing();
      lift_buffers(!capturing);
    }
    const auto* d = &rest_[N - 2].backward(ctx, dy);
    for (std::size_t i = N - 2; i-- > 0;) {
      // rest_[i + 1]'s input gradient is *d; rest_[i + 2]'s buffers are dead.
      if (lend && i + 4 <= N) exchange_buffers(i, i + 2);
      d = &rest_[i].backward(ctx, *d);
    }
    return *d;
  }
  // The buffer lists of the blocks after the first (made again where the module has moved or
  // been copied since they were made).
  void list_buffers() {
    if (listed_for_ == this) return;
    for (std::size_t i = 0; i + 1 < N; ++i) buffers_[i] = gradient_buffers(rest_[i]);
    listed_for_ = this;
  }
  // Block a takes block b's gradient buffers and b takes a's (a != b).
  void exchange_buffers(std::size_t a, std::size_t b) {
    list_buffers();
    for (std::size_t k = 0; k < buffers_[a].size(); ++k) {
      buffers_[a][k].exchange(buffers_[a][k].tensor, buffers_[b][k].tensor);
    }
  }
  // Before a backward pass: the two sets the last pass left with rest_[0] and rest_[1] go to
  // the last two blocks, rest_[0]'s to the one of its parity; with `release`, blocks below
  // those keep none (a pass without lending may have given every block a set).
  void lift_buffers(bool release) {
    constexpr std::size_t top = N - 2, even = top % 2 == 0 ? top : top - 1, odd = even == top ? top - 1 : top;
    exchange_buffers(0, even);
    if (odd != 1) exchange_buffers(1, odd);
    if (!release) return;
    for (std::size_t j = 0; j + 2 <= top; ++j) {
      for (auto& b : buffers_[j]) b.release(b.tensor);
    }
  }

  First first_;
  std::array<Rest, N - 1> rest_;
  bool share_ = true;
  bool uniform_ = false;  // every block after the first read one shape in the last forward pass
  std::array<std::vector<detail::gradient_buffer>, N - 1> buffers_{};
  const repeat_block* listed_for_ = nullptr;
};

// ---------------------------------------------------------------------------------------
// Names

template <class M>
class named_module;

/// Blueprint of a named node (nn::named).
template <class S>
struct named_spec {
  /// The node's name in paths; the characters it views must outlive the blueprint.
  std::string_view name;
  /// The blueprint named.
  S node;
  /// The module this blueprint builds into where element type In, gradient type G and rank R reach
  /// it, under policy map Map on context Ctx: an nn::named_module around the node's module.
  template <class Map, class Ctx, class In, class G, std::size_t R>
  using module_type = named_module<detail::resolve_spec_t<S, Map, Ctx, In, G, R>>;
};

/// `node`, called `name` in paths ("encoder", "mlp"). The name must outlive the blueprint
/// (a string literal does).
template <class S>
constexpr named_spec<S> named(std::string_view name, S node) {
  return {name, node};
}

/// A module with a name of its own in paths.
template <class M>
class named_module {
 public:
  /// The context its kernels run on (M's).
  using context_type = typename M::context_type;
  /// Element type forward() reads: M's.
  using input_type = typename M::input_type;
  /// Element type of the gradient backward() returns: M's.
  using input_grad_type = typename M::input_grad_type;
  /// Element type forward() returns: M's.
  using output_type = typename M::output_type;
  /// Element type of the gradient backward() reads: M's.
  using output_grad_type = typename M::output_grad_type;
  /// Rank of the input: M's.
  static constexpr std::size_t input_rank = M::input_rank;
  /// Rank of the output: M's.
  static constexpr std::size_t output_rank = M::output_rank;

  /// Builds M from `s.node` and keeps a copy of the name; throws precis::error where the name is
  /// empty or holds a '.'.
  template <class S>
  explicit named_module(const named_spec<S>& s) : name_(s.name), m_(s.node) {
    if (name_.empty() || name_.find('.') != std::string::npos) {
      throw error("precis::nn::named: a name must be non-empty and hold no '.', got \"" + name_ + "\"");
    }
  }

  /// The name given to nn::named: this module's component in paths.
  std::string_view name() const { return name_; }
  /// M's output shape for an input of shape `in`; M throws precis::error where it cannot take `in`.
  edge_shape_t<output_type, output_rank> output_shape(
      const edge_shape_t<input_type, input_rank>& in, std::string_view path,
      mode m = mode::eval) const {
    return detail::output_shape_in(m_, in, path, m);
  }
  /// M's forward pass; returns M's output.
  template <class X>
  decltype(auto) forward(context_ref_t<context_type> ctx, const X& x, mode m = mode::train) {
    return m_.forward(ctx, x, m);
  }
  /// M's backward pass; returns M's input gradient.
  template <class D>
  decltype(auto) backward(context_ref_t<context_type> ctx, const D& dy) {
    return m_.backward(ctx, dy);
  }
  /// backward() without the input gradient (see nn::backward_parameters).
  template <class D>
  void backward_parameters(context_ref_t<context_type> ctx, const D& dy) {
    nn::backward_parameters(m_, ctx, dy);
  }
  /// 0: the buffers belong to M.
  std::size_t own_bytes() const { return 0; }
  /// Calls `f("", M)`: M sits at this module's path, its children under the name.
  template <class Self, class F>
  static void for_each_child(Self& self, F&& f) {
    f("", self.m_);
  }
  /// The module named.
  M& inner() { return m_; }

 private:
  std::string name_;
  M m_;
};

}  // namespace precis::nn
