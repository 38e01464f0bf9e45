// precis/kernels/cast.hpp: casts of whole host tensors between float, double and the four
// precis formats, with a rounding and an overflow mode.
//
// A cast takes no policy: its meaning is fixed by the two element types and the modes.
// It is precis::convert's array form (vectorised where the formats have a vector route),
// split over threads in contiguous parts; each element is converted alone, so results do
// not depend on the thread count.
#pragma once

#include <precis/kernels/common.hpp>
#include <precis/kernels/context.hpp>
#include <precis/kernels/cpu/support.hpp>
#include <precis/numeric/numeric.hpp>
#include <precis/tensor/host_tensor.hpp>

#include <algorithm>
#include <cstddef>
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

}  // namespace precis
