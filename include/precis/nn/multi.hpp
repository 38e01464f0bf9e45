/// @file
/// Nodes with several outputs or several inputs.
///
///     nn::fork(a, b)              one input, the outputs of both branches (a detector's two heads)
///     nn::taps(s1, s2, s3, s4)    a sequence that gives every stage's output (a backbone for an FPN)
///     nn::each(n1, n2, ...)       node i on tensor i of a multi-tensor edge (lateral convolutions)
///     nn::top_down(node)          p[last] = x[last], p[i] = x[i] + node(p[i + 1]) (an FPN's top-down path)
///     nn::add_all()               the tensors of an edge summed into one
///     nn::concat_all(axis)        the tensors of an edge concatenated along `axis`
///     nn::concat_all(nn::channel_axis)   ... along the images' channels, in either layout
///     nn::subtract()              the first tensor of a two-tensor edge minus the second
///
/// A multi-tensor edge has the type nn::values<nn::sig<T, G, R>...>; forward passes a tuple
/// of pointers to the tensors, backward a tuple of pointers to their gradients. A model may
/// end in one (a loss of several terms over several outputs reads it) or start with one
/// (several inputs). Sums are added in float (double for double tensors) and rounded once;
/// where a tensor reaches several consumers, its gradient is the sum of theirs, likewise.
/// They run on either context: on the device the sums, differences and concatenations are
/// one launch each on the context's stream, with the host's bits (each element's terms are
/// added in the host's order, and copies are exact).
#pragma once

#include <precis/nn/compose.hpp>
#include <precis/nn/layout.hpp>
#include <precis/nn/module.hpp>

#include <array>
#include <cstddef>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace precis::nn {

namespace detail {

template <class M>
using output_sig_t = sig<typename M::output_type, typename M::output_grad_type, M::output_rank>;

template <class M>
inline constexpr bool single_output_v = !is_values_v<typename M::output_type>;

template <class... Ts>
inline constexpr bool all_same_v = sizeof...(Ts) == 0 || (std::is_same_v<std::tuple_element_t<0, std::tuple<Ts...>>, Ts> && ...);

template <class Child>
std::string component_of(std::size_t i, const Child& c) {
  return c.name().empty() ? std::to_string(i) : std::string(c.name());
}

/// The tuple of pointers to the elements of a buffer tuple.
template <class Tuple>
auto pointers_to(const Tuple& t) {
  return std::apply([](const auto&... e) { return std::tuple{&e...}; }, t);
}

}  // namespace detail

// ---------------------------------------------------------------------------------------
// fork: one input, several outputs

template <class... Ms>
class fork_module;

/// Blueprint of nn::fork.
template <class... Ss>
struct fork_spec {
  /// The branches' blueprints.
  std::tuple<Ss...> children;
  /// The module this blueprint builds into where element type In, gradient type G and rank R reach
  /// it, under policy map Map on context Ctx: an nn::fork_module of the branches' modules, each
  /// resolved where (In, G, R) reach it.
  template <class Map, class Ctx, class In, class G, std::size_t R>
  using module_type = fork_module<detail::resolve_spec_t<Ss, Map, Ctx, In, G, R>...>;
};

/// Branches on one input whose outputs all leave the node (a blueprint node): a head whose
/// two maps feed a loss. The input's gradient is the sum of the branches'.
template <class... Ss>
constexpr fork_spec<Ss...> fork(Ss... branches) {
  static_assert(sizeof...(Ss) >= 2, "precis: nn::fork needs at least two branches");
  return {std::tuple<Ss...>(branches...)};
}

/// The module nn::fork builds into.
template <class... Ms>
class fork_module {
  using children_type = std::tuple<Ms...>;
  static constexpr std::size_t count = sizeof...(Ms);
  using first = std::tuple_element_t<0, children_type>;
  static_assert(((std::is_same_v<typename Ms::input_type, typename first::input_type> &&
                  std::is_same_v<typename Ms::input_grad_type, typename first::input_grad_type> &&
                  Ms::input_rank == first::input_rank) &&
                 ...),
                "precis: the branches of nn::fork must read the same input type, gradient type and rank");
  static_assert((detail::single_output_v<Ms> && ...), "precis: each branch of nn::fork gives one tensor");

 public:
  /// The context its kernels run on: the branches'.
  using context_type = typename first::context_type;
  /// Element type forward() reads: every branch's input type.
  using input_type = typename first::input_type;
  /// Element type of the gradient backward() returns: every branch's.
  using input_grad_type = typename first::input_grad_type;
  /// The multi-tensor edge forward() gives: one nn::sig per branch, of its output's types and rank.
  using output_type = values<detail::output_sig_t<Ms>...>;
  /// The gradient backward() reads: the same edge, one gradient per branch.
  using output_grad_type = output_type;
  /// Rank of the input: every branch's.
  static constexpr std::size_t input_rank = first::input_rank;
  /// 0: the output is a multi-tensor edge.
  static constexpr std::size_t output_rank = 0;

