// precis/optim/optim.hpp: optimizers with float master weights and state, learning-rate
// schedules.
#pragma once

#include <precis/optim/optimizers.hpp>
