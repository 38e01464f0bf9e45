/// @file
/// Float math on SIMD vectors for the host kernels (exp, the normal CDF behind GELU, sigmoid, sums
/// and ranges of long rows, bfloat16 loads and rounding stores, fetching the next row ahead).
/// Private to precis (namespace precis::detail::vmath).
///
/// Why written here: no scalar libm call per element in a hot loop, and the same bits under
/// every build flag and on every target. The vectors are GCC/Clang vector extensions of the
/// target's width (16 floats with AVX-512, 8 with AVX, 4 otherwise), and every function is
/// lane-wise: a lane's result does not depend on the width. A product that feeds an
/// addition is passed through `product()`, which the compiler cannot fuse into an FMA
/// (-ffp-contract=fast would otherwise fuse some and not others, by target and compiler),
/// so the operations are the same on every target. The functions with a template parameter
/// A (exp, the normal CDF, GELU, sigmoid) take that rule from it: exact_arith keeps it,
/// fused_arith (the policies with hardware products) fuses their polynomials' and argument
/// reductions' multiply-adds where the build targets FMA, for a third fewer operations.
/// Sums over a row use 16 partial sums whatever the width (see row_sum_of), so they too
/// are the same bits everywhere.
///
/// Accuracy (tests/kernels/test_vec_math.cpp checks every bfloat16 and float16 input and
/// random floats against float64): exp within 1 ulp (1.05 with fused_arith's multiply-adds:
/// measured 1.03); the normal CDF Phi and GELU within a few ulps over the whole range,
/// tails included (computed from a scaled erfc, not from 1 + erf, which cancels), and a
/// few multiples of the smallest subnormal where the result is subnormal (x < -13);
/// sigmoid within 3 ulps, its gradient within 4 (the bounds test_vec_math checks).
#pragma once

#include <precis/numeric/detail/encoding.hpp>
#include <precis/numeric/detail/unfused.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__SSE__)
#include <immintrin.h>
#endif

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
// Vectors wider than the target's registers are never passed between translation units.
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

namespace precis::detail::vmath {

#if defined(__AVX512F__)
inline constexpr std::size_t lanes = 16;
#elif defined(__AVX__)
inline constexpr std::size_t lanes = 8;
#else
inline constexpr std::size_t lanes = 4;
#endif

using vf = float __attribute__((vector_size(lanes * sizeof(float))));

/// True when a kernel's math type M and accumulate type Acc are both float: the kernels
/// then run these SIMD functions and row sums (other types keep their scalar loops).
template <class M, class Acc>
inline constexpr bool float_path_v = std::is_same_v<M, float> && std::is_same_v<Acc, float>;
using vi = std::int32_t __attribute__((vector_size(lanes * sizeof(float))));

inline vf splat(float v) { return vf{} + v; }
inline vi splat_i(std::int32_t v) { return vi{} + v; }

/// a * b, rounded, never fused with what it is added to (T: float or vf; see
/// detail::opaque).
template <class T>
inline T product(T a, T b) {
  return opaque(a * b);
}

/// a * b + c with one rounding, lane-wise: std::fma's bits, by the FMA instruction where
/// the build targets it and by std::fma per lane elsewhere (exact, slower). Unlike
/// fused_arith::madd, never unfused: for code whose result is defined by fma (the
/// optimizers follow PyTorch's).
inline vf fma(vf a, vf b, vf c) {
#if defined(__AVX512F__)
  return (vf)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__AVX__) && defined(__FMA__)
  return (vf)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
  vf r;
  for (std::size_t j = 0; j < lanes; ++j) r[j] = std::fma(a[j], b[j], c[j]);
  return r;
#endif
}

