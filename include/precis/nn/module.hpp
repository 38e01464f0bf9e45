/// @file
/// What every built layer and combinator (a *module*) provides, and the pieces they share.
///
/// A module is the concrete, typed form of one node of a blueprint (see nn/build.hpp). It
/// names its element types and ranks:
///
///     input_type, input_grad_type, input_rank      what forward() reads, backward() returns
///     output_type, output_grad_type, output_rank   what forward() returns, backward() reads
///     context_type                                 the context its kernels run on
///
/// and offers (tensor: tensor_t<context_type, ...>; an edge of several tensors, nn::values,
/// passes a tuple of pointers instead, see nn/multi.hpp)
///
///     forward(context_ref_t<context_type>, const tensor<input_type, input_rank>&, mode)
///         -> const tensor<output_type, output_rank>&
///     backward(context_ref_t<context_type>, const tensor<output_grad_type, output_rank>&)
///         -> const tensor<input_grad_type, input_rank>&
///     backward_parameters(ctx, dy) (optional)   backward() without the input gradient
///     output_shape(const shape_t<input_rank>&, std::string_view path) const -> shape_t<output_rank>
///     output_shape(in, path, mode) (optional)   the same, with that mode's rules as well
///         (composites pass the mode to their children; batch norm refuses one value per
///         channel in training): nn::model::forward checks every layer so before any runs
///     std::string_view name() const          its component of a path ("": its position)
///     std::size_t own_bytes() const          bytes of the buffers it holds itself
///
/// Layers (leaves) also name their tag (`tag_type`), the resolved policy (`policy_type`),
/// `kind` and `shape()` for describe, their parameters through the static
/// `for_each_parameter(self, f)` (which nn::model saves in checkpoints, under their names),
/// `decays(name)` for weight decay, `reset(seed)`, and `visit_state` / `validate` for any
/// checkpoint state other than parameters. nn::build checks a layer's constructor from its
/// blueprint node, forward, backward, output_shape, own_bytes, kind and shape() when it
/// resolves the node (nn::detail::layer_contract), and that its policy_type is the one the
/// map gives its tag, each with a precis: message; a layer of your own:
/// docs/writing-layers.md. Layers that only move data (reshape, cast)
/// have no tag or policy. Combinators expose their children through
/// `for_each_child(self, f)`; nn::walk visits a whole model with each node's path.
///
/// For precis::diagnostics a layer also offers the static `for_each_observed(self, f)`,
/// calling f(piece, std::type_identity<Tag>{}, input, output, input_grads...) with the
/// buffers of its last forward and backward passes (empty tensors before them; `input` is a
/// pointer to what the last forward pass read, null before one): piece "" and its own
/// tag for most layers, one call per product for nn::attention ("qkv", "scores", ... with
/// their tags). The monitor reads them after a step; nothing is copied or computed for it.
///
/// Buffers: a module owns its outputs and its input gradient and keeps the address of its
/// last input for the backward pass, so the input must stay alive and unchanged until
/// backward() (the enclosing model arranges that).
///
/// A module may also name, through the static `for_each_gradient_buffer(self, f)`, the
/// buffers that only its backward pass writes and that nothing reads once the module before
/// it has read its input gradient: the input gradient itself, and the intermediate gradients
/// and parameter-gradient products of the pass (not the parameters' gradients, not what the
/// forward pass keeps). nn::repeat lends such buffers from block to block (see
/// repeat_block), so that N blocks of one type hold two sets of them instead of N.
#pragma once

/// Defined by this header, which every nn layer header includes: lets precis/nn/cuda.hpp
/// check that it comes first (see there).
#define PRECIS_NN_INCLUDED 1

#include <precis/kernels/context.hpp>
#include <precis/nn/parameter.hpp>
#include <precis/policy/describe.hpp>
#include <precis/policy/layer.hpp>
#include <precis/tensor/host_tensor.hpp>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace precis::nn {

/// A shape of rank N.
template <std::size_t N>
using shape_t = std::array<std::size_t, N>;

/// Whether a linear or convolution layer adds a bias.
enum class bias_mode { with_bias, no_bias };
/// The layer adds a bias (`nn::linear(64, 10, nn::with_bias)`).
inline constexpr bias_mode with_bias = bias_mode::with_bias;
/// The layer adds no bias (`nn::linear(64, 10, nn::no_bias)`).
inline constexpr bias_mode no_bias = bias_mode::no_bias;

