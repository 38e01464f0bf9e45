/// @file
/// The numerics monitor and the policy advisor.
#pragma once

#include <precis/diagnostics/advisor.hpp>
#include <precis/diagnostics/monitor.hpp>
