/// @file
/// Scaled and unscaled gradients as different types.
///
/// A backward pass on a scaled loss yields `scaled<G>`: the gradients still multiplied by
/// the loss scale. Only `unscale` turns them into `unscaled<G>`, once (it consumes its
/// argument), and only unscaled gradients can be clipped or stepped with. Clipping scaled
/// gradients, unscaling twice and stepping twice do not compile.
#pragma once

#include <precis/config.hpp>
#include <precis/kernels/cpu/vec_math.hpp>
#include <precis/kernels/unscale.hpp>
#include <precis/numeric/detail/unfused.hpp>
#include <precis/tensor/device_span.hpp>

#include <array>
#include <cmath>
#include <cstddef>
#include <ranges>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace precis {

/// A gradient tensor: a contiguous sized range of float, bfloat16 or float16.
template <class T>
concept gradient_tensor = std::ranges::contiguous_range<T> && std::ranges::sized_range<T> &&
                          gradient_element<std::ranges::range_value_t<T>>;

/// How precis reaches the tensors of a gradient container `G`: `for_each(g, f)` calls
/// `f(std::span<T>)` for each tensor, and `for_each_pair(a, b, f)` calls `f(span_a,
/// span_b)` for corresponding tensors of two containers of the same shape. The default
/// handles one tensor, a range of tensors (e.g. `std::vector<std::vector<bfloat16>>`),
/// and tuples of those; specialise it for other containers.
template <class G>
struct gradient_access {
  /// Calls `f(std::span<T>)` for every tensor of `g`, in order (`T`: its element type).
  template <class F>
  static void for_each(G& g, F&& f) {
    if constexpr (is_device_span_v<G>) {
      static_assert(!is_device_span_v<G>,
                    "precis: these gradients are in device memory (precis::device_span: a cuda_context "
                    "model's gradients()); the host's unscale, clipping and optimizers cannot read them");
    } else if constexpr (gradient_tensor<G>) {
      using T = std::ranges::range_value_t<G>;
      f(std::span<T>(std::ranges::data(g), std::ranges::size(g)));
    } else if constexpr (std::ranges::range<G>) {
      for (auto& t : g) gradient_access<std::remove_reference_t<decltype(t)>>::for_each(t, f);
    } else {
      std::apply(
          [&](auto&... parts) {
            (gradient_access<std::remove_reference_t<decltype(parts)>>::for_each(parts, f), ...);
          },
          g);
    }
  }

  /// Calls `f(span_a, span_b)` for corresponding tensors of `a` and `b`, in order. Throws
  /// precis::error when they differ in the number of tensors or of elements.
  template <class F>
  static void for_each_pair(G& a, G& b, F&& f) {
    if constexpr (is_device_span_v<G>) {
      static_assert(!is_device_span_v<G>,
                    "precis: these gradients are in device memory (precis::device_span: a cuda_context "
                    "model's gradients()); the host's unscale, clipping and optimizers cannot read them");
    } else if constexpr (gradient_tensor<G>) {
      using T = std::ranges::range_value_t<G>;
      if (std::ranges::size(a) != std::ranges::size(b)) {
        throw error("precis: gradient tensors of " + std::to_string(std::ranges::size(a)) +
                    " and " + std::to_string(std::ranges::size(b)) + " elements do not match");
      }
      f(std::span<T>(std::ranges::data(a), std::ranges::size(a)),
        std::span<T>(std::ranges::data(b), std::ranges::size(b)));
    } else if constexpr (std::ranges::range<G>) {
      if (std::ranges::size(a) != std::ranges::size(b)) {
        throw error("precis: gradient containers of " + std::to_string(std::ranges::size(a)) +
                    " and " + std::to_string(std::ranges::size(b)) + " tensors do not match");
      }
      auto ib = std::ranges::begin(b);
      for (auto& t : a) {
        gradient_access<std::remove_reference_t<decltype(t)>>::for_each_pair(t, *ib, f);
        ++ib;
      }
    } else {
      [&]<std::size_t... I>(std::index_sequence<I...>) {
        (gradient_access<std::remove_reference_t<decltype(std::get<I>(a))>>::for_each_pair(
             std::get<I>(a), std::get<I>(b), f),
         ...);
      }(std::make_index_sequence<std::tuple_size_v<G>>{});
    }
  }
};

namespace detail {
/// A visitor that does nothing: what the gradients concept walks a container with. A named
/// type rather than a lambda, which nvcc's device pass judges a requires-expression false by.
struct ignore_tensor {
  template <class T>
  void operator()(T) const {}
};
}  // namespace detail

/// A gradient container precis can walk (see gradient_access).
template <class G>
concept gradients = requires(G& g, detail::ignore_tensor f) { gradient_access<G>::for_each(g, f); };

template <gradients G>
class unscaled;