/// One tensor of a multi-tensor edge: element type T, gradient type G, rank R.
template <class T, class G, std::size_t R>
struct sig {
  /// Element type of the tensor.
  using type = T;
  /// Element type of its gradient.
  using grad_type = G;
  /// Rank of the tensor.
  static constexpr std::size_t rank = R;
};

/// Several tensors on one edge: what a node with several outputs gives (nn::fork,
/// nn::taps) and a node with several inputs reads (nn::each, nn::top_down, nn::add_all,
/// nn::concat_all). A module names such an edge with this type as both its value and its
/// gradient type, and rank 0.
template <class... Sigs>
struct values {};

/// True for nn::values<...>.
template <class T>
inline constexpr bool is_values_v = false;
/// nn::values<...> is a multi-tensor edge.
template <class... S>
inline constexpr bool is_values_v<values<S...>> = true;

namespace detail {
template <class Ctx, class T, std::size_t R>
struct edge_types {
  using value = tensor_t<Ctx, T, R>;
  using grad = value;
  using shape = shape_t<R>;
};
template <class Ctx, class... S>
struct edge_types<Ctx, values<S...>, 0> {
  using value = std::tuple<const tensor_t<Ctx, typename S::type, S::rank>*...>;
  using grad = std::tuple<const tensor_t<Ctx, typename S::grad_type, S::rank>*...>;
  using shape = std::tuple<shape_t<S::rank>...>;
};
}  // namespace detail

/// What an edge of element type T (or nn::values) and rank R passes forward: a tensor, or a
/// tuple of pointers to the tensors of a multi-tensor edge.
template <class Ctx, class T, std::size_t R>
using edge_value_t = typename detail::edge_types<Ctx, T, R>::value;
/// What it passes backward for gradient type G: a tensor, or a tuple of pointers to them.
template <class Ctx, class G, std::size_t R>
using edge_grad_t = std::conditional_t<is_values_v<G>, typename detail::edge_types<Ctx, G, R>::grad,
                                       tensor_t<Ctx, G, R>>;
/// The shape of such an edge: an array, or a tuple of arrays.
template <class T, std::size_t R>
using edge_shape_t = typename detail::edge_types<cpu_context, T, R>::shape;

namespace detail {
template <class A, class E>
struct binds_edge : std::is_same<A, E> {};
template <class... A, class... B>
struct binds_edge<std::tuple<A*...>, std::tuple<const B*...>>
    : std::is_same<std::tuple<std::remove_const_t<A>...>, std::tuple<B...>> {};
}  // namespace detail

/// Whether an argument of type A reaches a parameter `const E&` (E an edge's tensor, or
/// tuple of pointers to tensors) without a tensor being copied: A is E, or a tuple of
/// pointers to E's tensors, const or not. Anything else would reach it through a converting
/// constructor (xtensor's take other element types, ranks and expressions), as a temporary
/// copy that a layer's saved address would outlive, or as a conversion that fails at run
/// time; the model's and the trainer's entry points refuse it at compile time.
template <class A, class E>
inline constexpr bool binds_edge_v = detail::binds_edge<std::remove_cvref_t<A>, E>::value;

