// precis/precis.hpp: all of precis.
#pragma once

#include <precis/config.hpp>
#include <precis/numeric/numeric.hpp>
#include <precis/policy/policy.hpp>
#include <precis/scaling/scaling.hpp>
