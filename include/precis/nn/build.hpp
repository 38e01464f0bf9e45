/// @file
/// A blueprint resolved against a policy map gives a model.
///
///     struct fc2 : precis::layer<op::matmul, max_abs<200000>> {};
///     auto mlp(std::size_t d) {
///       return nn::seq(nn::linear<fc1>(d, 4 * d), nn::gelu(), nn::linear<fc2>(4 * d, d));
///     }
///     constexpr auto map = precis::make_policy_map(presets::bf16_mixed{},
///                                                   precis::for_layer<fc2>(presets::fp32{}));
///     auto model = nn::build<bfloat16, 3>(map, mlp(256), {.seed = 1});
///
/// build<Input, Rank>(map, blueprint) resolves every layer's policy from the map (layer
/// override > operation-kind override > default, then the rule set; every rule checked for
/// every layer at compile time), threads the element types and ranks through the blueprint
/// and inserts an nn::cast wherever neighbours differ: the model's type spells, for each
/// layer, its tag and its storage / compute / accumulate types, and every cast. A model
/// built from another map is another type. A policy may stand for a map with no overrides.
///
/// Parameters are drawn from the build seed and each layer's path, so every layer (and
/// every block of a repeat) gets its own values and a model is the same on every machine.
#pragma once

#include <precis/nn/compose.hpp>
#include <precis/nn/module.hpp>
#include <precis/policy/map.hpp>
#include <precis/scaling/scalers.hpp>

#include <cstddef>
#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace precis::nn {

/// Options of nn::build.
struct build_options {
  /// Seed of the parameters' initial values (and of dropout masks).
  std::uint64_t seed = 0;
  /// How the model's images lie: image_layout::nchw [N, C, H, W], or image_layout::nhwc
  /// [N, H, W, C] (channels-last) for its convolutions, norms, pooling, upsampling and
  /// nn::channel_axis concatenations (see nn/layout.hpp). The same parameters either way,
  /// and on the host the same bits.
  image_layout layout = image_layout::nchw;
};

namespace detail {

template <class T>
struct is_policy_map : std::false_type {};
template <class D, class O, class L>
struct is_policy_map<policy_map<D, O, L>> : std::true_type {};

template <class MapOrPolicy>
auto as_map() {
  if constexpr (is_policy_map<std::remove_cvref_t<MapOrPolicy>>::value) {
    return std::remove_cvref_t<MapOrPolicy>{};
  } else {
    static_assert(Policy<MapOrPolicy>, "precis: nn::build takes a policy map (precis::make_policy_map) or a policy");
    return make_policy_map(MapOrPolicy{});
  }
}

template <class M>
concept with_decay_rule = requires(std::string_view s) {
  { M::decays(s) } -> std::convertible_to<bool>;
};

}  // namespace detail

/// A built model: the root module of a blueprint resolved against `Map`, with what training
/// needs (parameters in a fixed order, weight-decay groups, checkpoints named by path).
template <class Root, class Map>
class model {
 public:
  /// The root module: the blueprint's top node, resolved.
  using root_type = Root;
  /// The policy map it was built from (a precis::policy_map).
  using map_type = Map;
  /// The context its kernels run on.
  using context_type = typename Root::context_type;
  /// Element type of the input forward() reads (nn::values for several inputs).
  using input_type = typename Root::input_type;
  /// Element type of the input gradient backward() returns.
  using input_grad_type = typename Root::input_grad_type;
  /// Element type of the output forward() returns (nn::values for several outputs).
  using output_type = typename Root::output_type;
  /// Element type of the output gradient backward() reads.
  using output_grad_type = typename Root::output_grad_type;
  /// Rank of the input (0 for several inputs).
  static constexpr std::size_t input_rank = Root::input_rank;
  /// Rank of the output (0 for several outputs).
  static constexpr std::size_t output_rank = Root::output_rank;
  /// What forward() reads: a tensor, or for several inputs a tuple of pointers to them.
  using input_tensor = edge_value_t<context_type, input_type, input_rank>;
  /// What forward() gives: a tensor, or for several outputs a tuple of pointers to them.
  using output_tensor = edge_value_t<context_type, output_type, output_rank>;
  /// What backward() reads: the gradient of the output(s).
  using output_grad_tensor = edge_grad_t<context_type, output_grad_type, output_rank>;
  /// The shape of an input: an array, or a tuple of arrays for several inputs.
  using input_shape = edge_shape_t<input_type, input_rank>;
  /// The shape of an output: an array, or a tuple of arrays for several outputs.
  using output_shape_type = edge_shape_t<output_type, output_rank>;
  /// The master type of its parameters.
  using master_type = float;
  /// Checkpoint kind (see precis::save_checkpoint).
  static constexpr std::string_view kind = "precis.nn.model";

