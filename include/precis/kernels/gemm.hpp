/// @file
/// Matrix products C = alpha * op(A) op(B) + beta * C (+ bias, relu/gelu) on host tensors, batched
/// products, and their backward pass.
///
/// Semantics (op::matmul under the policy, as tensor cores do it): inputs arrive in their
/// tensors' element types (the policy's storage or gradient type, or float); under a
/// tfloat32 compute type float inputs are first rounded to 10 mantissa bits (nearest-even);
/// every product of two such values is exact in float; products are summed in float, in k
/// order; alpha, beta * C, the bias and the activation are applied in float; the result is
/// rounded once to C's element type. A policy whose accumulate type is narrower than float
/// (an `unsafe` float16 accumulator) gets its sum rounded after every addition, and double
/// tensors are computed in double: both on a plain loop, since no model trains that way for
/// speed. With beta == 0, C is not read (it may hold NaN), as in BLAS.
///
/// Hardware products (a policy with products::hardware, float accumulation) run through
/// oneDNN when precis::onednn is linked: bfloat16 inputs on the CPU's bfloat16 dot-product
/// instructions when it has them (cpu_products_engine() says; subnormal inputs and results
/// flushed), float inputs on oneDNN's float kernels (products fused into the sums,
/// subnormals kept, as in torch's float matmul). Sums are in oneDNN's order, C is still
/// rounded once; those results are the same bits for a given machine and thread count.
/// Everything else runs precis's exact kernel.
///
/// Shapes are checked before anything is written; a mismatch throws precis::error naming
/// the expected and the actual shape. Exact products are the same bits for every thread
/// count.
#pragma once

#include <precis/kernels/common.hpp>
#include <precis/kernels/context.hpp>
#include <precis/kernels/cpu/gemm_kernel.hpp>
#include <precis/kernels/cpu/support.hpp>
#include <precis/kernels/elementwise.hpp>
#include <precis/tensor/host_tensor.hpp>

#if PRECIS_HAS_ONEDNN
#include <precis/kernels/cpu/onednn.hpp>
#endif

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>

namespace precis {

/// What is applied to alpha * op(A) op(B) + beta * C + bias before rounding: nothing, relu,
/// or the exact GELU x * Phi(x) (erf form, PyTorch's default), as cuBLASLt's epilogues.
enum class gemm_epilogue { none, relu, gelu };

/// Options of a product: transposes (A is stored K x M when trans_a, B is stored N x K
/// when trans_b), the scalars and the epilogue.
struct gemm_options {
  bool trans_a = false;                          ///< op(A) = A^T: A is stored K x M
  bool trans_b = false;                          ///< op(B) = B^T: B is stored N x K
  float alpha = 1.0F;                            ///< scales the product
  float beta = 0.0F;                             ///< scales C's previous values (0: C is not read)
  gemm_epilogue epilogue = gemm_epilogue::none;  ///< applied before the result is rounded
};

namespace detail {

/// True when the fast float engine gives P's semantics for inputs TA, TB: float math and a
/// float accumulator.
template <op_kind Op, Policy P, class TA, class TB>
inline constexpr bool float_engine_v =
    std::is_same_v<math_t<Op, P, TA, TB>, float> && std::is_same_v<accumulate_t<Op, P>, float>;

/// True when float inputs are rounded to tfloat32 first.
template <op_kind Op, Policy P>
inline constexpr bool tf32_inputs_v =
    std::is_same_v<typename kernel_policy_t<Op, P>::compute_type, tfloat32>;

/// True when inputs of type T (both operands) under P can take the hardware's products:
/// bfloat16 or float16 with float sums (float16 on oneDNN's float kernels, which multiply
/// any two float16 values exactly), or float that the float engine computes as it is
/// (float math and sums, not rounded to tfloat32 first).
template <op_kind Op, Policy P, class T>
inline constexpr bool hardware_inputs_v = std::disjunction_v<
    std::conjunction<std::disjunction<std::is_same<T, bfloat16>, std::is_same<T, float16>>,
                     std::is_same<accumulate_t<Op, P>, float>>,
    std::conjunction<std::is_same<T, float>, std::bool_constant<float_engine_v<Op, P, T, T>>,
                     std::bool_constant<!tf32_inputs_v<Op, P>>>>;

/// True when a product of TA and TB inputs under P uses the hardware's products: P asks
/// for them and both inputs are of one type the hardware takes (hardware_inputs_v).
template <op_kind Op, Policy P, class TA, class TB>
inline constexpr bool hardware_products_v = std::conjunction_v<
    std::is_same<typename kernel_policy_t<Op, P>::products_type, products::hardware>,
    std::is_same<TA, TB>, std::bool_constant<hardware_inputs_v<Op, P, TA>>>;

/// Packs the logical matrix L(i, k) = data[i * rs + k * cs] into MR- or NR-wide panels
/// (R values per k, zero-padded) as gemm_serial wants, converting to float (and rounding
/// to tfloat32 when TF32) on the way.
template <class T, std::size_t R, bool TF32>
struct strided_packer {
  const T* data;
  std::size_t rs, cs;

