// The DBNet example's policy maps beyond the presets, shared by its programs and benchmarks
// (example_dbnet, example_dbnet_cuda, bench_dbnet_gpu).
#pragma once

#include "loss.hpp"
#include "model.hpp"

#include <precis/precis.hpp>

namespace dbnet {

using namespace precis;

// float16 backbone and neck, the heads (and their norms, ReLUs and sigmoid) in float: a map
// with overrides; the float16 layers' gradients need a loss scaler (rule b).
using fp16_fp32_head_map = decltype(make_policy_map(
    presets::fp16_mixed{}, for_layer<dbnet::head_conv>(presets::fp32{}), for_layer<dbnet::head_norm>(presets::fp32{}),
    for_layer<dbnet::head_relu>(presets::fp32{}), for_layer<dbnet::head_up>(presets::fp32{}),
    for_layer<dbnet::head_out>(presets::fp32{}), for_layer<dbnet::thresh_sigmoid>(presets::fp32{})));

// The seed's configuration: float16 storage everywhere (convolutions sum in float, as cuDNN
// does), the loss terms, their sums and the binarization in float16, no loss scaler. It
// breaks rule fp32_operation twice (db_loss, binarize) and rule unscaled_gradients; here
// every one of them is waived, visibly.
using half_everything = policy<float16, float16, float16, float, float16>;
using seed_narrow = unsafe<half_everything, rule::fp32_operation, rule::unscaled_gradients>;
using seed_waived_map =
    decltype(make_policy_map(unsafe<presets::fp16_mixed, rule::unscaled_gradients>{},
                             for_layer<dbnet::db_loss>(seed_narrow{}), for_layer<dbnet::binarize>(seed_narrow{})));

}  // namespace dbnet