  /// Builds from the root module's blueprint and draws the parameters from `seed`.
  template <class Spec>
  model(const Spec& blueprint, build_options o) : root_(blueprint) {
    check_paths();
    walk(root_, root_path(), [&](const std::string& path, auto& node) {
      if constexpr (requires { node.set_layout(o.layout, path); }) node.set_layout(o.layout, path);
    });
    layout_ = o.layout;
    reset(o.seed);
  }
  /// How its images lie (build_options::layout).
  image_layout layout() const { return layout_; }

  /// Draws every parameter again from `seed` (each layer's reset(), from the seed and its
  /// path). On the host the working copies are then rounded from the new masters (refresh());
  /// a model on the device needs refresh(ctx) before its first pass.
  void reset(std::uint64_t seed) {
    walk(root_, root_path(), [&](const std::string& path, auto& node) {
      if constexpr (leaf<std::remove_cvref_t<decltype(node)>>) node.reset(detail::seed_for(seed, path));
    });
    if constexpr (std::is_same_v<context_type, cpu_context>) refresh();
  }

  /// The output shape for an input of shape `in`; throws precis::error naming the first
  /// layer (by path) that cannot take what reaches it, with both shapes.
  output_shape_type output_shape(const input_shape& in) const { return root_.output_shape(in, root_path()); }
  /// output_shape(in) with the rules of mode m as well: in mode::train a batch norm refuses
  /// an input with one value per channel (what forward() checks before any layer runs).
  output_shape_type output_shape(const input_shape& in, mode m) const {
    return detail::output_shape_in(root_, in, root_path(), m);
  }

