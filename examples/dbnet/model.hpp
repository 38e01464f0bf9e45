// DBNet written once as a blueprint with layer tags (the differentiable-binarization text
// detector of Liao et al., with MhLiao's SegDetector head):
//
//     dbnet::blueprint(config)   [N, 3, H, W] images -> (P logits, T) at [N, 1, H, W]
//
//   - backbone: ResNet-18's layout, widths scaled by config::width (64 in ResNet-18): a
//     7x7/2 stem with batch norm, ReLU and a 3x3/2 max pool, then four stages of two basic
//     blocks (strides 1, 2, 2, 2), their outputs at 1/4, 1/8, 1/16 and 1/32 of the image
//     (nn::taps);
//   - neck (FPN): a 1x1 lateral per level to config::inner channels, nearest 2x upsampling
//     added top-down (nn::top_down), a 3x3 smoothing to inner / 4 channels per level,
//     upsampled to 1/4 and concatenated (inner channels at 1/4);
//   - two heads (nn::fork), named "prob" and "thresh": 3x3 conv, batch norm, ReLU, a 2x2/2
//     transposed conv, batch norm, ReLU, a 2x2/2 transposed conv to one channel: full
//     resolution. The threshold head ends in a sigmoid (T in [0, 1]); the probability head
//     gives logits, so that the loss can take its BCE in the with-logits form (BCE on
//     rounded probabilities is one of float16's failure modes) and P = sigmoid(logits) is
//     taken where it is needed, in float.
//
// Convolutions followed by batch norm have no bias, as in the reference. Every layer a
// policy map may want to treat apart has its own tag: the backbone's (stem, conv_a, conv_b,
// shortcut), the neck's (lateral, smooth) and the heads' (head_conv, head_norm, head_relu,
// head_up, head_out; thresh_sigmoid), so that a map can give the heads a policy of their
// own. The binarization B = 1 / (1 + exp(-k (P - T))) is not part of the blueprint: the
// loss (loss.hpp) takes it under its own tag, dbnet::binarize (op::exp).
#pragma once

#include <precis/precis.hpp>

#include <cstddef>
#include <string>
#include <string_view>

namespace dbnet {

using namespace precis;

// ---- layer tags ----

struct stem : layer<op::conv> {
  static constexpr std::string_view name = "stem";
};
/// A basic block's first 3x3 convolution (strided in the first block of stages 2-4).
struct conv_a : layer<op::conv> {
  static constexpr std::string_view name = "conv_a";
};
/// A basic block's second 3x3 convolution.
struct conv_b : layer<op::conv> {
  static constexpr std::string_view name = "conv_b";
};
/// The 1x1 projection of a block that changes width or resolution.
struct shortcut : layer<op::conv> {
  static constexpr std::string_view name = "shortcut";
};
/// The FPN's 1x1 lateral convolutions.
struct lateral : layer<op::conv> {
  static constexpr std::string_view name = "lateral";
};
/// The FPN's 3x3 smoothing convolutions.
struct smooth : layer<op::conv> {
  static constexpr std::string_view name = "smooth";
};
struct head_conv : layer<op::conv> {
  static constexpr std::string_view name = "head_conv";
};
struct head_up : layer<op::conv> {
  static constexpr std::string_view name = "head_up";
};
struct head_out : layer<op::conv> {
  static constexpr std::string_view name = "head_out";
};
/// The heads' batch norms.
struct head_norm : layer<op::batch_norm> {
  static constexpr std::string_view name = "head_norm";
};
/// The heads' ReLUs.
struct head_relu : layer<op::elementwise> {
  static constexpr std::string_view name = "head_relu";
};
/// The threshold head's sigmoid. nn's activations take op::elementwise tags, so its exp is
/// computed in the policy's compute type (float under the mixed presets); no rule yet
/// keeps a float16-compute policy off it.
struct thresh_sigmoid : layer<op::elementwise> {
  static constexpr std::string_view name = "sigmoid";
};

/// The sizes of a DBNet.
struct config {
  /// Channels of the backbone's first stage (64 in ResNet-18; the stages have 1, 2, 4 and
  /// 8 times as many).
  std::size_t width = 64;
  /// Channels of the FPN's laterals (256 in the reference); the smoothed levels have a
  /// quarter each, the heads' hidden layers a quarter.
  std::size_t inner = 256;
  /// Throws precis::error unless the sizes make a model.
  void validate() const {
    if (width == 0 || inner == 0 || inner % 4 != 0) {
      throw error("dbnet::config: width must be positive and inner a positive multiple of 4");
    }
  }
  /// Images must be a multiple of this on both sides (the backbone halves them five times).
  static constexpr std::size_t image_multiple = 32;
};

/// A ResNet basic block's body: conv3x3 (stride) - BN - ReLU - conv3x3 - BN.
inline auto block_body(std::size_t in, std::size_t out, std::size_t stride) {
  return nn::seq(nn::conv2d<conv_a>(in, out, 3, {.stride = {stride, stride}, .padding = {1, 1}}, nn::no_bias),
                 nn::batch_norm(out), nn::relu(), nn::conv2d<conv_b>(out, out, 3, {.padding = {1, 1}}, nn::no_bias),
                 nn::batch_norm(out));
}

/// A basic block that keeps width and resolution: body + x, then ReLU.
inline auto identity_block(std::size_t channels) {
  return nn::seq(nn::residual(block_body(channels, channels, 1)), nn::relu());
}

/// A basic block that changes width and halves the resolution: body + a 1x1/2 projection
/// with BN, then ReLU.
inline auto projected_block(std::size_t in, std::size_t out) {
  return nn::seq(nn::residual(block_body(in, out, 2), nn::seq(nn::conv2d<shortcut>(in, out, 1, {.stride = {2, 2}}, nn::no_bias),
                                                            nn::batch_norm(out))),
                 nn::relu());
}

/// Stages 2-4: a projected block, then an identity block.
inline auto stage(std::size_t in, std::size_t out) { return nn::seq(projected_block(in, out), identity_block(out)); }

/// The backbone: its four stages' outputs, finest first.
inline auto backbone(const config& c) {
  const std::size_t w = c.width;
  return nn::taps(nn::seq(nn::conv2d<stem>(3, w, 7, {.stride = {2, 2}, .padding = {3, 3}}, nn::no_bias), nn::batch_norm(w),
                          nn::relu(), nn::max_pool2d({.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}}),
                          identity_block(w), identity_block(w)),
                  stage(w, 2 * w), stage(2 * w, 4 * w), stage(4 * w, 8 * w));
}

