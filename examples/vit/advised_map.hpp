// made by: example_vit --policy fp32 --epochs 1 --monitor 20 --advise examples/vit/advised_map.hpp
// A precis policy map advised by precis::diagnostics::advise from a monitored run: 24 observed steps, headroom x16, at most 0.1% of a layer's gradients rounding to zero, float16 gradients judged at loss scale 2^15.
// Include it after the model's layer tags are declared, before any model is built with them.
// Layers:
//   patch_embed (patch_embed): forward amax 2.9183 x 16 <= 65504, 0% of gradients round to zero at loss scale 2^15 -> float16
//   2 (embedding): forward amax 2.9183 x 16 <= 65504, 0% of gradients round to zero at loss scale 2^15 -> float16
//   3 (embedding): forward amax 2.9539 x 16 <= 65504, 0% of gradients round to zero at loss scale 2^15 -> float16
//   encoder.0.0.norm1 (norm1): forward amax 4.6464 x 16 <= 65504, 5.0863e-05% of gradients round to zero at loss scale 2^15 -> float16
//   encoder.0.0.attn.qkv (qkv): input amax 4.6464 x 16 <= 65504, 0.00066774% of gradients round to zero at loss scale 2^15 -> float16
//   encoder.0.0.attn.scores (scores): forward amax 6.9685 x 16 <= 65504, 0.00061035% of gradients round to zero at loss scale 2^15 -> float16
//   encoder.0.0.attn.softmax (softmax): input amax 6.9685 x 16 <= 65504, 0.0063379% of gradients round to zero at loss scale 2^15 -> float16
//   encoder.0.0.attn.context (context): forward amax 1.7746 x 16 <= 65504, 4.6855e-05% of gradients round to zero at loss scale 2^15 -> float16
//   encoder.0.0.attn.out (proj): forward amax 3.6067 x 16 <= 65504, 6.1035e-05% of gradients round to zero at loss scale 2^15 -> float16
//   encoder.0.1.norm2 (norm2): forward amax 4.8259 x 16 <= 65504, 0.00012207% of gradients round to zero at loss scale 2^15 -> float16
//   encoder.0.1.mlp.fc1 (fc1): input amax 4.8259 x 16 <= 65504, 0.00025431% of gradients round to zero at loss scale 2^15 -> float16
//   encoder.0.1.mlp.1 (gelu): input amax 3.5744 x 16 <= 65504, 0.0039215% of gradients round to zero at loss scale 2^15 -> float16
//   encoder.0.1.mlp.fc2 (fc2): forward amax 4.1713 x 16 <= 65504, 0.00024923% of gradients round to zero at loss scale 2^15 -> float16
//   encoder.1.0.norm1 (norm1): forward amax 5.0208 x 16 <= 65504, 0.00014242% of gradients round to zero at loss scale 2^15 -> float16
//   encoder.1.0.attn.qkv (qkv): input amax 5.0208 x 16 <= 65504, 0.0020032% of gradients round to zero at loss scale 2^15 -> float16
//   encoder.1.0.attn.scores (scores): forward amax 11.695 x 16 <= 65504, 0.0013529% of gradients round to zero at loss scale 2^15 -> float16
//   encoder.1.0.attn.softmax (softmax): 0.38615% of gradients round to zero in float16 at loss scale 2^15 -> bfloat16
//   encoder.1.0.attn.context (context): forward amax 2.7122 x 16 <= 65504, 9.8643e-05% of gradients round to zero at loss scale 2^15 -> float16
//   encoder.1.0.attn.out (proj): forward amax 4.7409 x 16 <= 65504, 0.00035604% of gradients round to zero at loss scale 2^15 -> float16
//   encoder.1.1.norm2 (norm2): input amax 4.7409 x 16 <= 65504, 0.00061035% of gradients round to zero at loss scale 2^15 -> float16
//   encoder.1.1.mlp.fc1 (fc1): input amax 4.4445 x 16 <= 65504, 0.00060018% of gradients round to zero at loss scale 2^15 -> float16
//   encoder.1.1.mlp.1 (gelu): input amax 3.3077 x 16 <= 65504, 0.0093104% of gradients round to zero at loss scale 2^15 -> float16
//   encoder.1.1.mlp.fc2 (fc2): forward amax 4.9019 x 16 <= 65504, 0.00056712% of gradients round to zero at loss scale 2^15 -> float16
//   encoder.2.0.norm1 (norm1): input amax 4.9019 x 16 <= 65504, 0.00034587% of gradients round to zero at loss scale 2^15 -> float16
//   encoder.2.0.attn.qkv (qkv): input amax 4.4233 x 16 <= 65504, 0.0066774% of gradients round to zero at loss scale 2^15 -> float16
//   encoder.2.0.attn.scores (scores): forward amax 4.6767 x 16 <= 65504, 0.0045115% of gradients round to zero at loss scale 2^15 -> float16
//   encoder.2.0.attn.softmax (softmax): input amax 4.6767 x 16 <= 65504, 0.019072% of gradients round to zero at loss scale 2^15 -> float16
//   encoder.2.0.attn.context (context): forward amax 2.1229 x 16 <= 65504, 0.00024907% of gradients round to zero at loss scale 2^15 -> float16
//   encoder.2.0.attn.out (proj): forward amax 5.447 x 16 <= 65504, 0.00085449% of gradients round to zero at loss scale 2^15 -> float16
//   encoder.2.1.norm2 (norm2): input amax 5.447 x 16 <= 65504, 0.0016988% of gradients round to zero at loss scale 2^15 -> float16
//   encoder.2.1.mlp.fc1 (fc1): input amax 4.3482 x 16 <= 65504, 0.0014852% of gradients round to zero at loss scale 2^15 -> float16
//   encoder.2.1.mlp.1 (gelu): input amax 3.2997 x 16 <= 65504, 0.02047% of gradients round to zero at loss scale 2^15 -> float16
//   encoder.2.1.mlp.fc2 (fc2): forward amax 6.0776 x 16 <= 65504, 0.0014852% of gradients round to zero at loss scale 2^15 -> float16
//   encoder.3.0.norm1 (norm1): input amax 6.0776 x 16 <= 65504, 0.00041707% of gradients round to zero at loss scale 2^15 -> float16
//   encoder.3.0.attn.qkv (qkv): input amax 4.5164 x 16 <= 65504, 0.0036725% of gradients round to zero at loss scale 2^15 -> float16
//   encoder.3.0.attn.scores (scores): forward amax 15.621 x 16 <= 65504, 0.078969% of gradients round to zero at loss scale 2^15 -> float16
//   encoder.3.0.attn.softmax (softmax): input amax 15.621 x 16 <= 65504, 0.0016211% of gradients round to zero at loss scale 2^15 -> float16
//   encoder.3.0.attn.context (context): forward amax 3.5017 x 16 <= 65504, 0.062584% of gradients round to zero at loss scale 2^15 -> float16
//   encoder.3.0.attn.out (proj): forward amax 6.5582 x 16 <= 65504, 0% of gradients round to zero at loss scale 2^15 -> float16
//   encoder.3.1.norm2 (norm2): input amax 6.5582 x 16 <= 65504, 0% of gradients round to zero at loss scale 2^15 -> float16
//   encoder.3.1.mlp.fc1 (fc1): input amax 4.4235 x 16 <= 65504, 0% of gradients round to zero at loss scale 2^15 -> float16
//   encoder.3.1.mlp.1 (gelu): input amax 3.4804 x 16 <= 65504, 0% of gradients round to zero at loss scale 2^15 -> float16
//   encoder.3.1.mlp.fc2 (fc2): forward amax 7.1207 x 16 <= 65504, 0% of gradients round to zero at loss scale 2^15 -> float16
//   5 (layer_norm): input amax 7.1207 x 16 <= 65504, 0% of gradients round to zero at loss scale 2^15 -> float16
//   head (head): forward amax 7.3537 x 16 <= 65504, 0% of gradients round to zero at loss scale 2^15 -> float16
#pragma once