  /// The model's output for x (a reference to the model's buffer, or for several outputs a
  /// tuple of pointers to them). Every layer's shape is checked before any runs, with the
  /// rules of mode m (in training, a batch norm refuses one value per channel). x must stay
  /// alive and unchanged until backward().
  decltype(auto) forward(context_ref_t<context_type> ctx, const input_tensor& x, mode m = mode::train) {
    return run_forward(ctx, x, m, false);
  }
  /// forward() of a temporary input (`model.forward(ctx, to_device(x), nn::mode::eval)`): the
  /// same output, but the input is gone once the call returns, so a backward pass or a
  /// monitor's look at the layers after it throws precis::error instead of reading it (from
  /// the moment any layer runs, even if a later one throws). A pass of a kept input ends that
  /// refusal. A model whose output is its input (an evaluation pass through dropout alone)
  /// returns a reference to the temporary: keep such an input.
  decltype(auto) forward(context_ref_t<context_type> ctx, input_tensor&& x, mode m = mode::train)
    requires(!is_values_v<input_type>)
  {
    return run_forward(ctx, std::as_const(x), m, true);
  }
  /// Any other argument does not compile (see nn::binds_edge_v): another element type, rank,
  /// allocator or an xtensor expression would be copied into a temporary that backward()
  /// reads after it is gone.
  template <class X>
    requires(!binds_edge_v<X, input_tensor>)
  void forward(context_ref_t<context_type>, const X&, mode = mode::train) {
    static_assert(precis::detail::dependent_false_v<X>,
                  "precis: nn::model::forward takes the model's input_tensor (nn::model's input_tensor type: "
                  "its element type and rank, a precis host_tensor or device_tensor, not an xtensor expression "
                  "or another element type, which would be copied into a temporary)");
  }
  /// Backpropagates dy (the loss's gradient with respect to the output(s)), adding the
  /// parameters' gradients to what they hold; returns the gradient with respect to x.
  decltype(auto) backward(context_ref_t<context_type> ctx, const output_grad_tensor& dy) {
    check_output_gradient(dy);
    return root_.backward(ctx, dy);
  }
  /// Any other argument does not compile, as for forward().
  template <class D>
    requires(!binds_edge_v<D, output_grad_tensor>)
  void backward(context_ref_t<context_type>, const D&) {
    static_assert(precis::detail::dependent_false_v<D>,
                  "precis: nn::model::backward takes the model's output_grad_tensor (its output gradient "
                  "type and rank), not another tensor type, which would be copied into a temporary");
  }
  /// backward() for training, where the gradient with respect to x is not wanted: the same
  /// parameter gradients, but the layers that read x compute no input gradient (a network's
  /// first convolution's backward-data pass is among its slowest). Returns nothing; those
  /// layers' input-gradient buffers are left empty (see nn::backward_parameters).
  void backward_parameters(context_ref_t<context_type> ctx, const output_grad_tensor& dy) {
    check_output_gradient(dy);
    nn::backward_parameters(root_, ctx, dy);
  }

  /// The root module.
  Root& root() { return root_; }
  /// The root module, read-only.
  const Root& root() const { return root_; }

  /// Calls f(path, layer) for every layer (leaf module), in order.
  template <class F>
  void for_each_layer(F&& f) {
    walk(root_, root_path(), [&](const std::string& path, auto& node) {
      if constexpr (leaf<std::remove_cvref_t<decltype(node)>>) f(path, node);
    });
  }
  /// Calls f(path, layer) for every layer, in order, read-only.
  template <class F>
  void for_each_layer(F&& f) const {
    walk(root_, root_path(), [&](const std::string& path, const auto& node) {
      if constexpr (leaf<std::remove_cvref_t<decltype(node)>>) f(path, node);
    });
  }
  /// Calls f(path, std::type_identity<Tag>{}, input, output, input_grads...) for every
  /// layer, and every product of an attention layer ("encoder.0.attn.scores"), in order,
  /// with the buffers of the last forward and backward passes (see nn/module.hpp): what
  /// precis::diagnostics::monitor reads. The sum of branches (nn::residual, nn::add) is
  /// stored in its first branch's output type, so it is passed, after the branches, as one
  /// more output of that branch's last layer (input null, no gradients). Throws
  /// precis::error after a forward pass of a temporary input (see forward()).
  template <class F>
  void for_each_observed(F&& f) const {
    check_input_kept("for_each_observed");
    observe_node(root_, root_path(), f);
  }
  /// Calls f(path, parameter) for every parameter ("encoder.3.1.mlp.fc2.weight"), in order.
  template <class F>
  void for_each_parameter(F&& f) {
    for_each_layer([&](const std::string& path, auto& l) {
      for_each_parameter_of(l, [&](std::string_view name, auto& p) { f(join_path(path, name), p); });
    });
  }
  /// Calls f(path, parameter) for every parameter, in order, read-only.
  template <class F>
  void for_each_parameter(F&& f) const {
    for_each_layer([&](const std::string& path, const auto& l) {
      for_each_parameter_of(l, [&](std::string_view name, const auto& p) { f(join_path(path, name), p); });
    });
  }

