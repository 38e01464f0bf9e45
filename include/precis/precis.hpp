/// @file
/// All of precis that runs on the host. The CUDA backend (precis/kernels/cuda/,
/// precis/tensor/device_tensor.hpp) is included separately, from code built with CUDA
/// (PRECIS_CUDA=1 or nvcc).
#pragma once

#include <precis/config.hpp>
#include <precis/diagnostics/diagnostics.hpp>
#include <precis/kernels/kernels.hpp>
#include <precis/nn/nn.hpp>
#include <precis/numeric/numeric.hpp>
#include <precis/optim/optim.hpp>
#include <precis/policy/policy.hpp>
#include <precis/scaling/scaling.hpp>
#include <precis/tensor/host_tensor.hpp>