  /// Builds each branch from its blueprint in `s`.
  template <class... Ss>
  explicit fork_module(const fork_spec<Ss...>& s) : fork_module(s, std::make_index_sequence<count>{}) {}

  /// "": a fork is named by its position in paths.
  std::string_view name() const { return ""; }
  /// The tuple of the branches' output shapes for an input of shape `in`; a branch that cannot take
  /// `in` throws precis::error naming its path.
  edge_shape_t<output_type, 0> output_shape(const shape_t<input_rank>& in, std::string_view path,
                                            mode m = mode::eval) const {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return edge_shape_t<output_type, 0>{detail::output_shape_in(
          std::get<I>(children_), in,
          join_path(path, detail::component_of(I, std::get<I>(children_))), m)...};
    }(std::make_index_sequence<count>{});
  }
  /// Runs each branch on x, in order; returns a tuple of pointers to their outputs (the branches'
  /// buffers).
  template <class X>
  edge_value_t<context_type, output_type, 0> forward(context_ref_t<context_type> ctx, const X& x, mode m = mode::train) {
    return std::apply([&](auto&... c) { return edge_value_t<context_type, output_type, 0>{&c.forward(ctx, x, m)...}; },
                      children_);
  }
  /// Runs each branch's backward pass on its gradient in dy (one pointer per branch); returns the
  /// sum of their input gradients, added in float (double for double tensors) and rounded once into
  /// this module's buffer.
  const tensor_t<context_type, input_grad_type, input_rank>& backward(context_ref_t<context_type> ctx,
                                                                       const edge_grad_t<context_type, output_type, 0>& dy) {
    const auto dxs = [&]<std::size_t... I>(std::index_sequence<I...>) {
      return std::tuple{&std::get<I>(children_).backward(ctx, *std::get<I>(dy))...};
    }(std::make_index_sequence<count>{});
    ensure(dx_, shape_of<input_rank>(*std::get<0>(dxs)));
    std::apply([&](auto... d) { context_traits<context_type>::add_rounded(ctx, dx_, *d...); }, dxs);
    return dx_;
  }
  /// backward() without the input gradient: no branch computes its own, none are added
  /// (see nn::backward_parameters).
  void backward_parameters(context_ref_t<context_type> ctx,
                           const edge_grad_t<context_type, output_type, 0>& dy) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (nn::backward_parameters(std::get<I>(children_), ctx, *std::get<I>(dy)), ...);
    }
    (std::make_index_sequence<count>{});
  }
  /// Bytes of the input-gradient buffer.
  std::size_t own_bytes() const { return bytes_of(dx_); }
  /// Calls `f(component, branch)` for each branch in order; the component is the branch's name, or
  /// its position where it has none.
  template <class Self, class F>
  static void for_each_child(Self& self, F&& f) {
    std::size_t i = 0;
    std::apply([&](auto&... c) { ((f(detail::component_of(i, c), c), ++i), ...); }, self.children_);
  }
  /// Branch I.
  template <std::size_t I>
  auto& child() {
    return std::get<I>(children_);
  }

 private:
  template <class Spec, std::size_t... I>
  fork_module(const Spec& s, std::index_sequence<I...>) : children_(Ms(std::get<I>(s.children))...) {}

  children_type children_;
  tensor_t<context_type, input_grad_type, input_rank> dx_;
};

// ---------------------------------------------------------------------------------------
// taps: a sequence that gives every child's output

template <class... Ms>
class taps_module;

/// Blueprint of nn::taps.
template <class... Ss>
struct taps_spec {
  /// The stages' blueprints, as a sequence.
  seq_spec<Ss...> chain;
  /// The taps module of the stages an nn::sequence type holds.
  template <class Seq>
  struct as_taps;
  /// The nn::taps_module of the modules Ms of an nn::sequence.
  template <class... Ms>
  struct as_taps<sequence<Ms...>> {
    /// The nn::taps_module built.
    using type = taps_module<Ms...>;
  };
  /// The module this blueprint builds into where element type In, gradient type G and rank R reach
  /// it, under policy map Map on context Ctx: the stages resolved as nn::seq resolves them (with an
  /// nn::cast_in where a stage reads another type than the one before gives), held in an
  /// nn::taps_module.
  template <class Map, class Ctx, class In, class G, std::size_t R>
  using module_type = typename as_taps<typename seq_spec<Ss...>::template module_type<Map, Ctx, In, G, R>>::type;
};

/// `stages` in order, every stage's output leaving the node (a blueprint node): a backbone
/// that gives its four feature maps to an FPN. A stage's output gradient is what comes
/// from outside plus what the next stage gives back, added in float and rounded once.
template <class... Ss>
constexpr taps_spec<Ss...> taps(Ss... stages) {
  static_assert(sizeof...(Ss) >= 2, "precis: nn::taps needs at least two stages");
  return {seq_spec<Ss...>{std::tuple<Ss...>(stages...)}};
}

