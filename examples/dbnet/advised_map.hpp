// made by: example_dbnet --policy fp32 --epochs 2 --monitor 10 --advise examples/dbnet/advised_map.hpp
// A precis policy map advised by precis::diagnostics::advise from a monitored run: 12 observed steps, headroom x16, at most 0.1% of a layer's gradients rounding to zero, float16 gradients judged at loss scale 2^14.
// Include it after the model's layer tags are declared, before any model is built with them.
// Layers:
//   0.0.stem (stem): forward amax 1.2523 x 16 <= 65504, 1.0596e-05% of gradients round to zero at loss scale 2^14 -> float16
//   0.0.1 (batch_norm): forward amax 10.586 x 16 <= 65504, 0.00037352% of gradients round to zero at loss scale 2^14 -> float16
//   0.0.2 (relu): forward amax 10.586 x 16 <= 65504, 0% of gradients round to zero at loss scale 2^14 -> float16
//   0.0.3 (max_pool2d): forward amax 10.586 x 16 <= 65504, 7.9473e-06% of gradients round to zero at loss scale 2^14 -> float16
//   0.0.4.0.conv_a (conv_a): input amax 10.586 x 16 <= 65504, 7.9473e-05% of gradients round to zero at loss scale 2^14 -> float16
//   0.0.4.0.1 (batch_norm): forward amax 8.9735 x 16 <= 65504, 0.00033379% of gradients round to zero at loss scale 2^14 -> float16
//   0.0.4.0.2 (relu): forward amax 8.9735 x 16 <= 65504, 4.7684e-05% of gradients round to zero at loss scale 2^14 -> float16
//   0.0.4.0.conv_b (conv_b): input amax 8.9735 x 16 <= 65504, 9.5367e-05% of gradients round to zero at loss scale 2^14 -> float16
//   0.0.4.0.4 (batch_norm): forward amax 15.313 x 16 <= 65504, 0.00022252% of gradients round to zero at loss scale 2^14 -> float16
//   0.0.4.1 (relu): forward amax 15.313 x 16 <= 65504, 0.00014305% of gradients round to zero at loss scale 2^14 -> float16
//   0.0.5.0.conv_a (conv_a): input amax 15.313 x 16 <= 65504, 0.00027021% of gradients round to zero at loss scale 2^14 -> float16
//   0.0.5.0.1 (batch_norm): input amax 14.439 x 16 <= 65504, 0.00061989% of gradients round to zero at loss scale 2^14 -> float16
//   0.0.5.0.2 (relu): forward amax 8.5863 x 16 <= 65504, 7.9473e-05% of gradients round to zero at loss scale 2^14 -> float16
//   0.0.5.0.conv_b (conv_b): input amax 8.5863 x 16 <= 65504, 0.00017484% of gradients round to zero at loss scale 2^14 -> float16
//   0.0.5.0.4 (batch_norm): forward amax 19.018 x 16 <= 65504, 0.00036558% of gradients round to zero at loss scale 2^14 -> float16
//   0.0.5.1 (relu): forward amax 19.018 x 16 <= 65504, 9.5367e-05% of gradients round to zero at loss scale 2^14 -> float16
//   0.1.0.0.conv_a (conv_a): forward amax 22.091 x 16 <= 65504, 9.5367e-05% of gradients round to zero at loss scale 2^14 -> float16
//   0.1.0.0.1 (batch_norm): input amax 22.091 x 16 <= 65504, 0.00034968% of gradients round to zero at loss scale 2^14 -> float16
//   0.1.0.0.2 (relu): forward amax 9.7816 x 16 <= 65504, 0% of gradients round to zero at loss scale 2^14 -> float16
//   0.1.0.0.conv_b (conv_b): input amax 9.7816 x 16 <= 65504, 3.1789e-05% of gradients round to zero at loss scale 2^14 -> float16
//   0.1.0.0.4 (batch_norm): forward amax 15.761 x 16 <= 65504, 0.00015895% of gradients round to zero at loss scale 2^14 -> float16
//   0.1.0.0.shortcut.shortcut (shortcut): input amax 19.018 x 16 <= 65504, 0% of gradients round to zero at loss scale 2^14 -> float16
//   0.1.0.0.shortcut.1 (batch_norm): input amax 17.121 x 16 <= 65504, 0.00047684% of gradients round to zero at loss scale 2^14 -> float16
//   0.1.0.1 (relu): forward amax 15.761 x 16 <= 65504, 6.3578e-05% of gradients round to zero at loss scale 2^14 -> float16
//   0.1.1.0.conv_a (conv_a): forward amax 16.4 x 16 <= 65504, 3.1789e-05% of gradients round to zero at loss scale 2^14 -> float16
//   0.1.1.0.1 (batch_norm): input amax 16.4 x 16 <= 65504, 0.00031789% of gradients round to zero at loss scale 2^14 -> float16
//   0.1.1.0.2 (relu): input amax 10.927 x 16 <= 65504, 0% of gradients round to zero at loss scale 2^14 -> float16
//   0.1.1.0.conv_b (conv_b): forward amax 12.382 x 16 <= 65504, 3.1789e-05% of gradients round to zero at loss scale 2^14 -> float16
//   0.1.1.0.4 (batch_norm): forward amax 24.068 x 16 <= 65504, 0.00025431% of gradients round to zero at loss scale 2^14 -> float16
//   0.1.1.1 (relu): forward amax 24.068 x 16 <= 65504, 9.5367e-05% of gradients round to zero at loss scale 2^14 -> float16
//   0.2.0.0.conv_a (conv_a): input amax 24.068 x 16 <= 65504, 0.00019073% of gradients round to zero at loss scale 2^14 -> float16
//   0.2.0.0.1 (batch_norm): input amax 20.557 x 16 <= 65504, 0.00038147% of gradients round to zero at loss scale 2^14 -> float16
//   0.2.0.0.2 (relu): forward amax 10.798 x 16 <= 65504, 6.3578e-05% of gradients round to zero at loss scale 2^14 -> float16
//   0.2.0.0.conv_b (conv_b): forward amax 18.378 x 16 <= 65504, 6.3578e-05% of gradients round to zero at loss scale 2^14 -> float16
//   0.2.0.0.4 (batch_norm): forward amax 20.106 x 16 <= 65504, 0.00038147% of gradients round to zero at loss scale 2^14 -> float16
//   0.2.0.0.shortcut.shortcut (shortcut): input amax 24.068 x 16 <= 65504, 0% of gradients round to zero at loss scale 2^14 -> float16
//   0.2.0.0.shortcut.1 (batch_norm): input amax 14.67 x 16 <= 65504, 0.00012716% of gradients round to zero at loss scale 2^14 -> float16
//   0.2.0.1 (relu): forward amax 20.106 x 16 <= 65504, 6.3578e-05% of gradients round to zero at loss scale 2^14 -> float16
//   0.2.1.0.conv_a (conv_a): forward amax 35.044 x 16 <= 65504, 6.3578e-05% of gradients round to zero at loss scale 2^14 -> float16
//   0.2.1.0.1 (batch_norm): input amax 35.044 x 16 <= 65504, 0.0008901% of gradients round to zero at loss scale 2^14 -> float16
//   0.2.1.0.2 (relu): forward amax 10.846 x 16 <= 65504, 0.00012716% of gradients round to zero at loss scale 2^14 -> float16
//   0.2.1.0.conv_b (conv_b): forward amax 25.72 x 16 <= 65504, 0.00012716% of gradients round to zero at loss scale 2^14 -> float16
//   0.2.1.0.4 (batch_norm): forward amax 29.919 x 16 <= 65504, 0.00050863% of gradients round to zero at loss scale 2^14 -> float16
//   0.2.1.1 (relu): forward amax 29.919 x 16 <= 65504, 6.3578e-05% of gradients round to zero at loss scale 2^14 -> float16
//   0.3.0.0.conv_a (conv_a): forward amax 50.626 x 16 <= 65504, 6.3578e-05% of gradients round to zero at loss scale 2^14 -> float16
//   0.3.0.0.1 (batch_norm): input amax 50.626 x 16 <= 65504, 0.00038147% of gradients round to zero at loss scale 2^14 -> float16
//   0.3.0.0.2 (relu): forward amax 11.01 x 16 <= 65504, 0.00012716% of gradients round to zero at loss scale 2^14 -> float16
//   0.3.0.0.conv_b (conv_b): forward amax 31.502 x 16 <= 65504, 0.00012716% of gradients round to zero at loss scale 2^14 -> float16
//   0.3.0.0.4 (batch_norm): input amax 31.502 x 16 <= 65504, 0.00012716% of gradients round to zero at loss scale 2^14 -> float16
//   0.3.0.0.shortcut.shortcut (shortcut): input amax 29.919 x 16 <= 65504, 0% of gradients round to zero at loss scale 2^14 -> float16
//   0.3.0.0.shortcut.1 (batch_norm): input amax 20.627 x 16 <= 65504, 0.00012716% of gradients round to zero at loss scale 2^14 -> float16
//   0.3.0.1 (relu): forward amax 19.626 x 16 <= 65504, 0.00012716% of gradients round to zero at loss scale 2^14 -> float16
//   0.3.1.0.conv_a (conv_a): forward amax 49.685 x 16 <= 65504, 0.00012716% of gradients round to zero at loss scale 2^14 -> float16
//   0.3.1.0.1 (batch_norm): input amax 49.685 x 16 <= 65504, 0.00038147% of gradients round to zero at loss scale 2^14 -> float16
//   0.3.1.0.2 (relu): forward amax 11.852 x 16 <= 65504, 0% of gradients round to zero at loss scale 2^14 -> float16
//   0.3.1.0.conv_b (conv_b): forward amax 34.842 x 16 <= 65504, 0% of gradients round to zero at loss scale 2^14 -> float16
//   0.3.1.0.4 (batch_norm): input amax 34.842 x 16 <= 65504, 0.00038147% of gradients round to zero at loss scale 2^14 -> float16
//   0.3.1.1 (relu): forward amax 27.936 x 16 <= 65504, 0% of gradients round to zero at loss scale 2^14 -> float16
//   1.0.p4 (lateral): input amax 19.018 x 16 <= 65504, 0.0011762% of gradients round to zero at loss scale 2^14 -> float16
//   1.0.p8 (lateral): input amax 24.068 x 16 <= 65504, 0.00019073% of gradients round to zero at loss scale 2^14 -> float16
//   1.0.p16 (lateral): forward amax 31.963 x 16 <= 65504, 0.00025431% of gradients round to zero at loss scale 2^14 -> float16
//   1.0.p32 (lateral): forward amax 34.483 x 16 <= 65504, 0% of gradients round to zero at loss scale 2^14 -> float16
//   1.1.0 (upsample): forward amax 50.805 x 16 <= 65504, 0.00055631% of gradients round to zero at loss scale 2^14 -> float16
//   1.1.1 (upsample): forward amax 54.186 x 16 <= 65504, 6.3578e-05% of gradients round to zero at loss scale 2^14 -> float16
//   1.1.2 (upsample): forward amax 34.483 x 16 <= 65504, 0% of gradients round to zero at loss scale 2^14 -> float16
//   1.2.p4 (smooth): forward amax 134.82 x 16 <= 65504, 0.0018517% of gradients round to zero at loss scale 2^14 -> float16
//   1.2.p8.smooth (smooth): forward amax 114.16 x 16 <= 65504, 0.00068347% of gradients round to zero at loss scale 2^14 -> float16
//   1.2.p8.1 (upsample): forward amax 114.16 x 16 <= 65504, 0.00038147% of gradients round to zero at loss scale 2^14 -> float16
//   1.2.p16.smooth (smooth): forward amax 166.6 x 16 <= 65504, 0.00031789% of gradients round to zero at loss scale 2^14 -> float16
//   1.2.p16.1 (upsample): forward amax 166.6 x 16 <= 65504, 0% of gradients round to zero at loss scale 2^14 -> float16
//   1.2.p32.smooth (smooth): forward amax 39.197 x 16 <= 65504, 0% of gradients round to zero at loss scale 2^14 -> float16
//   1.2.p32.1 (upsample): forward amax 39.197 x 16 <= 65504, 0% of gradients round to zero at loss scale 2^14 -> float16
//   2.prob.conv.head_conv (head_conv): forward amax 433.31 x 16 <= 65504, 0.0026902% of gradients round to zero at loss scale 2^14 -> float16
//   2.prob.conv.head_norm (head_norm): input amax 433.31 x 16 <= 65504, 0.0054359% of gradients round to zero at loss scale 2^14 -> float16
//   2.prob.conv.head_relu (head_relu): forward amax 11.599 x 16 <= 65504, 0% of gradients round to zero at loss scale 2^14 -> float16
//   2.prob.up.head_up (head_up): input amax 11.599 x 16 <= 65504, 1.5895e-05% of gradients round to zero at loss scale 2^14 -> float16
//   2.prob.up.head_norm (head_norm): forward amax 21.606 x 16 <= 65504, 3.9736e-05% of gradients round to zero at loss scale 2^14 -> float16
//   2.prob.up.head_relu (head_relu): forward amax 21.606 x 16 <= 65504, 0.012434% of gradients round to zero at loss scale 2^14 -> float16
//   2.prob.head_out (head_out): input amax 21.606 x 16 <= 65504, 0.02478% of gradients round to zero at loss scale 2^14 -> float16
//   2.thresh.0.conv.head_conv (head_conv): forward amax 365.27 x 16 <= 65504, 0.0039339% of gradients round to zero at loss scale 2^14 -> float16
//   2.thresh.0.conv.head_norm (head_norm): input amax 365.27 x 16 <= 65504, 0.0082016% of gradients round to zero at loss scale 2^14 -> float16
//   2.thresh.0.conv.head_relu (head_relu): forward amax 11.512 x 16 <= 65504, 9.5367e-05% of gradients round to zero at loss scale 2^14 -> float16
//   2.thresh.0.up.head_up (head_up): input amax 11.512 x 16 <= 65504, 0.00019073% of gradients round to zero at loss scale 2^14 -> float16
//   2.thresh.0.up.head_norm (head_norm): forward amax 20.855 x 16 <= 65504, 0.00030597% of gradients round to zero at loss scale 2^14 -> float16
//   2.thresh.0.up.head_relu (head_relu): forward amax 20.855 x 16 <= 65504, 0.021497% of gradients round to zero at loss scale 2^14 -> float16
//   2.thresh.0.head_out (head_out): input amax 20.855 x 16 <= 65504, 0.042748% of gradients round to zero at loss scale 2^14 -> float16
//   2.thresh.sigmoid (sigmoid): 1.5274% of gradients round to zero in float16 at loss scale 2^14 -> bfloat16
#pragma once