/// Gradients of a loss multiplied by `scale()`. Obtained from a scaler
/// (`scaler.scaled_gradients(std::move(grads))`) or from a backward pass of a scaled loss.
/// Micro-batches accumulate with accumulate() before the single unscale at the boundary.
template <gradients G>
class scaled {
 public:
  /// Wraps gradients computed from a loss multiplied by `scale`.
  scaled(G grads, float scale) : grads_(std::move(grads)), scale_(scale) {
    if (!(scale > 0.0f) || !std::isfinite(scale)) {
      throw error("precis::scaled: the loss scale must be finite and positive, got " +
                  std::to_string(scale));
    }
  }
  /// Takes over `other`'s gradients; `other` is left consumed (using it throws).
  scaled(scaled&& other) noexcept
      : grads_(std::move(other.grads_)), scale_(other.scale_), consumed_(other.consumed_) {
    other.consumed_ = true;
  }
  /// Takes over `other`'s gradients; `other` is left consumed (using it throws).
  scaled& operator=(scaled&& other) noexcept {
    grads_ = std::move(other.grads_);
    scale_ = other.scale_;
    consumed_ = other.consumed_;
    other.consumed_ = true;
    return *this;
  }
  scaled(const scaled&) = delete;  // a copy could be unscaled twice
  scaled& operator=(const scaled&) = delete;

  /// The scale these gradients are multiplied by.
  float scale() const { return scale_; }
  /// The scaled values, read-only (for inspection; they are scale() times too large).
  const G& values() const { return grads_; }

  /// Adds a further micro-batch's scaled gradients, computed with the same scale
  /// (elementwise, in float, rounded once to the gradient type).
  scaled& accumulate(scaled&& other) {
    require_live("accumulate into");
    other.require_live("accumulate");
    if (other.scale_ != scale_) {
      throw error("precis::scaled: accumulating gradients scaled by " + std::to_string(other.scale_) +
                  " into gradients scaled by " + std::to_string(scale_) +
                  "; the scale must not change within an accumulation window");
    }
    gradient_access<G>::for_each_pair(grads_, other.grads_, [](auto into, auto from) {
      using T = typename decltype(into)::value_type;
      for (std::size_t i = 0; i < into.size(); ++i) into[i] = T(float(into[i]) + float(from[i]));
    });
    other.consumed_ = true;
    return *this;
  }

 private:
  template <gradients H>
  friend unscaled<H> unscale(scaled<H>&&);

  void require_live(const char* what) const {
    if (consumed_) {
      throw error(std::string("precis::scaled: cannot ") + what +
                  " gradients that were moved from or already unscaled");
    }
  }

  G grads_;
  float scale_;
  bool consumed_ = false;
};

/// Gradients at their true magnitude, with whether unscaling found an infinity or NaN.
template <gradients G>
class unscaled {
 public:
  /// Takes over `other`'s gradients; `other` is left consumed (stepping with it throws).
  unscaled(unscaled&& other) noexcept
      : grads_(std::move(other.grads_)), found_inf_(other.found_inf_), consumed_(other.consumed_) {
    other.consumed_ = true;
  }
  /// Takes over `other`'s gradients; `other` is left consumed (stepping with it throws).
  unscaled& operator=(unscaled&& other) noexcept {
    grads_ = std::move(other.grads_);
    found_inf_ = other.found_inf_;
    consumed_ = other.consumed_;
    other.consumed_ = true;
    return *this;
  }
  unscaled(const unscaled&) = delete;  // a copy could be stepped with twice
  unscaled& operator=(const unscaled&) = delete;

  /// True when some gradient is infinite or NaN: the step will be skipped.
  bool found_inf() const { return found_inf_; }
  /// The gradients.
  G& values() { return grads_; }
  /// The gradients, read-only.
  const G& values() const { return grads_; }
  /// True once the gradients were stepped with or moved from.
  bool consumed() const { return consumed_; }

  /// Takes the gradients out (ending their use for a step).
  G release() && {
    consumed_ = true;
    return std::move(grads_);
  }

 private:
  template <gradients H>
  friend unscaled<H> unscale(scaled<H>&&);
  unscaled(G grads, bool found_inf) : grads_(std::move(grads)), found_inf_(found_inf) {}

  G grads_;
  bool found_inf_;
  bool consumed_ = false;
};

/// Multiplies the gradients by 1 / scale (rounded to float once; exact when the scale is a
/// power of two, as the dynamic scaler's are) in one fused pass per tensor and records
/// whether any result is infinite or NaN. Consumes the scaled gradients: they cannot be
/// unscaled twice.
template <gradients G>
unscaled<G> unscale(scaled<G>&& g) {
  g.require_live("unscale");
  const float inv = 1.0f / g.scale_;
  bool found = false;
  gradient_access<G>::for_each(g.grads_, [&](auto span) { found |= unscale_and_check(span, inv); });
  g.consumed_ = true;
  return unscaled<G>(std::move(g.grads_), found);
}

/// Does not compile: unscale() consumes its argument; pass `std::move(grads)`.
template <gradients G>
void unscale(scaled<G>&) {
  static_assert(detail::dependent_false_v<G>,
                "precis: unscale() consumes the scaled gradients; pass std::move(grads). Keeping "
                "them would let them be unscaled twice, dividing by the scale twice");
}

