// precis/nn/nn.hpp: layers, blueprints and their composition, nn::build, describe, losses
// and the training step.
#pragma once

#include <precis/nn/activation.hpp>
#include <precis/nn/build.hpp>
#include <precis/nn/cast.hpp>
#include <precis/nn/compose.hpp>
#include <precis/nn/describe.hpp>
#include <precis/nn/linear.hpp>
#include <precis/nn/loss.hpp>
#include <precis/nn/module.hpp>
#include <precis/nn/multi.hpp>
#include <precis/nn/norm.hpp>
#include <precis/nn/parameter.hpp>
#include <precis/nn/train.hpp>