/// The module nn::taps builds into.
template <class... Ms>
class taps_module {
  using children_type = std::tuple<Ms...>;
  static constexpr std::size_t count = sizeof...(Ms);
  using first = std::tuple_element_t<0, children_type>;
  static_assert(detail::neighbours_fit<Ms...>());
  static_assert((detail::single_output_v<Ms> && ...), "precis: each stage of nn::taps gives one tensor");

 public:
  /// The context its kernels run on: the stages'.
  using context_type = typename first::context_type;
  /// Element type forward() reads: the first stage's input type.
  using input_type = typename first::input_type;
  /// Element type of the gradient backward() returns: the first stage's.
  using input_grad_type = typename first::input_grad_type;
  /// The multi-tensor edge forward() gives: one nn::sig per stage, of its output's types and rank.
  using output_type = values<detail::output_sig_t<Ms>...>;
  /// The gradient backward() reads: the same edge, one gradient per stage output.
  using output_grad_type = output_type;
  /// Rank of the input: the first stage's.
  static constexpr std::size_t input_rank = first::input_rank;
  /// 0: the output is a multi-tensor edge.
  static constexpr std::size_t output_rank = 0;

  /// Builds each stage from its blueprint in `s`.
  template <class... Ss>
  explicit taps_module(const taps_spec<Ss...>& s) : taps_module(s.chain, std::make_index_sequence<count>{}) {}

  /// "": a taps node is named by its position in paths.
  std::string_view name() const { return ""; }
  /// The tuple of every stage's output shape for an input of shape `in`, each stage reading the
  /// shape the one before gives; a stage that cannot take what reaches it throws precis::error
  /// naming its path.
  edge_shape_t<output_type, 0> output_shape(const shape_t<input_rank>& in, std::string_view path,
                                            mode m = mode::eval) const {
    edge_shape_t<output_type, 0> out{};
    shapes_from<0>(in, path, m, out);
    return out;
  }
  /// Runs the stages in order on x; returns a tuple of pointers to every stage's output (the
  /// stages' buffers).
  template <class X>
  edge_value_t<context_type, output_type, 0> forward(context_ref_t<context_type> ctx, const X& x, mode m = mode::train) {
    edge_value_t<context_type, output_type, 0> out{};
    forward_from<0>(ctx, x, m, out);
    return out;
  }
  /// Runs the stages' backward passes in reverse order. The last stage's output gradient is its
  /// gradient in dy; every other stage's is its gradient in dy plus the input gradient the next
  /// stage gives back, added in float (double for double tensors) and rounded once into this
  /// module's buffers. Returns the first stage's input gradient.
  const tensor_t<context_type, input_grad_type, input_rank>& backward(context_ref_t<context_type> ctx,
                                                                       const edge_grad_t<context_type, output_type, 0>& dy) {
    return backward_from<count - 1>(ctx, dy, *std::get<count - 1>(dy));
  }
  /// backward() without the input gradient: the first stage leaves its own out (see
  /// nn::backward_parameters).
  void backward_parameters(context_ref_t<context_type> ctx,
                           const edge_grad_t<context_type, output_type, 0>& dy) {
    backward_from<count - 1, true>(ctx, dy, *std::get<count - 1>(dy));
  }
  /// Bytes of the summed output gradients (one buffer per stage but the last).
  std::size_t own_bytes() const {
    return std::apply([](const auto&... g) { return (std::size_t(0) + ... + bytes_of(g)); }, sums_);
  }
  /// Calls `f(component, stage)` for each stage in order; the component is the stage's name, or its
  /// position where it has none.
  template <class Self, class F>
  static void for_each_child(Self& self, F&& f) {
    std::size_t i = 0;
    std::apply([&](auto&... c) { ((f(detail::component_of(i, c), c), ++i), ...); }, self.children_);
  }
  /// Stage I.
  template <std::size_t I>
  auto& child() {
    return std::get<I>(children_);
  }

 private:
  template <class Spec, std::size_t... I>
  taps_module(const Spec& s, std::index_sequence<I...>) : children_(Ms(std::get<I>(s.children))...) {}

