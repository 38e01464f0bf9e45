// precis/policy/presets.hpp: the policies most models start from.
#pragma once

#include <precis/numeric/bfloat16.hpp>
#include <precis/numeric/float16.hpp>
#include <precis/numeric/float8.hpp>
#include <precis/policy/definition.hpp>

namespace precis::presets {

/// Everything in float: the reference every other policy is measured against.
using fp32 = policy<float, float, float, float>;

/// float tensors; matrix products on tensor cores in TF32 (10 mantissa bits), float
/// accumulation. Other operations compute in float (the rule set raises tfloat32 to float
/// for them, and elementwise kernels compute float-stored tensors in float).
using tf32 = policy<float, tfloat32, float, float>;

/// bfloat16 storage and compute, float accumulation, float master weights. bfloat16 has
/// float's range, so its gradients need no loss scaling.
using bf16_mixed = policy<bfloat16, bfloat16, float, float>;

/// float16 storage and compute, float accumulation, float master weights. float16
/// gradients need loss scaling (precis::scaler_for gives dynamic_scaler).
using fp16_mixed = policy<float16, float16, float, float>;

/// bfloat16 everywhere, master weights included: half the optimizer memory, at the cost
/// of updates smaller than bfloat16's resolution being lost. An expert choice: it waives
/// rule::narrow_master, and the waiver shows in every type and table that uses it.
using bf16_pure = unsafe<policy<bfloat16, bfloat16, float, bfloat16>, rule::narrow_master>;

/// float8 matrix-product inputs with per-tensor delayed scaling: float8_e4m3 forward,
/// float8_e5m2 gradients, float accumulation; every other operation stores bfloat16
/// (the rule set's float8 row) and the master weights are float.
using fp8_hybrid =
    policy<float8_e4m3, bfloat16, float, float, float8_e5m2, recipe::delayed>;

}  // namespace precis::presets