/// How the polynomials and argument reductions below multiply and add (their template
/// parameter A). exact_arith rounds every product before the addition it feeds: the same
/// bits under every build flag and on every target (what policies with exact products
/// get). fused_arith computes a * b + c with one rounding, a fused multiply-add, where the
/// build targets FMA (AVX-512, or -mfma), and as exact_arith does elsewhere: about a third
/// fewer operations in exp, GELU and sigmoid, within the same error bounds (tested), with
/// bits that depend on the build's target (what policies with products::hardware get,
/// whose matrix products already depend on the machine).
struct exact_arith {
  static vf madd(vf a, vf b, vf c) { return product(a, b) + c; }
};
struct fused_arith {
  static vf madd(vf a, vf b, vf c) {
#if defined(__AVX512F__) || (defined(__AVX__) && defined(__FMA__))
    return fma(a, b, c);
#else
    return product(a, b) + c;  // fma here would be std::fma per lane: exact but slow
#endif
  }
};

/// The square root lane-wise, correctly rounded (std::sqrt's bits). Called as an
/// instruction: std::sqrt per element does not vectorise, as it may set errno.
inline vf sqrt(vf x) {
#if defined(__AVX512F__)
  return (vf)_mm512_maskz_sqrt_ps(__mmask16(0xFFFF), (__m512)x);  // see scale2
#elif defined(__AVX__)
  return (vf)_mm256_sqrt_ps((__m256)x);
#elif defined(__SSE__)
  return (vf)_mm_sqrt_ps((__m128)x);
#else
  vf r;
  for (std::size_t j = 0; j < lanes; ++j) r[j] = std::sqrt(x[j]);
  return r;
#endif
}

/// m ? a : b lane-wise (m: all ones or all zeros per lane, as comparisons give). Written
/// as the vector conditional, which compilers turn into a blend.
inline vf select(vi m, vf a, vf b) { return m != 0 ? a : b; }

inline vf abs(vf x) { return (vf)((vi)x & splat_i(0x7FFFFFFF)); }

/// a < b ? a : b and a > b ? a : b lane-wise: b where either is NaN, and where both are
/// zeros. That is the rule of x86's min/max instructions, called directly: GCC 12 turns the
/// conditional into them only when neither operand is a constant (with one, a compare and
/// a blend).
inline vf min(vf a, vf b) {
#if defined(__AVX512F__)
  return (vf)_mm512_maskz_min_ps(__mmask16(0xFFFF), (__m512)a, (__m512)b);  // see scale2
#elif defined(__AVX__)
  return (vf)_mm256_min_ps((__m256)a, (__m256)b);
#elif defined(__SSE__)
  return (vf)_mm_min_ps((__m128)a, (__m128)b);
#else
  return a < b ? a : b;
#endif
}
inline vf max(vf a, vf b) {
#if defined(__AVX512F__)
  return (vf)_mm512_maskz_max_ps(__mmask16(0xFFFF), (__m512)a, (__m512)b);
#elif defined(__AVX__)
  return (vf)_mm256_max_ps((__m256)a, (__m256)b);
#elif defined(__SSE__)
  return (vf)_mm_max_ps((__m128)a, (__m128)b);
#else
  return a > b ? a : b;
#endif
}

inline vf load(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof v); }

/// The lane indices 0, 1, ..., lanes - 1.
inline vi lane_index() {
  vi v;
  for (std::size_t j = 0; j < lanes; ++j) v[j] = std::int32_t(j);
  return v;
}

/// All ones in the lanes below count (count <= lanes), zeros above.
inline vi lanes_below(std::size_t count) { return lane_index() < splat_i(std::int32_t(count)); }

/// p[0], ..., p[count - 1] (count < lanes) with zeros above, reading nothing past them
/// (masked loads where the target has them; the tails of rows and blocks).
inline vf load_partial(const float* p, std::size_t count) {
#if defined(__AVX512F__)
  return (vf)_mm512_maskz_loadu_ps(__mmask16((1U << count) - 1U), p);
#elif defined(__AVX__)
  return (vf)_mm256_maskload_ps(p, (__m256i)lanes_below(count));
#else
  vf v = {};
  for (std::size_t j = 0; j < count; ++j) v[j] = p[j];
  return v;
#endif
}

/// Writes v's lanes below count (count < lanes) to p, nothing past them.
inline void store_partial(float* p, vf v, std::size_t count) {
#if defined(__AVX512F__)
  _mm512_mask_storeu_ps(p, __mmask16((1U << count) - 1U), (__m512)v);
#elif defined(__AVX__)
  _mm256_maskstore_ps(p, (__m256i)lanes_below(count), (__m256)v);
#else
  for (std::size_t j = 0; j < count; ++j) p[j] = v[j];
#endif
}

