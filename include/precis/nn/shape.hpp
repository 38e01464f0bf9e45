/// @file
/// Layers that move data between shapes, and the two elementwise layers that only rescale it
/// (dropout, scale).
///
///     nn::flatten()                     [N, ...] -> [N, prod(...)]
///     nn::reshape<2>({4, 8})            [N, ...] -> [N, 4, 8]: the shape of one batch item
///     nn::permute<3>({0, 2, 1})         [N, T, D] -> [N, D, T]: every axis, the batch's too
///     nn::patchify(16)                  [N, C, H, W] -> [N, (H/16)(W/16), C*16*16]
///     nn::select_token(0)               [N, T, D] -> [N, D]: one token (ViT's class token)
///     nn::dropout(0.1)  nn::scale(0.5)  any rank, same shape
///
/// The data layers take whatever element type reaches them (no tag decides their
/// precision, so nn::build never puts a cast in front of one) and copy values unchanged,
/// forward and backward; their gradients are the same moves in reverse. Dropout and scale
/// are layers with tags (op::elementwise): their products are computed in the policy's
/// opmath type (float for 16-bit formats) and rounded once.
///
/// Every one runs on cuda_context too: flatten and reshape as one device-to-device copy,
/// permute, patchify and select_token as one strided-copy launch each (their copy plans,
/// which the host tests run against these layers), scale and dropout as one elementwise
/// launch, dropout drawing its mask from (seed, call, index) as the host does, so both give
/// the same bits.
#pragma once

#include <precis/kernels/elementwise.hpp>
#include <precis/nn/module.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace precis::nn {

namespace detail {

/// A number as printf's %g writes it (for errors and describe).
inline std::string number_string(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

/// The copy plan of nn::patchify for images of shape `in` and patches of p x p: over [N,
/// rows, cols, C, p, p], the patches side packed and the pixels side at the image's
/// strides; from pixels to patches, or back (`back`).
inline precis::detail::copy_plan<6> patchify_plan(const std::array<std::size_t, 4>& in, std::size_t p, bool back) {
  const std::size_t n = in[0], c = in[1], h = in[2], w = in[3], rows = h / p, cols = w / p;
  const std::size_t pixels[6] = {c * h * w, p * w, p, h * w, w, 1};
  const std::size_t patches[6] = {rows * cols * c * p * p, cols * c * p * p, c * p * p, p * p, p, 1};
  precis::detail::copy_plan<6> plan{{n, rows, cols, c, p, p}, {}, {}};
  for (std::size_t k = 0; k < 6; ++k) {
    plan.from[k] = back ? patches[k] : pixels[k];
    plan.to[k] = back ? pixels[k] : patches[k];
  }
  return plan;
}

/// The copy plan of nn::select_token for n items of t tokens of width d: from the source
/// at the token (forward: x + index d) to the packed rows, or back (the input gradient +
/// index d, from dy).
inline precis::detail::copy_plan<2> select_token_plan(std::size_t n, std::size_t t, std::size_t d, bool back) {
  return back ? precis::detail::copy_plan<2>{{n, d}, {d, 1}, {t * d, 1}}
              : precis::detail::copy_plan<2>{{n, d}, {t * d, 1}, {d, 1}};
}

/// The copy plan of nn::permute with `order` on tensors of shape `in`: over the output's
/// shape, the output packed and the input at its strides in the output's axis order; from
/// the input to the output, or back (`back`).
template <std::size_t R>
precis::detail::copy_plan<R> permute_plan(const std::array<std::size_t, R>& in, const std::array<std::size_t, R>& order,
                                          bool back) {
  std::size_t in_strides[R], out_strides[R];
  precis::detail::copy_plan<R> plan{};
  for (std::size_t k = R, step = 1; k-- > 0;) {
    in_strides[k] = step;
    step *= in[k];
  }
  for (std::size_t k = 0; k < R; ++k) plan.shape[k] = in[order[k]];
  for (std::size_t k = R, step = 1; k-- > 0;) {
    out_strides[k] = step;
    step *= plan.shape[k];
  }
  for (std::size_t k = 0; k < R; ++k) {
    plan.from[k] = back ? out_strides[k] : in_strides[order[k]];
    plan.to[k] = back ? in_strides[order[k]] : out_strides[k];
  }
  return plan;
}

/// Row-major strides of a shape.
template <std::size_t N>
shape_t<N> strides_of(const shape_t<N>& s) {
  shape_t<N> st{};
  std::size_t step = 1;
  for (std::size_t i = N; i-- > 0;) {
    st[i] = step;
    step *= s[i];
  }
  return st;
}

}  // namespace detail

// ---------------------------------------------------------------------------------------
// flatten

template <class T, class G, std::size_t R, class Ctx>
class flatten_layer;

/// Blueprint of nn::flatten.
struct flatten_spec {
  /// The layer nn::build makes of it on Ctx, for input element type In, gradient G, rank R.
  template <class Map, class Ctx, class In, class G, std::size_t R>
  using module_type = flatten_layer<In, G, R, Ctx>;
};

/// [N, d1, d2, ...] -> [N, d1 * d2 * ...], in row-major order (a blueprint node).
constexpr flatten_spec flatten() { return {}; }

/// Flattens every axis after the first of a rank-R tensor.
template <class T, class G, std::size_t R, class Ctx = cpu_context>
class flatten_layer : public data_layer_base<T, G, R, 2, Ctx> {
  template <class U, std::size_t N>
  using tensor = tensor_t<Ctx, U, N>;
  static_assert(
      R >= 2,
      "precis: nn::flatten takes [N, ...] tensors of rank >= 2; a rank-1 input has nothing "
      "to flatten");