  /// Makes every float8 recipe of the model (float8 policies' linear layers) agree on its
  /// amax through `r`, e.g. a data-parallel run's precis::mpi_reducer, so that every
  /// process casts with the same scales. `r` must outlive the model's use of it; a
  /// default precis::reducer_ref{} returns the recipes to one process.
  template <reducer R>
  void set_amax_reducer(R& r) {
    set_amax_reducer(reducer_ref(r));
  }
  /// The same, through a precis::reducer_ref.
  void set_amax_reducer(reducer_ref r) {
    for_each_layer([&](const std::string&, auto& l) {
      if constexpr (requires { l.set_amax_reducer(r); }) l.set_amax_reducer(r);
    });
  }

  /// Whether every layer keeps its own gradient buffers after a backward pass (true), or the
  /// repeated blocks of an nn::repeat lend theirs to each other (false, as built: see
  /// repeat_block), which leaves the backward buffers of an nn::repeat's blocks 3 to N - 1
  /// empty between passes. precis::diagnostics reads every layer's: nn::trainer keeps them in
  /// the steps it runs under a monitor. Takes effect from the next backward pass. A change
  /// of the setting counts as a reallocation of device buffers
  /// (detail::device_reallocations): nn::trainer's CUDA graphs captured before it run one
  /// eager step, which gives the blocks the buffers the setting says, and are captured again.
  void keep_gradient_buffers(bool keep) {
    if (keep != keep_) detail::device_reallocations.fetch_add(1, std::memory_order_relaxed);
    keep_ = keep;
    walk(root_, root_path(), [&](const std::string&, auto& node) {
      if constexpr (requires { node.share_gradient_buffers(true); }) node.share_gradient_buffers(!keep);
    });
  }
  /// What keep_gradient_buffers last set (false as built).
  bool keeps_gradient_buffers() const { return keep_; }

  /// Zeroes every parameter's gradient (before a step's first micro-batch).
  void zero_grad() {
    for_each_parameter([](const std::string&, auto& p) { p.zero_grad(); });
  }
  /// The same in ctx's order: on the device memsets queued on the context's stream, with
  /// nothing copied from the host and no wait (what a device training step calls).
  void zero_grad(context_ref_t<context_type> ctx) {
    for_each_parameter([&](const std::string&, auto& p) { p.zero_grad(ctx); });
  }
  /// Rounds every master weight to its working copy (after each applied optimizer step).
  void refresh(context_ref_t<context_type> ctx) {
    for_each_parameter([&](const std::string&, auto& p) { p.refresh(ctx); });
  }
  /// refresh(ctx) on a one-thread cpu_context, for models on the host.
  void refresh()
    requires std::is_same_v<context_type, cpu_context>
  {
    refresh(cpu_context{1});
  }
  /// The master weights, in a fixed order (the optimizer's view of the model): host spans,
  /// or precis::device_span for a model on the device, which the host optimizers refuse.
  std::vector<typename context_traits<context_type>::template span<float>> masters() {
    std::vector<typename context_traits<context_type>::template span<float>> out;
    for_each_parameter([&](const std::string&, auto& p) { out.push_back(p.master_span()); });
    return out;
  }
  /// The gradients, in the order of masters(): a precis::gradients container on the host,
  /// device spans on the device.
  std::vector<typename context_traits<context_type>::template span<float>> gradients() {
    std::vector<typename context_traits<context_type>::template span<float>> out;
    for_each_parameter([&](const std::string&, auto& p) { out.push_back(p.grad_span()); });
    return out;
  }
  /// For each tensor of masters(), whether weight decay applies: to the weights of linear
  /// and convolution layers, not to biases, norm parameters or embeddings (as the ViT and
  /// DBNet recipes have it). Give it to the optimizer (precis::adamw's `decay`).
  std::vector<bool> decay_mask() const {
    std::vector<bool> out;
    for_each_layer([&](const std::string&, const auto& l) {
      using L = std::remove_cvref_t<decltype(l)>;
      for_each_parameter_of(l, [&](std::string_view name, const auto&) {
        if constexpr (detail::with_decay_rule<L>) {
          out.push_back(L::decays(name));
        } else {
          out.push_back(name == "weight");
        }
      });
    });
    return out;
  }
  /// The paths of masters(), in its order.
  std::vector<std::string> parameter_names() const {
    std::vector<std::string> out;
    for_each_parameter([&](const std::string& path, const auto&) { out.push_back(path); });
    return out;
  }
  /// Number of trainable values.
  std::size_t parameter_count() const {
    std::size_t n = 0;
    for_each_parameter([&](const std::string&, const auto& p) { n += p.size(); });
    return n;
  }
  /// Bytes of master weights, working copies and gradients.
  std::size_t parameter_bytes() const {
    std::size_t n = 0;
    for_each_parameter([&](const std::string&, const auto& p) { n += p.bytes(); });
    return n;
  }
  /// Bytes of the activations, activation gradients and saved statistics of the last
  /// forward and backward passes.
  std::size_t activation_bytes() const {
    std::size_t n = 0;
    walk(root_, root_path(), [&](const std::string&, const auto& node) { n += node.own_bytes(); });
    return n;
  }

