/// @file
/// Casts of device arrays and device tensors between float, double and the four precis formats,
/// with the rounding and overflow modes of the host cast (kernels/cast.hpp). Each element is
/// converted alone by the same scalar conversion the host uses (precis::convert, compiled for the
/// device), so device and host casts give the same bits. Compiled by nvcc only (include from a .cu
/// file).
#pragma once

#include <precis/config.hpp>
#include <precis/kernels/cast.hpp>
#include <precis/kernels/cuda/common.hpp>
#include <precis/kernels/cuda_context.hpp>
#include <precis/tensor/device_tensor.hpp>

#if defined(__CUDACC__)

#include <cstddef>
#include <span>
#include <string>
#include <type_traits>

namespace precis {

namespace detail::cuda {

/// One element converted as the host cast<R, O> converts it.
template <rounding R, overflow O, class To, class From>
__device__ inline To convert_one(From x) {
  if constexpr (std::is_same_v<From, To>) {
    return x;
  } else if constexpr (precis_format<To>) {
    return precis::convert<To, R, O>(x);
  } else if constexpr (std::is_same_v<To, double>) {
    return precis_format<From> ? double(float(x)) : double(x);  // exact
  } else if constexpr (precis_format<From>) {
    return float(x);  // exact
  } else {
    // double -> float: the only narrowing to a built-in type.
    static_assert(R == rounding::nearest_even && O == overflow::infinity,
                  "precis: on the device double -> float casts round to nearest-even with IEEE "
                  "overflow; cast through precis::convert on the host for other modes");
    return float(x);
  }
}

/// packed_kernel's body: V elements converted, each alone.
template <rounding R, overflow O, class From, class To>
struct cast_body {
  const From* in;
  To* out;
  template <int V>
  __device__ void at(std::size_t i) const {
    const auto x = load_pack<V>(in + i);
    pack<To, V> y;
#pragma unroll
    for (int k = 0; k < V; ++k) y.v[k] = convert_one<R, O, To>(x.v[k]);
    store_pack<V>(out + i, y);
  }
};

template <rounding R, overflow O, class From, class To>
void cast_elements(cuda_context& ctx, const From* in, To* out, std::size_t n) {
  static_assert(R != rounding::stochastic,
                "precis: stochastic rounding needs random bits per element; call "
                "precis::stochastic_round<T>(x, random_bits) in your kernel");
  // 16 bytes of the wider type per access where both arrays are aligned for it (a span's
  // pointer may start anywhere: then one element per thread).
  constexpr int V = pack_width<From, To>;
  launch_packed<V>(ctx.stream(), cast_body<R, O, From, To>{in, out}, n, pack_aligned<V>(in, out), "precis::cast");
}

}  // namespace detail::cuda

/// out = in converted element by element on the device, as the host cast<R, O> does
/// (nearest-even and IEEE overflow by default; overflow::saturate clamps to +-max).
/// Throws precis::error naming both sizes, before any launch, when they differ.
template <rounding R = rounding::nearest_even, overflow O = overflow::infinity, kernel_element From,
          kernel_element To>
void cast(cuda_context& ctx, std::span<const From> in, std::span<To> out) {
  if (in.size() != out.size()) {
    throw error("precis::cast: the output has " + std::to_string(out.size()) +
                " elements, the input has " + std::to_string(in.size()));
  }
  detail::cuda::cast_elements<R, O>(ctx, in.data(), out.data(), in.size());
}

/// out = in converted element by element on the device (see the host cast). Throws
/// precis::error naming both shapes, before any launch, when they differ.
template <rounding R = rounding::nearest_even, overflow O = overflow::infinity, kernel_element From,
          kernel_element To, std::size_t N>
void cast(cuda_context& ctx, const device_tensor<From, N>& in, device_tensor<To, N>& out) {
  check_shape("precis::cast: out", out, in.shape());
  detail::cuda::cast_elements<R, O>(ctx, in.data(), out.data(), in.size());
}

}  // namespace precis

#endif