 public:
  /// Its kind as describe prints it.
  static constexpr std::string_view kind = "flatten";
  flatten_layer() = default;
  /// Makes the layer from its blueprint (which has no settings).
  explicit flatten_layer(const flatten_spec&) {}

  /// [N, d1 * d2 * ...] for [N, d1, d2, ...].
  shape_t<2> output_shape(const shape_t<R>& in, std::string_view) const {
    shape_t<2> out{in[0], 1};
    for (std::size_t i = 1; i < R; ++i) out[1] *= in[i];
    return out;
  }
  /// x with every axis after the first flattened (a copy, in row-major order).
  const tensor<T, 2>& forward(context_ref_t<Ctx> ctx, const tensor<T, R>& x, mode = mode::train) {
    in_shape_ = shape_of<R>(x);
    ensure(y_, output_shape(in_shape_, kind));
    context_traits<Ctx>::copy(ctx, x.data(), y_.data(), x.size());
    return y_;
  }
  /// dy in the last input's shape (a copy); throws precis::error when dy's shape is not
  /// the last output's.
  const tensor<G, R>& backward(context_ref_t<Ctx> ctx, const tensor<G, 2>& dy) {
    check_shape("precis::nn::flatten: dy", dy, shape_of<2>(y_));
    ensure(dx_, in_shape_);
    context_traits<Ctx>::copy(ctx, dy.data(), dx_.data(), dy.size());
    return dx_;
  }
  /// Its shape for describe: "-" (no settings).
  std::string shape() const { return "-"; }
  /// Bytes of its output and input-gradient buffers.
  std::size_t own_bytes() const { return bytes_of(y_) + bytes_of(dx_); }

 private:
  shape_t<R> in_shape_{};
  tensor<T, 2> y_;
  tensor<G, R> dx_;
};

// ---------------------------------------------------------------------------------------
// reshape

template <class T, class G, std::size_t R, std::size_t ItemRank, class Ctx>
class reshape_layer;

/// Blueprint of nn::reshape: the shape of one batch item.
template <std::size_t ItemRank>
struct reshape_spec {
  shape_t<ItemRank> item;  ///< the shape of one batch item (the batch axis left out)
  /// The layer nn::build makes of it on Ctx, for input element type In, gradient G, rank R.
  template <class Map, class Ctx, class In, class G, std::size_t R>
  using module_type = reshape_layer<In, G, R, ItemRank, Ctx>;
};

/// [N, ...] -> [N, item...]: the batch axis is kept and each item takes the shape `item`
/// (which leaves the batch axis out, so a model reads the same for any batch size);
/// values keep their row-major order. The output has rank ItemRank + 1 (a blueprint node):
/// `nn::reshape<2>({4, 8})` gives [N, 4, 8].
template <std::size_t ItemRank>
constexpr reshape_spec<ItemRank> reshape(const shape_t<ItemRank>& item) {
  static_assert(ItemRank >= 1,
                "precis: nn::reshape<K>(shape) takes the shape of one batch item, K >= 1 axes");
  return {item};
}

/// Gives each batch item of a rank-R tensor the shape `item` (rank ItemRank + 1 out).
template <class T, class G, std::size_t R, std::size_t ItemRank, class Ctx = cpu_context>
class reshape_layer : public data_layer_base<T, G, R, ItemRank + 1, Ctx> {
  template <class U, std::size_t N>
  using tensor = tensor_t<Ctx, U, N>;
  static_assert(R >= 1, "precis: nn::reshape keeps the batch axis: its input needs rank >= 1");
  static constexpr std::size_t out_rank = ItemRank + 1;