  template <std::size_t I, class S, class Out>
  void shapes_from(const S& in, std::string_view path, mode m, Out& out) const {
    const auto& c = std::get<I>(children_);
    std::get<I>(out) =
        detail::output_shape_in(c, in, join_path(path, detail::component_of(I, c)), m);
    if constexpr (I + 1 < count) shapes_from<I + 1>(std::get<I>(out), path, m, out);
  }
  template <std::size_t I, class X, class Out>
  void forward_from(context_ref_t<context_type> ctx, const X& x, mode m, Out& out) {
    const auto& y = std::get<I>(children_).forward(ctx, x, m);
    std::get<I>(out) = &y;
    if constexpr (I + 1 < count) forward_from<I + 1>(ctx, y, m, out);
  }
  // Stage I's output gradient is `d` (the outside's plus the next stage's, summed).
  template <std::size_t I, bool ParametersOnly = false, class D, class G>
  decltype(auto) backward_from(context_ref_t<context_type> ctx, const D& dy, const G& d) {
    if constexpr (I == 0 && ParametersOnly) {
      nn::backward_parameters(std::get<I>(children_), ctx, d);
      return;
    } else if constexpr (I == 0) {
      return std::get<I>(children_).backward(ctx, d);
    } else {
      const auto& dx = std::get<I>(children_).backward(ctx, d);
      auto& sum = std::get<I - 1>(sums_);
      const auto& outside = *std::get<I - 1>(dy);
      ensure(sum, shape_of<detail::rank_of_v<std::remove_cvref_t<decltype(outside)>>>(outside));
      context_traits<context_type>::add_rounded(ctx, sum, outside, dx);
      return backward_from<I - 1, ParametersOnly>(ctx, dy, sum);
    }
  }

  template <class M>
  using grad_buffer = tensor_t<context_type, typename M::output_grad_type, M::output_rank>;
  template <class Seq>
  struct all_but_last;
  template <std::size_t... I>
  struct all_but_last<std::index_sequence<I...>> {
    using type = std::tuple<grad_buffer<std::tuple_element_t<I, children_type>>...>;
  };

  children_type children_;
  typename all_but_last<std::make_index_sequence<count - 1>>::type sums_;
};

// ---------------------------------------------------------------------------------------
// each: node i on tensor i

template <class... Ms>
class each_module;

namespace detail {
template <class Specs, class Sigs, class Map, class Ctx>
struct resolve_each;
template <class... Ss, class... Sigs, class Map, class Ctx>
struct resolve_each<std::tuple<Ss...>, values<Sigs...>, Map, Ctx> {
  static_assert(sizeof...(Ss) == sizeof...(Sigs),
                "precis: nn::each needs one node for each tensor of the edge it reads");
  using type = each_module<resolve_spec_t<Ss, Map, Ctx, typename Sigs::type, typename Sigs::grad_type, Sigs::rank>...>;
};
}  // namespace detail

/// Blueprint of nn::each.
template <class... Ss>
struct each_spec {
  /// The nodes' blueprints, one per tensor of the edge.
  std::tuple<Ss...> children;
  /// The module this blueprint builds into where the multi-tensor edge In reaches it, under policy
  /// map Map on context Ctx: an nn::each_module with node i resolved where tensor i's types and
  /// rank reach it. In must be an nn::values edge of as many tensors as there are nodes.
  template <class Map, class Ctx, class In, class G, std::size_t R>
  using module_type = typename detail::resolve_each<std::tuple<Ss...>, In, Map, Ctx>::type;
};

/// Node i applied to tensor i of a multi-tensor edge (a blueprint node).
template <class... Ss>
constexpr each_spec<Ss...> each(Ss... nodes) {
  return {std::tuple<Ss...>(nodes...)};
}

/// The module nn::each builds into.
template <class... Ms>
class each_module {
  using children_type = std::tuple<Ms...>;
  static constexpr std::size_t count = sizeof...(Ms);
  using first = std::tuple_element_t<0, children_type>;
  static_assert((detail::single_output_v<Ms> && ...), "precis: each node of nn::each gives one tensor");

 public:
  /// The context its kernels run on: the nodes'.
  using context_type = typename first::context_type;
  /// The multi-tensor edge forward() reads: one nn::sig per node, of its input's types and rank.
  using input_type = values<sig<typename Ms::input_type, typename Ms::input_grad_type, Ms::input_rank>...>;
  /// The gradient backward() returns: the same edge, one gradient per node input.
  using input_grad_type = input_type;
  /// The multi-tensor edge forward() gives: one nn::sig per node, of its output's types and rank.
  using output_type = values<detail::output_sig_t<Ms>...>;
  /// The gradient backward() reads: the same edge, one gradient per node output.
  using output_grad_type = output_type;
  /// 0: the input is a multi-tensor edge.
  static constexpr std::size_t input_rank = 0;
  /// 0: the output is a multi-tensor edge.
  static constexpr std::size_t output_rank = 0;

  /// Builds each node from its blueprint in `s`.
  template <class... Ss>
  explicit each_module(const each_spec<Ss...>& s) : each_module(s, std::make_index_sequence<count>{}) {}