/// The FPN neck: four levels in, one [N, inner, H/4, W/4] map out.
inline auto neck(const config& c) {
  const std::size_t w = c.width, n = c.inner, q = c.inner / 4;
  const conv2d_params same{.padding = {1, 1}};
  // Levels are named by their stride (p4 .. p32): a tag names one layer per node.
  return nn::seq(nn::each(nn::named("p4", nn::conv2d<lateral>(w, n, 1, {}, nn::no_bias)),
                          nn::named("p8", nn::conv2d<lateral>(2 * w, n, 1, {}, nn::no_bias)),
                          nn::named("p16", nn::conv2d<lateral>(4 * w, n, 1, {}, nn::no_bias)),
                          nn::named("p32", nn::conv2d<lateral>(8 * w, n, 1, {}, nn::no_bias))),
                 nn::top_down(nn::upsample_nearest(2)),
                 nn::each(nn::named("p4", nn::conv2d<smooth>(n, q, 3, same, nn::no_bias)),
                          nn::named("p8", nn::seq(nn::conv2d<smooth>(n, q, 3, same, nn::no_bias), nn::upsample_nearest(2))),
                          nn::named("p16", nn::seq(nn::conv2d<smooth>(n, q, 3, same, nn::no_bias), nn::upsample_nearest(4))),
                          nn::named("p32", nn::seq(nn::conv2d<smooth>(n, q, 3, same, nn::no_bias), nn::upsample_nearest(8)))),
                 nn::concat_all(nn::channel_axis));
}

/// One head: from the neck's map to one full-resolution channel.
inline auto head_layers(const config& c) {
  const std::size_t n = c.inner, q = c.inner / 4;
  // The two conv - BN - ReLU groups are named: a tag names one layer per node.
  return nn::seq(nn::named("conv", nn::seq(nn::conv2d<head_conv>(n, q, 3, {.padding = {1, 1}}, nn::no_bias),
                                           nn::batch_norm<head_norm>(q), nn::relu<head_relu>())),
                 nn::named("up", nn::seq(nn::conv_transpose2d<head_up>(q, q, 2, {.stride = {2, 2}}),
                                         nn::batch_norm<head_norm>(q), nn::relu<head_relu>())),
                 nn::conv_transpose2d<head_out>(q, 1, 2, {.stride = {2, 2}}));
}

/// The whole model: images to (P logits, T).
inline auto blueprint(const config& c) {
  return nn::seq(backbone(c), neck(c),
                 nn::fork(nn::named("prob", head_layers(c)),
                          nn::named("thresh", nn::seq(head_layers(c), nn::sigmoid<thresh_sigmoid>()))));
}

}  // namespace dbnet