  static float prepare(float v) {
    if constexpr (TF32) {
      return round_tf32(v);
    } else {
      return v;
    }
  }

  /// n elements as floats. bfloat16 is the top half of a float, so a shift is exact (and
  /// vectorises better than the general conversion, which matters below n = 512).
  static void load_n(const T* src, float* dst, std::size_t n) {
    if constexpr (std::is_same_v<T, bfloat16>) {
      for (std::size_t i = 0; i < n; ++i) {
        dst[i] = std::bit_cast<float>(std::uint32_t(src[i].bits()) << 16);
      }
    } else {
      load_block(src, dst, n);
    }
  }

  void operator()(std::size_t i0, std::size_t rows, std::size_t k0, std::size_t kc,
                  float* out) const {
    if constexpr (std::is_same_v<T, float> && !TF32) {
      if (cs == 1 && rows == R) {
        // A full panel of float rows: read them in place (no staging copy), k outer so
        // that the panel is written in order.
        const float* row[R];
        for (std::size_t r = 0; r < R; ++r) row[r] = data + (i0 + r) * rs + k0;
        for (std::size_t k = 0; k < kc; ++k) {
          float* o = out + k * R;
          for (std::size_t r = 0; r < R; ++r) o[r] = row[r][k];
        }
        return;
      }
    }
    if (cs == 1) {
      float tmp[gemm_kc];
      for (std::size_t r = 0; r < rows; ++r) {
        load_n(data + (i0 + r) * rs + k0, tmp, kc);
        for (std::size_t k = 0; k < kc; ++k) out[k * R + r] = prepare(tmp[k]);
      }
    } else if (rs == 1) {
      for (std::size_t k = 0; k < kc; ++k) {
        float* o = out + k * R;
        load_n(data + (k0 + k) * cs + i0, o, rows);
        if constexpr (TF32) {
          for (std::size_t r = 0; r < rows; ++r) o[r] = prepare(o[r]);
        }
      }
    } else {
      for (std::size_t k = 0; k < kc; ++k) {
        for (std::size_t r = 0; r < rows; ++r) {
          out[k * R + r] = prepare(load<float>(data[(i0 + r) * rs + (k0 + k) * cs]));
        }
      }
    }
    if (rows < R) {
      for (std::size_t k = 0; k < kc; ++k) {
        for (std::size_t r = rows; r < R; ++r) out[k * R + r] = 0.0F;
      }
    }
  }
};

/// The activation of an epilogue, in math type M (host and device: the relu and exact
/// GELU functors of the elementwise kernels).
template <class M>
PRECIS_HOST_DEVICE M apply_epilogue(gemm_epilogue e, M v) {
  switch (e) {
    case gemm_epilogue::relu:
      return relu_fn<M>{}(v);
    case gemm_epilogue::gelu:
      return gelu_erf_fn<M>{}(v);
    default:
      return v;
  }
}

/// Writes finished float sums of one row of C: alpha * acc + beta * C + bias, activation,
/// rounded once to TC. Rows of C are `ldc` apart.
template <class TC, class TBias>
struct gemm_writer {
  TC* c;
  std::size_t ldc;
  const TBias* bias;  // nullptr: none
  float alpha, beta;
  gemm_epilogue epilogue;