#include <precis/policy/policy.hpp>

template <>
struct precis::measured_max_abs<::vit::patch_embed> {
  using type = precis::max_abs<47ULL>;  // measured amax 2.9183 x 16
};
template <>
struct precis::measured_max_abs<::vit::norm1> {
  using type = precis::max_abs<98ULL>;  // measured amax 6.0776 x 16
};
template <>
struct precis::measured_max_abs<::vit::qkv> {
  using type = precis::max_abs<81ULL>;  // measured amax 5.0208 x 16
};
template <>
struct precis::measured_max_abs<::vit::scores> {
  using type = precis::max_abs<250ULL>;  // measured amax 15.621 x 16
};
template <>
struct precis::measured_max_abs<::vit::attn_softmax> {
  using type = precis::max_abs<250ULL>;  // measured amax 15.621 x 16
};
template <>
struct precis::measured_max_abs<::vit::context> {
  using type = precis::max_abs<57ULL>;  // measured amax 3.5017 x 16
};
template <>
struct precis::measured_max_abs<::vit::attn_out> {
  using type = precis::max_abs<105ULL>;  // measured amax 6.5582 x 16
};
template <>
struct precis::measured_max_abs<::vit::norm2> {
  using type = precis::max_abs<105ULL>;  // measured amax 6.5582 x 16
};
template <>
struct precis::measured_max_abs<::vit::mlp_fc1> {
  using type = precis::max_abs<78ULL>;  // measured amax 4.8259 x 16
};
template <>
struct precis::measured_max_abs<::vit::mlp_fc2> {
  using type = precis::max_abs<114ULL>;  // measured amax 7.1207 x 16
};
template <>
struct precis::measured_max_abs<::vit::head> {
  using type = precis::max_abs<118ULL>;  // measured amax 7.3537 x 16
};

inline constexpr auto advised_map = precis::make_policy_map(
    precis::presets::fp16_mixed{},  // default: float16, the advice of 12 of 13 tags and positional kinds
    precis::for_layer<::vit::attn_softmax>(precis::policy<precis::bfloat16, float, float, float>{})  // encoder.1.0.attn.softmax: 0.38615% of gradients round to zero in float16 at loss scale 2^15 -> bfloat16
);