/// Lanes of 16 and of unsigned 32 bits (a 16-bit format's bit patterns, their widening).
using vh = std::uint16_t __attribute__((vector_size(lanes * sizeof(std::uint16_t))));
using vu = std::uint32_t __attribute__((vector_size(lanes * sizeof(float))));

/// The floats of `count` (<= lanes) values of a 16-bit format with float's exponent
/// (bfloat16) from their bits at p, zeros above: exact, a shift.
inline vf load_upper_half(const std::uint16_t* p, std::size_t count = lanes) {
  vh h = {};
  if (count == lanes) {
    std::memcpy(&h, p, sizeof h);
  } else {
    for (std::size_t j = 0; j < count; ++j) h[j] = p[j];
  }
  return (vf)(__builtin_convertvector(h, vu) << 16);
}

/// v's lanes below `count` (<= lanes) rounded to F, a 16-bit format with float's exponent
/// (bfloat16), by encoding's PRECIS_DETAIL_ENCODE_UPPER_HALF (precis::convert's rounding:
/// the same bits), their bits written to p.
template <class F>
inline void store_upper_half(std::uint16_t* p, vf v, std::size_t count = lanes) {
  const vu u = (vu)v;
  const vh h = __builtin_convertvector(
      PRECIS_DETAIL_ENCODE_UPPER_HALF(u, std::uint32_t(F::quiet_nan_bits)), vh);
  if (count == lanes) {
    std::memcpy(p, &h, sizeof h);
  } else {
    for (std::size_t j = 0; j < count; ++j) p[j] = h[j];
  }
}

/// Fetching ahead (a hint, which never faults): the row kernels fetch the next row while
/// they compute on the current one, so that rows of a tensor larger than the caches arrive
/// from memory during the arithmetic.
/// Called for every vector's first element i of a pass over a row, this fetches each
/// cache line of the row `next` (of any element type; null: none) once.
template <class T>
inline void prefetch_line(const T* next, std::size_t i) {
  if (next != nullptr && (i * sizeof(T)) % 64 == 0) __builtin_prefetch(next + i, 0, 3);
}

/// 2^n for integral n (as floats) in [-126, 127].
inline vf pow2(vf n) {
  return (vf)((__builtin_convertvector(n, vi) + 127) << 23);
}

/// exp(a + b) split for scaling: exp(a + b) = p 2^n with p in [0.7, 1.42] and n integral
/// (as a float), for |b| small beside |a| or both small. The sum a + b is never rounded
/// before the range reduction, so exp(-x^2 / 2) can be computed from an exact -x^2 / 2 =
/// a + b. Cody and Waite's reduction: a + b = n ln 2 + r with |r| <= ln 2 / 2 (ln 2 in two
/// parts, the first with 10 significant bits so that n ln2_hi is exact), then e^r from its
/// Taylor polynomial to r^7 (the remainder is below 0.12 ulp). Arguments are clamped to
/// [-150, 89], beyond which exp, even times a factor up to 2^40 (see scale2), underflows
/// to 0 or overflows.
struct exp_parts {
  vf p, n;
};
inline constexpr float exp_magic = 12582912.0F;  // 1.5 * 2^23: adding it rounds to an integer
inline constexpr float ln2_hi = 0.693359375F, ln2_lo = -2.12194440e-4F;

/// e^r for the reduced argument r (|r| <= ln 2 / 2), as exp_parts with the given n.
template <class A = exact_arith>
inline exp_parts exp_of_reduced(vf r, vf n) {
  vf q = splat(1.0F / 5040);
  q = A::madd(q, r, splat(1.0F / 720));
  q = A::madd(q, r, splat(1.0F / 120));
  q = A::madd(q, r, splat(1.0F / 24));
  q = A::madd(q, r, splat(1.0F / 6));
  q = A::madd(q, r, splat(0.5F));
  return {splat(1.0F) + A::madd(product(r, r), q, r), n};
}