/// The layer tags nn's blueprint functions use when given none: a map can override them by
/// operation kind, not one by one. Their layers are named by position in paths.
namespace tags {
/// Base of the default tags.
template <op_kind Op>
struct positional_tag : precis::layer<Op> {
  /// Marks the tag's layers as named by their position in paths (nn::positional_tag_v).
  static constexpr bool positional = true;
};
/// Default tag of nn::linear (op::matmul).
struct linear : positional_tag<op::matmul> {
  /// The name describe prints for the tag.
  static constexpr std::string_view name = "linear";
};
/// Default tag of nn::conv2d (op::conv).
struct conv2d : positional_tag<op::conv> {
  /// The name describe prints for the tag.
  static constexpr std::string_view name = "conv2d";
};
/// Default tag of nn::conv_transpose2d (op::conv).
struct conv_transpose2d : positional_tag<op::conv> {
  /// The name describe prints for the tag.
  static constexpr std::string_view name = "conv_transpose2d";
};
/// Default tag of nn::relu (op::elementwise).
struct relu : positional_tag<op::elementwise> {
  /// The name describe prints for the tag.
  static constexpr std::string_view name = "relu";
};
/// Default tag of nn::gelu (op::elementwise).
struct gelu : positional_tag<op::elementwise> {
  /// The name describe prints for the tag.
  static constexpr std::string_view name = "gelu";
};
/// Default tag of nn::sigmoid (op::elementwise).
struct sigmoid : positional_tag<op::elementwise> {
  /// The name describe prints for the tag.
  static constexpr std::string_view name = "sigmoid";
};
/// Default tag of nn::tanh (op::elementwise).
struct tanh : positional_tag<op::elementwise> {
  /// The name describe prints for the tag.
  static constexpr std::string_view name = "tanh";
};
/// Default tag of nn::dropout (op::elementwise).
struct dropout : positional_tag<op::elementwise> {
  /// The name describe prints for the tag.
  static constexpr std::string_view name = "dropout";
};
/// Default tag of nn::scale (op::elementwise).
struct scale : positional_tag<op::elementwise> {
  /// The name describe prints for the tag.
  static constexpr std::string_view name = "scale";
};
/// Default tag of nn::layer_norm (op::layer_norm).
struct layer_norm : positional_tag<op::layer_norm> {
  /// The name describe prints for the tag.
  static constexpr std::string_view name = "layer_norm";
};
/// Default tag of nn::batch_norm (op::batch_norm).
struct batch_norm : positional_tag<op::batch_norm> {
  /// The name describe prints for the tag.
  static constexpr std::string_view name = "batch_norm";
};
/// Default tag of nn::max_pool2d (op::pooling).
struct max_pool2d : positional_tag<op::pooling> {
  /// The name describe prints for the tag.
  static constexpr std::string_view name = "max_pool2d";
};
/// Default tag of nn::avg_pool2d (op::pooling).
struct avg_pool2d : positional_tag<op::pooling> {
  /// The name describe prints for the tag.
  static constexpr std::string_view name = "avg_pool2d";
};
/// Default tag of nn::global_avg_pool (op::reduction).
struct global_avg_pool : positional_tag<op::reduction> {
  /// The name describe prints for the tag.
  static constexpr std::string_view name = "global_avg_pool";
};
/// Default tag of nn::upsample_nearest and nn::upsample_bilinear (op::pooling).
struct upsample : positional_tag<op::pooling> {
  /// The name describe prints for the tag.
  static constexpr std::string_view name = "upsample";
};
/// Default tag of nn::softmax (op::softmax).
struct softmax : positional_tag<op::softmax> {
  /// The name describe prints for the tag.
  static constexpr std::string_view name = "softmax";
};
/// Default tag of nn::class_token and nn::position_embedding (op::elementwise).
struct embedding : positional_tag<op::elementwise> {
  /// The name describe prints for the tag.
  static constexpr std::string_view name = "embedding";
};
/// A tag for a loss (op::loss), as nn::softmax_cross_entropy_for takes one.
struct loss : positional_tag<op::loss> {
  /// The name describe prints for the tag.
  static constexpr std::string_view name = "loss";
};
}  // namespace tags

/// True for the tags in nn::tags, whose layers are named by their position.
template <class Tag>
inline constexpr bool positional_tag_v = requires { requires Tag::positional; };

/// The name a tag gives its layer in paths: "" for nn::tags (the position is used), the
/// tag's `name`, or its type's name without namespaces.
template <Layer Tag>
constexpr std::string_view path_name() {
  if constexpr (positional_tag_v<Tag>) {
    return "";
  } else if constexpr (requires { std::string_view(Tag::name); }) {
    return Tag::name;
  } else {
    constexpr std::string_view full = precis::detail::type_name<Tag>();
    constexpr auto colon = full.rfind("::");
    return colon == std::string_view::npos ? full : full.substr(colon + 2);
  }
}

/// "a.b" from "a" and "b"; either may be empty.
inline std::string join_path(std::string_view a, std::string_view b) {
  if (a.empty()) return std::string(b);
  if (b.empty()) return std::string(a);
  return std::string(a) + "." + std::string(b);
}

/// A model's path as describe and errors print it: "(model)" for the root.
inline std::string path_or_root(std::string_view path) {
  return path.empty() ? std::string("(model)") : std::string(path);
}