  void operator()(std::size_t i, std::size_t j0, const float* acc, std::size_t n) const {
    if constexpr (std::is_same_v<TC, float>) {
      if (beta == 0.0F && bias == nullptr && epilogue == gemm_epilogue::none) {
        // Float sums to a float C: alpha * acc is the result (one pass, no staging).
        float* out = c + i * ldc + j0;
        for (std::size_t j = 0; j < n; ++j) out[j] = alpha * acc[j];
        return;
      }
    }
    float v[block_size], t[block_size];
    for (std::size_t s = 0; s < n; s += block_size) {
      const std::size_t len = std::min(block_size, n - s);
      TC* out = c + i * ldc + j0 + s;
      for (std::size_t j = 0; j < len; ++j) v[j] = alpha * acc[s + j];
      if (beta != 0.0F) {
        // beta * C is rounded before it is added (never fused, whatever the build flags).
        load_block(out, t, len);
        const vmath::vf bv = vmath::splat(beta);
        vmath::map2(v, t, v, len, [bv](vmath::vf a, vmath::vf prior) { return a + vmath::product(bv, prior); });
      }
      if (bias != nullptr) {
        load_block(bias + j0 + s, t, len);
        for (std::size_t j = 0; j < len; ++j) v[j] += t[j];
      }
      if (epilogue == gemm_epilogue::gelu) {
        vmath::map(v, v, len, [](vmath::vf a) { return vmath::gelu(a); });
      } else if (epilogue != gemm_epilogue::none) {
        for (std::size_t j = 0; j < len; ++j) v[j] = apply_epilogue(epilogue, v[j]);
      }
      store_row(v, out, len);
    }
  }

