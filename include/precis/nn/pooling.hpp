/// @file
/// Pooling and upsampling layers on [N, C, H, W] images, or [N, H, W, C] in a model built
/// channels-last (nn/layout.hpp: on the host their kernels then read NCHW copies, moved back
/// after; the device kernels read channels-last themselves, and global average pooling does
/// on both).
///
///     nn::max_pool2d({.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}})
///     nn::avg_pool2d<pool>({.kernel = {2, 2}})
///     nn::global_avg_pool()                 // [N, C, H, W] -> [N, C]
///     nn::upsample_nearest(2)               // [N, C, H, W] -> [N, C, 2H, 2W]
///     nn::upsample_bilinear(2, true)        // align_corners
///
/// Pooling and upsampling run under their tags' policies resolved for op::pooling through
/// kernels/pooling.hpp: window sums and gradient sums in the accumulate type, each output
/// rounded once; max pooling's gradient goes to the window's first maximum, whose index a
/// training forward pass keeps (4 bytes per output) so that the backward pass neither reads x
/// nor searches the windows again (after an evaluation-mode forward it searches them in x).
/// Global average pooling runs under op::reduction (the rule set makes its sums float or
/// wider): each channel's mean is one running sum over H * W in pixel order, divided once
/// and rounded once; backward gives every input element dy / (H * W), computed in the math
/// type and rounded once to the gradient type. It reads channels-last images in place, on
/// the host and the device alike. None of these layers has parameters.
#pragma once

#include <precis/kernels/pooling.hpp>
#include <precis/kernels/reduce.hpp>
#include <precis/nn/layout.hpp>
#include <precis/nn/module.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

