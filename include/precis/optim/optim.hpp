/// @file
/// Optimizers with float master weights and state, learning-rate schedules.
#pragma once

#include <precis/optim/checkpoint_file.hpp>
#include <precis/optim/optimizers.hpp>
#include <precis/optim/update.hpp>
