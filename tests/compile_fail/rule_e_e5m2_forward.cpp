// Rule e: float8_e5m2 for forward tensors.
#include <precis/policy/policy.hpp>
constexpr auto policies = precis::make_policy_map(
    precis::presets::bf16_mixed{},
    precis::for_op<precis::op::matmul>(precis::policy<precis::float8_e5m2, precis::bfloat16, float,
                                                      float, precis::float8_e5m2,
                                                      precis::recipe::delayed>{}));