namespace precis::nn {

template <Layer Tag, Policy P, class Kernel, class Ctx>
class pool2d_layer;
template <Layer Tag, Policy P, class Kernel, class Ctx>
class upsample_layer;
template <Layer Tag, Policy P, class Ctx>
class global_avg_pool_layer;

namespace detail {

/// The layer L, built only on rank-4 tensors: nn::build reports any other rank here.
template <std::size_t R, class L>
struct pool_on_images {
  static_assert(R == 4,
                "precis: nn's pooling and upsampling layers (max_pool2d, avg_pool2d, "
                "global_avg_pool, upsample_nearest, upsample_bilinear) take [N, C, H, W] tensors "
                "(rank 4); build with nn::build<T, 4>, or reshape to rank 4 before the layer");
  using type = L;
};

// The pooling kernels a pool2d_layer runs, on any context with these kernels (by qualified
// name: the device overloads come first). A training forward pass fills `kept`, what the
// backward pass needs besides dy: max pooling keeps each window's first maximum's index,
// average pooling nothing.
struct max_pool_kernel {
  static constexpr std::string_view name = "max_pool2d";
  template <class Ctx>
  using kept = tensor_t<Ctx, std::uint32_t, 4>;
  template <Policy P, class C, class X, class Y, class K>
  static void forward(C& ctx, const X& x, Y& y, K& indices, const pool2d_params& p, mode m) {
    if (m == mode::train) {
      ensure(indices, shape_of<4>(y));
      precis::max_pool2d<P>(ctx, x, y, indices, p);
    } else {
      precis::max_pool2d<P>(ctx, x, y, p);
    }
  }
  /// From the indices where the last forward pass was in training mode (`kept`), else from
  /// x: the same bits.
  template <Policy P, class C, class K, class X, class DY, class DX>
  static void backward(C& ctx, const K& indices, bool kept, const X& x, const DY& dy, DX& dx,
                       const pool2d_params& p) {
    if (kept) {
      precis::max_pool2d_backward<P>(ctx, indices, dy, dx, p);
    } else {
      precis::max_pool2d_backward<P>(ctx, x, dy, dx, p);
    }
  }
  /// forward() and backward() on images in `layout`, for a context whose kernels take it
  /// (context_traits<Ctx>::channels_last_pooling).
  template <Policy P, class C, class X, class Y, class K>
  static void forward_in(C& ctx, const X& x, Y& y, K& indices, const pool2d_params& p, mode m, image_layout layout) {
    if (m == mode::train) {
      ensure(indices, shape_of<4>(y));
      precis::max_pool2d<P>(ctx, x, y, indices, p, layout);
    } else {
      precis::max_pool2d<P>(ctx, x, y, p, layout);
    }
  }
  template <Policy P, class C, class K, class X, class DY, class DX>
  static void backward_in(C& ctx, const K& indices, bool kept, const X& x, const DY& dy, DX& dx,
                          const pool2d_params& p, image_layout layout) {
    if (kept) {
      precis::max_pool2d_backward<P>(ctx, indices, dy, dx, p, layout);
    } else {
      precis::max_pool2d_backward<P>(ctx, x, dy, dx, p, layout);
    }
  }
  template <class K>
  static std::size_t kept_bytes(const K& indices) {
    return bytes_of(indices);
  }
};
struct avg_pool_kernel {
  static constexpr std::string_view name = "avg_pool2d";
  struct nothing {};
  template <class Ctx>
  using kept = nothing;
  template <Policy P, class C, class X, class Y>
  static void forward(C& ctx, const X& x, Y& y, nothing&, const pool2d_params& p, mode) {
    precis::avg_pool2d<P>(ctx, x, y, p);
  }
  template <Policy P, class C, class X, class DY, class DX>
  static void backward(C& ctx, const nothing&, bool, const X&, const DY& dy, DX& dx,
                       const pool2d_params& p) {
    precis::avg_pool2d_backward<P>(ctx, dy, dx, p);
  }
  template <Policy P, class C, class X, class Y>
  static void forward_in(C& ctx, const X& x, Y& y, nothing&, const pool2d_params& p, mode, image_layout layout) {
    precis::avg_pool2d<P>(ctx, x, y, p, layout);
  }
  template <Policy P, class C, class X, class DY, class DX>
  static void backward_in(C& ctx, const nothing&, bool, const X&, const DY& dy, DX& dx, const pool2d_params& p,
                          image_layout layout) {
    precis::avg_pool2d_backward<P>(ctx, dy, dx, p, layout);
  }
  static std::size_t kept_bytes(const nothing&) { return 0; }
};

// The resampling kernels an upsample_layer runs (sizes come from the tensors' shapes).
struct nearest_kernel {
  static constexpr std::string_view name = "upsample_nearest";
  template <Policy P, class C, class X, class Y>
  static void forward(C& ctx, const X& x, Y& y, bool) {
    precis::upsample_nearest2d<P>(ctx, x, y);
  }
  template <Policy P, class C, class DY, class DX>
  static void backward(C& ctx, const DY& dy, DX& dx, bool) {
    precis::upsample_nearest2d_backward<P>(ctx, dy, dx);
  }
  template <Policy P, class C, class X, class Y>
  static void forward_in(C& ctx, const X& x, Y& y, bool, image_layout layout) {
    precis::upsample_nearest2d<P>(ctx, x, y, layout);
  }
  template <Policy P, class C, class DY, class DX>
  static void backward_in(C& ctx, const DY& dy, DX& dx, bool, image_layout layout) {
    precis::upsample_nearest2d_backward<P>(ctx, dy, dx, layout);
  }
};
struct bilinear_kernel {
  static constexpr std::string_view name = "upsample_bilinear";
  template <Policy P, class C, class X, class Y>
  static void forward(C& ctx, const X& x, Y& y, bool align_corners) {
    precis::upsample_bilinear2d<P>(ctx, x, y, align_corners);
  }
  template <Policy P, class C, class DY, class DX>
  static void backward(C& ctx, const DY& dy, DX& dx, bool align_corners) {
    precis::upsample_bilinear2d_backward<P>(ctx, dy, dx, align_corners);
  }
  template <Policy P, class C, class X, class Y>
  static void forward_in(C& ctx, const X& x, Y& y, bool align_corners, image_layout layout) {
    precis::upsample_bilinear2d<P>(ctx, x, y, align_corners, layout);
  }
  template <Policy P, class C, class DY, class DX>
  static void backward_in(C& ctx, const DY& dy, DX& dx, bool align_corners, image_layout layout) {
    precis::upsample_bilinear2d_backward<P>(ctx, dy, dx, align_corners, layout);
  }
};

/// Whether context Ctx's pooling and upsampling kernels read channels-last images in place
/// (context_traits<Ctx>::channels_last_pooling: the device's), so that a channels-last model
/// moves nothing around them; elsewhere the layers move images through nchw_bridge.
template <class Ctx>
inline constexpr bool channels_last_pooling = requires { requires context_traits<Ctx>::channels_last_pooling; };

/// "[N > 0, C > 0, H >= 2, W >= 2]": the inputs a parameter-free spatial layer takes.
inline std::string any_image_string(std::size_t min_h, std::size_t min_w,
                                    image_layout layout = image_layout::nchw) {
  return image_string(layout, "N > 0", "C > 0", "H >= " + std::to_string(min_h), "W >= " + std::to_string(min_w));
}

/// True when no axis of the shape is empty.
inline bool no_empty_axis(const shape_t<4>& s) { return elements(s) != 0; }

}  // namespace detail

/// Blueprint of a max or average pooling (see nn::max_pool2d, nn::avg_pool2d).
template <Layer Tag, class Kernel>
struct pool2d_spec {
  /// The window: kernel, stride, padding and (average pooling) count_include_pad.
  pool2d_params params{};
  /// The layer it builds into for policy map Map on context Ctx (In and G, the types that
  /// reach it, are not used: build casts them to its own). A rank R other than 4 fails to
  /// compile, with a message.
  template <class Map, class Ctx, class In, class G, std::size_t R>
  using module_type =
      typename detail::pool_on_images<R,
                                      pool2d_layer<Tag, policy_for_t<Tag, Map>, Kernel, Ctx>>::type;
};
/// Blueprint of an upsampling by an integer factor (see nn::upsample_nearest,
/// nn::upsample_bilinear).
template <Layer Tag, class Kernel>
struct upsample_spec {
  /// The factor by which H and W grow (at least 1).
  std::size_t scale;
  /// Bilinear only: whether the corner pixels of input and output line up (PyTorch's
  /// align_corners).
  bool align_corners = false;
  /// The layer it builds into for policy map Map on context Ctx (In and G, the types that
  /// reach it, are not used: build casts them to its own). A rank R other than 4 fails to
  /// compile, with a message.
  template <class Map, class Ctx, class In, class G, std::size_t R>
  using module_type = typename detail::pool_on_images<
      R, upsample_layer<Tag, policy_for_t<Tag, Map>, Kernel, Ctx>>::type;
};
/// Blueprint of a global average pooling (see nn::global_avg_pool).
template <Layer Tag>
struct global_avg_pool_spec {
  /// The layer it builds into for policy map Map on context Ctx (In and G, the types that
  /// reach it, are not used: build casts them to its own). A rank R other than 4 fails to
  /// compile, with a message.
  template <class Map, class Ctx, class In, class G, std::size_t R>
  using module_type = typename detail::pool_on_images<
      R, global_avg_pool_layer<Tag, policy_for_t<Tag, Map>, Ctx>>::type;
};

/// The maximum over each window (PyTorch's MaxPool2d; a zero stride means the kernel's).
template <Layer Tag = tags::max_pool2d>
constexpr pool2d_spec<Tag, detail::max_pool_kernel> max_pool2d(pool2d_params params = {}) {
  return {params};
}
/// The mean over each window (PyTorch's AvgPool2d, count_include_pad as given).
template <Layer Tag = tags::avg_pool2d>
constexpr pool2d_spec<Tag, detail::avg_pool_kernel> avg_pool2d(pool2d_params params = {}) {
  return {params};
}
/// The mean of each channel over H and W: [N, C, H, W] -> [N, C].
template <Layer Tag = tags::global_avg_pool>
constexpr global_avg_pool_spec<Tag> global_avg_pool() {
  return {};
}
/// Nearest-neighbour upsampling by `scale` along H and W (PyTorch's `nearest`).
template <Layer Tag = tags::upsample>
constexpr upsample_spec<Tag, detail::nearest_kernel> upsample_nearest(std::size_t scale) {
  return {scale, false};
}
/// Bilinear upsampling by `scale` along H and W (PyTorch's `bilinear`).
template <Layer Tag = tags::upsample>
constexpr upsample_spec<Tag, detail::bilinear_kernel> upsample_bilinear(
    std::size_t scale, bool align_corners = false) {
  return {scale, align_corners};
}

/// Max or average pooling built for tag Tag under the resolved policy P: [N, C, H, W] ->
/// [N, C, Ho, Wo], Ho = (H + 2 padding - kernel) / stride + 1.
template <Layer Tag, Policy P, class Kernel, class Ctx>
class pool2d_layer : public layer_base<Tag, P, op::pooling, 4, 4, Ctx> {
  using base = layer_base<Tag, P, op::pooling, 4, 4, Ctx>;
  using S = typename base::input_type;
  using G = typename base::input_grad_type;
  template <class T, std::size_t N = 4>
  using tensor = tensor_t<Ctx, T, N>;