  /// "": an each node is named by its position in paths.
  std::string_view name() const { return ""; }
  /// The tuple of node i's output shape for shape i of `in`; a node that cannot take its shape
  /// throws precis::error naming its path.
  edge_shape_t<output_type, 0> output_shape(const edge_shape_t<input_type, 0>& in,
                                            std::string_view path, mode m = mode::eval) const {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return edge_shape_t<output_type, 0>{detail::output_shape_in(
          std::get<I>(children_), std::get<I>(in),
          join_path(path, detail::component_of(I, std::get<I>(children_))), m)...};
    }(std::make_index_sequence<count>{});
  }
  /// Runs node i on tensor i of x, in order; returns a tuple of pointers to their outputs (the
  /// nodes' buffers).
  edge_value_t<context_type, output_type, 0> forward(context_ref_t<context_type> ctx,
                                                     const edge_value_t<context_type, input_type, 0>& x,
                                                     mode m = mode::train) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return edge_value_t<context_type, output_type, 0>{&std::get<I>(children_).forward(ctx, *std::get<I>(x), m)...};
    }(std::make_index_sequence<count>{});
  }
  /// Runs node i's backward pass on gradient i of dy; returns a tuple of pointers to their input
  /// gradients.
  edge_grad_t<context_type, input_type, 0> backward(context_ref_t<context_type> ctx,
                                                    const edge_grad_t<context_type, output_type, 0>& dy) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return edge_grad_t<context_type, input_type, 0>{&std::get<I>(children_).backward(ctx, *std::get<I>(dy))...};
    }(std::make_index_sequence<count>{});
  }
  /// 0: the buffers belong to the nodes.
  std::size_t own_bytes() const { return 0; }
  /// Calls `f(component, node)` for each node in order; the component is the node's name, or its
  /// position where it has none.
  template <class Self, class F>
  static void for_each_child(Self& self, F&& f) {
    std::size_t i = 0;
    std::apply([&](auto&... c) { ((f(detail::component_of(i, c), c), ++i), ...); }, self.children_);
  }
  /// Node I.
  template <std::size_t I>
  auto& child() {
    return std::get<I>(children_);
  }

 private:
  template <class Spec, std::size_t... I>
  each_module(const Spec& s, std::index_sequence<I...>) : children_(Ms(std::get<I>(s.children))...) {}

  children_type children_;
};

// ---------------------------------------------------------------------------------------
// top_down: p[last] = x[last], p[i] = x[i] + node(p[i + 1])

template <class Edge, class M>
class top_down_module;

/// Blueprint of nn::top_down.
template <class S>
struct top_down_spec {
  /// The blueprint of the node between two levels (an upsampling); one is built per level but the
  /// last.
  S node;
  /// Resolves the node where the edge In reaches it; defined for an nn::values edge only.
  template <class Map, class Ctx, class In, class G, std::size_t R>
  struct resolved;
  /// The case of an nn::values edge: its tensors must be of one element type, gradient type and
  /// rank; the node is resolved where one of them reaches it.
  template <class Map, class Ctx, class S0, class... Sigs, class G, std::size_t R>
  struct resolved<Map, Ctx, values<S0, Sigs...>, G, R> {
    static_assert((std::is_same_v<S0, Sigs> && ...),
                  "precis: nn::top_down adds tensors of one element type, gradient type and rank; give "
                  "the nodes before it one storage type in the map, or cast in nn::each");
    /// The nn::top_down_module built.
    using type = top_down_module<values<S0, Sigs...>,
                                 detail::resolve_spec_t<S, Map, Ctx, typename S0::type, typename S0::grad_type, S0::rank>>;
  };
  /// The module this blueprint builds into where the multi-tensor edge In reaches it, under policy
  /// map Map on context Ctx: an nn::top_down_module (see resolved).
  template <class Map, class Ctx, class In, class G, std::size_t R>
  using module_type = typename resolved<Map, Ctx, In, G, R>::type;
};

/// The top-down path of a feature pyramid (a blueprint node): on tensors x[0..n) (finest
/// first), p[n-1] = x[n-1] and p[i] = x[i] + node(p[i + 1]), e.g. with node an upsampling
/// by 2; the sums are added in float and rounded once. One node per level (n - 1 of them).
template <class S>
constexpr top_down_spec<S> top_down(S node) {
  return {node};
}

/// The module nn::top_down builds into.
template <class S0, class... Sigs, class M>
class top_down_module<values<S0, Sigs...>, M> {
  static constexpr std::size_t levels = 1 + sizeof...(Sigs);
  using T = typename S0::type;
  using G = typename S0::grad_type;
  static constexpr std::size_t R = S0::rank;
  static_assert(std::is_same_v<typename M::output_type, T> && std::is_same_v<typename M::output_grad_type, G> &&
                    M::output_rank == R,
                "precis: the node of nn::top_down must give the type and rank it reads (an upsampling)");

 public:
  /// The context its kernels run on: the node's.
  using context_type = typename M::context_type;
  /// The multi-tensor edge forward() reads: the n levels x, finest first, all of one nn::sig.
  using input_type = values<S0, Sigs...>;
  /// The gradient backward() returns: the same edge, the gradients of x.
  using input_grad_type = input_type;
  /// The multi-tensor edge forward() gives: the levels p, of the types and shapes of x.
  using output_type = input_type;
  /// The gradient backward() reads: the same edge, the gradients of p.
  using output_grad_type = input_type;
  /// 0: the input is a multi-tensor edge.
  static constexpr std::size_t input_rank = 0;
  /// 0: the output is a multi-tensor edge.
  static constexpr std::size_t output_rank = 0;
  /// One level's tensor.
  using tensor = tensor_t<context_type, T, R>;
  /// One level's gradient.
  using grad_tensor = tensor_t<context_type, G, R>;