  /// True when every layer's gradients fit `Scaler`: a layer with float16 gradients and a
  /// scaler that does not scale fails to compile with rule b's message (unless its policy
  /// waives rule::unscaled_gradients).
  template <class Scaler>
  bool check_scaler() const {
    bool ok = true;
    for_each_layer([&](const std::string&, const auto& l) {
      using L = std::remove_cvref_t<decltype(l)>;
      if constexpr (requires { typename L::policy_types; }) {
        // A layer made of pieces (attention): every piece's gradients.
        constexpr bool fits = []<class... Ps>(std::type_identity<std::tuple<Ps...>>) {
          return (precis::check_scaler<Ps, Scaler>() && ...);
        }(std::type_identity<typename L::policy_types>{});
        ok = ok && fits;
      } else if constexpr (has_policy<L>) {
        constexpr bool fits = precis::check_scaler<typename L::policy_type, Scaler>();
        ok = ok && fits;
      }
    });
    return ok;
  }

  /// Checkpoint fields, under each layer's path: its parameters (those its
  /// for_each_parameter names, under their names), then the layer's other state, through its
  /// own visit_state (batch norm's running statistics, a float8 layer's recipes, dropout's
  /// seed; nothing for most layers).
  template <class Archive>
  void visit_state(Archive& a) {
    for_each_layer([&](const std::string& path, auto& l) {
      const std::string prefix = path.empty() ? path : path + ".";
      detail::visit_parameters(a, prefix, l);
      l.visit_state(a, prefix);
    });
  }
  /// What went wrong loading a checkpoint: every layer's problems (its parameters', then its
  /// own validate()'s), joined by "; " ("" when nothing; see precis::load_checkpoint).
  std::string validate() const {
    std::string out;
    const auto add = [&](const std::string& p) {
      if (!p.empty()) out += (out.empty() ? "" : "; ") + p;
    };
    for_each_layer([&](const std::string&, const auto& l) {
      add(detail::parameter_problems(l));
      add(l.validate());
    });
    return out;
  }