 public:
  /// Its kind in nn::describe: "max_pool2d" or "avg_pool2d".
  static constexpr std::string_view kind = Kernel::name;
  /// Whether channels-last images are pooled in place (the device), not moved to NCHW.
  static constexpr bool native = detail::channels_last_pooling<Ctx>;

  /// The layer of a blueprint. Throws precis::error for an empty kernel or padding of more
  /// than half the kernel.
  explicit pool2d_layer(const pool2d_spec<Tag, Kernel>& s) : p_(s.params) {
    const auto& k = p_.kernel;
    if (k[0] == 0 || k[1] == 0 || 2 * p_.padding[0] > k[0] || 2 * p_.padding[1] > k[1]) {
      throw error("precis::nn::" + std::string(kind) +
                  ": needs a kernel of at least 1x1 and padding at most half the kernel, got "
                  "kernel " +
                  shape_string(k) + " and padding " + shape_string(p_.padding));
    }
  }

  /// The shape of the output, [N, C, Ho, Wo] (see the class comment). Throws
  /// precis::error (naming the layer's `path`) for an empty axis or an image smaller than
  /// one window.
  shape_t<4> output_shape(const shape_t<4>& in, std::string_view path) const {
    const auto layout = bridge_.layout();
    const auto s = detail::nchw_shape(in, layout);
    const std::size_t ho = out_size(s[2], 0), wo = out_size(s[3], 1);
    if (!detail::no_empty_axis(in) || ho == 0 || wo == 0) {
      bad_shape(path, kind, detail::any_image_string(min_in(0), min_in(1), layout), shape_string(in));
    }
    return detail::layout_shape({s[0], s[1], ho, wo}, layout);
  }