#include <precis/policy/policy.hpp>

template <>
struct precis::measured_max_abs<::dbnet::stem> {
  using type = precis::max_abs<21ULL>;  // measured amax 1.2523 x 16
};
template <>
struct precis::measured_max_abs<::dbnet::conv_a> {
  using type = precis::max_abs<811ULL>;  // measured amax 50.626 x 16
};
template <>
struct precis::measured_max_abs<::dbnet::conv_b> {
  using type = precis::max_abs<558ULL>;  // measured amax 34.842 x 16
};
template <>
struct precis::measured_max_abs<::dbnet::shortcut> {
  using type = precis::max_abs<479ULL>;  // measured amax 29.919 x 16
};
template <>
struct precis::measured_max_abs<::dbnet::lateral> {
  using type = precis::max_abs<552ULL>;  // measured amax 34.483 x 16
};
template <>
struct precis::measured_max_abs<::dbnet::smooth> {
  using type = precis::max_abs<2666ULL>;  // measured amax 166.6 x 16
};
template <>
struct precis::measured_max_abs<::dbnet::head_conv> {
  using type = precis::max_abs<6933ULL>;  // measured amax 433.31 x 16
};
template <>
struct precis::measured_max_abs<::dbnet::head_norm> {
  using type = precis::max_abs<6933ULL>;  // measured amax 433.31 x 16
};
template <>
struct precis::measured_max_abs<::dbnet::head_relu> {
  using type = precis::max_abs<346ULL>;  // measured amax 21.606 x 16
};
template <>
struct precis::measured_max_abs<::dbnet::head_up> {
  using type = precis::max_abs<186ULL>;  // measured amax 11.599 x 16
};
template <>
struct precis::measured_max_abs<::dbnet::head_out> {
  using type = precis::max_abs<346ULL>;  // measured amax 21.606 x 16
};
template <>
struct precis::measured_max_abs<::dbnet::thresh_sigmoid> {
  using type = precis::max_abs<228ULL>;  // measured amax 14.2 x 16
};

inline constexpr auto advised_map = precis::make_policy_map(
    precis::presets::fp16_mixed{},  // default: float16, the advice of 14 of 15 tags and positional kinds
    precis::for_layer<::dbnet::thresh_sigmoid>(precis::presets::bf16_mixed{})  // 2.thresh.sigmoid: 1.5274% of gradients round to zero in float16 at loss scale 2^14 -> bfloat16
);
