// Two overrides for the same operation kind.
#include <precis/policy/policy.hpp>
constexpr auto policies = precis::make_policy_map(
    precis::presets::bf16_mixed{}, precis::for_op<precis::op::loss>(precis::presets::fp32{}),
    precis::for_op<precis::op::loss>(precis::presets::bf16_mixed{}));
