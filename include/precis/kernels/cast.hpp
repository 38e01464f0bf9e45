/// @file
/// Casts of whole host tensors between float, double and the four precis formats, with a rounding
/// and an overflow mode.
///
/// A cast takes no policy: its meaning is fixed by the two element types and the modes.
/// It is precis::convert's array form (vectorised where the formats have a vector route),
/// split over threads in contiguous parts; each element is converted alone, so results do
/// not depend on the thread count.
#pragma once

#include <precis/kernels/common.hpp>
#include <precis/kernels/context.hpp>
#include <precis/kernels/cpu/support.hpp>
#include <precis/numeric/numeric.hpp>
#include <precis/tensor/host_tensor.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

namespace precis {

/// out = in converted element by element to out's element type: a narrowing conversion
/// rounds once as `R` says (nearest-even by default; rounding::stochastic is refused, use
/// precis::stochastic_round with your own random bits) and treats values beyond the
/// target's range as `O` says (overflow::infinity: IEEE, NaN for float8_e4m3;
/// overflow::saturate: +-max). Widening is exact; NaN stays NaN. Throws precis::error
/// naming both shapes, before writing, when the shapes differ.
///
///     precis::host_tensor<float, 2> w = ...;
///     precis::host_tensor<precis::float8_e4m3, 2> w8(w.shape());
///     precis::cast<precis::rounding::nearest_even, precis::overflow::saturate>(ctx, w, w8);
template <rounding R = rounding::nearest_even, overflow O = overflow::infinity,
          kernel_element From, kernel_element To, std::size_t N>
void cast(const cpu_context& ctx, const host_tensor<From, N>& in, host_tensor<To, N>& out) {
  static_assert(R != rounding::stochastic,
                "precis: stochastic rounding needs random bits per element; call "
                "precis::stochastic_round<T>(x, random_bits) in your loop");
  check_shape("precis::cast: out", out, detail::shape_array<N>(in));
  const std::size_t n = detail::element_count(in);
  const From* src = in.data();
  To* dst = out.data();
  detail::parallel_for(ctx, n, detail::elements_per_thread * 4, [&](std::size_t b, std::size_t e) {
    if constexpr (std::is_same_v<From, To>) {
      std::copy(src + b, src + e, dst + b);
    } else {
      precis::convert<R, O>(std::span<const From>(src + b, e - b), std::span<To>(dst + b, e - b));
    }
  });
}

namespace detail {

/// |x|'s bits: for non-negative floats (and NaN, whose magnitude bits exceed infinity's)
/// the unsigned order is the numeric order.
inline std::uint32_t magnitude_bits(float x) { return std::bit_cast<std::uint32_t>(x) & 0x7FFFFFFFU; }

/// The amax of n elements, and (when `out` is not null) out = saturate(in * scale), per
/// element; the parts' maxima are folded with an atomic maximum, which does not depend on
/// the order.
template <class From, class To>
float amax_and_cast(const cpu_context& ctx, const From* in, std::size_t n, float scale, To* out) {
  std::atomic<std::uint32_t> amax{0};
  parallel_for(ctx, n, elements_per_thread, [&](std::size_t begin, std::size_t end) {
    std::array<float, block_size> v;
    std::uint32_t part = 0;
    for (std::size_t i = begin; i < end; i += block_size) {
      const std::size_t len = std::min(block_size, end - i);
      load_block(in + i, v.data(), len);
      for (std::size_t j = 0; j < len; ++j) part = std::max(part, magnitude_bits(v[j]));
      if constexpr (!std::is_void_v<To>) {
        for (std::size_t j = 0; j < len; ++j) v[j] *= scale;
        precis::convert<rounding::nearest_even, overflow::saturate>(std::span<const float>(v.data(), len),
                                                                    std::span<To>(out + i, len));
      }
    }
    std::uint32_t seen = amax.load(std::memory_order_relaxed);
    while (part > seen && !amax.compare_exchange_weak(seen, part, std::memory_order_relaxed)) {
    }
  });
  return std::bit_cast<float>(amax.load());
}

}  // namespace detail

/// The largest magnitude of `in` (its amax, as float8 scaling recipes record it); NaN when
/// `in` holds a NaN, 0 when it is empty.
template <kernel_element From, std::size_t N>
float amax_of(const cpu_context& ctx, const host_tensor<From, N>& in) {
  return detail::amax_and_cast<From, void>(ctx, in.data(), detail::element_count(in), 1.0f, nullptr);
}

/// out = in * scale cast to the float8 format `To`, as a float8 recipe casts a tensor: the
/// product is rounded to float, then to `To` (nearest-even), and values past the format's
/// max become +-max (NaN stays NaN). Returns the amax of `in` (before scaling; NaN when
/// `in` holds a NaN) for the recipe to record. Each element is converted alone, so the
/// results do not depend on the thread count. Throws precis::error naming both shapes,
/// before writing, when the shapes differ.
///
///     precis::delayed_scaling<precis::float8_e4m3> recipe;
///     const float a = precis::scaled_cast(ctx, x, recipe.scale(), x8);
///     recipe.update(a);  // the scale for the next step
template <kernel_element From, class To, std::size_t N>
  requires is_float8_v<To>
float scaled_cast(const cpu_context& ctx, const host_tensor<From, N>& in, float scale, host_tensor<To, N>& out) {
  check_shape("precis::scaled_cast: out", out, detail::shape_array<N>(in));
  return detail::amax_and_cast(ctx, in.data(), detail::element_count(in), scale, out.data());
}

}  // namespace precis