 public:
  /// Its kind as describe prints it.
  static constexpr std::string_view kind = "reshape";
  /// Makes the layer from its blueprint `s`.
  explicit reshape_layer(const reshape_spec<ItemRank>& s) : item_(s.item) {}

  /// [N, item...] for [N, ...]; throws precis::error naming `path` when an input item does
  /// not hold as many values as `item`.
  shape_t<out_rank> output_shape(const shape_t<R>& in, std::string_view path) const {
    std::size_t per_item = 1;
    for (std::size_t i = 1; i < R; ++i) per_item *= in[i];
    if (per_item != detail::elements(item_)) {
      bad_shape(path, kind,
                        "[N, ...] with " + std::to_string(detail::elements(item_)) +
                            " values per item (to reshape to " + shape_string(item_) + ")",
                        shape_string(in));
    }
    shape_t<out_rank> out{};
    out[0] = in[0];
    for (std::size_t i = 0; i < ItemRank; ++i) out[i + 1] = item_[i];
    return out;
  }
  /// x with each item in the shape `item` (a copy; the values keep their order). Throws
  /// precis::error as output_shape() does.
  const tensor<T, out_rank>& forward(context_ref_t<Ctx> ctx, const tensor<T, R>& x, mode = mode::train) {
    in_shape_ = shape_of<R>(x);
    ensure(y_, output_shape(in_shape_, kind));
    context_traits<Ctx>::copy(ctx, x.data(), y_.data(), x.size());
    return y_;
  }
  /// dy in the last input's shape (a copy); throws precis::error when dy's shape is not
  /// the last output's.
  const tensor<G, R>& backward(context_ref_t<Ctx> ctx, const tensor<G, out_rank>& dy) {
    check_shape("precis::nn::reshape: dy", dy, shape_of<out_rank>(y_));
    ensure(dx_, in_shape_);
    context_traits<Ctx>::copy(ctx, dy.data(), dx_.data(), dy.size());
    return dx_;
  }
  /// Its shape for describe: the item shape, as "N x [4, 8]".
  std::string shape() const { return "N x " + shape_string(item_); }
  /// Bytes of its output and input-gradient buffers.
  std::size_t own_bytes() const { return bytes_of(y_) + bytes_of(dx_); }

 private:
  shape_t<ItemRank> item_;
  shape_t<R> in_shape_{};
  tensor<T, out_rank> y_;
  tensor<G, R> dx_;
};

// ---------------------------------------------------------------------------------------
// permute

template <class T, class G, std::size_t R, class Ctx>
class permute_layer;

namespace detail {
template <class T, class G, std::size_t In, std::size_t R, class Ctx>
struct checked_permute {
  static_assert(
      In == R,
      "precis: nn::permute<R>(order) reorders the axes of rank-R tensors; give it one index "
      "per axis of the tensor that reaches it (the batch axis included)");
  using type = permute_layer<T, G, R, Ctx>;
};
}  // namespace detail

/// Blueprint of nn::permute.
template <std::size_t R>
struct permute_spec {
  shape_t<R> order;  ///< output axis i is input axis order[i]
  /// The layer nn::build makes of it on Ctx, for input element type In, gradient G, rank
  /// InRank (which must be R).
  template <class Map, class Ctx, class In, class G, std::size_t InRank>
  using module_type = typename detail::checked_permute<In, G, InRank, R, Ctx>::type;
};

/// Output axis i is input axis order[i], as torch.permute: every axis is named, the batch
/// axis too (a blueprint node). `order` must hold each of 0 .. R-1 once.
template <std::size_t R>
constexpr permute_spec<R> permute(const shape_t<R>& order) {
  return {order};
}

/// Reorders the axes of a rank-R tensor (a copy in the new row-major order).
template <class T, class G, std::size_t R, class Ctx = cpu_context>
class permute_layer : public data_layer_base<T, G, R, R, Ctx> {
  template <class U>
  using tensor = tensor_t<Ctx, U, R>;

 public:
  /// Its kind as describe prints it.
  static constexpr std::string_view kind = "permute";
  /// Makes the layer from its blueprint `s`; throws precis::error when `s.order` is not a
  /// permutation of 0 .. R-1.
  explicit permute_layer(const permute_spec<R>& s) : order_(s.order) {
    std::array<bool, R> seen{};
    for (auto a : order_) {
      if (a >= R || seen[a]) {
        throw error("precis::nn::permute: the order " + shape_string(order_) +
                    " is not a permutation of 0 .. " + std::to_string(R - 1));
      }
      seen[a] = true;
    }
  }

