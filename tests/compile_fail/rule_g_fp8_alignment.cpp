// Rule g: a float8 matrix product with N = 100, not a multiple of 16.
#include <precis/policy/policy.hpp>
struct proj : precis::layer<precis::op::matmul, precis::gemm_shape<64, 100, 64>> {};
constexpr auto policies = precis::make_policy_map(precis::presets::fp8_hybrid{});
auto p = precis::policy_for<proj>(policies);
