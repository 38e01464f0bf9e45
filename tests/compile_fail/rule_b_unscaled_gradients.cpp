// Rule b: float16 gradients meet a scaler that does not scale the loss.
#include <precis/policy/policy.hpp>
static_assert(precis::check_gradient_scaling<precis::presets::fp16_mixed, false>());