  /// The input's axes in the new order.
  shape_t<R> output_shape(const shape_t<R>& in, std::string_view) const {
    shape_t<R> out{};
    for (std::size_t i = 0; i < R; ++i) out[i] = in[order_[i]];
    return out;
  }
  /// x with its axes reordered (a copy in the new row-major order).
  const tensor<T>& forward(context_ref_t<Ctx> ctx, const tensor<T>& x, mode = mode::train) {
    in_shape_ = shape_of<R>(x);
    ensure(y_, output_shape(in_shape_, kind));
    move(ctx, x.data(), y_.data(), false);
    return y_;
  }
  /// dy moved back to the input's axis order; throws precis::error when dy's shape is not
  /// the last output's.
  const tensor<G>& backward(context_ref_t<Ctx> ctx, const tensor<G>& dy) {
    check_shape("precis::nn::permute: dy", dy, shape_of<R>(y_));
    ensure(dx_, in_shape_);
    move(ctx, dy.data(), dx_.data(), true);
    return dx_;
  }
  /// Its shape for describe: the order, as "[0, 2, 1]".
  std::string shape() const { return shape_string(order_); }
  /// Bytes of its output and input-gradient buffers.
  std::size_t own_bytes() const { return bytes_of(y_) + bytes_of(dx_); }

 private:
  // Walks the output in row-major order with the input offset alongside; `back` writes to
  // the input's place instead of reading from it (the gradient's move).
  template <class U>
  void move(context_ref_t<Ctx> ctx, const U* from, U* to, bool back) const {
    if constexpr (!std::is_same_v<Ctx, cpu_context>) {
      context_traits<Ctx>::strided_copy("precis::nn::permute", ctx, from, to,
                                        detail::permute_plan(in_shape_, order_, back));
      return;
    } else {
      (void)ctx;
    }
    const auto out = output_shape(in_shape_, kind);
    const auto in_strides = detail::strides_of<R>(in_shape_);
    shape_t<R> step{};  // input stride of each output axis
    for (std::size_t i = 0; i < R; ++i) step[i] = in_strides[order_[i]];
    const std::size_t n = detail::elements(out);
    shape_t<R> idx{};
    std::size_t src = 0;
    for (std::size_t o = 0; o < n; ++o) {
      if (back) {
        to[src] = from[o];
      } else {
        to[o] = from[src];
      }
      for (std::size_t a = R; a-- > 0;) {
        src += step[a];
        if (++idx[a] < out[a]) break;
        src -= step[a] * out[a];
        idx[a] = 0;
      }
    }
  }

  shape_t<R> order_;
  shape_t<R> in_shape_{};
  tensor<T> y_;
  tensor<G> dx_;
};

// ---------------------------------------------------------------------------------------
// patchify

template <class T, class G, std::size_t R, class Ctx>
class patchify_layer;

/// Blueprint of nn::patchify.
struct patchify_spec {
  std::size_t patch;  ///< the side p of the square patches, in pixels
  /// The layer nn::build makes of it on Ctx, for input element type In, gradient G, rank R (4).
  template <class Map, class Ctx, class In, class G, std::size_t R>
  using module_type = patchify_layer<In, G, R, Ctx>;
};

/// Cuts [N, C, H, W] images into p x p patches: [N, (H/p)(W/p), C*p*p] (a blueprint node).
/// Patches are numbered row-major (token = row * (W/p) + column); within a patch the
/// values run channel-major, then row, then column (feature = (c * p + i) * p + j), as
/// PyTorch's `x.unfold(2, p, p).unfold(3, p, p).permute(0, 2, 3, 1, 4, 5).reshape(N, -1,
/// C*p*p)`: so patchify then nn::linear(C*p*p, D) is ViT's patch embedding, a p x p
/// convolution of stride p whose [D, C, p, p] weight is the linear's [D, C*p*p] one.
/// H and W must be multiples of p.
constexpr patchify_spec patchify(std::size_t patch) { return {patch}; }

/// Cuts images into patches (see nn::patchify).
template <class T, class G, std::size_t R, class Ctx = cpu_context>
class patchify_layer : public data_layer_base<T, G, R, 3, Ctx> {
  static_assert(R == 4, "precis: nn::patchify takes [N, C, H, W] images (rank 4)");
  template <class U, std::size_t N>
  using tensor = tensor_t<Ctx, U, N>;