  /// The maximum or mean over each window of x; keeps the address of x (or of its NCHW
  /// copy) for backward(), and in mode::train max pooling keeps each window's maximum's
  /// index too. Throws precis::error for an input of another shape.
  const tensor<S>& forward(context_ref_t<Ctx> ctx, const tensor<S>& x, mode m = mode::train) {
    const auto out = output_shape(shape_of<4>(x), path_name<Tag>());
    if constexpr (native) {
      if (bridge_.moves()) {  // channels-last, in place
        ensure(y_, out);
        Kernel::template forward_in<P>(ctx, x, y_, kept_, p_, m, bridge_.layout());
        x_.set(x);
        last_train_ = m == mode::train;
        return y_;
      }
    }
    const auto& xn = bridge_.to_nchw(ctx, x, xn_);
    ensure(y_, detail::nchw_shape(out, bridge_.layout()));
    Kernel::template forward<P>(ctx, xn, y_, kept_, p_, m);
    x_.set(xn);
    last_train_ = m == mode::train;
    return bridge_.to_layout(ctx, y_, moved_y_);
  }
  /// Backward of the last forward pass. Max pooling's gradient goes where that pass found
  /// the maxima: through the indices a training-mode pass kept, or, after an
  /// evaluation-mode pass, by finding them again in x (the same bits, more slowly).
  /// Throws precis::error without a forward pass or when dy's shape is not the last
  /// output's.
  const tensor<G>& backward(context_ref_t<Ctx> ctx, const tensor<G>& dy) {
    const auto& x = x_.get(kind);
    if constexpr (native) {
      if (bridge_.moves()) {
        check_same_shape("precis::nn::" + std::string(kind) + ": dy and the output", dy, y_);
        ensure(dx_, shape_of<4>(x));
        Kernel::template backward_in<P>(ctx, kept_, last_train_, x, dy, dx_, p_, bridge_.layout());
        return dx_;
      }
    }
    check_same_shape("precis::nn::" + std::string(kind) + ": dy and the output", dy,
                     bridge_.moves() ? moved_y_ : y_);
    const auto& dyn = bridge_.to_nchw(ctx, dy, moved_dy_);
    ensure(dx_, shape_of<4>(x));
    Kernel::template backward<P>(ctx, kept_, last_train_, x, dyn, dx_, p_);
    return bridge_.to_layout(ctx, dx_, moved_dx_);
  }
  /// Takes images in `layout` (nn::build calls it with build_options::layout).
  void set_layout(image_layout layout, std::string_view) { bridge_.set(layout); }