namespace detail {

/// A visitor that accepts any child: what `composite` asks for_each_child to take. A named
/// type, not a lambda: nvcc's device pass judges a requires-expression holding a lambda
/// false, so a model walked through it would give kernels launched only from the walk
/// (refresh's casts) no device code, and their launches would fail on the GPU.
struct any_child {
  template <class Child>
  void operator()(std::string_view, Child&) const {}
};

}  // namespace detail

/// True for modules with children (combinators).
template <class M>
concept composite = requires(M& m) {
  M::for_each_child(m, detail::any_child{});
};

/// Calls f(path, node) for `node` and, depth first, every module below it. `Self` may be
/// const: one walker serves both.
template <class Self, class F>
void walk(Self& node, const std::string& path, F&& f) {
  f(path, node);
  if constexpr (composite<std::remove_const_t<Self>>) {
    std::remove_const_t<Self>::for_each_child(node, [&](std::string_view component, auto& child) {
      walk(child, join_path(path, component), f);
    });
  }
}

/// True for modules with parameters or state of their own (layers).
template <class M>
concept leaf = requires { typename M::tag_type; };

/// True for leaves that run under a policy (layers that only move or cast data have none).
template <class M>
concept has_policy = leaf<M> && requires { typename M::policy_type; };

/// Backpropagates dy through module m into its parameters' gradients without the gradient
/// with respect to m's input, where m can leave it out (its `backward_parameters`); other
/// modules run backward() and their input gradient is dropped. nn::model's
/// backward_parameters starts it at the root: the layers that read the model's input
/// compute no input gradient. Their input-gradient buffer is left empty, so precis::diagnostics
/// sees no values there rather than stale ones.
template <class M, class Ctx, class D>
void backward_parameters(M& m, Ctx&& ctx, const D& dy) {
  if constexpr (requires { m.backward_parameters(ctx, dy); }) {
    m.backward_parameters(ctx, dy);
  } else {
    (void)m.backward(ctx, dy);
  }
}

namespace detail {

/// A visitor that accepts any buffer (see `any_child`: a named type for requires-expressions).
struct any_buffer {
  template <class T>
  void operator()(T&) const {}
};

/// One gradient buffer of a module, its type erased: two modules of one type exchange theirs
/// pairwise, or a module frees one (nn::repeat's blocks).
struct gradient_buffer {
  void* tensor;
  void (*exchange)(void*, void*);
  void (*release)(void*);
};

/// How many times a layer's device buffer (its outputs, saved tensors, a float8 layer's
/// quantised copies, a loss's scratch) took another shape (a batch of another size),
/// reallocated or within its memory, or was freed (a lent gradient buffer released,
/// gradient_buffer::release), and how many times a model's keep_gradient_buffers setting
/// changed (which buffers its next pass holds): a captured CUDA graph holds the old addresses
/// and sizes, so nn::trainer replays none captured before the count last changed.
inline std::atomic<std::uint64_t> device_reallocations{0};

template <class T>
gradient_buffer gradient_buffer_of(T& t) {
  return {&t,
          [](void* a, void* b) {
            using std::swap;
            swap(*static_cast<T*>(a), *static_cast<T*>(b));
          },
          [](void* a) {
            T& held = *static_cast<T*>(a);
            if constexpr (requires { held.capacity(); }) {
              // A device buffer freed: a graph captured while it was there would write into it.
              if (held.capacity() != 0) device_reallocations.fetch_add(1, std::memory_order_relaxed);
            }
            T empty;
            using std::swap;
            swap(held, empty);
          }};
}

}  // namespace detail

/// The gradient buffers of module m and every module below it, in walk order: what each
/// module's optional static `for_each_gradient_buffer(self, f)` names (see the file comment).
/// Two modules of one type give lists of one length and order.
template <class M>
std::vector<detail::gradient_buffer> gradient_buffers(M& m) {
  std::vector<detail::gradient_buffer> out;
  walk(m, std::string(), [&](const std::string&, auto& node) {
    using N = std::remove_cvref_t<decltype(node)>;
    if constexpr (requires { N::for_each_gradient_buffer(node, detail::any_buffer{}); }) {
      N::for_each_gradient_buffer(node, [&](auto& t) { out.push_back(detail::gradient_buffer_of(t)); });
    }
  });
  return out;
}

/// Calls f(name, parameter) for each parameter of a leaf (none for other modules).
template <class Self, class F>
void for_each_parameter_of(Self& node, F&& f) {
  if constexpr (requires { std::remove_const_t<Self>::for_each_parameter(node, f); }) {
    std::remove_const_t<Self>::for_each_parameter(node, f);
  }
}

