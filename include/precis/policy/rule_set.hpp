/// @file
/// The default rule set: how an operation kind reads the policy it is given.
#pragma once

#include <precis/policy/checks.hpp>
#include <precis/policy/definition.hpp>
#include <precis/policy/ops.hpp>

#include <type_traits>

namespace precis {

namespace detail {
template <class T>
using at_least_float = std::conditional_t<at_least_as_wide_v<T, float>, T, float>;

template <class Base, class Waived>
struct with_waivers;
template <class Base>
struct with_waivers<Base, rule_list<>> {
  using type = Base;
};
template <class Base, class... Rules>
struct with_waivers<Base, rule_list<Rules...>> {
  using type = unsafe<Base, Rules...>;
};
}  // namespace detail

/// The policy operation kind `Op` runs under when given policy `P`:
/// - matmul and conv: `P` as it is;
/// - the fp32-rule kinds (exp, log, pow, softmax, log_softmax, logsumexp, the norms, losses,
///   reductions): compute and accumulate at least fp32 (`Promote`: a map's default and a
///   kernel's policy are promoted; a map's explicit override is taken as written and
///   checked, rule c). A policy that waives rule::fp32_operation is never promoted: the
///   waiver says its types apply to these kinds too;
/// - every kind but matmul and conv: float8 storage and gradients become `P`'s compute
///   type, since float8 is a format for matrix-product inputs (bfloat16 in
///   presets::fp8_hybrid).
/// Master type, recipe, products and waived rules are kept.
template <op_kind Op, Policy P, bool Promote = true>
struct apply_rules {
 private:
  static constexpr bool fp32 = Op::fp32_rule && Promote && !waives_v<P, rule::fp32_operation>;
  static constexpr bool leave_fp8 = !is_gemm_like_v<Op>;
  using C = typename P::compute_type;
  using S = typename P::storage_type;
  using G = typename P::gradient_type;

 public:
  /// `P`'s storage type, or its compute type where that is float8 and `Op` is not a
  /// matrix product or convolution.
  using storage_type = std::conditional_t<leave_fp8 && is_float8_v<S>, C, S>;
  /// `P`'s gradient type, replaced as storage_type is.
  using gradient_type = std::conditional_t<leave_fp8 && is_float8_v<G>, C, G>;
  /// `P`'s compute type, widened to at least float for a promoted fp32-rule kind.
  using compute_type = std::conditional_t<fp32, detail::at_least_float<C>, C>;
  /// `P`'s accumulate type, widened as compute_type is.
  using accumulate_type =
      std::conditional_t<fp32, detail::at_least_float<typename P::accumulate_type>,
                         typename P::accumulate_type>;
  /// The resulting policy: these four types with `P`'s master type, recipe and products,
  /// wrapped in precis::unsafe with `P`'s waivers where it has any.
  using type = typename detail::with_waivers<
      policy<storage_type, compute_type, accumulate_type, typename P::master_type, gradient_type,
             typename P::fp8_recipe, typename P::products_type>,
      typename P::waived_rules>::type;
};

/// The policy operation kind `Op` runs under when given `P` (`apply_rules<...>::type`).
template <op_kind Op, Policy P, bool Promote = true>
using apply_rules_t = typename apply_rules<Op, P, Promote>::type;

}  // namespace precis