  /// Builds the n - 1 nodes (n levels) from `s.node`.
  template <class S>
  explicit top_down_module(const top_down_spec<S>& s) : top_down_module(s.node, std::make_index_sequence<levels - 1>{}) {}

  /// "": a top-down path is named by its position in paths.
  std::string_view name() const { return ""; }
  /// `in` itself, once checked: node i must turn level i + 1's shape into level i's. Throws
  /// precis::error naming both levels and their shapes where it does not, or where node i cannot
  /// take the shape.
  edge_shape_t<input_type, 0> output_shape(const edge_shape_t<input_type, 0>& in,
                                           std::string_view path, mode m = mode::eval) const {
    const auto shapes = to_array(in);
    for (std::size_t i = 0; i + 1 < levels; ++i) {
      const auto up =
          detail::output_shape_in(nodes_[i], shapes[i + 1], join_path(path, std::to_string(i)), m);
      if (up != shapes[i]) {
        throw error("precis::nn::top_down at " + path_or_root(path) + ": level " + std::to_string(i + 1) + " of shape " +
                    shape_string(shapes[i + 1]) + " becomes " + shape_string(up) + ", but level " + std::to_string(i) +
                    " has shape " + shape_string(shapes[i]));
      }
    }
    return in;
  }
  /// `p[n-1] = x[n-1]` and, from the coarsest level down, `p[i] = x[i] + node_i(p[i+1])`, added in
  /// float (double for double tensors) and rounded once into this module's buffers. Returns a tuple
  /// of pointers to p (`p[n-1]` points to `x[n-1]` itself).
  edge_value_t<context_type, output_type, 0> forward(context_ref_t<context_type> ctx,
                                                     const edge_value_t<context_type, input_type, 0>& x,
                                                     mode m = mode::train) {
    const auto xs = to_array(x);
    std::array<const tensor*, levels> p{};
    p[levels - 1] = xs[levels - 1];
    for (std::size_t i = levels - 1; i-- > 0;) {
      const auto& u = nodes_[i].forward(ctx, *p[i + 1], m);
      ensure(sums_[i], shape_of<R>(*xs[i]));
      context_traits<context_type>::add_rounded(ctx, sums_[i], *xs[i], u);
      p[i] = &sums_[i];
    }
    return from_array<edge_value_t<context_type, output_type, 0>>(p);
  }
  /// The gradients of x from those of p (dy): that of `x[0]` is `dy[0]` itself; from the finest
  /// level up, that of `x[i]` is `dy[i]` plus the input gradient node i - 1 gives for the gradient
  /// of `p[i-1]`, added in float (double for double tensors) and rounded once into this module's
  /// buffers. Returns a tuple of pointers to them.
  edge_grad_t<context_type, input_type, 0> backward(context_ref_t<context_type> ctx,
                                                    const edge_grad_t<context_type, output_type, 0>& dy) {
    const auto ds = to_array(dy);
    std::array<const grad_tensor*, levels> g{};
    g[0] = ds[0];
    for (std::size_t i = 1; i < levels; ++i) {
      const auto& d = nodes_[i - 1].backward(ctx, *g[i - 1]);
      ensure(grads_[i - 1], shape_of<R>(*ds[i]));
      context_traits<context_type>::add_rounded(ctx, grads_[i - 1], *ds[i], d);
      g[i] = &grads_[i - 1];
    }
    return from_array<edge_grad_t<context_type, input_type, 0>>(g);
  }
  /// Bytes of the sums `p[i]` for i < n - 1 and of the gradients of `x[i]` for i > 0.
  std::size_t own_bytes() const {
    std::size_t n = 0;
    for (const auto& t : sums_) n += bytes_of(t);
    for (const auto& t : grads_) n += bytes_of(t);
    return n;
  }
  /// Calls `f("i", node i)` for i = 0 to n-2; node i gives level i's addend.
  template <class Self, class F>
  static void for_each_child(Self& self, F&& f) {
    for (std::size_t i = 0; i + 1 < levels; ++i) f(std::to_string(i), self.nodes_[i]);
  }

 private:
  template <class S, std::size_t... I>
  top_down_module(const S& s, std::index_sequence<I...>) : nodes_{((void)I, M(s))...} {}