/// x clamped to [-150, 89] and n = round(x / ln 2) of the clamped value.
struct exp_argument {
  vf xc, n;
};
inline exp_argument exp_clamp(vf x) {
  const vf xc = min(max(x, splat(-150.0F)), splat(89.0F));
  return {xc, (product(xc, splat(1.44269502F)) + splat(exp_magic)) - splat(exp_magic)};
}

template <class A = exact_arith>
inline exp_parts exp_reduce(vf a, vf b) {
  const vf x = a + b;
  const auto [xc, n] = exp_clamp(x);
  // For clamped lanes a and b no longer matter: their results are inf or 0 anyway.
  const vi clamped = (x != xc);
  const vf ac = select(clamped, xc, a), bc = select(clamped, splat(0.0F), b);
  // n ln2_hi is exact, so only the last product can fuse.
  const vf r = A::madd(-n, splat(ln2_lo), (ac - product(n, splat(ln2_hi))) + bc);
  return exp_of_reduced<A>(r, n);
}

/// exp_reduce(x, 0) in fewer operations, the same bits: with b = 0 the clamped value
/// stands for a in every lane, and adding bc = +0 can only turn an r of -0 into +0, for
/// which e^r is 1 either way.
template <class A = exact_arith>
inline exp_parts exp_reduce(vf x) {
  const auto [xc, n] = exp_clamp(x);
  const vf r = A::madd(-n, splat(ln2_lo), xc - product(n, splat(ln2_hi)));
  return exp_of_reduced<A>(r, n);
}

/// v 2^n, rounded once: 2^n = 2^n1 2^n2 with n1 = floor(n / 2), both factors normal for n
/// in [-217, 128], the first product exact for |v| in the normal range. A factor m of an
/// exp (v = m p) is thus applied before a subnormal result is rounded. AVX-512's VSCALEFPS
/// computes the same single rounding of v 2^n in one instruction.
inline vf scale2(vf v, vf n) {
#if defined(__AVX512F__)
  static_assert(sizeof(vf) == sizeof(__m512));
  // (The zero-masking form: GCC 12 warns that the plain one reads an undefined source.)
  return (vf)_mm512_maskz_scalef_ps(__mmask16(0xFFFF), (__m512)v, (__m512)n);
#else
  const vi ni = __builtin_convertvector(n, vi);
  const vi n1 = ni >> 1;
  const vf s1 = (vf)((n1 + 127) << 23), s2 = (vf)((ni - n1 + 127) << 23);
  return product(product(v, s1), s2);
#endif
}

/// exp(x) for x with no NaN lane: exp's bits there, without its NaN test (softmax's
/// x - max, which is never NaN when the maximum is finite).
template <class A = exact_arith>
inline vf exp_not_nan(vf x) {
  const exp_parts e = exp_reduce<A>(x);
  return scale2(e.p, e.n);
}

/// The lower end of exp_normal's range: x >= -86 gives n >= -124 below, so p 2^n >=
/// 0.7 2^-124 is normal.
inline constexpr float exp_normal_low = -86.0F;

/// exp(x) for x in [exp_normal_low, 88], where exp's result is a normal float: exp's bits,
/// in fewer operations. Nothing to clamp, and p 2^n (p in [0.7, 1.42], n in [-124, 127])
/// is exact and normal, so adding n to p's exponent field gives it (without AVX-512's
/// VSCALEFPS, scale2's two products cost eight operations). The row kernels (softmax,
/// logsumexp, cross-entropy) take it for rows whose values lie within 86 of their maximum
/// (the usual rows; see exp_normal_covers).
template <class A = exact_arith>
inline vf exp_normal(vf x) {
  const vf n = (product(x, splat(1.44269502F)) + splat(exp_magic)) - splat(exp_magic);
  const exp_parts e =
      exp_of_reduced<A>(A::madd(-n, splat(ln2_lo), x - product(n, splat(ln2_hi))), n);
#if defined(__AVX512F__)
  return scale2(e.p, e.n);
#else
  return (vf)((vi)e.p + (__builtin_convertvector(e.n, vi) << 23));
#endif
}

