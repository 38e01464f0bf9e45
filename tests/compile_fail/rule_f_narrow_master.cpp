// Rule f: bfloat16 master weights without the explicit waiver bf16_pure carries.
#include <precis/policy/policy.hpp>
constexpr auto policies = precis::make_policy_map(
    precis::policy<precis::bfloat16, precis::bfloat16, float, precis::bfloat16>{});
