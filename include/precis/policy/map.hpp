/// @file
/// Per-layer policy maps (Boost.Hana), resolved at compile time.
///
///     constexpr auto policies = precis::make_policy_map(
///         precis::presets::bf16_mixed{},                          // default
///         precis::for_op<precis::op::loss>(precis::presets::fp32{}),
///         precis::for_layer<detection_head>(precis::presets::fp32{}));
///     using head_policy = precis::policy_for_t<detection_head, decltype(policies)>;
///
/// Precedence: a layer override beats an operation-kind override, which beats the
/// default. The default passes through the rule set (precis::apply_rules); overrides are
/// taken as written, except for float8 storage outside matrix products, and checked.
#pragma once

#include <precis/policy/checks.hpp>
#include <precis/policy/definition.hpp>
#include <precis/policy/layer.hpp>
#include <precis/policy/ops.hpp>
#include <precis/policy/rule_set.hpp>

#include <boost/hana/at_key.hpp>
#include <boost/hana/basic_tuple.hpp>
#include <boost/hana/bool.hpp>
#include <boost/hana/contains.hpp>
#include <boost/hana/filter.hpp>
#include <boost/hana/map.hpp>
#include <boost/hana/pair.hpp>
#include <boost/hana/type.hpp>
#include <boost/hana/unpack.hpp>

#include <type_traits>

namespace precis {

/// An override of the policy for every operation of kind `Op`.
template <op_kind Op, Policy P>
struct op_override {
  using key = Op;         ///< The operation kind it overrides.
  using policy_type = P;  ///< The policy it gives that kind.
};

/// An override of the policy for one layer tag `L`.
template <Layer L, Policy P>
struct layer_override {
  using key = L;          ///< The layer tag it overrides.
  using policy_type = P;  ///< The policy it gives that layer.
};

/// `for_op<op::softmax>(presets::fp32{})`: an operation-kind override.
template <op_kind Op, Policy P>
constexpr op_override<Op, P> for_op(P) {
  return {};
}

/// `for_layer<my_layer>(presets::fp32{})`: a layer override.
template <Layer L, Policy P>
constexpr layer_override<L, P> for_layer(P) {
  return {};
}

namespace detail {
template <class T>
struct is_op_override : std::false_type {};
template <class Op, class P>
struct is_op_override<op_override<Op, P>> : std::true_type {};
template <class T>
struct is_layer_override : std::false_type {};
template <class L, class P>
struct is_layer_override<layer_override<L, P>> : std::true_type {};

template <class Key, class... Keys>
inline constexpr int key_count = (0 + ... + int(std::is_same_v<Key, Keys>));

// A Hana map from key types to policy types, of the overrides that `Keep` selects.
template <template <class> class Keep, class... Overrides>
constexpr auto override_map() {
  namespace hana = boost::hana;
  auto kept = hana::filter(hana::make_basic_tuple(hana::type_c<Overrides>...), [](auto t) {
    return hana::bool_c<Keep<typename decltype(t)::type>::value>;
  });
  return hana::unpack(kept, [](auto... t) {
    return hana::make_map(hana::make_pair(hana::type_c<typename decltype(t)::type::key>,
                                          hana::type_c<typename decltype(t)::type::policy_type>)...);
  });
}

// The policy type a Hana map gives `Key`, or `Fallback`.
template <class HanaMap, class Key, class Fallback>
constexpr auto lookup() {
  namespace hana = boost::hana;
  if constexpr (decltype(hana::contains(std::declval<HanaMap>(), hana::type_c<Key>))::value) {
    using found = std::decay_t<decltype(hana::at_key(std::declval<HanaMap>(), hana::type_c<Key>))>;
    return std::type_identity<typename found::type>{};
  } else {
    return std::type_identity<Fallback>{};
  }
}
template <class HanaMap, class Key, class Fallback>
using lookup_t = typename decltype(lookup<HanaMap, Key, Fallback>())::type;
}  // namespace detail

/// A default policy and its overrides, as two Hana maps from key types to policy types.
/// Built by make_policy_map; holds no data.
template <Policy Default, class OpMap, class LayerMap>
struct policy_map {
  /// The policy of layers no override names, before the rule set.
  using default_policy = Default;
  /// hana::map from operation-kind types to policy types.
  using op_overrides = OpMap;
  /// hana::map from layer-tag types to policy types.
  using layer_overrides = LayerMap;
};

/// Builds a policy map from a default policy and any number of `for_op` / `for_layer`
/// overrides. Every policy in it is checked (rules a, e, f); two overrides of the same
/// key do not compile.
template <Policy Default, class... Overrides>
constexpr auto make_policy_map(Default, Overrides...) {
  static_assert(((detail::is_op_override<Overrides>::value ||
                  detail::is_layer_override<Overrides>::value) &&
                 ...),
                "precis: make_policy_map(default, overrides...) takes for_op<Op>(policy) and "
                "for_layer<Layer>(policy) after the default policy");
  static_assert(((detail::key_count<typename Overrides::key, typename Overrides::key...> == 1) &&
                 ...),
                "precis: two overrides name the same operation kind or layer; keep one");
  static_assert(check_policy<Default>() && (check_policy<typename Overrides::policy_type>() && ...));
  using ops = decltype(detail::override_map<detail::is_op_override, Overrides...>());
  using layers = decltype(detail::override_map<detail::is_layer_override, Overrides...>());
  return policy_map<Default, ops, layers>{};
}

/// Where a layer's policy came from.
enum class policy_source { default_policy, op_override, layer_override };

/// How `Map` resolves layer `L`: `given` is the policy the map names for it, `type` the
/// policy it runs under after the rule set, `source` which entry applied. Instantiating
/// it checks the rules (a, c, d, e, f, g).
template <Layer L, class Map>
struct resolution {
  using op = typename L::op;  ///< The layer's operation kind.

 private:
  using by_layer = detail::lookup_t<typename Map::layer_overrides, L, void>;
  using by_op = detail::lookup_t<typename Map::op_overrides, op, void>;

 public:
  /// Which entry of the map applied: the layer override, else the kind override, else the
  /// default.
  static constexpr policy_source source =
      !std::is_void_v<by_layer> ? policy_source::layer_override
      : !std::is_void_v<by_op>  ? policy_source::op_override
                                : policy_source::default_policy;
  /// The policy the map names for the layer, as written.
  using given = std::conditional_t<
      !std::is_void_v<by_layer>, by_layer,
      std::conditional_t<!std::is_void_v<by_op>, by_op, typename Map::default_policy>>;
  /// The policy the layer runs under: `given` through precis::apply_rules, promoting the
  /// fp32-rule kinds only where `given` is the default.
  using type = apply_rules_t<op, given, source == policy_source::default_policy>;

 private:
  static_assert(check_policy<given>() &&
                check_layer<L, type, source != policy_source::default_policy>());
};

/// The policy layer `L` runs under in `Map`, readable in the type:
/// `policy<bfloat16, float, float, float, bfloat16, recipe::none>`.
template <Layer L, class Map>
using policy_for_t = typename resolution<L, Map>::type;

/// The same as a value: `auto p = precis::policy_for<my_layer>(policies);`.
template <Layer L, class Map>
constexpr policy_for_t<L, Map> policy_for(Map) {
  return {};
}

}  // namespace precis