  /// Its shape column in nn::describe: kernel, stride and (when not zero) padding, as
  /// "3x3 s2x2 p1x1"; " no pad count" for average pooling without count_include_pad.
  std::string shape() const {
    std::string s = std::to_string(p_.kernel[0]) + "x" + std::to_string(p_.kernel[1]);
    s += " s" + std::to_string(stride(0)) + "x" + std::to_string(stride(1));
    if (p_.padding != std::array<std::size_t, 2>{0, 0}) {
      s += " p" + std::to_string(p_.padding[0]) + "x" + std::to_string(p_.padding[1]);
    }
    if (std::is_same_v<Kernel, detail::avg_pool_kernel> && !p_.count_include_pad)
      s += " no pad count";
    return s;
  }
  /// Bytes of its output and input-gradient buffers, of max pooling's kept indices, and
  /// in a channels-last model of its images moved to and from NCHW.
  std::size_t own_bytes() const {
    return bytes_of(y_) + bytes_of(dx_) + Kernel::kept_bytes(kept_) + bytes_of(xn_) +
           bytes_of(moved_y_) + bytes_of(moved_dy_) + bytes_of(moved_dx_);
  }
  /// The buffers of the last passes, for precis::diagnostics (see nn/module.hpp).
  template <class Self, class F>
  static void for_each_observed(Self& self, F&& f) {
    f("", std::type_identity<Tag>{}, self.x_.peek(), self.y_, self.dx_);
  }

 private:
  std::size_t stride(std::size_t a) const {
    return p_.stride[a] == 0 ? p_.kernel[a] : p_.stride[a];
  }
  std::size_t out_size(std::size_t in, std::size_t a) const {
    const std::size_t padded = in + 2 * p_.padding[a];
    return in == 0 || padded < p_.kernel[a] ? 0 : (padded - p_.kernel[a]) / stride(a) + 1;
  }
  std::size_t min_in(std::size_t a) const {
    return p_.kernel[a] > 2 * p_.padding[a] + 1 ? p_.kernel[a] - 2 * p_.padding[a] : 1;
  }

  pool2d_params p_;
  tensor<S> y_;
  tensor<G> dx_;
  typename Kernel::template kept<Ctx> kept_;
  saved<tensor<S>> x_;
  bool last_train_ = false;
  detail::nchw_bridge<Ctx> bridge_;
  tensor<S> xn_, moved_y_;  // channels-last: x moved to NCHW, y moved back
  tensor<G> moved_dy_, moved_dx_;
};

/// Upsampling by an integer factor built for tag Tag under the resolved policy P:
/// [N, C, H, W] -> [N, C, H scale, W scale].
template <Layer Tag, Policy P, class Kernel, class Ctx>
class upsample_layer : public layer_base<Tag, P, op::pooling, 4, 4, Ctx> {
  using base = layer_base<Tag, P, op::pooling, 4, 4, Ctx>;
  using S = typename base::input_type;
  using G = typename base::input_grad_type;
  template <class T, std::size_t N = 4>
  using tensor = tensor_t<Ctx, T, N>;

 public:
  /// Its kind in nn::describe: "upsample_nearest" or "upsample_bilinear".
  static constexpr std::string_view kind = Kernel::name;
  /// Whether channels-last images are resampled in place (the device), not moved to NCHW.
  static constexpr bool native = detail::channels_last_pooling<Ctx>;

