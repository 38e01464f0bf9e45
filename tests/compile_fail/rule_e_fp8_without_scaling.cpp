// Rule e: float8 storage with no scaling recipe.
#include <precis/policy/policy.hpp>
constexpr auto policies = precis::make_policy_map(precis::policy<
    precis::float8_e4m3, precis::bfloat16, float, float, precis::float8_e5m2>{});
