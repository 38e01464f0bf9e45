// unsafe<> names something that is not a rule.
#include <precis/policy/policy.hpp>
precis::unsafe<precis::presets::fp16_mixed, int> p;
