/// @file
/// Every number format and conversion.
#pragma once

#include <precis/numeric/bfloat16.hpp>
#include <precis/numeric/convert.hpp>
#include <precis/numeric/cuda_types.hpp>
#include <precis/numeric/float16.hpp>
#include <precis/numeric/float8.hpp>
#include <precis/numeric/format_traits.hpp>