 public:
  /// Its kind as describe prints it.
  static constexpr std::string_view kind = "patchify";
  /// Makes the layer from its blueprint `s`; throws precis::error when the patch size is 0.
  explicit patchify_layer(const patchify_spec& s) : p_(s.patch) {
    if (p_ == 0) throw error("precis::nn::patchify: needs a patch size > 0");
  }

  /// [N, (H/p)(W/p), C*p*p] for [N, C, H, W]; throws precis::error naming `path` when H or
  /// W is not a multiple of p or an axis is empty.
  shape_t<3> output_shape(const shape_t<4>& in, std::string_view path) const {
    if (in[2] % p_ != 0 || in[3] % p_ != 0 || detail::elements(in) == 0) {
      bad_shape(
          path, kind,
          "[N, C, H, W] with H and W multiples of " + std::to_string(p_) + " and no empty axis",
          shape_string(in));
    }
    return {in[0], (in[2] / p_) * (in[3] / p_), in[1] * p_ * p_};
  }
  /// The patches of x, laid out as nn::patchify describes (a copy, split across ctx's
  /// threads). Throws precis::error as output_shape() does.
  const tensor<T, 3>& forward(context_ref_t<Ctx> ctx, const tensor<T, 4>& x, mode = mode::train) {
    in_shape_ = shape_of<4>(x);
    ensure(y_, output_shape(in_shape_, kind));
    move(ctx, x.data(), y_.data(), false);
    return y_;
  }
  /// dy moved back from patches to pixels; throws precis::error when dy's shape is not
  /// the last output's.
  const tensor<G, 4>& backward(context_ref_t<Ctx> ctx, const tensor<G, 3>& dy) {
    check_shape("precis::nn::patchify: dy", dy, shape_of<3>(y_));
    ensure(dx_, in_shape_);
    move(ctx, dy.data(), dx_.data(), true);
    return dx_;
  }
  /// Its shape for describe: the patch size, as "16x16".
  std::string shape() const { return std::to_string(p_) + "x" + std::to_string(p_); }
  /// Bytes of its output and input-gradient buffers.
  std::size_t own_bytes() const { return bytes_of(y_) + bytes_of(dx_); }

 private:
  // One (image, patch row) at a time; `back` moves from patches to pixels. A bijection:
  // every element is written once.
  template <class U>
  void move(context_ref_t<Ctx> ctx, const U* from, U* to, bool back) const {
    const std::size_t n = in_shape_[0], c = in_shape_[1], h = in_shape_[2], w = in_shape_[3];
    const std::size_t rows = h / p_, cols = w / p_;
    if constexpr (!std::is_same_v<Ctx, cpu_context>) {
      context_traits<Ctx>::strided_copy("precis::nn::patchify", ctx, from, to,
                                        detail::patchify_plan(in_shape_, p_, back));
    } else {
      const std::size_t features = c * p_ * p_, per_row = cols * features;
      precis::detail::parallel_for(
          ctx, n * rows, std::max<std::size_t>(1, precis::detail::elements_per_thread / per_row),
          [&](std::size_t b, std::size_t e) {
            for (std::size_t r = b; r < e; ++r) {
              const std::size_t img = r / rows, pr = r % rows;
              for (std::size_t pc = 0; pc < cols; ++pc) {
                const std::size_t token = pr * cols + pc;
                std::size_t f = (img * rows * cols + token) * features;
                for (std::size_t ch = 0; ch < c; ++ch) {
                  for (std::size_t i = 0; i < p_; ++i) {
                    const std::size_t pixel = ((img * c + ch) * h + pr * p_ + i) * w + pc * p_;
                    for (std::size_t j = 0; j < p_; ++j, ++f) {
                      if (back) {
                        to[pixel + j] = from[f];
                      } else {
                        to[f] = from[pixel + j];
                      }
                    }
                  }
                }
              }
            }
          });
    }
  }

