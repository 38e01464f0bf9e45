// Rule c: an explicit override makes softmax compute in float16.
#include <precis/policy/policy.hpp>
struct scores : precis::layer<precis::op::softmax> {};
constexpr auto policies = precis::make_policy_map(
    precis::presets::bf16_mixed{}, precis::for_op<precis::op::softmax>(precis::presets::fp16_mixed{}));
using resolved = precis::policy_for_t<scores, decltype(policies)>;
resolved p;