/// exp(x), within 1 ulp; NaN stays NaN, +inf gives inf, -inf 0.
template <class A = exact_arith>
inline vf exp(vf x) {
  return select(x != x, x, exp_not_nan<A>(x));
}

/// -x^2 / 2 as an exact sum a + b (b's rounding is far below a's ulp): x is split into a
/// 12-bit high part and the rest, whose products are exact in float (Dekker's splitting).
inline void minus_half_square(vf x, vf& a, vf& b) {
  const vf xh = (vf)((vi)x & splat_i(std::int32_t(0xFFFFF000U)));
  const vf xl = x - xh;
  a = product(xh, xh) * splat(-0.5F);
  b = -(product(xh, xl) + product(product(xl, xl), splat(0.5F)));
}

/// log(erfc(z) e^(z^2) / t) with t = 2 / (2 + z), z >= 0, as u Q(u) with u = 1 - t =
/// z / (2 + z) in [0, 1): Q a degree-11 least-squares fit on Chebyshev nodes (the fit's
/// error below 1e-9; evaluated in float, 1.6e-7 absolute at most, exactly 0 at z = 0);
/// tests/data/vec_math/fit_erfc.py makes these coefficients and measures that error.
template <class A = exact_arith>
inline vf log_scaled_erfc(vf u) {
  constexpr float c[] = {-0x1.41baeap+0F, -0x1.36844ep-2F, 0x1.4ac20ap-3F,  0x1.89d8c8p-3F,
                         0x1.fe2726p-5F,  -0x1.52b0e8p-4F, -0x1.eb1702p-5F, 0x1.61c6ecp-4F,
                         -0x1.bdd374p-2F, 0x1.7ae82ap-1F,  -0x1.ec76e2p-2F, 0x1.c64a7ap-4F};
  // Horner's rule, written out (a loop here is left rolled inside the callers).
  vf q = splat(c[11]);
  q = A::madd(q, u, splat(c[10]));
  q = A::madd(q, u, splat(c[9]));
  q = A::madd(q, u, splat(c[8]));
  q = A::madd(q, u, splat(c[7]));
  q = A::madd(q, u, splat(c[6]));
  q = A::madd(q, u, splat(c[5]));
  q = A::madd(q, u, splat(c[4]));
  q = A::madd(q, u, splat(c[3]));
  q = A::madd(q, u, splat(c[2]));
  q = A::madd(q, u, splat(c[1]));
  q = A::madd(q, u, splat(c[0]));
  return product(q, u);
}

/// |x| capped at 20 (erfc(20 / sqrt 2) underflows float) and -x^2 / 2 as the exact sum
/// a + b (minus_half_square): where the normal CDF and the normal density of x both start.
struct gaussian_terms {
  vf ax, a, b;
};
inline gaussian_terms gaussian_of(vf x) {
  gaussian_terms g;
  g.ax = min(abs(x), splat(20.0F));
  minus_half_square(g.ax, g.a, g.b);
  return g;
}

/// erfc(|x| / sqrt 2) / 2 = t exp(-x^2 / 2 + log_scaled_erfc(u)) / 2 for every x, from x's
/// gaussian_terms, as exp parts (value = p 2^n, see scale2) so that a factor can be applied
/// before the last rounding: -x^2 / 2 is exact (the rounding of |x| / sqrt 2 reaches only
/// t and u, where the derivatives are small).
template <class A = exact_arith>
inline exp_parts half_erfc(const gaussian_terms& g) {
  const vf z = product(g.ax, splat(0.707106769F));
  const vf r = splat(1.0F) / (splat(2.0F) + z);  // t = 2r, u = 1 - t = z r
  const vf u = product(z, r);
  const exp_parts e = exp_reduce<A>(g.a, g.b + log_scaled_erfc<A>(u));
  return {product(e.p, r), e.n};  // t / 2 = r
}

/// The standard normal CDF Phi(x) = erfc(-x / sqrt 2) / 2 from half_erfc's parts h: erfc
/// on both sides (no 1 + erf cancellation in the lower tail).
inline vf normal_cdf(vf x, const exp_parts& h) {
  const vf half_e = scale2(h.p, h.n);
  const vf cdf = select(x < splat(0.0F), half_e, splat(1.0F) - half_e);
  return select(x != x, x, cdf);
}

