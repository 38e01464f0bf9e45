/// @file
/// precis::gemm on device tensors, with the calls of kernels/gemm.hpp (a cuda_context in place of
/// the cpu_context), through cuBLASLt with the policy's types: bfloat16 or float16 operands with
/// float compute, float operands exact (pedantic) or TF32 under a tfloat32 compute type. Shapes are
/// checked on the host, with the host's messages, before anything is launched.
///
/// Epilogues: none and relu (with or without bias) run inside cuBLASLt, which rounds once
/// after them. gelu is precis's exact (erf) GELU, as on the host: the product is written in
/// float to a stream-ordered scratch buffer and one kernel adds beta * C and the bias,
/// applies GELU and rounds once; an empty product (K = 0) gives epilogue(beta * C + bias)
/// through the same kernel, as on the host. A batched product is one strided-batch cuBLASLt
/// call.
/// float8 operands need per-tensor scales: use precis::lt_matmul for them. Compiled by nvcc
/// only (include from a .cu file).
#pragma once

#include <precis/config.hpp>
#include <precis/kernels/cuda/blas_lt.hpp>
#include <precis/kernels/cuda/elementwise.hpp>
#include <precis/kernels/gemm.hpp>

#if defined(__CUDACC__)

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

namespace precis {

namespace detail::cuda {

/// The element types a device product accepts under P, on top of the host's rules.
template <Policy P, class TA, class TB, class TC, class TBias>
constexpr void check_device_gemm_types() {
  check_gemm_types<op::matmul, P, TA, TB, TC>();
  static_assert(!is_float8_v<TA> && !is_float8_v<TB>,
                "precis: float8 products on the device need per-tensor scales; call "
                "precis::lt_matmul with a_scale and b_scale");
  static_assert(std::is_same_v<TA, TB>,
                "precis: cuBLASLt multiplies operands of one type (bfloat16 x bfloat16, "
                "float16 x float16, float x float); cast one of them with precis::cast first");
  static_assert(!std::is_same_v<TA, double> && !std::is_same_v<TC, double>,
                "precis: device products take float, bfloat16 or float16, not double");
  static_assert(std::is_same_v<accumulate_t<op::matmul, P>, float>,
                "precis: device products accumulate in float (tensor cores); a policy with a "
                "narrower accumulator has no cuBLASLt equivalent");
  static_assert(std::is_same_v<TBias, TC>,
                "precis: on the device a bias has the output's element type (cuBLASLt's rule)");
}

/// c[i] = round(epilogue(t[i] + beta * c[i] + bias[i % n])), t[i] = alpha * 0 when t is
/// null: the gelu epilogue after a float product (alpha already applied), and an empty
/// product (K = 0, where the host gives epilogue(alpha * 0 + beta * C + bias)). The host
/// writer's steps, in order, each rounded as there (no fused multiply-add).
template <class TC, class TBias>
__global__ void finish_product(const float* t, TC* c, const TBias* bias, std::size_t total,
                               std::size_t n, float alpha, float beta, gemm_epilogue epilogue) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < total;
       i += std::size_t(gridDim.x) * blockDim.x) {
    float v = t != nullptr ? t[i] : alpha * 0.0F;
    if (beta != 0.0F) v += __fmul_rn(beta, device_load<float>(c[i]));
    if (bias != nullptr) v += device_load<float>(bias[i % n]);
    c[i] = round_to<TC>(apply_epilogue(epilogue, v));
  }
}

