// Rule d: a ViT-H-like layer declares activations beyond float16's 65504.
#include <precis/policy/policy.hpp>
struct mlp : precis::layer<precis::op::matmul, precis::max_abs<200000>> {};
constexpr auto policies = precis::make_policy_map(precis::presets::fp16_mixed{});
auto p = precis::policy_for<mlp>(policies);
