/// @file
/// Products and sums the compiler may not fuse into a multiply-add. Private (namespace
/// precis::detail).
///
/// Why: -ffp-contract=fast (g++'s default outside ISO mode) lets the compiler fuse a product
/// into the addition it feeds, some and not others, by target and compiler, which changes
/// results in the last bit. precis's kernels and optimizers pass every product that feeds
/// an addition through mul (or add, or the kernels' accumulator, which takes its terms
/// through opaque), and write the fused operations they mean as std::fma, so their bits do
/// not depend on the flags the headers are compiled with (docs/reproducibility.md;
/// tests/flags checks both the results and the machine code).
#pragma once

#include <precis/config.hpp>

#include <type_traits>

namespace precis::detail {

/// True for a floating-point scalar or a GCC/Clang vector of them (the host SIMD math's
/// vectors): the values opaque hands over in a register.
template <class T>
concept float_register = std::is_floating_point_v<T> ||
    (!std::is_class_v<T> && !std::is_pointer_v<T> &&
     requires(T v) { requires std::is_floating_point_v<std::remove_cvref_t<decltype(v[0])>>; });

/// x as a value the compiler must take as it is: rounded, never fused with the operation
/// it feeds (see above). Other types pass through.
template <class T>
PRECIS_HOST_DEVICE T opaque(T x) {
#if !defined(__CUDA_ARCH__) && (defined(__x86_64__) || defined(__i386__))
  if constexpr (float_register<T>) asm("" : "+v"(x));
#elif !defined(__CUDA_ARCH__) && defined(__aarch64__)
  if constexpr (float_register<T>) asm("" : "+w"(x));
#elif !defined(__CUDA_ARCH__)
  if constexpr (float_register<T>) {
    volatile T v = x;
    x = v;
  }
#endif
  return x;
}

/// a * b rounded on its own, never fused into an addition (see opaque). On the device the
/// round-to-nearest intrinsics, which nvcc does not contract.
template <class T>
PRECIS_HOST_DEVICE T mul(T a, T b) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, float>) {
    return __fmul_rn(a, b);
  } else if constexpr (std::is_same_v<T, double>) {
    return __dmul_rn(a, b);
  } else {
    return a * b;
  }
#else
  return opaque(a * b);
#endif
}

/// a + b with neither operand fused into the addition (see opaque).
template <class T>
PRECIS_HOST_DEVICE T add(T a, T b) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, float>) {
    return __fadd_rn(a, b);
  } else if constexpr (std::is_same_v<T, double>) {
    return __dadd_rn(a, b);
  } else {
    return a + b;
  }
#else
  return opaque(a) + opaque(b);
#endif
}

}  // namespace precis::detail