  std::size_t p_;
  shape_t<4> in_shape_{};
  tensor<T, 3> y_;
  tensor<G, 4> dx_;
};

// ---------------------------------------------------------------------------------------
// select_token

template <class T, class G, std::size_t R, class Ctx>
class select_token_layer;

/// Blueprint of nn::select_token.
struct select_token_spec {
  std::size_t index;  ///< the token taken from each item
  /// The layer nn::build makes of it on Ctx, for input element type In, gradient G, rank R (3).
  template <class Map, class Ctx, class In, class G, std::size_t R>
  using module_type = select_token_layer<In, G, R, Ctx>;
};

/// [N, T, D] -> [N, D]: token `index` of every item, as ViT's head reads the class token
/// (index 0); its gradient goes to that token, the others get zeros (a blueprint node).
constexpr select_token_spec select_token(std::size_t index) { return {index}; }

/// Takes one token of each item (see nn::select_token).
template <class T, class G, std::size_t R, class Ctx = cpu_context>
class select_token_layer : public data_layer_base<T, G, R, 2, Ctx> {
  static_assert(R == 3, "precis: nn::select_token takes [N, T, D] token sequences (rank 3)");
  template <class U, std::size_t N>
  using tensor = tensor_t<Ctx, U, N>;
  using io = context_traits<Ctx>;
  static constexpr bool on_host = std::is_same_v<Ctx, cpu_context>;

 public:
  /// Its kind as describe prints it.
  static constexpr std::string_view kind = "select_token";
  /// Makes the layer from its blueprint `s`.
  explicit select_token_layer(const select_token_spec& s) : index_(s.index) {}

  /// [N, D] for [N, T, D]; throws precis::error naming `path` when T <= index.
  shape_t<2> output_shape(const shape_t<3>& in, std::string_view path) const {
    if (in[1] <= index_) {
      bad_shape(path, kind, "[N, T, D] with T > " + std::to_string(index_),
                        shape_string(in));
    }
    return {in[0], in[2]};
  }
  /// Token `index` of each item of x (a copy). Throws precis::error as output_shape() does.
  const tensor<T, 2>& forward(context_ref_t<Ctx> ctx, const tensor<T, 3>& x, mode = mode::train) {
    in_shape_ = shape_of<3>(x);
    ensure(y_, output_shape(in_shape_, kind));
    const std::size_t t = in_shape_[1], d = in_shape_[2];
    if constexpr (on_host) {
      for (std::size_t n = 0; n < in_shape_[0]; ++n) {
        std::copy_n(x.data() + (n * t + index_) * d, d, y_.data() + n * d);
      }
    } else {
      io::strided_copy("precis::nn::select_token", ctx, x.data() + index_ * d, y_.data(),
                       detail::select_token_plan(in_shape_[0], t, d, false));
    }
    return y_;
  }
  /// dy at token `index` of each item, zeros at the others; throws precis::error when dy's
  /// shape is not the last output's.
  const tensor<G, 3>& backward(context_ref_t<Ctx> ctx, const tensor<G, 2>& dy) {
    check_shape("precis::nn::select_token: dy", dy, shape_of<2>(y_));
    ensure(dx_, in_shape_);
    const std::size_t t = in_shape_[1], d = in_shape_[2];
    if constexpr (on_host) {
      std::fill(dx_.begin(), dx_.end(), G{});
      for (std::size_t n = 0; n < in_shape_[0]; ++n) {
        std::copy_n(dy.data() + n * d, d, dx_.data() + (n * t + index_) * d);
      }
    } else {
      io::zero(ctx, dx_);
      io::strided_copy("precis::nn::select_token", ctx, dy.data(), dx_.data() + index_ * d,
                       detail::select_token_plan(in_shape_[0], t, d, true));
    }
    return dx_;
  }
  /// Its shape for describe: the token, as "token 0".
  std::string shape() const { return "token " + std::to_string(index_); }
  /// Bytes of its output and input-gradient buffers.
  std::size_t own_bytes() const { return bytes_of(y_) + bytes_of(dx_); }

 private:
  std::size_t index_;
  shape_t<3> in_shape_{};
  tensor<T, 2> y_;
  tensor<G, 3> dx_;
};

// ---------------------------------------------------------------------------------------
// dropout

template <Layer Tag, Policy P, std::size_t R, class Ctx>
class dropout_layer;

/// Blueprint of nn::dropout.
template <Layer Tag>
struct dropout_spec {
  double p;  ///< the drop probability, in [0, 1)
  /// The layer nn::build makes of it: a dropout_layer under the policy `Map` gives `Tag`.
  template <class Map, class Ctx, class In, class G, std::size_t R>
  using module_type = dropout_layer<Tag, policy_for_t<Tag, Map>, R, Ctx>;
};

/// Inverted dropout with drop probability p in [0, 1) (a blueprint node).
template <Layer Tag = tags::dropout>
constexpr dropout_spec<Tag> dropout(double p) {
  return {p};
}

/// Inverted dropout: in training each element is kept with probability 1 - p and scaled by
/// 1 / (1 - p) (the product in the policy's opmath type, rounded once to the storage
/// type), or zeroed; the gradient is masked and scaled the same way. In evaluation it is
/// the identity (no copy). The mask is a counter hash of (seed, forward-call count,
/// element): the same on every machine and thread count, repeated by a layer with the
/// same seed, and continued by a resumed run, since seed and call count are checkpointed
/// (fields "seed" and "calls"). The seed comes from the build seed and the layer's path.
template <Layer Tag, Policy P, std::size_t R, class Ctx>
class dropout_layer : public layer_base<Tag, P, op::elementwise, R, R, Ctx> {
  using base = layer_base<Tag, P, op::elementwise, R, R, Ctx>;
  using S = typename base::input_type;
  using G = typename base::input_grad_type;
  template <class U, std::size_t N = R>
  using tensor = tensor_t<Ctx, U, N>;
  static constexpr bool on_host = std::is_same_v<Ctx, cpu_context>;

