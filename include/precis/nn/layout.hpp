/// @file
/// The image layout of a model's spatial layers: NCHW or channels-last NHWC, chosen once
/// for the whole model (nn::build_options::layout), and the channel axis that blueprints
/// name without knowing which it is.
///
///     auto m = nn::build<bfloat16, 4>(map, blueprint, {.seed = 1, .layout = image_layout::nhwc});
///     nn::concat_all(nn::channel_axis)   // axis 1 of [N, C, H, W], axis 3 of [N, H, W, C]
///
/// A blueprint is written once. Under image_layout::nhwc its convolutions, batch norms,
/// pooling, upsampling, global pooling and channel concatenations read and write
/// [N, H, W, C] images; nothing else changes: the parameters (a convolution's weight stays
/// [out, in / groups, kh, kw]) and the policies. On the host the layout moves values, never
/// a result: a model built channels-last gives, for the same input moved to NHWC, the NCHW
/// model's outputs and gradients moved to NHWC, bit for bit (tests/nn/test_layout.cpp). On
/// the device, cuDNN picks other kernels for NHWC and batch norm sums in another order, so
/// the two layouts agree within the policy's bounds (tests/cuda/test_nn_images.cu).
///
/// How each layer takes NHWC images:
/// - convolutions run their kernels in the layout (conv2d_params::layout): on the CPU the
///   hardware products are oneDNN's convolutions (channels-last, or oneDNN's blocked layout
///   where it prefers one), and the exact products move the images to NCHW in scratch; on
///   the device, cuDNN's NHWC convolutions, the weight moved to cuDNN's NHWC filter layout
///   per call; the bias is added in the layout;
/// - batch norm reads and writes channels-last images in place: the CPU kernels gather each
///   channel's values in NCHW's order, a cache line of channels at a time (NCHW's bits); the
///   device's reduce the columns of [N * H * W, C] (coalesced; another fixed order, so
///   bits within a float sum's bound of the NCHW model's);
/// - on the CPU, pooling, upsampling and global pooling run their NCHW kernels on copies of
///   their inputs moved to NCHW (detail::nchw_bridge), and move their outputs back: the same
///   sums in the same order, at the cost of the moves; on the device, pooling and upsampling
///   read and write channels-last images in place (context_traits<Ctx>::channels_last_pooling),
///   with the NCHW kernels' bits;
/// - nn::concat_all(nn::channel_axis) concatenates along the last axis.
///
/// Global average pooling runs on the host only, in either layout.
#pragma once

#include <precis/kernels/conv.hpp>
#include <precis/kernels/cpu/support.hpp>
#include <precis/kernels/cpu/transpose.hpp>
#include <precis/kernels/common.hpp>
#include <precis/nn/module.hpp>

#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>

namespace precis::nn {

/// The type of nn::channel_axis.
struct channel_axis_t {
  explicit constexpr channel_axis_t() = default;
};
/// The channels' axis of a model's images, whichever layout the model is built in: axis 1
/// of [N, C, H, W], axis 3 of [N, H, W, C] (nn::concat_all takes it).
inline constexpr channel_axis_t channel_axis{};

namespace detail {

/// An image shape given in `layout`, in NCHW order.
inline shape_t<4> nchw_shape(const shape_t<4>& s, image_layout layout) {
  return layout == image_layout::nhwc ? shape_t<4>{s[0], s[3], s[1], s[2]} : s;
}
/// An NCHW image shape in `layout`'s order.
inline shape_t<4> layout_shape(const shape_t<4>& s, image_layout layout) {
  return layout == image_layout::nhwc ? shape_t<4>{s[0], s[2], s[3], s[1]} : s;
}
/// "[N, C, H, W]" or "[N, H, W, C]" from the four axes' descriptions given in NCHW order.
inline std::string image_string(image_layout layout, const std::string& n, const std::string& c, const std::string& h,
                                const std::string& w) {
  return layout == image_layout::nhwc ? "[" + n + ", " + h + ", " + w + ", " + c + "]"
                                      : "[" + n + ", " + c + ", " + h + ", " + w + "]";
}
/// "nchw" or "nhwc".
inline std::string_view layout_name(image_layout layout) {
  return layout == image_layout::nhwc ? "nhwc" : "nchw";
}

/// Moves each of `images` row-major rows x cols matrices of T to cols x rows (NHWC -> NCHW
/// with rows = H*W, cols = C; NCHW -> NHWC the other way), on the context: the host's
/// blocked transposes, images split over the threads; one strided copy on a device.
template <class Ctx, class T>
void move_images(context_ref_t<Ctx> ctx, const T* from, T* to, std::size_t images, std::size_t rows,
                 std::size_t cols) {
  if constexpr (std::is_same_v<Ctx, cpu_context>) {
    precis::detail::for_rows(ctx, images, rows * cols, [&](std::size_t lo, std::size_t hi) {
      precis::detail::transpose_images(from + lo * rows * cols, to + lo * rows * cols, hi - lo, rows, cols);
    });
  } else {
    context_traits<Ctx>::strided_copy("precis::nn (channels-last images)", ctx, from, to,
                                      precis::detail::transpose_plan(images, rows, cols));
  }
}

/// How a layer whose kernels read NCHW images takes a model's layout. In NCHW it passes
/// tensors through; in NHWC, to_nchw() moves an input (x, dy) into an NCHW buffer the
/// layer owns, and to_layout() moves an NCHW result (y, dx) into the layer's buffer in
/// the layout. The layer keeps its NCHW buffers as before and adds the moved ones.
template <class Ctx>
class nchw_bridge {
  template <class T>
  using tensor = tensor_t<Ctx, T, 4>;

 public:
  /// The layout the layer's neighbours use.
  image_layout layout() const { return layout_; }
  /// Sets it (nn::build does, from build_options::layout).
  void set(image_layout layout) { layout_ = layout; }
  /// Whether images are moved (the layout is NHWC).
  bool moves() const { return layout_ == image_layout::nhwc; }

  /// t itself in NCHW; in NHWC, t ([N, H, W, C]) moved to `buffer` as [N, C, H, W].
  template <class T>
  const tensor<T>& to_nchw(context_ref_t<Ctx> ctx, const tensor<T>& t, tensor<T>& buffer) const {
    if (!moves()) return t;
    const auto s = shape_of<4>(t);
    ensure(buffer, nchw_shape(s, layout_));
    move_images<Ctx>(ctx, t.data(), buffer.data(), s[0], s[1] * s[2], s[3]);
    return buffer;
  }
  /// t itself in NCHW; in NHWC, t ([N, C, H, W]) moved to `buffer` as [N, H, W, C].
  template <class T>
  const tensor<T>& to_layout(context_ref_t<Ctx> ctx, const tensor<T>& t, tensor<T>& buffer) const {
    if (!moves()) return t;
    const auto s = shape_of<4>(t);
    ensure(buffer, layout_shape(s, layout_));
    move_images<Ctx>(ctx, t.data(), buffer.data(), s[0], s[1], s[2] * s[3]);
    return buffer;
  }

 private:
  image_layout layout_ = image_layout::nchw;
};

}  // namespace detail
}  // namespace precis::nn
