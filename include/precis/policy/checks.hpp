/// @file
/// The admissibility rules as named concepts, and the checks that reject a policy or a layer's
/// resolved policy with a `precis:` message naming the fix. A rule a policy waives (precis::unsafe)
/// is not checked.
#pragma once

#include <precis/policy/definition.hpp>
#include <precis/policy/layer.hpp>

#include <limits>
#include <type_traits>

namespace precis {

/// (a) Sums are at least as wide as the math they add up.
template <class P>
concept accumulates_wide_enough = at_least_as_wide_v<typename P::accumulate_type, typename P::compute_type>;

/// (c) Compute and accumulate types of an fp32-rule operation hold every float.
template <class P>
concept computes_in_fp32 = at_least_as_wide_v<typename P::compute_type, float> &&
                           at_least_as_wide_v<typename P::accumulate_type, float>;

/// (e) float8 tensors come with a per-tensor scaling recipe.
template <class P>
concept fp8_is_scaled = (!is_float8_v<typename P::storage_type> &&
                         !is_float8_v<typename P::gradient_type>) ||
                        !std::is_same_v<typename P::fp8_recipe, recipe::none>;

/// (e) Forward tensors are not float8_e5m2.
template <class P>
concept forward_not_e5m2 = !std::is_same_v<typename P::storage_type, float8_e5m2>;

/// (f) Master weights and optimizer state hold every float, and so every stored value.
template <class P>
concept master_is_fp32 = at_least_as_wide_v<typename P::master_type, float> &&
                         at_least_as_wide_v<typename P::master_type, typename P::storage_type>;

/// (d) The storage type holds the layer's declared activation bound. float8 storage with a
/// scaling recipe is scaled into range per tensor, so the bound does not constrain it.
template <class P, class Bound>
concept holds_activation_bound =
    std::is_void_v<Bound> ||
    (is_float8_v<typename P::storage_type> &&
     !std::is_same_v<typename P::fp8_recipe, recipe::none>) ||
    double(float(std::numeric_limits<typename P::storage_type>::max())) >= Bound::value;

/// (g) float8 matrix products have every dimension a multiple of 16.
template <class P, class Op, class Shape>
concept fp8_gemm_aligned = std::is_void_v<Shape> || !is_gemm_like_v<Op> ||
                           !is_float8_v<typename P::storage_type> || Shape::aligned_to(16);

/// Checks the rules that concern a policy alone (a, e, f). Returns true so that it can
/// sit in a static_assert or a fold.
template <Policy P>
constexpr bool check_policy() {
  static_assert(accumulates_wide_enough<P> || waives_v<P, rule::narrow_accumulate>,
                "precis: the accumulate type is narrower than the compute type (rule "
                "narrow_accumulate); accumulate in float, or waive "
                "precis::rule::narrow_accumulate with precis::unsafe");
  static_assert(master_is_fp32<P> || waives_v<P, rule::narrow_master>,
                "precis: master weights and optimizer state narrower than fp32 (rule "
                "narrow_master); keep float master weights (Master = float, as the *_mixed "
                "presets do), or waive precis::rule::narrow_master with precis::unsafe as "
                "presets::bf16_pure does");
  static_assert(fp8_is_scaled<P> || waives_v<P, rule::fp8_without_scaling>,
                "precis: float8 storage needs a per-tensor scaling recipe (rule "
                "fp8_without_scaling); give the policy precis::recipe::delayed or "
                "precis::recipe::current as its Fp8Recipe, as presets::fp8_hybrid does");
  static_assert(forward_not_e5m2<P> || waives_v<P, rule::e5m2_forward>,
                "precis: float8_e5m2 is a gradient format (rule e5m2_forward); store forward "
                "tensors as float8_e4m3 and gradients as float8_e5m2 (Gradient = "
                "float8_e5m2), as presets::fp8_hybrid does");
  return true;
}

/// Checks the rules that concern a layer's resolved policy `R` (c, d, g). `Explicit` says
/// the policy came from an override rather than from the map's default.
template <Layer L, Policy R, bool Explicit>
constexpr bool check_layer() {
  using Op = typename L::op;
  static_assert(!Op::fp32_rule || !Explicit || computes_in_fp32<R> ||
                    waives_v<R, rule::fp32_operation>,
                "precis: this operation (exp, log, pow, softmax, norm, loss or reduction) must "
                "compute and accumulate in fp32 (rule fp32_operation); remove the override "
                "that narrows it (the default rule set computes these in fp32 whatever the "
                "layer's storage), or waive precis::rule::fp32_operation with precis::unsafe");
  static_assert(holds_activation_bound<R, activation_bound_t<L>> ||
                    waives_v<R, rule::activation_range>,
                "precis: the layer declares activations (max_abs<...>) beyond what its "
                "storage type holds (rule activation_range); store it as bfloat16 or float "
                "(float16 holds at most 65504), or waive precis::rule::activation_range");
  static_assert(fp8_gemm_aligned<R, Op, gemm_shape_t<L>> || waives_v<R, rule::fp8_alignment>,
                "precis: float8 matrix products need every dimension (M, N, K) a multiple of "
                "16, as cuBLASLt requires (rule fp8_alignment); pad the layer, or give it a "
                "bfloat16 policy");
  return true;
}

/// Checks rule (b) where a policy meets a loss scaler: `Scaled` says whether the scaler
/// scales the loss.
template <Policy P, bool Scaled>
constexpr bool check_gradient_scaling() {
  static_assert(Scaled || !needs_loss_scaling_v<P> || waives_v<P, rule::unscaled_gradients>,
                "precis: float16 and float8 gradients underflow without loss scaling (rule "
                "unscaled_gradients); use precis::scaler_for<Policy> (dynamic_scaler for "
                "float16), store gradients as bfloat16, or waive "
                "precis::rule::unscaled_gradients with precis::unsafe");
  return true;
}

}  // namespace precis