/// `batch` row-major products, stored one after another, C (M x N) = epilogue(alpha op(A)
/// op(B) + beta C + bias).
template <class Compute, class T, class TC, class TBias>
void device_product(cuda_context& ctx, std::size_t batch, std::size_t M, std::size_t N,
                    std::size_t K, const T* a, const T* b, const TBias* bias, TC* c,
                    const gemm_options& o) {
  if (batch == 0 || M == 0 || N == 0) return;
  const std::size_t total = batch * M * N;
  if (K == 0) {  // cuBLASLt takes no empty products: C = epilogue(beta * C + bias)
    finish_product<<<grid_for(total), 256, 0, ctx.stream()>>>(static_cast<const float*>(nullptr), c,
                                                              bias, total, N, o.alpha, o.beta,
                                                              o.epilogue);
    check(cudaGetLastError(), "precis::gemm (K = 0)");
    return;
  }
  if (o.epilogue == gemm_epilogue::gelu) {
    device_tensor<float, 1> scratch({total}, ctx.stream());
    lt_product<T, T, float> p;
    p.m = std::int64_t(M), p.n = std::int64_t(N), p.k = std::int64_t(K);
    p.batch = std::int64_t(batch);
    p.a = a, p.b = b, p.c = scratch.data();
    p.trans_a = o.trans_a, p.trans_b = o.trans_b;
    p.alpha = o.alpha, p.beta = 0.0F;
    lt_matmul<Compute>(ctx, p);
    finish_product<<<grid_for(total), 256, 0, ctx.stream()>>>(scratch.data(), c, bias, total, N,
                                                              o.alpha, o.beta, o.epilogue);
    check(cudaGetLastError(), "precis::gemm (gelu epilogue)");
    return;
  }
  lt_product<T, T, TC> p;
  p.m = std::int64_t(M), p.n = std::int64_t(N), p.k = std::int64_t(K);
  p.batch = std::int64_t(batch);
  p.a = a, p.b = b, p.c = c;
  p.trans_a = o.trans_a, p.trans_b = o.trans_b;
  p.alpha = o.alpha, p.beta = o.beta;
  p.bias = bias;
  const bool relu = o.epilogue == gemm_epilogue::relu;
  p.epilogue = bias != nullptr ? (relu ? lt_epilogue::relu_bias : lt_epilogue::bias)
                               : (relu ? lt_epilogue::relu : lt_epilogue::none);
  lt_matmul<Compute>(ctx, p);
}

template <Policy P>
using device_compute_t = typename kernel_policy_t<op::matmul, P>::compute_type;

/// Whether an operand whose element (i, k) of an R x C view is at p[i * rs + k * cs] is
/// stored transposed (C x R, packed) rather than row-major (R x C, packed); throws
/// precis::error for any other layout, which cuBLASLt's packed operands cannot express.
inline bool stored_transposed(std::string_view who, std::size_t rows, std::size_t cols,
                              std::size_t rs, std::size_t cs) {
  if (cs == 1 && (rs == cols || rows == 1)) return false;
  if (rs == 1 && (cs == rows || cols == 1)) return true;
  throw error(std::string(who) + ": a device product takes packed operands (row-major or " +
              "stored transposed); strides " + std::to_string(rs) + ", " + std::to_string(cs) +
              " of a " + std::to_string(rows) + " x " + std::to_string(cols) + " operand are neither");
}

}  // namespace detail::cuda

namespace detail {

/// gemm_raw on the device (the host's raw call, for layers that run on either context):
/// C (M x N) = alpha op(A) op(B) + beta C + bias through cuBLASLt, queued on ctx's stream.
/// The strides must describe packed operands, each row-major or stored transposed, and C
/// must be packed (ldc = N); anything else throws precis::error before a launch.
template <op_kind Op, Policy P, class TA, class TB, class TC, class TBias>
void gemm_raw(cuda_context& ctx, std::size_t M, std::size_t N, std::size_t K, const TA* a,
              std::size_t ars, std::size_t acs, const TB* b, std::size_t brs, std::size_t bcs,
              TC* c, std::size_t ldc, const TBias* bias, const gemm_options& o) {
  static_assert(std::is_same_v<Op, op::matmul>, "precis: device products take op::matmul policies");
  cuda::check_device_gemm_types<P, TA, TB, TC, TBias>();
  if (M == 0 || N == 0) return;
  if (ldc != N) throw error("precis::gemm (device): the output must be packed (ldc = N)");
  gemm_options d = o;
  d.trans_a = cuda::stored_transposed("precis::gemm (device): A", M, K, ars, acs);
  d.trans_b = cuda::stored_transposed("precis::gemm (device): B", K, N, brs, bcs);
  cuda::device_product<cuda::device_compute_t<P>>(ctx, 1, M, N, K, a, b, bias, c, d);
}

}  // namespace detail

