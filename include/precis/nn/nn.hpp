// precis/nn/nn.hpp: layers, composition and the training step.
#pragma once

#include <precis/nn/layers.hpp>
#include <precis/nn/loss.hpp>
#include <precis/nn/parameter.hpp>
#include <precis/nn/sequential.hpp>
#include <precis/nn/train.hpp>
