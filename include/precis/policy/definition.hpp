// precis/policy/definition.hpp: precis::policy, precis::unsafe and the Policy concept.
#pragma once

#include <precis/policy/precision.hpp>
#include <precis/policy/rules.hpp>

#include <type_traits>

namespace precis {

/// A type list of waived rules.
template <class... Rules>
struct rule_list {};

/// The precision of a layer or operation:
/// - `Storage`: the type tensors (activations, working copies of weights) are kept in;
/// - `Compute`: the type elementwise math runs in;
/// - `Accumulate`: the type sums and matrix-product accumulators use;
/// - `Master`: the type of master weights and optimizer state;
/// - `Gradient`: the type gradients are stored in (float8_e5m2 where the forward pass
///   stores float8_e4m3);
/// - `Fp8Recipe`: the per-tensor scaling recipe float8 tensors use (precis::recipe).
///
/// A policy is a type, resolved at compile time; it holds no data. Its admissibility
/// (the rules in precis::rule) is checked where it is used: in a policy map, for a layer.
template <class Storage, class Compute, class Accumulate, class Master = float,
          class Gradient = Storage, class Fp8Recipe = recipe::none>
struct policy {
  using storage_type = Storage;
  using compute_type = Compute;
  using accumulate_type = Accumulate;
  using master_type = Master;
  using gradient_type = Gradient;
  using fp8_recipe = Fp8Recipe;
  /// Rules this policy waives (none; see precis::unsafe).
  using waived_rules = rule_list<>;
};

namespace detail {
template <class List, class Rule>
struct contains_rule;
template <class... Rules, class Rule>
struct contains_rule<rule_list<Rules...>, Rule>
    : std::bool_constant<(std::is_same_v<Rules, Rule> || ...)> {};

template <class Rule>
constexpr bool check_waivable() {
  static_assert(is_rule_v<Rule>,
                "precis: unsafe<Policy, Rules...> waives rules named in precis::rule "
                "(narrow_accumulate, unscaled_gradients, fp32_operation, activation_range, "
                "fp8_without_scaling, e5m2_forward, narrow_master, fp8_alignment); this "
                "argument is not one of them");
  return true;
}

template <class A, class B>
struct concat_rules;
template <class... A, class... B>
struct concat_rules<rule_list<A...>, rule_list<B...>> {
  using type = rule_list<A..., B...>;
};
}  // namespace detail

/// A policy with rules explicitly waived: `unsafe<policy<...>, rule::narrow_master>`.
/// The waiver stays in the type and shows in `describe`; only the named rules are
/// lifted. Waiving an unknown rule does not compile.
template <class Policy, class... Waived>
struct unsafe : Policy {
  static_assert((detail::check_waivable<Waived>() && ...));
  using base_policy = Policy;
  using waived_rules =
      typename detail::concat_rules<typename Policy::waived_rules, rule_list<Waived...>>::type;
};

/// True when policy `P` waives rule `Rule`.
template <class P, class Rule>
inline constexpr bool waives_v = detail::contains_rule<typename P::waived_rules, Rule>::value;

/// A policy: names its six types and its waived rules.
template <class P>
concept Policy = requires {
  typename P::storage_type;
  typename P::compute_type;
  typename P::accumulate_type;
  typename P::master_type;
  typename P::gradient_type;
  typename P::fp8_recipe;
  typename P::waived_rules;
} && is_recipe_v<typename P::fp8_recipe>;

/// True when gradients stored as `P::gradient_type` need loss scaling: float16 and
/// float8 have less exponent range than float, so small gradients flush to zero.
template <Policy P>
inline constexpr bool needs_loss_scaling_v = narrower_range_than_float_v<typename P::gradient_type>;

/// Trait form of needs_loss_scaling_v.
template <Policy P>
struct needs_loss_scaling : std::bool_constant<needs_loss_scaling_v<P>> {};

}  // namespace precis
