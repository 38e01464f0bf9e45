/// @file
/// The bit-level conversions between float/double and the narrow formats. Private: use the format
/// types and <precis/numeric/convert.hpp>.
///
/// Everything here is integer arithmetic on bit patterns: it is constexpr, does not depend
/// on the floating-point environment (rounding mode, flush-to-zero), runs unchanged in
/// device code, and is written without branches so that loops over arrays vectorise.
#pragma once

#include <precis/numeric/format_traits.hpp>

#include <cstdint>
#include <type_traits>

namespace precis::detail {

template <class T>
struct source_format;
template <>
struct source_format<float> {
  using type = float_format;
};
template <>
struct source_format<double> {
  using type = double_format;
};

/// Rounds the value with bit pattern `source_bits` in format `S` (float, double, or a
/// wider precis format) once to format `F`. See `encode` for the semantics.
template <class F, rounding R, overflow O, class S>
PRECIS_HOST_DEVICE constexpr typename F::storage_type encode_bits(
    typename S::storage_type source_bits, std::uint32_t random_bits = 0) {
  // Narrow sources compute in 32 bits.
  using U = std::conditional_t<(sizeof(typename S::storage_type) < 4), std::uint32_t,
                               typename S::storage_type>;
  using I = std::make_signed_t<U>;
  using out_t = typename F::storage_type;
  static_assert(S::exponent_bits >= F::exponent_bits && S::mantissa_bits > F::mantissa_bits,
                "precis: encode_bits narrows; the source format must be the wider one");
  constexpr int src_man = S::mantissa_bits;
  constexpr int dst_man = F::mantissa_bits;
  constexpr int drop = src_man - dst_man;  // significand bits a normal result discards
  constexpr I rebias = I(S::exponent_bias - F::exponent_bias);
  constexpr I max_shift = src_man + 2;  // any larger shift also rounds to zero

  const U u = source_bits;
  const U a = u & U(~S::sign_mask);
  const U sign = (u & S::sign_mask) != 0 ? U(F::sign_mask) : U(0);

  const U e = a >> src_man;  // biased source exponent; 0 for zero and subnormals
  const U significand = (a & S::mantissa_mask) | (e != 0 ? U(U(1) << src_man) : U(0));
  // Biased exponent the value would have in F; below 1 the result is subnormal in F and
  // the significand is shifted further right by the difference.
  const I te = I(e != 0 ? e : U(1)) - rebias;
  const I extra = te < 1 ? I(1 - te) : I(0);
  const I s0 = I(drop) + extra;
  const I s = s0 > max_shift ? max_shift : s0;
  // For a normal result the significand still carries its leading 1, which adds the
  // 1 missing from (te - 1) in the exponent field; a rounding carry runs into the
  // exponent field the same way, so rounding up to the next binade needs no special case.
  const U kept = significand >> s;
  const U rest = significand - (kept << s);
  U result = (te > 1 ? U(U(te - 1) << dst_man) : U(0)) + kept;
  if constexpr (R == rounding::nearest_even) {
    // Integer selects rather than boolean arithmetic, so that loops vectorise.
    const U half = U(U(1) << s) >> 1;
    U up = rest > half ? U(1) : U(0);
    up = rest == half ? U(kept & 1U) : up;
    result += up;
  } else if constexpr (R == rounding::stochastic) {
    const U mask = U((U(1) << s) - 1);
    result += U((rest + (U(random_bits) & mask)) >> s);
  }

  constexpr U infinite_result = F::has_infinity ? U(F::infinity_bits) : U(F::quiet_nan_bits);
  constexpr U overflow_result =
      (O == overflow::saturate || R == rounding::toward_zero) ? U(F::max_bits) : infinite_result;
  constexpr U infinity_input_result =
      O == overflow::saturate ? U(F::max_bits) : infinite_result;
  result = result > U(F::max_bits) ? overflow_result : result;
  if constexpr (infinity_input_result != overflow_result) {
    result = a == S::infinity_bits ? infinity_input_result : result;
  }
  result |= sign;
  result = a > S::infinity_bits ? U(F::quiet_nan_bits) : result;
  return out_t(result);
}

/// Rounds `x` (float or double) once, directly, to format `F`.
/// NaN gives F's canonical NaN (`quiet_nan_bits`). Infinity gives infinity (NaN for
/// formats without infinity), or +-max under `overflow::saturate`. Finite values beyond
/// max follow `O` (see `precis::overflow`); a finite overflow keeps the sign, so float8_e4m3
/// gives the NaN pattern with the input's sign, as CUDA does.
/// `random_bits` is read only by `rounding::stochastic`.
/// Float bits `u` rounded to a 16-bit format with float's exponent (bfloat16: float's upper
/// half), nearest-even, overflow to infinity, a NaN as that format's quiet NaN `nan_bits`;
/// the format's bits are the low 16 of the result. Adds just under half an ulp, plus the
/// kept lowest bit (ties to even), and takes the upper half; a carry out of the largest
/// finite value lands on infinity, as it should. A macro so that the one formula serves
/// both encode_upper_half below (host and device) and the host kernels' SIMD stores on GCC
/// vectors of std::uint32_t (kernels/cpu/vec_math.hpp), which nvcc would reject in a
/// host-and-device template. `u` must be a variable (it is read several times).
#define PRECIS_DETAIL_ENCODE_UPPER_HALF(u, nan_bits)           \
  ((((u)&0x7FFFFFFFU) > 0x7F800000U) ? (((u)&0U) + (nan_bits)) \
                                     : (((u) + 0x7FFFU + (((u) >> 16) & 1U)) >> 16))

/// PRECIS_DETAIL_ENCODE_UPPER_HALF for format F (bfloat16's format).
template <class F>
PRECIS_HOST_DEVICE constexpr std::uint32_t encode_upper_half(std::uint32_t u) {
  static_assert(F::exponent_bits == 8 && F::total_bits == 16,
                "precis: encode_upper_half is for formats with float's exponent in 16 bits");
  return PRECIS_DETAIL_ENCODE_UPPER_HALF(u, std::uint32_t(F::quiet_nan_bits));
}

template <class F, rounding R, overflow O, class Src>
PRECIS_HOST_DEVICE constexpr typename F::storage_type encode(Src x,
                                                             std::uint32_t random_bits = 0) {
  using S = typename source_format<Src>::type;
  using out_t = typename F::storage_type;
  static_assert(R != rounding::stochastic || std::is_same_v<Src, float>,
                "precis: stochastic rounding is defined for float inputs; convert the double "
                "to float first or round to nearest");
  if constexpr (std::is_same_v<Src, float> && F::exponent_bits == S::exponent_bits &&
                R == rounding::nearest_even && O == overflow::infinity) {
    // float -> bfloat16 keeps the exponent (see encode_upper_half).
    // The source type spelled dependently: nvcc 13 fails on a non-dependent one here.
    return out_t(encode_upper_half<F>(__builtin_bit_cast(typename S::storage_type, x)));
  } else {
    return encode_bits<F, R, O, S>(__builtin_bit_cast(typename S::storage_type, x), random_bits);
  }
}

/// Decodes format `F` to float, exactly. bfloat16 (float's upper half) is a shift and
/// keeps NaN payloads; the other formats give float's canonical NaN (0x7FFFFFFF) for
/// every NaN, as CUDA's conversions do.
template <class F>
PRECIS_HOST_DEVICE constexpr float decode(typename F::storage_type bits) {
  if constexpr (F::exponent_bits == float_format::exponent_bits) {
    static_assert(F::total_bits == 16, "a format with float's exponent is float's upper half");
    return __builtin_bit_cast(float, std::uint32_t(std::uint32_t(bits) << 16));
  } else {
    constexpr int m = F::mantissa_bits;
    constexpr std::uint32_t rebias = std::uint32_t(float_format::exponent_bias - F::exponent_bias);
    const std::uint32_t b = bits;
    const std::uint32_t sign = (b & F::sign_mask) != 0 ? 0x80000000U : 0U;
    const std::uint32_t a = b & std::uint32_t(F::exponent_mask | F::mantissa_mask);
    const std::uint32_t e = a >> m;
    const std::uint32_t frac = a & F::mantissa_mask;
    const std::uint32_t normal = ((e + rebias) << 23) | (frac << (23 - m));
    // A subnormal is frac * 2^(1 - bias - m): frac converts to float exactly and the
    // product is a normal float, so it is exact and flush-to-zero cannot touch it.
    constexpr float subnormal_unit =
        __builtin_bit_cast(float, std::uint32_t(float_format::exponent_bias + 1 -
                                                F::exponent_bias - m)
                                      << 23);
    const std::uint32_t subnormal =
        __builtin_bit_cast(std::uint32_t, float(std::int32_t(frac)) * subnormal_unit);
    std::uint32_t r = (e != 0 ? normal : subnormal) | sign;
    if constexpr (F::has_infinity) {
      const bool special = e == (F::exponent_mask >> m);
      const std::uint32_t inf_or_nan = frac == 0 ? (0x7F800000U | sign) : 0x7FFFFFFFU;
      r = special ? inf_or_nan : r;
    } else {
      r = a == F::quiet_nan_bits ? 0x7FFFFFFFU : r;
    }
    return __builtin_bit_cast(float, r);
  }
}

/// Rounds an integer once to format `F`. Integers up to 2^53 in magnitude are exact in
/// double; wider ones keep 53 significant bits with the discarded bits folded into the
/// last one (a sticky bit), which keeps the one rounding to F's few bits correct.
template <class F, rounding R, overflow O, class Int>
PRECIS_HOST_DEVICE constexpr typename F::storage_type encode_integer(Int v) {
  if constexpr (sizeof(Int) <= 4) {
    return encode<F, R, O>(static_cast<double>(v));
  } else {
    using UI = std::make_unsigned_t<Int>;
    const bool negative = v < Int(0);
    const UI magnitude = negative ? UI(UI(0) - UI(v)) : UI(v);
    int width = 0;
    while (width < int(sizeof(UI) * 8) && (magnitude >> width) != 0) ++width;
    const int shift = width > 53 ? width - 53 : 0;
    UI kept = magnitude >> shift;
    if (shift > 0 && (magnitude & ((UI(1) << shift) - 1)) != 0) kept |= 1U;
    // 2^shift as a double, built from its exponent field.
    const double scale = __builtin_bit_cast(double, std::uint64_t(1023 + shift) << 52);
    const double d = static_cast<double>(kept) * scale;  // exact: 53 bits times 2^shift
    return encode<F, R, O>(negative ? -d : d);
  }
}

}  // namespace precis::detail