  template <class Tuple>
  static auto to_array(const Tuple& t) {
    return std::apply([](const auto&... e) { return std::array{e...}; }, t);
  }
  template <class Tuple, class A>
  static Tuple from_array(const A& a) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) { return Tuple{a[I]...}; }(std::make_index_sequence<levels>{});
  }

  std::array<M, levels - 1> nodes_;
  std::array<tensor, levels - 1> sums_;       // p[i] for i < levels - 1
  std::array<grad_tensor, levels - 1> grads_;  // the gradients of p[i] for i > 0
};

// ---------------------------------------------------------------------------------------
// add_all / concat_all: a multi-tensor edge joined into one tensor

template <join_kind Join, class Edge, class Ctx>
class join_module;

/// Blueprint of nn::add_all and nn::concat_all.
template <join_kind Join>
struct join_spec {
  /// The concatenation axis (nn::concat_all); 0 for the others.
  std::size_t axis = 0;
  /// Whether `axis` is the images' channel axis (nn::channel_axis), which follows the
  /// model's layout: 1 in NCHW, 3 in NHWC.
  bool channels = false;
  /// The module this blueprint builds into where the multi-tensor edge In reaches it, on context
  /// Ctx: an nn::join_module (the map Map is not consulted).
  template <class Map, class Ctx, class In, class G, std::size_t R>
  using module_type = join_module<Join, In, Ctx>;
};

/// The tensors of a multi-tensor edge added into one (a blueprint node).
constexpr join_spec<join_kind::add> add_all() { return {0}; }
/// The tensors of a multi-tensor edge concatenated along `axis` (a blueprint node).
constexpr join_spec<join_kind::concat> concat_all(std::size_t axis) { return {axis}; }
/// The images of a multi-tensor edge concatenated along their channels (a blueprint node):
/// axis 1 of [N, C, H, W], axis 3 of [N, H, W, C] in a model built channels-last.
constexpr join_spec<join_kind::concat> concat_all(channel_axis_t) { return {1, true}; }
/// a - b for the two tensors (a, b) of an edge (a blueprint node): DBNet's P - T, after
/// nn::fork(probability_head, threshold_head).
constexpr join_spec<join_kind::subtract> subtract() { return {0}; }

/// The module nn::add_all, nn::concat_all and nn::subtract build into. Differences, like
/// sums, are taken in float (double for double tensors) and rounded once.
template <join_kind Join, class S0, class... Sigs, class Ctx>
class join_module<Join, values<S0, Sigs...>, Ctx> {
  static_assert((std::is_same_v<S0, Sigs> && ...),
                "precis: nn::add_all, nn::concat_all and nn::subtract join tensors of one element type, "
                "gradient type and rank; give the nodes before it one storage type in the map, or cast in "
                "nn::each");
  static_assert(Join != join_kind::subtract || sizeof...(Sigs) == 1,
                "precis: nn::subtract reads an edge of two tensors (a, b) and gives a - b");
  static constexpr std::size_t count = 1 + sizeof...(Sigs);
  using T = typename S0::type;
  using G = typename S0::grad_type;
  static constexpr std::size_t R = S0::rank;

 public:
  /// The context its kernels run on.
  using context_type = Ctx;
  /// The multi-tensor edge forward() reads: tensors all of one nn::sig.
  using input_type = values<S0, Sigs...>;
  /// The gradient backward() returns: the same edge, one gradient per tensor.
  using input_grad_type = input_type;
  /// Element type forward() returns: the tensors' element type.
  using output_type = T;
  /// Element type of the gradient backward() reads: the tensors' gradient type.
  using output_grad_type = G;
  /// 0: the input is a multi-tensor edge.
  static constexpr std::size_t input_rank = 0;
  /// Rank of the output: the tensors' rank.
  static constexpr std::size_t output_rank = R;

  /// Keeps the axis of `s`; throws precis::error where it is not below the tensors' rank.
  explicit join_module(const join_spec<Join>& s) : axis_(s.axis), channels_(s.channels) {
    if (axis_ >= R) {
      throw error("precis::nn::concat_all: axis " + std::to_string(axis_) + " is out of range for tensors of rank " +
                  std::to_string(R));
    }
    if (channels_ && R != 4) {
      throw error("precis::nn::concat_all: nn::channel_axis is an axis of images ([N, C, H, W] or [N, H, W, C]); "
                  "these tensors have rank " + std::to_string(R));
    }
  }
  /// Follows the model's image layout (nn::build calls it with build_options::layout) where
  /// the axis is nn::channel_axis: axis 3 for [N, H, W, C].
  void set_layout(image_layout layout, std::string_view) {
    if (channels_) axis_ = layout == image_layout::nhwc ? 3 : 1;
  }

