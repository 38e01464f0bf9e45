// Rule a: accumulating float16 math in bfloat16 loses precision.
#include <precis/policy/policy.hpp>
constexpr auto policies = precis::make_policy_map(
    precis::policy<precis::float16, precis::float16, precis::bfloat16>{});