 public:
  /// Its kind as describe prints it.
  static constexpr std::string_view kind = "dropout";

  /// Makes the layer from its blueprint `s`, with seed 0 until reset(); throws precis::error
  /// when p is not in [0, 1).
  explicit dropout_layer(const dropout_spec<Tag>& s) : p_(s.p) {
    if (!(s.p >= 0.0 && s.p < 1.0)) {
      throw error("precis::nn::dropout: p must be in [0, 1), got " + detail::number_string(s.p));
    }
  }

  /// Starts the mask sequence of `seed` again.
  void reset(std::uint64_t seed) {
    seed_ = seed;
    calls_ = 0;
  }

  /// The input's shape.
  shape_t<R> output_shape(const shape_t<R>& in, std::string_view) const { return in; }

  /// In training, x with each element kept and scaled by 1 / (1 - p) or zeroed, by the
  /// next mask of the sequence (advancing calls()); in evaluation, x itself.
  const tensor<S>& forward(context_ref_t<Ctx> ctx, const tensor<S>& x, mode m = mode::train) {
    train_ = m == mode::train;
    if (!train_) return x;
    using M = precis::detail::math_t<op::elementwise, P, S>;
    const std::size_t n = x.size();
    ensure(y_, shape_of<R>(x));
    ensure(mask_, shape_t<1>{n});
    const M keep = M(1) / (M(1) - M(p_));
    const std::uint64_t seed = seed_, call = calls_;
    const double p = p_;
    std::uint8_t* mask = mask_.data();
    if constexpr (!on_host) {
      context_traits<Ctx>::dropout(ctx, x.data(), y_.data(), mask, n, seed, call, p, keep);
    } else {
      precis::detail::map_blocks<M>(
          ctx, n, y_.data(),
          [=](std::size_t start, std::size_t len, M* r, const M* v) {
            for (std::size_t i = 0; i < len; ++i) {
              const bool kept = detail::unit_random(seed, call, start + i) >= p;
              mask[start + i] = kept ? 1 : 0;
              r[i] = kept ? v[i] * keep : M(0);
            }
          },
          x.data());
    }
    ++calls_;
    x_.set(x);
    return y_;
  }
  /// Backward of the last forward pass (the identity after an evaluation pass).
  const tensor<G>& backward(context_ref_t<Ctx> ctx, const tensor<G>& dy) {
    if (!train_) return dy;
    check_same_shape("precis::nn::dropout: dy and the output", dy, y_);
    using M = precis::detail::math_t<op::elementwise, P, G>;
    ensure(dx_, shape_of<R>(dy));
    const M keep = M(1) / (M(1) - M(p_));
    const std::uint8_t* mask = mask_.data();
    if constexpr (!on_host) {
      context_traits<Ctx>::dropout_backward(ctx, dy.data(), mask, dx_.data(), dy.size(), keep);
    } else {
      precis::detail::map_blocks<M>(
          ctx, dy.size(), dx_.data(),
          [=](std::size_t start, std::size_t len, M* r, const M* g) {
            for (std::size_t i = 0; i < len; ++i) r[i] = mask[start + i] != 0 ? g[i] * keep : M(0);
          },
          dy.data());
    }
    return dx_;
  }

  /// The seed of the mask sequence.
  std::uint64_t seed() const { return seed_; }
  /// Forward calls in training mode since reset().
  std::uint64_t calls() const { return calls_; }
  /// The drop probability.
  double probability() const { return p_; }
  /// Its shape for describe: the probability, as "p=0.1".
  std::string shape() const { return "p=" + detail::number_string(p_); }
  /// Bytes of its output, input-gradient and mask buffers.
  std::size_t own_bytes() const {
    return bytes_of(y_) + bytes_of(dx_) + bytes_of(mask_);
  }
  /// The buffers of the last passes, for precis::diagnostics (see nn/module.hpp).
  template <class Self, class F>
  static void for_each_observed(Self& self, F&& f) {
    f("", std::type_identity<Tag>{}, self.x_.peek(), self.y_, self.dx_);
  }
  /// Saves or loads the checkpoint fields "seed" and "calls" under `prefix`.
  template <class Archive>
  void visit_state(Archive& a, const std::string& prefix) {
    a.field(prefix + "seed", seed_);
    a.field(prefix + "calls", calls_);
  }