 private:
  // forward(): every layer's shape checked before any runs (a refusal changes nothing), then
  // the passes; `temporary` records that x is gone when the call returns.
  decltype(auto) run_forward(context_ref_t<context_type> ctx, const input_tensor& x, mode m, bool temporary) {
    out_shape_ = output_shape(detail::edge_shape_of<input_rank>(x), m);
    input_gone_ = temporary;
    return root_.forward(ctx, x, m);
  }
  // Throws where the last forward pass read a temporary input, which `what` would read.
  void check_input_kept(std::string_view what) const {
    if (input_gone_) {
      throw error("precis::nn::model::" + std::string(what) +
                  ": the last forward() was given a temporary input, gone since, which it would read; pass "
                  "forward() a tensor that stays alive until backward()");
    }
  }
  void check_output_gradient(const output_grad_tensor& dy) const {
    check_input_kept("backward");
    if (detail::edge_shape_of<output_rank>(dy) != out_shape_) {
      throw error("precis::nn::model::backward: dy has shape " +
                  detail::edge_shape_string(detail::edge_shape_of<output_rank>(dy)) +
                  ", the last forward pass gave " + detail::edge_shape_string(out_shape_));
    }
  }
  // Parameters and checkpoint fields are named by path: two layers at one path would mix.
  void check_paths() const {
    std::set<std::string> seen;
    for_each_layer([&](const std::string& path, const auto&) {
      if (!seen.insert(path).second) {
        throw error("precis::nn::build: two layers have the path \"" + path_or_root(path) +
                    "\"; give one another tag or wrap it in nn::named");
      }
    });
  }

  template <class Node, class F>
  static void observe_node(const Node& node, const std::string& path, F& f) {
    if constexpr (has_policy<Node>) {
      static_assert(
          requires {
            Node::for_each_observed(
                node, [](std::string_view, auto, const auto*, const auto&, const auto&...) {});
          },
          "precis: a layer without for_each_observed(self, f) cannot be monitored; see "
          "nn/module.hpp");
      Node::for_each_observed(
          node, [&](std::string_view piece, auto tag, const auto* x, const auto& y,
                    const auto&... g) { f(join_path(path, piece), tag, x, y, g...); });
    } else if constexpr (composite<Node>) {
      Node::for_each_child(node, [&](std::string_view c, const auto& child) {
        observe_node(child, join_path(path, c), f);
      });
      if constexpr (requires { node.joined(); }) {
        using Y = std::remove_cvref_t<decltype(node.joined())>;
        bool first = true;
        Node::for_each_child(node, [&](std::string_view c, const auto& child) {
          if (!first) return;
          first = false;
          // The first branch's last output (a nested join's, if it ends in one) decides the type.
          std::size_t outputs = 0, seen = 0;
          auto count = [&](const std::string&, auto, const auto*, const auto&, const auto&...) {
            ++outputs;
          };
          observe_node(child, join_path(path, c), count);
          auto emit = [&](const std::string& p, auto tag, const auto*, const auto&,
                          const auto&...) {
            if (++seen == outputs) f(p, tag, static_cast<const Y*>(nullptr), node.joined());
          };
          observe_node(child, join_path(path, c), emit);
        });
      }
    }
  }

  // A named root gives its name to every path.
  std::string root_path() const { return std::string(root_.name()); }

  Root root_;
  output_shape_type out_shape_{};
  image_layout layout_ = image_layout::nchw;
  bool input_gone_ = false;  // the last forward pass read a temporary (forward(ctx, input_tensor&&))
  bool keep_ = false;
};

/// The model `blueprint` builds into under `map` (or a single policy) for inputs of
/// element type `Input` and rank `Rank` on context `Ctx`. See the file comment.
template <class Input, std::size_t Rank, class Ctx = cpu_context, class MapOrPolicy, class Spec>
auto build(MapOrPolicy, const Spec& blueprint, build_options o = {}) {
  using Map = decltype(detail::as_map<MapOrPolicy>());
  using Root = detail::resolve_spec_t<Spec, Map, Ctx, Input, Input, Rank>;
  return model<Root, Map>(blueprint, o);
}

/// The type nn::build gives for these arguments.
template <class Input, std::size_t Rank, class MapOrPolicy, class Spec, class Ctx = cpu_context>
using model_t = model<detail::resolve_spec_t<Spec, decltype(detail::as_map<MapOrPolicy>()), Ctx, Input, Input, Rank>,
                      decltype(detail::as_map<MapOrPolicy>())>;

}  // namespace precis::nn