/// @name Writing a layer
/// The pieces nn's own layers are written with, for a layer of your own
/// (docs/writing-layers.md).
/// @{

/// The address of the input a layer saw in its last forward pass, for its backward pass
/// (the module before it owns the tensor, and the caller of nn::model::forward keeps the
/// model's input alive until backward()). A copied layer has seen no input.
///
///     nn::saved<tensor<S>> x_;
///     x_.set(x);                        // in forward()
///     const auto& x = x_.get(kind);     // in backward(): throws without a forward pass
template <class Tensor>
class saved {
 public:
  /// Nothing seen yet.
  saved() = default;
  /// A copy has seen nothing: the address belongs to the original's last pass.
  saved(const saved&) {}
  /// Forgets the address, as the copy constructor does.
  saved& operator=(const saved&) {
    p_ = nullptr;
    return *this;
  }
  ~saved() = default;
  /// Keeps the address of x (forward()).
  void set(const Tensor& x) { p_ = &x; }
  /// The input, or null before the first forward pass.
  const Tensor* peek() const { return p_; }
  /// The input; throws precis::error naming `layer` (the layer's kind) before any forward
  /// pass.
  const Tensor& get(std::string_view layer) const {
    if (p_ == nullptr) {
      throw error("precis::nn: backward() of " + std::string(layer) +
                  " called without a forward() since the layer was made or copied");
    }
    return *p_;
  }

 private:
  const Tensor* p_ = nullptr;
};

/// The shape of a tensor as an array of its rank.
template <std::size_t N, class X>
shape_t<N> shape_of(const X& x) {
  shape_t<N> s{};
  for (std::size_t i = 0; i < N; ++i) s[i] = std::size_t(x.shape()[i]);
  return s;
}

/// Resizes `t` to `shape` unless it already has it (buffers are reused across steps). A
/// device tensor keeps its memory where it holds the new shape (device_tensor::fit: a
/// smaller last batch, and the full ones after it, allocate nothing), else is made again as
/// Tensor(shape, make...) (a stream after the shape: memory in that stream's order); either
/// way the change is counted in detail::device_reallocations (so that nn::trainer's CUDA
/// graphs are captured again). A layer sizes every buffer it owns through it.
template <class Tensor, std::size_t N, class... Make>
void ensure(Tensor& t, const shape_t<N>& shape, const Make&... make) {
  bool same = true;
  for (std::size_t i = 0; i < N; ++i) same = same && std::size_t(t.shape()[i]) == shape[i];
  if (same) return;
  if constexpr (requires { t.resize(shape); }) {
    t.resize(shape);
  } else {
    // Counted first, so that an allocation that fails (inside a CUDA graph's capture, say)
    // is counted too.
    detail::device_reallocations.fetch_add(1, std::memory_order_relaxed);
    std::size_t n = 1;
    for (const std::size_t e : shape) n *= e;
    if constexpr (requires { t.fit(shape); }) {
      if (n <= t.capacity()) {
        (void)t.fit(shape);
      } else {
        t = Tensor(shape, make...);  // a first allocation, or a larger one: in make's stream
      }
    } else {
      t = Tensor(shape, make...);
    }
  }
}

namespace detail {
/// A layer's archive seen by a float8 recipe: each field under `prefix`.
template <class Archive>
struct prefixed_archive {
  Archive& a;
  const std::string& prefix;
  template <class V>
  void field(std::string_view n, V& v) {
    a.field(prefix + std::string(n), v);
  }
  void floats(std::string_view n, std::vector<float>& v) { a.floats(prefix + std::string(n), v); }
};
/// Visits a float8 recipe's checkpoint fields (its visit_state) under `prefix` in a layer's
/// archive `a` (the host's and the device's float8 linear layers: "fp8.input." and so on).
template <class Archive, class Recipe>
void visit_recipe(Archive& a, const std::string& prefix, Recipe& r) {
  prefixed_archive<Archive> p{a, prefix};
  r.visit_state(p);
}
}  // namespace detail

