/// @file
/// The admissibility rules, as tags that `unsafe` can waive.
#pragma once

#include <string_view>
#include <type_traits>

namespace precis {
namespace rule {

/// (a) The accumulate type must hold every compute-type value (range and precision).
struct narrow_accumulate {
  static constexpr std::string_view name = "narrow_accumulate";  ///< Printed name.
};
/// (b) float16 or float8 gradients need loss scaling (checked where a policy meets a
/// scaler).
struct unscaled_gradients {
  static constexpr std::string_view name = "unscaled_gradients";  ///< Printed name.
};
/// (c) exp, log, pow, softmax, norms, losses and reductions compute and accumulate in
/// fp32 or wider.
struct fp32_operation {
  static constexpr std::string_view name = "fp32_operation";  ///< Printed name.
};
/// (d) A layer's declared activation bound (`max_abs<V>`) must fit its storage type.
struct activation_range {
  static constexpr std::string_view name = "activation_range";  ///< Printed name.
};
/// (e) float8 storage needs a per-tensor scaling recipe.
struct fp8_without_scaling {
  static constexpr std::string_view name = "fp8_without_scaling";  ///< Printed name.
};
/// (e) float8_e5m2 is for gradients; forward tensors are float8_e4m3.
struct e5m2_forward {
  static constexpr std::string_view name = "e5m2_forward";  ///< Printed name.
};
/// (f) Master weights and optimizer state are fp32 or wider.
struct narrow_master {
  static constexpr std::string_view name = "narrow_master";  ///< Printed name.
};
/// (g) float8 GEMM dimensions are multiples of 16 (cuBLASLt requires it).
struct fp8_alignment {
  static constexpr std::string_view name = "fp8_alignment";  ///< Printed name.
};

}  // namespace rule

/// True for the rule tags in precis::rule.
template <class T>
inline constexpr bool is_rule_v =
    std::is_same_v<T, rule::narrow_accumulate> || std::is_same_v<T, rule::unscaled_gradients> ||
    std::is_same_v<T, rule::fp32_operation> || std::is_same_v<T, rule::activation_range> ||
    std::is_same_v<T, rule::fp8_without_scaling> || std::is_same_v<T, rule::e5m2_forward> ||
    std::is_same_v<T, rule::narrow_master> || std::is_same_v<T, rule::fp8_alignment>;

/// Per-tensor scaling recipes a float8 policy names. The scalers that implement them
/// live in precis/scaling; a policy only records which one its tensors use.
namespace recipe {
/// No float8 scaling: what every non-float8 policy has.
struct none {
  static constexpr std::string_view name = "none";  ///< Printed name.
};
/// Scale from the maximum of a history of per-tensor amax values (delayed scaling).
struct delayed {
  static constexpr std::string_view name = "delayed";  ///< Printed name.
};
/// Scale from this step's amax (current scaling).
struct current {
  static constexpr std::string_view name = "current";  ///< Printed name.
};
}  // namespace recipe

/// True for the recipe tags in precis::recipe.
template <class T>
inline constexpr bool is_recipe_v = std::is_same_v<T, recipe::none> ||
                                    std::is_same_v<T, recipe::delayed> ||
                                    std::is_same_v<T, recipe::current>;

}  // namespace precis
