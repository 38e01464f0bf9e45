/// @file
/// precis::policy, precis::unsafe and the Policy concept.
#pragma once

#include <precis/policy/precision.hpp>
#include <precis/policy/rules.hpp>

#include <type_traits>

namespace precis {

/// A type list of waived rules.
template <class... Rules>
struct rule_list {};

/// Whose products a matrix product or convolution uses.
namespace products {
/// precis's own: every product of two inputs exact in float, subnormal inputs and results
/// kept, summed in k order; the same bits on every machine and for every thread count.
struct exact {
  static constexpr const char* name = "exact";  ///< Printed name.
};
/// The hardware's products, through oneDNN on the CPU (tensor cores on the GPU). bfloat16
/// inputs: the dot-product instructions (AMX TDPBF16PS, AVX512-BF16 VDPBF16PS), products
/// exact and summed in float, but subnormal inputs and results flushed to zero and summed in
/// the hardware's order; where the CPU has no such instructions the exact kernel runs
/// (precis::cpu_products_engine() says which one does). float inputs: oneDNN's float
/// kernels (the products fused into float sums, subnormals kept, oneDNN's order; what
/// PyTorch's float matmul and convolution run); float16 inputs: the same kernels on the
/// inputs converted to float (exactly, as is every product of two float16 values). Either way
/// the same bits for a given machine and thread count; without precis::onednn the exact
/// kernel runs.
struct hardware {
  static constexpr const char* name = "hardware";  ///< Printed name.
};
}  // namespace products

/// True for precis::products::exact and precis::products::hardware.
template <class T>
inline constexpr bool is_products_v =
    std::is_same_v<T, products::exact> || std::is_same_v<T, products::hardware>;

/// The precision of a layer or operation:
/// - `Storage`: the type tensors (activations, working copies of weights) are kept in;
/// - `Compute`: the type elementwise math runs in;
/// - `Accumulate`: the type sums and matrix-product accumulators use;
/// - `Master`: the type of master weights and optimizer state;
/// - `Gradient`: the type gradients are stored in (float8_e5m2 where the forward pass
///   stores float8_e4m3);
/// - `Fp8Recipe`: the per-tensor scaling recipe float8 tensors use (precis::recipe);
/// - `Products`: whose products matrix products and convolutions use (precis::products:
///   `exact`, or the `hardware`'s dot-product instructions).
///
/// A policy is a type, resolved at compile time; it holds no data. Its admissibility
/// (the rules in precis::rule) is checked where it is used: in a policy map, for a layer.
template <class Storage, class Compute, class Accumulate, class Master = float,
          class Gradient = Storage, class Fp8Recipe = recipe::none,
          class Products = products::exact>
struct policy {
  using storage_type = Storage;        ///< Type tensors are kept in.
  using compute_type = Compute;        ///< Type elementwise math runs in.
  using accumulate_type = Accumulate;  ///< Type of sums and matrix-product accumulators.
  using master_type = Master;          ///< Type of master weights and optimizer state.
  using gradient_type = Gradient;      ///< Type gradients are stored in.
  using fp8_recipe = Fp8Recipe;        ///< Per-tensor scaling recipe (a precis::recipe tag).
  using products_type = Products;      ///< Whose products matrix products use (precis::products).
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
  /// The policy whose rules are waived.
  using base_policy = Policy;
  /// The rules `Policy` waives followed by `Waived...`, as a precis::rule_list.
  using waived_rules =
      typename detail::concat_rules<typename Policy::waived_rules, rule_list<Waived...>>::type;
};

/// True when policy `P` waives rule `Rule`.
template <class P, class Rule>
inline constexpr bool waives_v = detail::contains_rule<typename P::waived_rules, Rule>::value;

/// A policy: names its six types, its products and its waived rules.
template <class P>
concept Policy = requires {
  typename P::storage_type;
  typename P::compute_type;
  typename P::accumulate_type;
  typename P::master_type;
  typename P::gradient_type;
  typename P::fp8_recipe;
  typename P::products_type;
  typename P::waived_rules;
} && is_recipe_v<typename P::fp8_recipe> && is_products_v<typename P::products_type>;

/// True when gradients stored as `P::gradient_type` need loss scaling: float16 and
/// float8 have less exponent range than float, so small gradients flush to zero.
template <Policy P>
inline constexpr bool needs_loss_scaling_v = narrower_range_than_float_v<typename P::gradient_type>;

/// Trait form of needs_loss_scaling_v.
template <Policy P>
struct needs_loss_scaling : std::bool_constant<needs_loss_scaling_v<P>> {};

}  // namespace precis
