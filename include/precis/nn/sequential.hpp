// precis/nn/sequential.hpp: composing layers, with every narrowing visible in the type.
//
// `nn::chain<L0, L1, ...>` runs its layers in order; neighbouring layers must fit (the
// output and gradient types of one are the input and gradient types of the next), or the
// chain does not compile. `nn::sequential<L0, L1, ...>` is the chain with an `nn::cast`
// inserted wherever they do not, so the model's type spells out each layer's policy and
// each conversion between them:
//
//     using model = nn::sequential<nn::linear<presets::bf16_mixed>, nn::linear<presets::fp32>>;
//     // = nn::chain<nn::basic_linear<bf16 policy>, nn::cast<bfloat16, float, bfloat16, float>,
//     //             nn::basic_linear<fp32 policy>>
//     auto m = nn::make_sequential(nn::linear<presets::bf16_mixed>(64, 256),
//                                  nn::linear<presets::fp32>(256, 10));
#pragma once

#include <precis/nn/layers.hpp>
#include <precis/policy/describe.hpp>
#include <precis/scaling/scalers.hpp>

#include <cstddef>
#include <limits>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace precis::nn {

namespace detail {

template <class A, class B>
inline constexpr bool fits_v = std::is_same_v<typename A::output_type, typename B::input_type> &&
                               std::is_same_v<typename A::output_grad_type, typename B::input_grad_type>;

template <class... Ls>
constexpr bool neighbours_fit() {
  if constexpr (sizeof...(Ls) < 2) {
    return true;
  } else {
    using T = std::tuple<Ls...>;
    return []<std::size_t... I>(std::index_sequence<I...>) {
      return (fits_v<std::tuple_element_t<I, T>, std::tuple_element_t<I + 1, T>> && ...);
    }(std::make_index_sequence<sizeof...(Ls) - 1>{});
  }
}

template <class L>
concept has_policy = requires { typename L::policy_type; };

}  // namespace detail

/// Layers run in order. Its input is the first layer's input type, its output the last
/// layer's output type. Holds its layers by value; see the file comment.
template <class... Ls>
class chain {
  static_assert(sizeof...(Ls) > 0, "precis: a model needs at least one layer");
  static_assert(detail::neighbours_fit<Ls...>(),
                "precis: neighbouring layers store different types (or gradient types); build "
                "the model with nn::sequential / nn::make_sequential, which inserts the nn::cast "
                "between them, or insert the nn::cast yourself");
  using layers_type = std::tuple<Ls...>;
  static constexpr std::size_t count = sizeof...(Ls);
  using first = std::tuple_element_t<0, layers_type>;
  using last = std::tuple_element_t<count - 1, layers_type>;

 public:
  using input_type = typename first::input_type;
  using input_grad_type = typename first::input_grad_type;
  using output_type = typename last::output_type;
  using output_grad_type = typename last::output_grad_type;
  /// The master type of its parameters.
  using master_type = float;
  /// Checkpoint kind (see precis::save_checkpoint).
  static constexpr std::string_view kind = "precis.nn.chain";

  explicit chain(Ls... layers) : layers_(std::move(layers)...) {}

  /// The model's output for input x ([batch, features]); x must stay alive until backward().
  const host_tensor<output_type, 2>& forward(const cpu_context& ctx, const host_tensor<input_type, 2>& x,
                                             mode m = mode::train) {
    return forward_from<0>(ctx, x, m);
  }
  /// Backpropagates dy (the gradient of the loss with respect to the output), adding the
  /// parameters' gradients to what they hold; returns the gradient with respect to x.
  const host_tensor<input_grad_type, 2>& backward(const cpu_context& ctx,
                                                  const host_tensor<output_grad_type, 2>& dy) {
    return backward_from<count - 1>(ctx, dy);
  }

  /// Calls f(layer) for each layer in order.
  template <class F>
  void for_each_layer(F&& f) {
    std::apply([&](auto&... l) { (f(l), ...); }, layers_);
  }
  template <class F>
  void for_each_layer(F&& f) const {
    std::apply([&](const auto&... l) { (f(l), ...); }, layers_);
  }
  /// Layer I.
  template <std::size_t I>
  auto& layer() {
    return std::get<I>(layers_);
  }
  static constexpr std::size_t size() { return count; }