/// Throws the error a layer gives for a shape it cannot take: "precis::nn: layer <path>
/// (<layer>) expects an input of shape <expected>, got <got>".
[[noreturn]] inline void bad_shape(std::string_view path, std::string_view layer, std::string_view expected,
                                   const std::string& got) {
  throw error("precis::nn: layer " + path_or_root(path) + " (" + std::string(layer) + ") expects an input of shape " +
              std::string(expected) + ", got " + got);
}

/// Bytes a buffer holds: its memory (a device tensor's capacity, which a smaller batch
/// keeps), else its elements'.
template <class Tensor>
std::size_t bytes_of(const Tensor& t) {
  if constexpr (requires { t.capacity(); }) {
    return t.capacity() * sizeof(*t.data());
  } else {
    return t.size() * sizeof(*t.data());
  }
}

/// @}

namespace detail {

/// node's output shape for an input of shape `in` under mode m: node.output_shape(in, path, m)
/// where the node takes a mode (see the file comment), else node.output_shape(in, path).
template <class Node, class Shape>
auto output_shape_in(const Node& node, const Shape& in, std::string_view path, mode m) {
  if constexpr (requires { node.output_shape(in, path, m); }) {
    return node.output_shape(in, path, m);
  } else {
    return node.output_shape(in, path);
  }
}

/// The shape of what an edge passes: a tensor's shape, or the tuple of shapes of a
/// multi-tensor edge's tensors.
template <class X>
inline constexpr std::size_t rank_of_v = std::tuple_size_v<std::remove_cvref_t<decltype(std::declval<const X&>().shape())>>;

template <std::size_t N, class X>
auto edge_shape_of(const X& x) {
  if constexpr (requires { std::tuple_size<X>::value; }) {
    return std::apply([](const auto*... t) { return std::tuple{shape_of<rank_of_v<std::remove_cvref_t<decltype(*t)>>>(*t)...}; }, x);
  } else {
    return shape_of<N>(x);
  }
}

/// "[2, 3]" for a shape, "([2, 3], [2, 5])" for the shapes of a multi-tensor edge.
template <class S>
std::string edge_shape_string(const S& s) {
  if constexpr (requires { std::tuple_size<S>::value; } && !requires { s.size(); }) {
    std::string out = "(";
    std::apply([&](const auto&... e) { ((out += (out.size() > 1 ? ", " : "") + shape_string(e)), ...); }, s);
    return out + ")";
  } else {
    return shape_string(s);
  }
}


/// Elements of a shape.
template <std::size_t N>
std::size_t elements(const shape_t<N>& s) {
  std::size_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

/// The seed of the parameters at `path` in a model built with `seed`: every layer draws its
/// own values, and repeated blocks differ.
inline std::uint64_t seed_for(std::uint64_t seed, std::string_view path) {
  std::uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a over the path, then mixed with the seed
  for (char c : path) h = (h ^ std::uint8_t(c)) * 0x100000001b3ULL;
  return mix64(seed ^ mix64(h));
}

}  // namespace detail

}  // namespace precis::nn