 private:
  double p_;
  std::uint64_t seed_ = 0;
  std::uint64_t calls_ = 0;
  bool train_ = true;
  tensor<std::uint8_t, 1> mask_;  // 1 where the element was kept
  tensor<S> y_;
  tensor<G> dx_;
  saved<tensor<S>> x_;
};

// ---------------------------------------------------------------------------------------
// scale

template <Layer Tag, Policy P, std::size_t R, class Ctx>
class scale_layer;

/// Blueprint of nn::scale.
template <Layer Tag>
struct scale_spec {
  double factor;  ///< what the values are multiplied by
  /// The layer nn::build makes of it: a scale_layer under the policy `Map` gives `Tag`.
  template <class Map, class Ctx, class In, class G, std::size_t R>
  using module_type = scale_layer<Tag, policy_for_t<Tag, Map>, R, Ctx>;
};

/// y = x * factor (a blueprint node).
template <Layer Tag = tags::scale>
constexpr scale_spec<Tag> scale(double factor) {
  return {factor};
}

/// y = x * factor and dx = dy * factor: the factor is held in the policy's opmath type
/// (float for 16-bit formats, so it is rounded to float once), each product rounded once.
template <Layer Tag, Policy P, std::size_t R, class Ctx>
class scale_layer : public layer_base<Tag, P, op::elementwise, R, R, Ctx> {
  using base = layer_base<Tag, P, op::elementwise, R, R, Ctx>;
  using S = typename base::input_type;
  using G = typename base::input_grad_type;
  template <class U>
  using tensor = tensor_t<Ctx, U, R>;

 public:
  /// Its kind as describe prints it.
  static constexpr std::string_view kind = "scale";

  /// Makes the layer from its blueprint `s`.
  explicit scale_layer(const scale_spec<Tag>& s) : factor_(s.factor) {}

  /// The input's shape.
  shape_t<R> output_shape(const shape_t<R>& in, std::string_view) const { return in; }

  /// x * factor, each product rounded once to the storage type.
  const tensor<S>& forward(context_ref_t<Ctx> ctx, const tensor<S>& x, mode = mode::train) {
    ensure(y_, shape_of<R>(x));
    multiply(ctx, x, y_);
    x_.set(x);
    return y_;
  }
  /// dy * factor, each product rounded once to the gradient type.
  const tensor<G>& backward(context_ref_t<Ctx> ctx, const tensor<G>& dy) {
    ensure(dx_, shape_of<R>(dy));
    multiply(ctx, dy, dx_);
    return dx_;
  }
  /// The factor, as the blueprint gave it.
  double factor() const { return factor_; }
  /// Its shape for describe: the factor, as "x0.5".
  std::string shape() const { return "x" + detail::number_string(factor_); }
  /// Bytes of its output and input-gradient buffers.
  std::size_t own_bytes() const { return bytes_of(y_) + bytes_of(dx_); }
  /// The buffers of the last passes, for precis::diagnostics (see nn/module.hpp).
  template <class Self, class F>
  static void for_each_observed(Self& self, F&& f) {
    f("", std::type_identity<Tag>{}, self.x_.peek(), self.y_, self.dx_);
  }

 private:
  template <class U>
  void multiply(context_ref_t<Ctx> ctx, const tensor<U>& in, tensor<U>& out) const {
    using M = precis::detail::math_t<op::elementwise, P, U>;
    const M f = static_cast<M>(factor_);
    if constexpr (!std::is_same_v<Ctx, cpu_context>) {
      context_traits<Ctx>::scale(ctx, in.data(), out.data(), in.size(), f);
    } else {
      precis::detail::map_blocks<M>(
          ctx, in.size(), out.data(),
          [f](std::size_t, std::size_t len, M* r, const M* v) {
            for (std::size_t i = 0; i < len; ++i) r[i] = v[i] * f;
          },
          in.data());
    }
  }

  double factor_;
  tensor<S> y_;
  tensor<G> dx_;
  saved<tensor<S>> x_;
};

}  // namespace precis::nn