/// Does not compile: the gradients are already unscaled.
template <gradients G>
void unscale(unscaled<G>&&) {
  static_assert(detail::dependent_false_v<G>,
                "precis: these gradients are already unscaled; unscale() once per optimizer "
                "step, at the end of gradient accumulation");
}
/// Does not compile: the gradients are already unscaled.
template <gradients G>
void unscale(unscaled<G>&) {
  static_assert(detail::dependent_false_v<G>,
                "precis: these gradients are already unscaled; unscale() once per optimizer "
                "step, at the end of gradient accumulation");
}

namespace detail {

/// sums[k] += the squares, in double, of span's elements i with i mod 8 = k, each sum in
/// element order. The sums run as SIMD vectors of doubles as wide as the target's
/// registers (2, 4 or 8 doubles; lane j of vector a holds sum a * width + j), so every
/// target adds the same terms in the same order: the same bits everywhere.
template <class T>
void add_squares(std::span<T> span, std::array<double, 8>& sums) {
#if defined(__CUDACC__)
  // nvcc cannot instantiate host-device templates (mul) with GCC vector types: one element
  // at a time, each into the same sum in the same order as the vectors below.
  for (std::size_t i = 0; i < span.size(); ++i) {
    sums[i % 8] += mul(double(float(span[i])), double(float(span[i])));
  }
#else
  constexpr std::size_t bytes = vmath::lanes * sizeof(float);
  using vd = double __attribute__((vector_size(bytes)));
  constexpr std::size_t width = bytes / sizeof(double);
  constexpr std::size_t vectors = 8 / width;
  static_assert(8 % width == 0);
  vd acc[vectors];
  for (std::size_t a = 0; a < vectors; ++a) {
    for (std::size_t j = 0; j < width; ++j) acc[a][j] = sums[a * width + j];
  }
  const std::size_t n = span.size(), whole = n - n % 8;
  for (std::size_t i = 0; i < whole; i += 8) {
    for (std::size_t a = 0; a < vectors; ++a) {
      vd x;
      for (std::size_t j = 0; j < width; ++j) x[j] = double(float(span[i + a * width + j]));
      // Squares of floats are exact in double; mul keeps the compiler from fusing them
      // anyway, so the machine code is the same under any -ffp-contract (tests/flags).
      acc[a] += mul(x, x);
    }
  }
  for (std::size_t a = 0; a < vectors; ++a) {
    for (std::size_t j = 0; j < width; ++j) sums[a * width + j] = acc[a][j];
  }
  for (std::size_t i = whole; i < n; ++i) {
    sums[i % 8] += mul(double(float(span[i])), double(float(span[i])));
  }
#endif
}

}  // namespace detail

/// The L2 norm of all gradients together, accumulated in double: eight running sums (element
/// i of each tensor goes to sum i mod 8), added pairwise at the end. A fixed order, so the
/// same value on every machine; the sums run as SIMD vectors.
template <gradients G>
double grad_norm(const unscaled<G>& g) {
  std::array<double, 8> sum{};
  gradient_access<G>::for_each(const_cast<G&>(g.values()),
                               [&](auto span) { detail::add_squares(span, sum); });
  return std::sqrt(((sum[0] + sum[1]) + (sum[2] + sum[3])) +
                   ((sum[4] + sum[5]) + (sum[6] + sum[7])));
}

/// Scales the gradients so that their joint L2 norm is at most `max_norm`; returns the
/// norm before clipping. A non-finite norm leaves them unchanged (that step is skipped).
template <gradients G>
double clip_grad_norm(unscaled<G>& g, double max_norm) {
  if (!(max_norm > 0.0)) throw error("precis::clip_grad_norm: max_norm must be positive");
  const double norm = grad_norm(g);
  if (!std::isfinite(norm) || norm <= max_norm) return norm;
  const float factor = static_cast<float>(max_norm / (norm + 1e-6));
  gradient_access<G>::for_each(g.values(), [&](auto span) {
    using T = typename decltype(span)::value_type;
    for (auto& v : span) v = T(float(v) * factor);
  });
  return norm;
}

/// Clamps every gradient to [-clip_value, clip_value].
template <gradients G>
void clip_grad_value(unscaled<G>& g, float clip_value) {
  if (!(clip_value > 0.0f)) throw error("precis::clip_grad_value: clip_value must be positive");
  gradient_access<G>::for_each(g.values(), [&](auto span) {
    using T = typename decltype(span)::value_type;
    const T hi(clip_value), lo(-clip_value);
    for (auto& v : span) v = float(v) > float(hi) ? hi : (float(v) < float(lo) ? lo : v);
  });
}

/// Does not compile: clip after unscale(), not the gradients still multiplied by the scale.
template <gradients G>
void clip_grad_norm(scaled<G>&, double) {
  static_assert(detail::dependent_false_v<G>,
                "precis: clip the gradients after unscale(); these are still multiplied by the "
                "loss scale, so max_norm would be compared with a norm scale times too large");
}
/// Does not compile: clip after unscale(), not the gradients still multiplied by the scale.
template <gradients G>
void clip_grad_value(scaled<G>&, float) {
  static_assert(detail::dependent_false_v<G>,
                "precis: clip the gradients after unscale(); these are still multiplied by the "
                "loss scale, so the clip value would cut them scale times too early");
}

}  // namespace precis