/// The standard normal CDF Phi(x).
template <class A = exact_arith>
inline vf normal_cdf(vf x) { return normal_cdf(x, half_erfc<A>(gaussian_of(x))); }

/// GELU x Phi(x) from half_erfc's parts h (see gelu(x)).
inline vf gelu(vf x, const exp_parts& h) {
  // One scaling for both sides: erfc / 2 above 0, x erfc / 2 below.
  const vi negative = x < splat(0.0F);
  const vf s = scale2(select(negative, product(h.p, max(x, splat(-20.0F))), h.p), h.n);
  const vf upper = x * (splat(1.0F) - s);
  const vf lower = select(x == splat(-__builtin_inff()), x * splat(0.0F), s);
  return select(x != x, x, select(negative, lower, upper));
}

/// GELU x Phi(x) (PyTorch's default, approximate='none'). Below 0 the factor x is applied
/// before the exp's last rounding, so subnormal results are rounded once. As the formula
/// does in any float type: gelu(inf) = inf, gelu(-inf) = -inf * 0 = NaN, NaN stays NaN.
template <class A = exact_arith>
inline vf gelu(vf x) { return gelu(x, half_erfc<A>(gaussian_of(x))); }

/// gelu'(x) from x's gaussian_terms g and its normal CDF (see gelu_grad_factor(x)).
template <class A = exact_arith>
inline vf gelu_grad_factor(vf x, const gaussian_terms& g, vf cdf) {
  const exp_parts e = exp_reduce<A>(g.a, g.b);
  const vf x_pdf = scale2(product(e.p, product(max(x, splat(-20.0F)), splat(0.398942292F))), e.n);
  const vi finite = abs(x) < splat(__builtin_inff());  // false for inf and NaN
  return select(finite, cdf + x_pdf, x * splat(0.0F));
}

/// d/dx (x Phi(x)) = Phi(x) + x phi(x), phi(x) = exp(-x^2 / 2) / sqrt(2 pi); NaN at
/// x = +-inf (inf * 0, as the formula gives) and for NaN.
template <class A = exact_arith>
inline vf gelu_grad_factor(vf x) {
  const gaussian_terms g = gaussian_of(x);
  return gelu_grad_factor<A>(x, g, normal_cdf(x, half_erfc<A>(g)));
}

/// gelu(x), with gelu_grad_factor(x) stored to `factor`: the same bits as the two calls,
/// for about the cost of the second (they share |x|, -x^2 / 2 and the erfc). For a training
/// pass that keeps the derivative for its backward pass instead of recomputing it there.
template <class A = exact_arith>
inline vf gelu_and_grad_factor(vf x, vf& factor) {
  const gaussian_terms g = gaussian_of(x);
  const exp_parts h = half_erfc<A>(g);
  factor = gelu_grad_factor<A>(x, g, normal_cdf(x, h));
  return gelu(x, h);
}

/// dy gelu'(x): dy times gelu_grad_factor(x), rounded once.
template <class A = exact_arith>
inline vf gelu_grad(vf dy, vf x) { return dy * gelu_grad_factor<A>(x); }

/// 1 / (1 + exp(-x)), as e / (1 + e) with e = exp(x) for x < 0: exp(-x) would overflow
/// there (x < -88.7) while the result is still a nonzero subnormal.
template <class A = exact_arith>
inline vf sigmoid(vf x) {
  const vf e = exp<A>(-abs(x));
  const vf d = splat(1.0F) + e;
  return select(x < splat(0.0F), e / d, splat(1.0F) / d);
}

/// sigmoid'(x) = e / (1 + e)^2 with e = exp(-|x|) (even in x; no 1 - s cancellation).
template <class A = exact_arith>
inline vf sigmoid_grad_factor(vf x) {
  const vf e = exp<A>(-abs(x));
  const vf d = splat(1.0F) + e;
  return e / product(d, d);
}

