/// @file
/// Precision policies, presets, per-layer maps and their rules.
#pragma once

#include <precis/policy/checks.hpp>
#include <precis/policy/definition.hpp>
#include <precis/policy/describe.hpp>
#include <precis/policy/layer.hpp>
#include <precis/policy/map.hpp>
#include <precis/policy/ops.hpp>
#include <precis/policy/precision.hpp>
#include <precis/policy/presets.hpp>
#include <precis/policy/rule_set.hpp>
#include <precis/policy/rules.hpp>