  /// Rounds n floats to TC. For bfloat16, the nearest-even rounding of the top half of the
  /// bits (carry into the exponent gives infinity, as it should) is done inline so that it
  /// vectorises; NaN, which that would not keep, is converted by the format itself.
  static void store_row(const float* v, TC* out, std::size_t n) {
    if constexpr (std::is_same_v<TC, bfloat16>) {
      for (std::size_t j = 0; j < n; ++j) {
        const auto u = std::bit_cast<std::uint32_t>(v[j]);
        out[j] = bfloat16::from_bits(
            static_cast<std::uint16_t>((u + 0x7FFFU + ((u >> 16) & 1U)) >> 16));
      }
      for (std::size_t j = 0; j < n; ++j) {
        if (std::isnan(v[j])) out[j] = bfloat16(v[j]);
      }
    } else {
      store_block(v, out, n);
    }
  }
};

/// One product C (M x N, row stride ldc) = alpha * op(A) op(B) + beta * C + bias on raw
/// pointers: A element (i, k) at a[i * ars + k * acs], B element (k, j) at b[k * brs +
/// j * bcs]. Shapes are the caller's to check.
template <op_kind Op, Policy P, class TA, class TB, class TC, class TBias>
void gemm_raw(const cpu_context& ctx, std::size_t M, std::size_t N, std::size_t K, const TA* a,
              std::size_t ars, std::size_t acs, const TB* b, std::size_t brs, std::size_t bcs,
              TC* c, std::size_t ldc, const TBias* bias, const gemm_options& o) {
  if (M == 0 || N == 0) return;
#if PRECIS_HAS_ONEDNN
  if constexpr (hardware_products_v<Op, P, TA, TB>) {
    const gemm_writer<TC, TBias> w{c, ldc, bias, o.alpha, o.beta, o.epilogue};
    const bool direct = o.beta == 0.0F && o.epilogue == gemm_epilogue::none;
    if (onednn_product(ctx, 1, M, N, K,
                       strided_operand<const TA>{a, 0, std::int64_t(ars), std::int64_t(acs)},
                       strided_operand<const TB>{b, 0, std::int64_t(brs), std::int64_t(bcs)}, c, 0,
                       std::int64_t(ldc), bias, o.alpha, direct,
                       [&](std::size_t, std::size_t i, std::size_t j0, const float* v,
                           std::size_t n) { w(i, j0, v, n); })) {
      return;
    }
  }
#endif
  if constexpr (float_engine_v<Op, P, TA, TB>) {
    constexpr bool tf32 = tf32_inputs_v<Op, P>;
    constexpr bool tf32_a = tf32 && std::is_same_v<TA, float>;
    constexpr bool tf32_b = tf32 && std::is_same_v<TB, float>;
    strided_packer<TA, gemm_mr, tf32_a> pa{a, ars, acs};
    // B is packed as its transpose: element (j, k).
    strided_packer<TB, gemm_nr, tf32_b> pb{b, bcs, brs};
    gemm_writer<TC, TBias> w{c, ldc, bias, o.alpha, o.beta, o.epilogue};
    gemm_float(ctx, M, N, K, pa, pb, w);
  } else {
    // Double math or a narrower-than-float accumulator: a plain loop over k per element.
    using Mt = math_t<Op, P, TA, TB>;
    using Acc = accumulate_t<Op, P>;
    parallel_for(ctx, M, std::max<std::size_t>(1, (std::size_t(1) << 20) / (N * K + 1)),
                 [&](std::size_t i0, std::size_t i1) {
                   for (std::size_t i = i0; i < i1; ++i) {
                     for (std::size_t j = 0; j < N; ++j) {
                       accumulator<Acc> acc;
                       for (std::size_t k = 0; k < K; ++k) {
                         accumulate(acc, load<Mt>(a[i * ars + k * acs]) *
                                             load<Mt>(b[k * brs + j * bcs]));
                       }
                       Mt v = mul(static_cast<Mt>(o.alpha), static_cast<Mt>(acc.value()));
                       TC& out = c[i * ldc + j];
                       if (o.beta != 0.0F) v = add(v, static_cast<Mt>(o.beta) * load<Mt>(out));
                       if (bias != nullptr) v += load<Mt>(bias[j]);
                       out = round_to<TC>(apply_epilogue(o.epilogue, v));
                     }
                   }
                 });
  }
}

/// The static checks every product makes on its element types.
template <op_kind Op, Policy P, class TA, class TB, class TC>
constexpr void check_gemm_types() {
  static_assert(kernel_element<TA> && kernel_element<TB> && kernel_element<TC>,
                "precis: gemm element types are float, double or precis number formats");
  static_assert(policy_input_v<Op, P, TA> && policy_input_v<Op, P, TB>,
                "precis: gemm inputs must be the policy's storage or gradient type, or float; "
                "cast them with precis::cast first, or call with the policy they were "
                "stored under");
}

/// "[M, K]" style expected shapes.
inline std::array<std::size_t, 2> dims2(std::size_t r, std::size_t c) { return {r, c}; }

/// Checks the three operands of a product and returns {M, N, K}.
template <class A, class B>
std::array<std::size_t, 3> check_gemm(std::string_view name, const A& a, const B& b,
                                      const gemm_options& o, std::size_t batch_axes) {
  const auto& sa = a.shape();
  const auto& sb = b.shape();
  const std::size_t M = std::size_t(sa[batch_axes + (o.trans_a ? 1 : 0)]);
  const std::size_t K = std::size_t(sa[batch_axes + (o.trans_a ? 0 : 1)]);
  const std::size_t N = std::size_t(sb[batch_axes + (o.trans_b ? 0 : 1)]);
  const std::size_t kb = std::size_t(sb[batch_axes + (o.trans_b ? 1 : 0)]);
  if (kb != K) {
    throw error(std::string(name) + ": b has shape " + shape_string(sb) + ", expected " +
                (o.trans_b ? "[N, K] with K = " : "[K, N] with K = ") + std::to_string(K) +
                " (a has shape " + shape_string(sa) + (o.trans_a ? ", transposed" : "") + ")");
  }
  return {M, N, K};
}

}  // namespace detail

/// C = epilogue(alpha * op(A) op(B) + beta * C) with op(A) M x K and op(B) K x N (see
/// gemm_options for the transposes). Throws precis::error naming the shapes when they do
/// not fit; C is then untouched.
template <Policy P, class TA, class TB, class TC>
void gemm(const cpu_context& ctx, const host_tensor<TA, 2>& a, const host_tensor<TB, 2>& b,
          host_tensor<TC, 2>& c, const gemm_options& o = {}) {
  detail::check_gemm_types<op::matmul, P, TA, TB, TC>();
  const auto mnk = detail::check_gemm("precis::gemm", a, b, o, 0);
  const std::size_t M = mnk[0], N = mnk[1], K = mnk[2];
  check_shape("precis::gemm: c", c, detail::dims2(M, N));
  detail::gemm_raw<op::matmul, P>(ctx, M, N, K, a.data(), o.trans_a ? 1 : K, o.trans_a ? M : 1,
                                  b.data(), o.trans_b ? 1 : N, o.trans_b ? K : 1, c.data(), N,
                                  static_cast<const TC*>(nullptr), o);
}

/// As gemm, plus `bias` (N values) added to every row before the epilogue: a linear
/// layer's forward in one pass, rounded once.
template <Policy P, class TA, class TB, class TBias, class TC>
void gemm(const cpu_context& ctx, const host_tensor<TA, 2>& a, const host_tensor<TB, 2>& b,
          const host_tensor<TBias, 1>& bias, host_tensor<TC, 2>& c, const gemm_options& o = {}) {
  detail::check_gemm_types<op::matmul, P, TA, TB, TC>();
  static_assert(kernel_element<TBias>, "precis: a bias is float, double or a precis format");
  const auto mnk = detail::check_gemm("precis::gemm", a, b, o, 0);
  const std::size_t M = mnk[0], N = mnk[1], K = mnk[2];
  check_shape("precis::gemm: bias", bias, std::array<std::size_t, 1>{N});
  check_shape("precis::gemm: c", c, detail::dims2(M, N));
  detail::gemm_raw<op::matmul, P>(ctx, M, N, K, a.data(), o.trans_a ? 1 : K, o.trans_a ? M : 1,
                                  b.data(), o.trans_b ? 1 : N, o.trans_b ? K : 1, c.data(), N,
                                  bias.data(), o);
}

/// Batched product: c[i] = alpha * op(a[i]) op(b[i]) + beta * c[i] for every i of the first
/// (batch) axis, as attention's Q K^T and P V. Batch items run on separate threads when
/// there are enough of them; either way every element gets the same sequence of operations.
template <Policy P, class TA, class TB, class TC>
void gemm(const cpu_context& ctx, const host_tensor<TA, 3>& a, const host_tensor<TB, 3>& b,
          host_tensor<TC, 3>& c, const gemm_options& o = {}) {
  detail::check_gemm_types<op::matmul, P, TA, TB, TC>();
  const std::size_t batch = std::size_t(a.shape()[0]);
  const auto mnk = detail::check_gemm("precis::gemm (batched)", a, b, o, 1);
  const std::size_t M = mnk[0], N = mnk[1], K = mnk[2];
  check_shape("precis::gemm (batched): b", b,
              std::array<std::size_t, 3>{batch, std::size_t(b.shape()[1]),
                                         std::size_t(b.shape()[2])});
  check_shape("precis::gemm (batched): c", c, std::array<std::size_t, 3>{batch, M, N});
  const std::int64_t ars = o.trans_a ? 1 : std::int64_t(K), acs = o.trans_a ? std::int64_t(M) : 1;
  const std::int64_t brs = o.trans_b ? 1 : std::int64_t(N), bcs = o.trans_b ? std::int64_t(K) : 1;
#if PRECIS_HAS_ONEDNN
  if constexpr (detail::hardware_products_v<op::matmul, P, TA, TB>) {
    const bool direct = o.beta == 0.0F && o.epilogue == gemm_epilogue::none;
    const auto finish = [&](std::size_t item, std::size_t i, std::size_t j0, const float* v,
                            std::size_t n) {
      detail::gemm_writer<TC, TC>{c.data() + item * M * N, N, nullptr, o.alpha, o.beta, o.epilogue}(i, j0, v, n);
    };
    if (detail::onednn_product(
            ctx, batch, M, N, K,
            detail::strided_operand<const TA>{a.data(), std::int64_t(M * K), ars, acs},
            detail::strided_operand<const TB>{b.data(), std::int64_t(K * N), brs, bcs}, c.data(),
            std::int64_t(M * N), std::int64_t(N), static_cast<const TC*>(nullptr), o.alpha,
            direct, finish)) {
      return;
    }
  }
#endif
  const auto one = [&](const cpu_context& inner, std::size_t i) {
    detail::gemm_raw<op::matmul, P>(inner, M, N, K, a.data() + i * M * K, std::size_t(ars),
                                    std::size_t(acs), b.data() + i * K * N, std::size_t(brs),
                                    std::size_t(bcs), c.data() + i * M * N, N,
                                    static_cast<const TC*>(nullptr), o);
  };
  if (batch >= ctx.thread_count() && batch > 1) {
    detail::parallel_for(ctx, batch, 1, [&](std::size_t b0, std::size_t b1) {
      // One single-threaded context per part (not per item) serves the part's items.
      const cpu_context single{1};
      for (std::size_t i = b0; i < b1; ++i) one(single, i);
    });
  } else {
    for (std::size_t i = 0; i < batch; ++i) one(ctx, i);
  }
}

/// Which engine runs hardware products (products::hardware) with bfloat16 inputs in this
/// build on this machine: oneDNN and the instruction set it uses (with "; large matmuls:
/// precis AMX tiles" where the matrix products that detail::amx_takes run on precis's own
/// AMX kernel), or precis's exact kernel and why. (Float inputs under hardware products run on oneDNN wherever precis::onednn is
/// linked: cpu_float_products_engine().)
inline std::string cpu_products_engine() {
#if PRECIS_HAS_ONEDNN
  const std::string onednn = detail::onednn_version_name();
  if (detail::onednn_has_bf16_products()) {
    const std::string engine = onednn + " (" + detail::onednn_isa_name() + ")";
    return detail::amx_enabled() ? engine + "; large matmuls: precis AMX tiles" : engine;
  }
  return std::string("precis exact kernel (no bfloat16 dot-product instructions: ") + onednn +
         " sees " + detail::onednn_isa_name() + ")";
#else
  return "precis exact kernel (precis::onednn not linked)";
#endif
}

/// Which engine runs hardware products with float inputs (and float16 ones, converted to
/// float) in this build on this machine: oneDNN's float kernels and the instruction set they
/// use, or precis's exact kernel.
inline std::string cpu_float_products_engine() {
#if PRECIS_HAS_ONEDNN
  return detail::onednn_version_name() + " (" + detail::onednn_isa_name() + ")";
#else
  return "precis exact kernel (precis::onednn not linked)";
#endif
}

namespace detail {

/// gemm_backward's two products for c = alpha op(a) op(b) (M x N, inner K; options `o`),
/// each one call raw(m, n, k, left, left_rs, left_cs, right, right_rs, right_cs, out, ldo) of
/// a gemm_raw (host or device): dA = alpha dC op(B)^T and dB = alpha op(A)^T dC, each written
/// in its operand's layout (stored transposed where the operand is). Host and device
/// gemm_backward share it.
template <class TA, class TB, class TG, class TDA, class TDB, class Raw>
void gemm_backward_products(std::size_t M, std::size_t N, std::size_t K, const gemm_options& o,
                            const TA* a, const TB* b, const TG* dc, TDA* da, TDB* db, Raw&& raw) {
  // Element (i, k) of the logical product; strides say where operands and result live.
  const std::size_t brs = o.trans_b ? 1 : N, bcs = o.trans_b ? K : 1;  // B(k, j)
  const std::size_t ars = o.trans_a ? 1 : K, acs = o.trans_a ? M : 1;  // A(i, k)
  if (!o.trans_a) {
    // da[i][k] = sum_j dc[i][j] * B(k, j): left dc (M x N), right B^T (N x K).
    raw(M, K, N, dc, N, 1, b, bcs, brs, da, K);
  } else {
    // da[k][i] = sum_j B(k, j) * dc[i][j]: left B (K x N), right dc^T (N x M).
    raw(K, M, N, b, brs, bcs, dc, 1, N, da, M);
  }
  if (!o.trans_b) {
    // db[k][j] = sum_i A(i, k) * dc[i][j]: left A^T (K x M), right dc (M x N).
    raw(K, N, M, a, acs, ars, dc, N, 1, db, N);
  } else {
    // db[j][k] = sum_i dc[i][j] * A(i, k): left dc^T (N x M), right A (M x K).
    raw(N, K, M, dc, 1, N, a, ars, acs, db, K);
  }
}

/// gemm_backward's checks (host and device tensors): the forward product's shapes, and dc,
/// da and db shaped as c, a and b. Returns (M, N, K).
template <class A, class B, class G, class DA, class DB>
std::array<std::size_t, 3> check_gemm_backward(const A& a, const B& b, const G& dc, const DA& da,
                                               const DB& db, const gemm_options& o) {
  const auto mnk = check_gemm("precis::gemm_backward", a, b, o, 0);
  check_shape("precis::gemm_backward: dc", dc, dims2(mnk[0], mnk[1]));
  check_shape("precis::gemm_backward: da", da, shape_array<2>(a));
  check_shape("precis::gemm_backward: db", db, shape_array<2>(b));
  return mnk;
}

}  // namespace detail

/// The backward pass of c = alpha * op(a) op(b) (options `o` as in the forward call; the
/// epilogue's derivative and the bias gradient are the caller's, e.g. precis::relu_backward
/// and a column sum): da = dL/da and db = dL/db, each shaped as its operand and rounded
/// once. Two products with transposes, so the same semantics as gemm.
template <Policy P, class TA, class TB, class TG, class TDA, class TDB>
void gemm_backward(const cpu_context& ctx, const host_tensor<TA, 2>& a, const host_tensor<TB, 2>& b,
                   const host_tensor<TG, 2>& dc, host_tensor<TDA, 2>& da, host_tensor<TDB, 2>& db,
                   const gemm_options& o = {}) {
  detail::check_gemm_types<op::matmul, P, TA, TG, TDA>();
  detail::check_gemm_types<op::matmul, P, TB, TG, TDB>();
  const auto mnk = detail::check_gemm_backward(a, b, dc, da, db, o);
  gemm_options g;
  g.alpha = o.alpha;
  detail::gemm_backward_products(
      mnk[0], mnk[1], mnk[2], o, a.data(), b.data(), dc.data(), da.data(), db.data(),
      [&](std::size_t m, std::size_t n, std::size_t k, const auto* l, std::size_t lrs,
          std::size_t lcs, const auto* r, std::size_t rrs, std::size_t rcs, auto* out,
          std::size_t ldo) {
        using TO = std::remove_pointer_t<decltype(out)>;
        detail::gemm_raw<op::matmul, P>(ctx, m, n, k, l, lrs, lcs, r, rrs, rcs, out, ldo,
                                        static_cast<const TO*>(nullptr), g);
      });
}

}  // namespace precis
