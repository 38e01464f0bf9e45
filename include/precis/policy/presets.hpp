/// @file
/// The policies most models start from.
#pragma once

#include <precis/numeric/bfloat16.hpp>
#include <precis/numeric/float16.hpp>
#include <precis/numeric/float8.hpp>
#include <precis/policy/definition.hpp>

namespace precis::presets {

/// Everything in float: the reference every other policy is measured against.
using fp32 = policy<float, float, float, float>;

/// fp32 with the hardware's products (products::hardware): float matrix products and
/// convolutions on oneDNN's float kernels where precis::onednn is linked, as PyTorch's
/// float32 runs them; sums in oneDNN's order (the same bits for a given machine and thread
/// count, not across them), subnormals kept. Everything else is fp32's.
using fp32_hardware = policy<float, float, float, float, float, recipe::none, products::hardware>;

/// float tensors; matrix products on tensor cores in TF32 (10 mantissa bits), float
/// accumulation. Other operations compute in float (the rule set raises tfloat32 to float
/// for them, and elementwise kernels compute float-stored tensors in float).
using tf32 = policy<float, tfloat32, float, float>;

/// bfloat16 storage and compute, float accumulation, float master weights. bfloat16 has
/// float's range, so its gradients need no loss scaling. Matrix products and convolutions
/// use the hardware's products (products::hardware: AMX / AVX512-BF16 through oneDNN where
/// precis::onednn is linked and the CPU has them, tensor cores on the GPU), as PyTorch's
/// autocast does: subnormals flushed, the hardware's summation order.
using bf16_mixed =
    policy<bfloat16, bfloat16, float, float, bfloat16, recipe::none, products::hardware>;

/// bf16_mixed with precis's exact products (products::exact): subnormals kept, and the
/// same bits on every machine and for every thread count.
using bf16_exact = policy<bfloat16, bfloat16, float, float>;

/// float16 storage and compute, float accumulation, float master weights. float16
/// gradients need loss scaling (precis::scaler_for gives dynamic_scaler).
using fp16_mixed = policy<float16, float16, float, float>;

/// fp16_mixed with the hardware's products (products::hardware): on the CPU, float16 matrix
/// products and convolutions run on oneDNN's float kernels where precis::onednn is linked
/// (the inputs converted to float, exactly; each product of two float16 values is exact in
/// float, so nothing is flushed), summed in oneDNN's order: the same bits for a given machine
/// and thread count, not across them. Everything else is fp16_mixed's, loss scaling included.
using fp16_hardware =
    policy<float16, float16, float, float, float16, recipe::none, products::hardware>;

/// bfloat16 everywhere, master weights included: half the optimizer memory, at the cost
/// of updates smaller than bfloat16's resolution being lost. An expert choice: it waives
/// rule::narrow_master, and the waiver shows in every type and table that uses it. Its
/// products are the hardware's, as bf16_mixed's.
using bf16_pure = unsafe<
    policy<bfloat16, bfloat16, float, bfloat16, bfloat16, recipe::none, products::hardware>,
    rule::narrow_master>;

/// float8 matrix-product inputs with per-tensor delayed scaling: float8_e4m3 forward,
/// float8_e5m2 gradients, float accumulation; every other operation stores bfloat16
/// (the rule set's float8 row) and the master weights are float.
using fp8_hybrid =
    policy<float8_e4m3, bfloat16, float, float, float8_e5m2, recipe::delayed>;

}  // namespace precis::presets