namespace precis::nn {

/// True when policy P puts float8 in a layer's matrix products (presets::fp8_hybrid): its
/// storage or gradient type is a float8 format.
template <Policy P>
inline constexpr bool float8_products_v = is_float8_v<typename P::storage_type> || is_float8_v<typename P::gradient_type>;

/// The type a layer under P keeps its activations in between layers: P's storage type, or
/// its compute type where the storage type is float8 (float8 lives inside the products).
template <Policy P>
using activation_type_t =
    std::conditional_t<is_float8_v<typename P::storage_type>, typename P::compute_type, typename P::storage_type>;
/// The type a layer under P passes activation gradients in: P's gradient type, or its
/// compute type where the gradient type is float8.
template <Policy P>
using activation_grad_type_t =
    std::conditional_t<is_float8_v<typename P::gradient_type>, typename P::compute_type, typename P::gradient_type>;

/// The types a layer (a leaf module) under the resolved policy P names; Tag is its layer
/// tag and must be of the operation kind `Op` the layer performs. Activations are stored
/// in P's storage type, activation gradients in its gradient type; statistics (norm means
/// and variances) in float, or double under a double policy. A layer whose products take
/// float8 inputs (`Float8Products`: nn::linear and the projections of nn::attention) may
/// run under a float8 policy: it then passes activations and gradients in P's compute
/// type and quantises inside (see activation_type_t); other layers refuse one.
template <Layer Tag, Policy P, op_kind Op, std::size_t InRank, std::size_t OutRank, class Ctx,
          bool Float8Products = false>
struct layer_base {
  static_assert(std::is_same_v<typename Tag::op, Op>,
                "precis: a layer's tag must be of the operation kind the layer performs "
                "(precis::layer<op::matmul> for linear and attention products, op::conv for "
                "convolutions, op::elementwise for activations, ...); see nn::tags");
  static_assert(Float8Products || !float8_products_v<P>,
                "precis: only nn::linear and the projections of nn::attention take float8 inputs "
                "in their products; give this layer a bfloat16 or float16 policy in the map");
  /// The layer tag: the key of its policy in the map, and its name in paths (nn::path_name).
  using tag_type = Tag;
  /// The policy the layer runs under, resolved by the rule set for its operation kind.
  using policy_type = P;
  /// The operation kind the layer performs (op::matmul, op::conv, ...).
  using operation = Op;
  /// The context its kernels run on.
  using context_type = Ctx;
  /// Element type of the input forward() reads (see nn::activation_type_t).
  using input_type = activation_type_t<P>;
  /// Element type of the output forward() returns.
  using output_type = activation_type_t<P>;
  /// Element type of the input gradient backward() returns (see nn::activation_grad_type_t).
  using input_grad_type = activation_grad_type_t<P>;
  /// Element type of the output gradient backward() reads.
  using output_grad_type = activation_grad_type_t<P>;
  /// Element type of its master weights and parameter gradients (P's master type).
  using master_type = typename P::master_type;
  /// Element type of its statistics (norm means and variances): double under a double
  /// master type, float otherwise.
  using statistics_type = std::conditional_t<std::is_same_v<master_type, double>, double, float>;
  /// Rank of the input.
  static constexpr std::size_t input_rank = InRank;
  /// Rank of the output.
  static constexpr std::size_t output_rank = OutRank;
  /// A rank-N tensor of T on its context.
  template <class T, std::size_t N>
  using tensor = tensor_t<Ctx, T, N>;

  /// Its component of a path: the tag's name, "" for nn::tags (see nn::path_name).
  std::string_view name() const { return path_name<Tag>(); }
  /// Draws the parameters (and random state) from `seed`; nothing for most layers.
  void reset(std::uint64_t) {}
  /// Saves or loads its checkpoint fields other than its parameters under `prefix` (nn::model
  /// saves those itself, from for_each_parameter); none here. A layer with other state
  /// (running statistics, a random stream) defines its own.
  template <class Archive>
  void visit_state(Archive&, const std::string&) {}
  /// What went wrong loading those fields ("" when nothing; always "" here).
  std::string validate() const { return {}; }
};

/// The types of a layer that only moves data (reshape, permute, identity): it takes and
/// gives T, with gradients G, whatever the policy; no tag decides its precision.
template <class T, class G, std::size_t InRank, std::size_t OutRank, class Ctx>
struct data_layer_base {
  /// The context its kernels run on.
  using context_type = Ctx;
  /// Element type of the input forward() reads.
  using input_type = T;
  /// Element type of the output forward() returns: the input's.
  using output_type = T;
  /// Element type of the input gradient backward() returns.
  using input_grad_type = G;
  /// Element type of the output gradient backward() reads: the input gradient's.
  using output_grad_type = G;
  /// Rank of the input.
  static constexpr std::size_t input_rank = InRank;
  /// Rank of the output.
  static constexpr std::size_t output_rank = OutRank;
  /// A rank-N tensor of U on its context.
  template <class U, std::size_t N>
  using tensor = tensor_t<Ctx, U, N>;
  /// Its component of a path: "" (named by its position).
  std::string_view name() const { return ""; }
};

namespace detail {

/// Saves or loads the parameters of a leaf under `prefix`.
template <class Archive, class Leaf>
void visit_parameters(Archive& a, const std::string& prefix, Leaf& l) {
  for_each_parameter_of(l, [&](std::string_view name, auto& p) { p.visit_state(a, prefix + std::string(name)); });
}

/// What went wrong loading a leaf's parameters ("" when nothing).
template <class Leaf>
std::string parameter_problems(const Leaf& l) {
  std::string out;
  for_each_parameter_of(l, [&](std::string_view, const auto& p) {
    if (!p.problem().empty()) out += (out.empty() ? "" : "; ") + p.problem();
  });
  return out;
}

}  // namespace detail

}  // namespace precis::nn