  /// The layer of a blueprint. Throws precis::error when scale is 0.
  explicit upsample_layer(const upsample_spec<Tag, Kernel>& s)
      : scale_(s.scale), align_corners_(s.align_corners) {
    if (scale_ == 0) throw error("precis::nn::" + std::string(kind) + ": needs scale >= 1");
  }

  /// The shape of the output: [N, C, H scale, W scale]. Throws precis::error (naming the
  /// layer's `path`) for an empty axis.
  shape_t<4> output_shape(const shape_t<4>& in, std::string_view path) const {
    const auto layout = bridge_.layout();
    if (!detail::no_empty_axis(in)) {
      bad_shape(path, kind, detail::any_image_string(1, 1, layout), shape_string(in));
    }
    const auto s = detail::nchw_shape(in, layout);
    return detail::layout_shape({s[0], s[1], s[2] * scale_, s[3] * scale_}, layout);
  }

  /// x resampled to the output size, nearest-neighbour or bilinear (each output a weighted
  /// sum of its four neighbours in the math type, rounded once); keeps the address of x (or
  /// of its NCHW copy) for backward(). Throws precis::error for an input of another shape.
  const tensor<S>& forward(context_ref_t<Ctx> ctx, const tensor<S>& x, mode = mode::train) {
    const auto out = output_shape(shape_of<4>(x), path_name<Tag>());
    if constexpr (native) {
      if (bridge_.moves()) {  // channels-last, in place
        ensure(y_, out);
        Kernel::template forward_in<P>(ctx, x, y_, align_corners_, bridge_.layout());
        x_.set(x);
        return y_;
      }
    }
    const auto& xn = bridge_.to_nchw(ctx, x, xn_);
    ensure(y_, detail::nchw_shape(out, bridge_.layout()));
    Kernel::template forward<P>(ctx, xn, y_, align_corners_);
    x_.set(xn);
    return bridge_.to_layout(ctx, y_, moved_y_);
  }
  /// dx: for each input element, the sum of dy over the outputs it fed (with the forward
  /// weights, for bilinear), in the accumulate type, rounded once to the gradient type.
  /// Throws precis::error without a forward pass or when dy's shape is not the last
  /// output's.
  const tensor<G>& backward(context_ref_t<Ctx> ctx, const tensor<G>& dy) {
    const auto& x = x_.get(kind);
    if constexpr (native) {
      if (bridge_.moves()) {
        check_same_shape("precis::nn::" + std::string(kind) + ": dy and the output", dy, y_);
        ensure(dx_, shape_of<4>(x));
        Kernel::template backward_in<P>(ctx, dy, dx_, align_corners_, bridge_.layout());
        return dx_;
      }
    }
    check_same_shape("precis::nn::" + std::string(kind) + ": dy and the output", dy,
                     bridge_.moves() ? moved_y_ : y_);
    const auto& dyn = bridge_.to_nchw(ctx, dy, moved_dy_);
    ensure(dx_, shape_of<4>(x));
    Kernel::template backward<P>(ctx, dyn, dx_, align_corners_);
    return bridge_.to_layout(ctx, dx_, moved_dx_);
  }
  /// Takes images in `layout` (nn::build calls it with build_options::layout).
  void set_layout(image_layout layout, std::string_view) { bridge_.set(layout); }

  /// Its shape column in nn::describe: the factor, as "x2", or "x2 align_corners".
  std::string shape() const {
    std::string s = "x";  // appended: `"x" + std::string` trips GCC 12's -Wrestrict false positive
    s += std::to_string(scale_);
    if (align_corners_) s += " align_corners";
    return s;
  }
  /// Bytes of its output and input-gradient buffers, and in a channels-last model of its
  /// images moved to and from NCHW.
  std::size_t own_bytes() const {
    return bytes_of(y_) + bytes_of(dx_) + bytes_of(xn_) + bytes_of(moved_y_) +
           bytes_of(moved_dy_) + bytes_of(moved_dx_);
  }
  /// The buffers of the last passes, for precis::diagnostics (see nn/module.hpp).
  template <class Self, class F>
  static void for_each_observed(Self& self, F&& f) {
    f("", std::type_identity<Tag>{}, self.x_.peek(), self.y_, self.dx_);
  }