  /// "": a join is named by its position in paths.
  std::string_view name() const { return ""; }
  /// The joined shape for the edge's shapes `in`: their common shape for nn::add_all and
  /// nn::subtract; for nn::concat_all, their shape with the extents along the axis summed. Throws
  /// precis::error naming `path` and two shapes where they cannot be joined so.
  shape_t<R> output_shape(const edge_shape_t<input_type, 0>& in, std::string_view path) const {
    const auto shapes = std::apply([](const auto&... s) { return std::array{s...}; }, in);
    shape_t<R> out = shapes[0];
    for (std::size_t i = 1; i < count; ++i) {
      for (std::size_t a = 0; a < R; ++a) {
        if (shapes[i][a] != out[a] && !(Join == join_kind::concat && a == axis_)) {
          throw error("precis::nn: the tensors joined at " + path_or_root(path) + " have shapes " +
                      shape_string(shapes[0]) + " and " + shape_string(shapes[i]) +
                      (Join == join_kind::add        ? ", which cannot be added"
                       : Join == join_kind::subtract ? ", which cannot be subtracted"
                                                     : ", which differ outside the concatenation axis"));
        }
      }
      if constexpr (Join == join_kind::concat) out[axis_] += shapes[i][axis_];
    }
    return out;
  }
  /// Joins the tensors of x into this module's buffer and returns it: added in float (double for
  /// double tensors) and rounded once (nn::add_all), a - b likewise (nn::subtract), or copied side
  /// by side along the axis (nn::concat_all). Checks the shapes first and throws as output_shape()
  /// does.
  const tensor_t<Ctx, T, R>& forward(context_ref_t<Ctx> ctx, const edge_value_t<Ctx, input_type, 0>& x, mode = mode::train) {
    const auto shape = output_shape(detail::edge_shape_of<0>(x), "");
    ensure(y_, shape);
    if constexpr (Join == join_kind::add) {
      std::apply([&](auto... t) { context_traits<Ctx>::add_rounded(ctx, y_, *t...); }, x);
    } else if constexpr (Join == join_kind::subtract) {
      context_traits<Ctx>::subtract_rounded(ctx, y_, *std::get<0>(x), *std::get<1>(x));
    } else {
      std::size_t offset = 0, i = 0;
      std::apply([&](auto... t) { ((widths_[i++] = std::size_t(t->shape()[axis_])), ...); }, x);
      std::apply([&](auto... t) { (copy_part(ctx, *t, offset), ...); }, x);
    }
    return y_;
  }
  /// The gradients of the edge's tensors for dy: dy itself for each (nn::add_all); dy and -dy, the
  /// negation exact (nn::subtract); each tensor's part of dy along the axis (nn::concat_all).
  /// Returns a tuple of pointers to them; negated and sliced gradients are in this module's
  /// buffers.
  edge_grad_t<Ctx, input_type, 0> backward(context_ref_t<Ctx> ctx, const tensor_t<Ctx, G, R>& dy) {
    if constexpr (Join == join_kind::add) {
      // Every input's gradient is dy itself.
      return [&]<std::size_t... I>(std::index_sequence<I...>) {
        return edge_grad_t<Ctx, input_type, 0>{((void)I, &dy)...};
      }(std::make_index_sequence<count>{});
    } else if constexpr (Join == join_kind::subtract) {
      // da = dy, db = -dy (negation is exact in every format).
      ensure(parts_[1], shape_of<R>(dy));
      context_traits<Ctx>::negate(ctx, dy, parts_[1]);
      return edge_grad_t<Ctx, input_type, 0>{&dy, &parts_[1]};
    } else {
      std::size_t offset = 0;
      for (std::size_t i = 0; i < count; ++i) {
        shape_t<R> s = shape_of<R>(dy);
        s[axis_] = widths_[i];
        ensure(parts_[i], s);
        const auto d = detail::split_at<R>(s, axis_);
        context_traits<Ctx>::copy_rows("precis::nn::concat_all", ctx, dy.data() + offset * d[2], parts_[i].data(),
                                       detail::concat_part_plan(d, std::size_t(dy.shape()[axis_]), true));
        offset += widths_[i];
      }
      return [&]<std::size_t... I>(std::index_sequence<I...>) {
        return edge_grad_t<Ctx, input_type, 0>{&parts_[I]...};
      }(std::make_index_sequence<count>{});
    }
  }
  /// Bytes of the output and of the gradient buffers (nn::subtract and nn::concat_all).
  std::size_t own_bytes() const {
    std::size_t n = bytes_of(y_);
    for (const auto& p : parts_) n += bytes_of(p);
    return n;
  }

 private:
  void copy_part(context_ref_t<Ctx> ctx, const tensor_t<Ctx, T, R>& part, std::size_t& offset) {
    const auto d = detail::split_at<R>(shape_of<R>(part), axis_);
    context_traits<Ctx>::copy_rows("precis::nn::concat_all", ctx, part.data(), y_.data() + offset * d[2],
                                   detail::concat_part_plan(d, std::size_t(y_.shape()[axis_]), false));
    offset += d[1];
  }

  std::size_t axis_;
  bool channels_;
  tensor_t<Ctx, T, R> y_;
  std::array<tensor_t<Ctx, G, R>, count> parts_;
  std::array<std::size_t, count> widths_{};
};

}  // namespace precis::nn