/// dy sigmoid'(x): dy times sigmoid_grad_factor(x), rounded once.
template <class A = exact_arith>
inline vf sigmoid_grad(vf dy, vf x) { return dy * sigmoid_grad_factor<A>(x); }

/// Applies f (vf -> vf) to n floats, in place allowed; a tail shorter than a vector goes
/// through a zero-padded vector.
template <class F>
void map(const float* in, float* out, std::size_t n, F f) {
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) store(out + i, f(load(in + i)));
  if (i < n) store_partial(out + i, f(load_partial(in + i, n - i)), n - i);
}

/// As map, for f(v, second) that also gives a second vector (a value and its derivative):
/// f's result goes to out, `second` to out2.
template <class F>
void map_two_outputs(const float* in, float* out, float* out2, std::size_t n, F f) {
  std::size_t i = 0;
  vf second;
  for (; i + lanes <= n; i += lanes) {
    store(out + i, f(load(in + i), second));
    store(out2 + i, second);
  }
  if (i < n) {
    store_partial(out + i, f(load_partial(in + i, n - i), second), n - i);
    store_partial(out2 + i, second, n - i);
  }
}

/// As map, for f(a, b).
template <class F>
void map2(const float* a, const float* b, float* out, std::size_t n, F f) {
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) store(out + i, f(load(a + i), load(b + i)));
  if (i < n)
    store_partial(out + i, f(load_partial(a + i, n - i), load_partial(b + i, n - i)), n - i);
}

/// The lanes-wide vector of x[i], x[i + 1], ... with zeros from x[n] on.
inline vf load_padded(const float* x, std::size_t i, std::size_t n) {
  if (i + lanes <= n) return load(x + i);
  return load_partial(x + i, n - i);
}

/// Stores v's lanes to x[i], x[i + 1], ..., writing nothing from x[n] on.
inline void store_padded(float* x, std::size_t i, std::size_t n, vf v) {
  if (i + lanes <= n) {
    store(x + i, v);
  } else {
    store_partial(x + i, v, n - i);
  }
}

/// Lanes from position n - i on set to 0 (the tail of a row).
inline vf zero_past(vf v, std::size_t i, std::size_t n) {
  if (i + lanes <= n) return v;
  return select(lanes_below(n - i), v, vf{});
}

/// The smallest and largest values of a row; both NaN if the row holds a NaN.
template <class T>
struct row_range {
  T min, max;
};

/// The range of the values f(i) gives for the lanes-wide vectors starting at i, over a row
/// of n >= 1 (lanes from n on are ignored).
template <class F>
row_range<float> row_range_of(std::size_t n, F f) {
  vf lo = splat(__builtin_inff()), hi = splat(-__builtin_inff());
  vi nan = {};
  for (std::size_t i = 0; i < n; i += lanes) {
    const vf v = f(i);
    if (i + lanes > n) {  // the tail: its lanes past n count for nothing
      const vi in = lanes_below(n - i);
      nan |= in & (v != v);
      lo = min(select(in, v, splat(__builtin_inff())), lo);
      hi = max(select(in, v, splat(-__builtin_inff())), hi);
    } else {
      nan |= (v != v);
      lo = min(v, lo);
      hi = max(v, hi);
    }
  }
  float low[lanes], high[lanes];
  std::int32_t nans[lanes];
  store(low, lo);
  store(high, hi);
  std::memcpy(nans, &nan, sizeof nan);
  row_range<float> r{low[0], high[0]};
  bool any_nan = nans[0] != 0;
  for (std::size_t j = 1; j < lanes; ++j) {
    r.min = low[j] < r.min ? low[j] : r.min;
    r.max = high[j] > r.max ? high[j] : r.max;
    any_nan = any_nan || nans[j] != 0;
  }
  if (any_nan) r.min = r.max = __builtin_nanf("");
  return r;
}

/// True where exp_normal may take x - hi for every x of a row whose range is [lo, hi]
/// (hi finite): x - hi >= lo - hi, rounded, since rounding is monotone, so lo - hi >=
/// exp_normal_low puts every lane in exp_normal's range. False for a NaN or an infinite
/// bound.
inline bool exp_normal_covers(float lo, float hi) { return lo - hi >= exp_normal_low; }