 private:
  std::size_t scale_;
  bool align_corners_;
  tensor<S> y_;
  tensor<G> dx_;
  saved<tensor<S>> x_;
  detail::nchw_bridge<Ctx> bridge_;
  tensor<S> xn_, moved_y_;  // channels-last: x moved to NCHW, y moved back
  tensor<G> moved_dy_, moved_dx_;
};

/// Global average pooling built for tag Tag under the resolved policy P (op::reduction):
/// [N, C, H, W] -> [N, C], or channels-last [N, H, W, C] -> [N, C], on any context (the
/// kernels are kernels/reduce.hpp's global_avg_pool and its device overload, which read
/// either layout in place with the same bits).
template <Layer Tag, Policy P, class Ctx>
class global_avg_pool_layer : public layer_base<Tag, P, op::reduction, 4, 2, Ctx> {
  using base = layer_base<Tag, P, op::reduction, 4, 2, Ctx>;
  using S = typename base::input_type;
  using G = typename base::input_grad_type;
  template <class T, std::size_t N>
  using tensor = tensor_t<Ctx, T, N>;

 public:
  /// Its kind in nn::describe: "global_avg_pool".
  static constexpr std::string_view kind = "global_avg_pool";

  global_avg_pool_layer() = default;
  /// The layer of a blueprint (nn::global_avg_pool); it has no parameters.
  explicit global_avg_pool_layer(const global_avg_pool_spec<Tag>&) {}

  /// The shape of the output: [N, C]. Throws precis::error (naming the layer's `path`) for
  /// an empty axis.
  shape_t<2> output_shape(const shape_t<4>& in, std::string_view path) const {
    if (!detail::no_empty_axis(in)) {
      bad_shape(path, kind, detail::any_image_string(1, 1, layout_), shape_string(in));
    }
    return {in[0], detail::nchw_shape(in, layout_)[1]};
  }

  /// The mean of each channel of each image: one running sum over H * W in pixel order,
  /// divided once and rounded once (see the file comment); keeps the address of x for
  /// backward(). Throws precis::error for an empty axis.
  const tensor<S, 2>& forward(context_ref_t<Ctx> ctx, const tensor<S, 4>& x, mode = mode::train) {
    ensure(y_, output_shape(shape_of<4>(x), path_name<Tag>()));
    precis::global_avg_pool<P>(ctx, x, y_, layout_);
    x_.set(x);
    return y_;
  }
  /// dx [N, C, H, W] (or channels-last): every element of a plane gets that plane's
  /// dy / (H * W), computed in the math type and rounded once. Throws precis::error without
  /// a forward pass or when dy's shape is not the last output's.
  const tensor<G, 4>& backward(context_ref_t<Ctx> ctx, const tensor<G, 2>& dy) {
    const auto& x = x_.get(kind);
    check_same_shape("precis::nn::global_avg_pool: dy and the output", dy, y_);
    ensure(dx_, shape_of<4>(x));
    precis::global_avg_pool_backward<P>(ctx, dy, dx_, layout_);
    return dx_;
  }
  /// Takes images in `layout` (nn::build calls it with build_options::layout); both layouts
  /// are read in place.
  void set_layout(image_layout layout, std::string_view) { layout_ = layout; }

  /// Its shape column in nn::describe: "HxW->1".
  std::string shape() const { return "HxW->1"; }
  /// Bytes of its output and input-gradient buffers.
  std::size_t own_bytes() const { return bytes_of(y_) + bytes_of(dx_); }
  /// The buffers of the last passes, for precis::diagnostics (see nn/module.hpp).
  template <class Self, class F>
  static void for_each_observed(Self& self, F&& f) {
    f("", std::type_identity<Tag>{}, self.x_.peek(), self.y_, self.dx_);
  }

 private:
  tensor<S, 2> y_;
  tensor<G, 4> dx_;
  saved<tensor<S, 4>> x_;
  image_layout layout_ = image_layout::nchw;
};

}  // namespace precis::nn