  /// Zeroes every parameter's gradient (before a step's first micro-batch).
  void zero_grad() {
    for_each_parameter([](auto& p) { p.zero_grad(); });
  }
  /// Rounds every master weight to its working copy (after each applied optimizer step).
  void refresh(const cpu_context& ctx = {}) {
    for_each_parameter([&](auto& p) { p.refresh(ctx); });
  }
  /// The master weights, in a fixed order (the optimizer's view of the model).
  std::vector<std::span<float>> masters() {
    std::vector<std::span<float>> out;
    for_each_parameter([&](auto& p) { out.push_back(p.master_span()); });
    return out;
  }
  /// The gradients, in the order of masters(): a precis::gradients container.
  std::vector<std::span<float>> gradients() {
    std::vector<std::span<float>> out;
    for_each_parameter([&](auto& p) { out.push_back(p.grad_span()); });
    return out;
  }
  /// Number of trainable values.
  std::size_t parameter_count() const {
    std::size_t n = 0;
    for_each_parameter([&](const auto& p) { n += p.size(); });
    return n;
  }
  /// Bytes of master weights, working copies and gradients.
  std::size_t parameter_bytes() const {
    std::size_t n = 0;
    for_each_parameter([&](const auto& p) { n += p.bytes(); });
    return n;
  }
  /// Bytes of the activations, activation gradients and saved statistics of the last
  /// forward and backward passes.
  std::size_t activation_bytes() const {
    std::size_t n = 0;
    for_each_layer([&](const auto& l) { n += l.activation_bytes(); });
    return n;
  }

  /// True when every layer's gradients fit `Scaler` (rule b); a layer with float16
  /// gradients and a scaler that does not scale fails to compile with rule b's message.
  template <class Scaler>
  static constexpr bool check_scaler() {
    return (layer_fits_scaler<Ls, Scaler>() && ...);
  }

  template <class Archive>
  void visit_state(Archive& a) {
    std::size_t i = 0;
    for_each_layer([&](auto& l) { l.visit_state(a, std::to_string(i++) + "."); });
  }
  std::string validate() const {
    std::string out;
    for_each_layer([&](const auto& l) {
      const std::string p = l.validate();
      if (!p.empty()) out += (out.empty() ? "" : "; ") + p;
    });
    return out;
  }

 private:
  template <class L, class Scaler>
  static constexpr bool layer_fits_scaler() {
    if constexpr (detail::has_policy<L>) {
      return precis::check_scaler<typename L::policy_type, Scaler>();
    } else {
      return true;
    }
  }
  template <class F>
  void for_each_parameter(F&& f) {
    for_each_layer([&](auto& l) { l.for_each_parameter([&](std::string_view, auto& p) { f(p); }); });
  }
  template <class F>
  void for_each_parameter(F&& f) const {
    for_each_layer([&](const auto& l) { l.for_each_parameter([&](std::string_view, const auto& p) { f(p); }); });
  }
  template <std::size_t I, class X>
  const auto& forward_from(const cpu_context& ctx, const X& x, mode m) {
    const auto& y = std::get<I>(layers_).forward(ctx, x, m);
    if constexpr (I + 1 == count) {
      return y;
    } else {
      return forward_from<I + 1>(ctx, y, m);
    }
  }
  template <std::size_t I, class D>
  const auto& backward_from(const cpu_context& ctx, const D& dy) {
    const auto& dx = std::get<I>(layers_).backward(ctx, dy);
    if constexpr (I == 0) {
      return dx;
    } else {
      return backward_from<I - 1>(ctx, dx);
    }
  }

  layers_type layers_;
};

namespace detail {

/// The nn::cast that connects layer A's output to layer B's input.
template <class A, class B>
using cast_between_t = cast<typename A::output_type, typename B::input_type, typename A::output_grad_type,
                            typename B::input_grad_type>;

inline constexpr std::size_t inserted = std::numeric_limits<std::size_t>::max();

// Builds chain<...> from the user's layers with casts inserted; `map` gives, for each
// element of the chain, the index of the user's layer it is, or `inserted`.
template <class Chain, class Map, std::size_t Next, class... Rest>
struct insert_casts;
template <class... Done, std::size_t... M, std::size_t Next>
struct insert_casts<chain<Done...>, std::index_sequence<M...>, Next> {
  using type = chain<Done...>;
  using map = std::index_sequence<M...>;
};
template <class... Done, std::size_t... M, std::size_t Next, class L>
struct insert_casts<chain<Done...>, std::index_sequence<M...>, Next, L> {
  using type = chain<Done..., L>;
  using map = std::index_sequence<M..., Next>;
};
template <class... Done, std::size_t... M, std::size_t Next, class A, class B, class... Rest>
struct insert_casts<chain<Done...>, std::index_sequence<M...>, Next, A, B, Rest...> {
  using next = std::conditional_t<
      fits_v<A, B>, insert_casts<chain<Done..., A>, std::index_sequence<M..., Next>, Next + 1, B, Rest...>,
      insert_casts<chain<Done..., A, cast_between_t<A, B>>, std::index_sequence<M..., Next, inserted>,
                   Next + 1, B, Rest...>>;
  using type = typename next::type;
  using map = typename next::map;
};

template <class T, std::size_t M, class Tuple>
T pick_layer(Tuple& user) {
  if constexpr (M == inserted) {
    return T{};
  } else {
    return std::get<M>(user);
  }
}

template <class... Ts, std::size_t... M, class Tuple>
chain<Ts...> build_chain(std::type_identity<chain<Ts...>>, std::index_sequence<M...>, Tuple& user) {
  return chain<Ts...>(pick_layer<Ts, M>(user)...);
}

}  // namespace detail

