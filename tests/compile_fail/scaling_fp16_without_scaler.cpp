// Rule b where a policy meets a scaler: float16 gradients with no_scaling.
#include <precis/policy/presets.hpp>
#include <precis/scaling/scaling.hpp>
static_assert(precis::check_scaler<precis::presets::fp16_mixed, precis::no_scaling>());