/// C = epilogue(alpha op(A) op(B) + beta C) on the device (see the host gemm).
template <Policy P, class TA, class TB, class TC>
void gemm(cuda_context& ctx, const device_tensor<TA, 2>& a, const device_tensor<TB, 2>& b,
          device_tensor<TC, 2>& c, const gemm_options& o = {}) {
  detail::cuda::check_device_gemm_types<P, TA, TB, TC, TC>();
  const auto mnk = detail::check_gemm("precis::gemm", a, b, o, 0);
  check_shape("precis::gemm: c", c, detail::dims2(mnk[0], mnk[1]));
  detail::cuda::device_product<detail::cuda::device_compute_t<P>>(
      ctx, 1, mnk[0], mnk[1], mnk[2], a.data(), b.data(), static_cast<const TC*>(nullptr),
      c.data(), o);
}

/// As gemm, plus `bias` (N values, of C's type) added to every row before the epilogue.
template <Policy P, class TA, class TB, class TBias, class TC>
void gemm(cuda_context& ctx, const device_tensor<TA, 2>& a, const device_tensor<TB, 2>& b,
          const device_tensor<TBias, 1>& bias, device_tensor<TC, 2>& c,
          const gemm_options& o = {}) {
  detail::cuda::check_device_gemm_types<P, TA, TB, TC, TBias>();
  const auto mnk = detail::check_gemm("precis::gemm", a, b, o, 0);
  check_shape("precis::gemm: bias", bias, std::array<std::size_t, 1>{mnk[1]});
  check_shape("precis::gemm: c", c, detail::dims2(mnk[0], mnk[1]));
  detail::cuda::device_product<detail::cuda::device_compute_t<P>>(
      ctx, 1, mnk[0], mnk[1], mnk[2], a.data(), b.data(), bias.data(), c.data(), o);
}

/// Batched product on the device: c[i] = alpha op(a[i]) op(b[i]) + beta c[i] for every i
/// of the first axis.
template <Policy P, class TA, class TB, class TC>
void gemm(cuda_context& ctx, const device_tensor<TA, 3>& a, const device_tensor<TB, 3>& b,
          device_tensor<TC, 3>& c, const gemm_options& o = {}) {
  detail::cuda::check_device_gemm_types<P, TA, TB, TC, TC>();
  const std::size_t batch = a.shape()[0];
  const auto mnk = detail::check_gemm("precis::gemm (batched)", a, b, o, 1);
  const std::size_t M = mnk[0], N = mnk[1], K = mnk[2];
  check_shape("precis::gemm (batched): b", b,
              std::array<std::size_t, 3>{batch, b.shape()[1], b.shape()[2]});
  check_shape("precis::gemm (batched): c", c, std::array<std::size_t, 3>{batch, M, N});
  detail::cuda::device_product<detail::cuda::device_compute_t<P>>(
      ctx, batch, M, N, K, a.data(), b.data(), static_cast<const TC*>(nullptr), c.data(), o);
}

/// The backward pass of c = alpha op(a) op(b) on the device (see the host gemm_backward):
/// da and db, each shaped as its operand, by two cuBLASLt products, each rounded once. Every
/// shape is checked before anything is queued.
template <Policy P, class TA, class TB, class TG, class TDA, class TDB>
void gemm_backward(cuda_context& ctx, const device_tensor<TA, 2>& a, const device_tensor<TB, 2>& b,
                   const device_tensor<TG, 2>& dc, device_tensor<TDA, 2>& da,
                   device_tensor<TDB, 2>& db, const gemm_options& o = {}) {
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

#endif
