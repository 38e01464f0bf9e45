/// @file
/// The fused unscale + non-finite check: one pass over many gradient tensors multiplies each
/// element by 1/scale and notes whether any result is infinite or NaN. For float, bfloat16 and
/// float16 gradient storage.
#pragma once

#include <precis/config.hpp>
#include <precis/numeric/bfloat16.hpp>
#include <precis/numeric/float16.hpp>
#include <precis/numeric/detail/encoding.hpp>
#include <precis/numeric/detail/f16c.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

namespace precis {

/// Element types the fused unscale accepts.
template <class T>
concept gradient_element =
    std::is_same_v<T, float> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>;

namespace detail {

// 1 when the float with these bits is infinite or NaN (exponent all ones), else 0:
// integer arithmetic, so the loop vectorises.
PRECIS_HOST_DEVICE constexpr std::uint32_t nonfinite_bit(std::uint32_t bits) {
  return ((bits & 0x7F800000U) + 0x00800000U) >> 31;
}

}  // namespace detail

/// Multiplies every element of `data` by `inv_scale` in place (a narrow format rounds the
/// float product once to nearest-even) and returns true when any result is infinite or
/// NaN. The CUDA backend offers the same call for device tensors.
template <gradient_element T>
bool unscale_and_check(std::span<T> data, float inv_scale) {
  std::uint32_t found = 0;
  if constexpr (std::is_same_v<T, float>) {
    float* p = data.data();
    for (std::size_t i = 0, n = data.size(); i < n; ++i) {
      const float v = p[i] * inv_scale;
      p[i] = v;
      found |= detail::nonfinite_bit(__builtin_bit_cast(std::uint32_t, v));
    }
  } else {
    using F = typename T::format;
    auto* p = reinterpret_cast<typename F::storage_type*>(data.data());
    std::size_t i = 0;
    const std::size_t n = data.size();
#if PRECIS_HAVE_F16C
    if constexpr (std::is_same_v<T, float16>) {
      // The portable decoder does not vectorise; F16C converts eight at a time.
      const __m256 factor = _mm256_set1_ps(inv_scale);
      __m128i bad = _mm_setzero_si128();
      for (; i + 8 <= n; i += 8) {
        auto* at = reinterpret_cast<__m128i*>(p + i);
        const __m128i h = detail::f16c::encode8(
            _mm256_mul_ps(detail::f16c::decode8(_mm_loadu_si128(at)), factor));
        _mm_storeu_si128(at, h);
        bad = _mm_or_si128(bad, detail::f16c::nonfinite8(h));
      }
      found |= _mm_testz_si128(bad, bad) ? 0U : 1U;
    }
#endif
    for (; i < n; ++i) {
      const auto r = detail::encode<F, rounding::nearest_even, overflow::infinity>(
          detail::decode<F>(p[i]) * inv_scale);
      p[i] = r;
      // The stored result is checked: a finite product can still overflow the format.
      found |= (std::uint32_t(r & F::exponent_mask) + (1U << F::mantissa_bits)) >>
               (F::total_bits - 1);
    }
  }
  return found != 0;
}

/// The same over many tensors of one element type, in one pass each.
template <gradient_element T>
bool unscale_and_check(std::span<const std::span<T>> tensors, float inv_scale) {
  bool found = false;
  for (auto t : tensors) found |= unscale_and_check(t, inv_scale);
  return found;
}

}  // namespace precis
