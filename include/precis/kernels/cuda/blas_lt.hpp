// precis/kernels/cuda/blas_lt.hpp: matrix products through cuBLASLt with a policy's types:
// bfloat16/float16 inputs with float compute, float8 inputs with per-tensor scales, TF32
// or exact float for float inputs, and the bias / ReLU / GELU epilogues. Row-major
// operands are passed to cuBLASLt (column-major) as their transposes: C = A B becomes
// C^T = B^T A^T. Host code: usable from .cpp files with PRECIS_CUDA=1 or from .cu files.
#pragma once

#include <precis/config.hpp>
#include <precis/kernels/cuda_context.hpp>
#include <precis/numeric/numeric.hpp>
#include <precis/policy/precision.hpp>

#if PRECIS_CUDA

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

namespace precis {

/// The epilogue fused into a cuBLASLt product. `gelu_bias` is cuBLASLt's own GELU, whose
/// formula is cuBLASLt's; precis::gemm's gelu epilogue on device tensors uses precis's
/// exact (erf) GELU instead (kernels/cuda/gemm.hpp).
enum class lt_epilogue { none, bias, relu, relu_bias, gelu_bias };

namespace detail::cuda {

template <class T>
constexpr cudaDataType_t data_type() {
  if constexpr (std::is_same_v<T, float>) {
    return CUDA_R_32F;
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    return CUDA_R_16BF;
  } else if constexpr (std::is_same_v<T, float16>) {
    return CUDA_R_16F;
  } else if constexpr (std::is_same_v<T, float8_e4m3>) {
    return CUDA_R_8F_E4M3;
  } else if constexpr (std::is_same_v<T, float8_e5m2>) {
    return CUDA_R_8F_E5M2;
  } else {
    static_assert(std::is_same_v<T, float>,
                  "precis: cuBLASLt products take float, bfloat16, float16 or float8 operands");
    return CUDA_R_32F;
  }
}

// RAII for the cuBLASLt descriptors of one call.
struct lt_desc_deleter {
  void operator()(cublasLtMatmulDescOpaque_t* d) const { (void)cublasLtMatmulDescDestroy(d); }
  void operator()(cublasLtMatrixLayoutOpaque_t* d) const { (void)cublasLtMatrixLayoutDestroy(d); }
  void operator()(cublasLtMatmulPreferenceOpaque_t* d) const { (void)cublasLtMatmulPreferenceDestroy(d); }
};
using matmul_desc = std::unique_ptr<cublasLtMatmulDescOpaque_t, lt_desc_deleter>;
using matrix_layout = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, lt_desc_deleter>;
using matmul_preference = std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, lt_desc_deleter>;

inline matrix_layout layout(cudaDataType_t t, std::uint64_t rows, std::uint64_t cols, std::int64_t ld) {
  cublasLtMatrixLayout_t l = nullptr;
  check(cublasLtMatrixLayoutCreate(&l, t, rows, cols, ld), "cublasLtMatrixLayoutCreate");
  return matrix_layout(l);
}

template <class V>
void set(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const V& v, const char* what) {
  check(cublasLtMatmulDescSetAttribute(d, a, &v, sizeof v), what);
}

}  // namespace detail::cuda

/// The operands of a row-major product C = alpha * op(A) op(B) + beta * C (+ bias over
/// columns, epilogue), op(A) being M x K and op(B) K x N, all pointers to device memory.
/// For float8 operands, `a_scale` and `b_scale` point (on the device) to the factors that
/// undo the per-tensor scaling (1/scale), and only C = A B^T is accepted (cuBLASLt's TN
/// layout for float8).
template <class TA, class TB, class TC>
struct lt_product {
  std::int64_t m = 0, n = 0, k = 0;
  const TA* a = nullptr;
  const TB* b = nullptr;
  TC* c = nullptr;
  bool trans_a = false, trans_b = false;
  float alpha = 1.0f, beta = 0.0f;
  lt_epilogue epilogue = lt_epilogue::none;
  const void* bias = nullptr;  ///< N values, of TC's type (float for float8 outputs)
  const float* a_scale = nullptr;
  const float* b_scale = nullptr;
};

/// Runs one product on ctx's stream. `Compute` is the policy's compute type: tfloat32
/// selects TF32 tensor cores for float operands; float keeps them exact (pedantic).
template <class Compute, class TA, class TB, class TC>
void lt_matmul(cuda_context& ctx, const lt_product<TA, TB, TC>& p) {
  using namespace detail::cuda;
  constexpr bool fp8 = is_float8_v<TA> || is_float8_v<TB>;
  if (p.m <= 0 || p.n <= 0 || p.k <= 0) {
    throw error("precis::lt_matmul: M, N, K must be positive, got " + std::to_string(p.m) + ", " +
                std::to_string(p.n) + ", " + std::to_string(p.k));
  }
  if constexpr (fp8) {
    if (p.trans_a || !p.trans_b) {
      throw error("precis::lt_matmul: float8 products are C = A x B^T (cuBLASLt's TN layout); "
                  "store B as N x K");
    }
    if (p.m % 16 || p.n % 16 || p.k % 16) {
      throw error("precis::lt_matmul: float8 products need M, N, K multiples of 16, got " +
                  std::to_string(p.m) + ", " + std::to_string(p.n) + ", " + std::to_string(p.k));
    }
    if (!p.a_scale || !p.b_scale) throw error("precis::lt_matmul: float8 operands need a_scale and b_scale");
  }
  const cublasComputeType_t compute =
      std::is_same_v<Compute, tfloat32> ? CUBLAS_COMPUTE_32F_FAST_TF32
      : (std::is_same_v<TA, float> && std::is_same_v<TB, float>) ? CUBLAS_COMPUTE_32F_PEDANTIC
                                                                  : CUBLAS_COMPUTE_32F;
  cublasLtMatmulDesc_t raw = nullptr;
  check(cublasLtMatmulDescCreate(&raw, compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
  matmul_desc desc(raw);
  // Column-major view: C^T (N x M) = op(B)^T (N x K) op(A)^T (K x M).
  const cublasOperation_t op_first = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;   // applies to B
  const cublasOperation_t op_second = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // applies to A
  set(desc.get(), CUBLASLT_MATMUL_DESC_TRANSA, op_first, "cublasLtMatmulDescSetAttribute(TRANSA)");
  set(desc.get(), CUBLASLT_MATMUL_DESC_TRANSB, op_second, "cublasLtMatmulDescSetAttribute(TRANSB)");
  if (p.epilogue == lt_epilogue::relu) {
    set(desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_RELU,
        "cublasLtMatmulDescSetAttribute(EPILOGUE)");
  } else if (p.epilogue != lt_epilogue::none) {
    if (!p.bias) throw error("precis::lt_matmul: the bias epilogues need a bias pointer");
    const cublasLtEpilogue_t e = p.epilogue == lt_epilogue::bias        ? CUBLASLT_EPILOGUE_BIAS
                                 : p.epilogue == lt_epilogue::relu_bias ? CUBLASLT_EPILOGUE_RELU_BIAS
                                                                        : CUBLASLT_EPILOGUE_GELU_BIAS;
    set(desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE, e, "cublasLtMatmulDescSetAttribute(EPILOGUE)");
    set(desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias, "cublasLtMatmulDescSetAttribute(BIAS_POINTER)");
  }
  if constexpr (fp8) {
    // First operand in cuBLASLt's terms is B, second is A.
    set(desc.get(), CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, p.b_scale, "cublasLtMatmulDescSetAttribute(A_SCALE)");
    set(desc.get(), CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, p.a_scale, "cublasLtMatmulDescSetAttribute(B_SCALE)");
  }
  // Stored shapes (row-major) seen as column-major: a row-major R x C matrix is a
  // column-major C x R matrix with leading dimension C.
  const std::uint64_t b_rows = p.trans_b ? std::uint64_t(p.k) : std::uint64_t(p.n);  // col-major rows of B's storage
  const std::uint64_t b_cols = p.trans_b ? std::uint64_t(p.n) : std::uint64_t(p.k);
  const std::uint64_t a_rows = p.trans_a ? std::uint64_t(p.m) : std::uint64_t(p.k);
  const std::uint64_t a_cols = p.trans_a ? std::uint64_t(p.k) : std::uint64_t(p.m);
  auto first = layout(data_type<TB>(), b_rows, b_cols, std::int64_t(b_rows));
  auto second = layout(data_type<TA>(), a_rows, a_cols, std::int64_t(a_rows));
  auto out = layout(data_type<TC>(), std::uint64_t(p.n), std::uint64_t(p.m), p.n);

  constexpr std::size_t workspace_bytes = std::size_t(32) << 20;
  void* workspace = ctx.workspace(workspace_bytes);
  cublasLtMatmulPreference_t rawp = nullptr;
  check(cublasLtMatmulPreferenceCreate(&rawp), "cublasLtMatmulPreferenceCreate");
  matmul_preference pref(rawp);
  const std::uint64_t ws = workspace_bytes;
  check(cublasLtMatmulPreferenceSetAttribute(pref.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
        "cublasLtMatmulPreferenceSetAttribute");
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  check(cublasLtMatmulAlgoGetHeuristic(ctx.blas_lt(), desc.get(), first.get(), second.get(), out.get(),
                                       out.get(), pref.get(), 1, &heuristic, &found),
        "cublasLtMatmulAlgoGetHeuristic");
  if (found == 0) throw error("precis::lt_matmul: cuBLASLt has no algorithm for this product");
  check(cublasLtMatmul(ctx.blas_lt(), desc.get(), &p.alpha, p.b, first.get(), p.a, second.get(), &p.beta, p.c,
                       out.get(), p.c, out.get(), &heuristic.algo, workspace, workspace_bytes, ctx.stream()),
        "cublasLtMatmul");
}

}  // namespace precis

#endif