/// The 16 partial sums of block_sum (partial j in lane j % lanes of vector j / lanes) added
/// pairwise: p[j] += p[j + w] for j < w, w = 8, 4, 2, 1, then p[0]; in registers, as
/// vector additions of halves where they are whole vectors (the same additions).
inline float pairwise_16(const vf* acc) {
#if defined(__AVX512F__)
  vf v = acc[0];
  v += __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15);
  v += __builtin_shufflevector(v, v, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7);
  v += __builtin_shufflevector(v, v, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
  return v[0] + v[1];
#elif defined(__AVX__)
  vf v = acc[0] + acc[1];
  v += __builtin_shufflevector(v, v, 4, 5, 6, 7, 4, 5, 6, 7);
  v += __builtin_shufflevector(v, v, 2, 3, 2, 3, 2, 3, 2, 3);
  return v[0] + v[1];
#else
  const vf v = (acc[0] + acc[2]) + (acc[1] + acc[3]);
  const vf h = v + __builtin_shufflevector(v, v, 2, 3, 2, 3);
  return h[0] + h[1];
#endif
}

/// Elements per block of a row sum: each of the 16 partial sums takes 16 terms of a block
/// (serial sums of 64 terms gave 5 float ulps of error on 4096-column softmax rows).
inline constexpr std::size_t sum_block = 256;

/// The sum over [0, len), len <= sum_block, of the values f(i) gives for the lanes-wide
/// vectors starting at i (zero past len): 16 partial sums (element i goes to partial
/// i % 16) added pairwise at the end, the same operations for every vector width.
template <class F>
float block_sum(std::size_t len, F f) {
  constexpr std::size_t k = 16 / lanes;  // vectors per 16 floats
  vf acc[k] = {};
  for (std::size_t i = 0; i < len; i += 16) {
    for (std::size_t v = 0; v < k; ++v) {
      if (i + v * lanes < len) acc[v] += f(i + v * lanes);
    }
  }
  return pairwise_16(acc);
}

/// The float sum over a row of n elements of the vectors f(i) (elements i .. i + lanes - 1,
/// zero past n), accurate for long rows: blocks of sum_block elements summed by block_sum,
/// the block sums added pairwise (a binary counter), so the error grows with
/// log2(n / 256) rather than with n. The same bits for every vector width and start
/// address; a row is never split between threads.
template <class F>
float row_sum_of(std::size_t n, F f) {
  if (n <= sum_block) return block_sum(n, f);  // one block: the sum below, without its counter
  float level[64];  // level[j]: the pending sum of 2^j blocks
  std::uint64_t count = 0;
  for (std::size_t b = 0; b < n; b += sum_block) {
    const std::size_t len = std::min(sum_block, n - b);
    float s = block_sum(len, [&](std::size_t i) { return f(b + i); });
    std::size_t j = 0;
    for (std::uint64_t c = count; c & 1U; c >>= 1, ++j) s = level[j] + s;
    level[j] = s;
    ++count;
  }
  float total = 0.0F;
  bool any = false;
  for (std::size_t j = 0; (count >> j) != 0; ++j) {
    if ((count >> j) & 1U) {
      total = any ? level[j] + total : level[j];
      any = true;
    }
  }
  return total;
}

/// The sum of g(x[i]) over a row of n floats (g maps a vector to a vector; lanes past n
/// add nothing, whatever g(0) is).
template <class G>
float row_sum(const float* x, std::size_t n, G g) {
  return row_sum_of(n, [&](std::size_t i) { return zero_past(g(load_padded(x, i, n)), i, n); });
}

/// The plain sum of a row of n floats.
inline float row_sum(const float* x, std::size_t n) {
  return row_sum_of(n, [&](std::size_t i) { return load_padded(x, i, n); });
}

/// The sum of a[i] * b[i] over a row (each product rounded, then summed as row_sum does).
inline float row_dot(const float* a, const float* b, std::size_t n) {
  return row_sum_of(n, [&](std::size_t i) { return product(load_padded(a, i, n), load_padded(b, i, n)); });
}

}  // namespace precis::detail::vmath

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