/// The chain of Ls with an nn::cast inserted between neighbours that store different types.
template <class... Ls>
using sequential = typename detail::insert_casts<chain<>, std::index_sequence<>, 0, Ls...>::type;

/// Builds nn::sequential<Ls...> from layer objects (casts are created where inserted).
template <class... Ls>
sequential<std::remove_cvref_t<Ls>...> make_sequential(Ls&&... layers) {
  using built = detail::insert_casts<chain<>, std::index_sequence<>, 0, std::remove_cvref_t<Ls>...>;
  std::tuple<std::remove_cvref_t<Ls>...> user(std::forward<Ls>(layers)...);
  return detail::build_chain(std::type_identity<typename built::type>{}, typename built::map{}, user);
}

namespace detail {

inline std::string byte_string(std::size_t bytes) {
  char buf[32];
  if (bytes < 10 * 1024) {
    std::snprintf(buf, sizeof buf, "%zu B", bytes);
  } else if (bytes < 10 * 1024 * 1024) {
    std::snprintf(buf, sizeof buf, "%.1f KiB", double(bytes) / 1024.0);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f MiB", double(bytes) / (1024.0 * 1024.0));
  }
  return buf;
}

template <class L>
std::vector<std::string> model_row(std::size_t index, const L& l) {
  std::size_t count = 0, bytes = 0;
  l.for_each_parameter([&](std::string_view, const auto& p) {
    count += p.size();
    bytes += p.bytes();
  });
  std::vector<std::string> row{std::to_string(index), std::string(L::name), l.shape(),
                               std::string(L::operation::name)};
  if constexpr (has_policy<L>) {
    using P = typename L::policy_type;
    for (std::string_view t : {type_name_v<typename P::storage_type>, type_name_v<typename P::compute_type>,
                               type_name_v<typename P::accumulate_type>, type_name_v<typename P::master_type>,
                               type_name_v<typename P::gradient_type>}) {
      row.emplace_back(t);
    }
    row.push_back(precis::detail::rule_names(typename P::waived_rules{}));
    // The rule raised compute to float where the storage is narrower.
    constexpr bool by_rule = L::operation::fp32_rule && !waives_v<P, rule::fp32_operation> &&
                             !std::is_same_v<typename P::storage_type, typename P::compute_type>;
    row.push_back(by_rule ? "fp32 by rule" : "-");
  } else {
    row.insert(row.end(), {std::string(type_name_v<typename L::output_type>), "-", "-", "-",
                           std::string(type_name_v<typename L::output_grad_type>) + "->" +
                               std::string(type_name_v<typename L::input_grad_type>),
                           "-", "inserted cast"});
  }
  row.push_back(std::to_string(count));
  row.push_back(count == 0 ? "-" : byte_string(bytes));
  return row;
}

}  // namespace detail

/// The model as a table: for each layer its index, kind, shape, operation kind, the
/// resolved storage / compute / accumulate / master / gradient types, waived rules, notes,
/// parameter count and parameter bytes (masters, working copies, gradients); then totals.
template <class... Ls>
std::string describe(const chain<Ls...>& model) {
  std::vector<std::vector<std::string>> rows{{"#", "layer", "shape", "op", "storage", "compute", "accumulate",
                                              "master", "gradient", "waived", "notes", "params", "bytes"}};
  std::size_t i = 0;
  model.for_each_layer([&](const auto& l) { rows.push_back(detail::model_row(i++, l)); });
  rows.push_back({"", "total", "", "", "", "", "", "", "", "", "", std::to_string(model.parameter_count()),
                  detail::byte_string(model.parameter_bytes())});
  return precis::detail::format_table(rows);
}

}  // namespace precis::nn
