/// @file
/// The host kernels and their context.
#pragma once

#include <precis/kernels/cast.hpp>
#include <precis/kernels/common.hpp>
#include <precis/kernels/context.hpp>
#include <precis/kernels/conv.hpp>
#include <precis/kernels/elementwise.hpp>
#include <precis/kernels/gemm.hpp>
#include <precis/kernels/loss.hpp>
#include <precis/kernels/norm.hpp>
#include <precis/kernels/pooling.hpp>
#include <precis/kernels/reduce.hpp>
#include <precis/kernels/softmax.hpp>
#include <precis/kernels/unscale.hpp>
