/// @file
/// Loss scalers, typed gradients, fused unscale, float8 recipes, checkpoints.
#pragma once

#include <precis/scaling/checkpoint.hpp>
#include <precis/scaling/fp8.hpp>
#include <precis/scaling/gradients.hpp>
#include <precis/scaling/reducer.hpp>
#include <precis/scaling/scalers.hpp>
#include <precis/kernels/unscale.hpp>
