/// @file
/// Layers, blueprints and their composition, nn::build, describe, losses and the training step.
#pragma once

#include <precis/nn/activation.hpp>
#include <precis/nn/attention.hpp>
#include <precis/nn/build.hpp>
#include <precis/nn/cast.hpp>
#include <precis/nn/compose.hpp>
#include <precis/nn/conv.hpp>
#include <precis/nn/describe.hpp>
#include <precis/nn/embedding.hpp>
#include <precis/nn/layout.hpp>
#include <precis/nn/linear.hpp>
#include <precis/nn/loss.hpp>
#include <precis/nn/module.hpp>
#include <precis/nn/multi.hpp>
#include <precis/nn/norm.hpp>
#include <precis/nn/parameter.hpp>
#include <precis/nn/pooling.hpp>
#include <precis/nn/shape.hpp>
#include <precis/nn/state.hpp>
#include <precis/nn/train.hpp>
