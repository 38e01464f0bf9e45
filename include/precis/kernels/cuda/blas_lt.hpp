/// @file
/// Matrix products through cuBLASLt with a policy's types: bfloat16/float16 inputs with float
/// compute, float8 inputs with per-tensor scales, TF32 or exact float for float inputs, and the
/// bias / ReLU / GELU epilogues. Row-major operands are passed to cuBLASLt (column-major) as their
/// transposes: C = A B becomes C^T = B^T A^T. Batches of products stored one after another run as
/// one strided-batch call. The descriptors and the algorithm cuBLASLt's heuristic picks are made
/// once per product shape, types, epilogue and operand alignment and kept in the context
/// (cuda_context::plan), so a repeated product costs only the cublasLtMatmul call. Host code:
/// usable from .cpp files with PRECIS_CUDA=1 or from .cu files.
#pragma once

#include <precis/config.hpp>
#include <precis/kernels/cuda_context.hpp>
#include <precis/numeric/numeric.hpp>
#include <precis/policy/precision.hpp>

#if PRECIS_CUDA

#include <array>
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

/// A column-major rows x cols layout; `batch` of them `stride` elements apart when batch > 1.
inline matrix_layout layout(cudaDataType_t t, std::uint64_t rows, std::uint64_t cols, std::int64_t ld,
                            std::int64_t batch = 1, std::int64_t stride = 0) {
  cublasLtMatrixLayout_t l = nullptr;
  check(cublasLtMatrixLayoutCreate(&l, t, rows, cols, ld), "cublasLtMatrixLayoutCreate");
  matrix_layout owned(l);
  if (batch > 1) {
    const auto count = static_cast<std::int32_t>(batch);
    check(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count),
          "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)");
    check(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                           sizeof stride),
          "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)");
  }
  return owned;
}

/// The alignment cuBLASLt's heuristic is told an operand has (it then excludes kernels
/// needing more): the largest power of two, at most 256, that divides the address, the
/// leading dimension in bytes and, for a batch, the distance between items in bytes.
inline std::uint32_t alignment_of(const void* p, std::size_t element_bytes, std::int64_t ld, std::int64_t batch,
                                  std::int64_t stride) {
  std::uint64_t a = reinterpret_cast<std::uintptr_t>(p) | (std::uint64_t(ld) * element_bytes);
  if (batch > 1) a |= std::uint64_t(stride) * element_bytes;
  std::uint32_t r = 256;
  while (r > 1 && a % r != 0) r /= 2;
  return r;
}

/// What cuBLASLt keeps for one kind of product: descriptors and the chosen algorithm.
struct lt_plan {
  matmul_desc desc;
  matrix_layout first, second, out;
  cublasLtMatmulAlgo_t algo{};
};

inline constexpr std::size_t lt_workspace_bytes = std::size_t(32) << 20;

template <class V>
void set(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const V& v, const char* what) {
  check(cublasLtMatmulDescSetAttribute(d, a, &v, sizeof v), what);
}

}  // namespace detail::cuda

/// The operands of a row-major product C = alpha * op(A) op(B) + beta * C (+ bias over
/// columns, epilogue), op(A) being M x K and op(B) K x N, all pointers to device memory.
/// For float8 operands, `a_scale` and `b_scale` point (on the device, each 16-byte aligned)
/// to the factors that undo the per-tensor scaling (1/scale), and only C = A B^T is
/// accepted (cuBLASLt's TN layout for float8).
template <class TA, class TB, class TC>
struct lt_product {
  /// @var m
  /// Rows of op(A) and of C.
  /// @var n
  /// Columns of op(B) and of C.
  /// @var k
  /// Columns of op(A) and rows of op(B): the length of each sum.
  std::int64_t m = 0, n = 0, k = 0;
  const TA* a = nullptr;  ///< A, row-major: M x K, or K x M when trans_a
  const TB* b = nullptr;  ///< B, row-major: K x N, or N x K when trans_b
  TC* c = nullptr;        ///< C, row-major M x N: read when beta != 0, then written
  /// Whether A is stored transposed (K x M).
  bool trans_a = false, trans_b = false;  ///< whether B is stored transposed (N x K)
  /// Scales the product.
  float alpha = 1.0f, beta = 0.0f;           ///< scales C's previous values
  lt_epilogue epilogue = lt_epilogue::none;  ///< what is applied after the sum, before rounding
  const void* bias = nullptr;                ///< N values, of TC's type (bfloat16 or float16 with float8 inputs)
  const float* a_scale = nullptr;            ///< float8 A: 1 / its scale, on the device
  const float* b_scale = nullptr;            ///< float8 B: 1 / its scale, on the device
  /// Products stored one after another (A, B, C items m*k, k*n, m*n elements apart), run
  /// as one strided-batch call; the bias, when given, is shared by all.
  std::int64_t batch = 1;
};

namespace detail::cuda {

template <class Compute, class TA, class TB>
constexpr cublasComputeType_t lt_compute() {
  if constexpr (std::is_same_v<Compute, tfloat32>) {
    return CUBLAS_COMPUTE_32F_FAST_TF32;
  } else if constexpr (std::is_same_v<TA, float> && std::is_same_v<TB, float>) {
    return CUBLAS_COMPUTE_32F_PEDANTIC;
  } else {
    return CUBLAS_COMPUTE_32F;
  }
}

inline cublasLtEpilogue_t lt_epilogue_of(lt_epilogue e) {
  switch (e) {
    case lt_epilogue::bias: return CUBLASLT_EPILOGUE_BIAS;
    case lt_epilogue::relu: return CUBLASLT_EPILOGUE_RELU;
    case lt_epilogue::relu_bias: return CUBLASLT_EPILOGUE_RELU_BIAS;
    case lt_epilogue::gelu_bias: return CUBLASLT_EPILOGUE_GELU_BIAS;
    default: return CUBLASLT_EPILOGUE_DEFAULT;
  }
}

/// Sets the pointers a plan's descriptor holds for one call (bias, float8 scales).
template <class TA, class TB, class TC>
void set_call_pointers(cublasLtMatmulDesc_t desc, const lt_product<TA, TB, TC>& p) {
  if (p.epilogue != lt_epilogue::none && p.epilogue != lt_epilogue::relu) {
    set(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias, "cublasLtMatmulDescSetAttribute(BIAS_POINTER)");
  }
  if constexpr (is_float8_v<TA> || is_float8_v<TB>) {
    // First operand in cuBLASLt's terms is B, second is A.
    set(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, p.b_scale, "cublasLtMatmulDescSetAttribute(A_SCALE)");
    set(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, p.a_scale, "cublasLtMatmulDescSetAttribute(B_SCALE)");
  }
}

/// The product as errors name it: "128x96x200 bfloat16 x bfloat16 -> bfloat16, A^T, bias,
/// batch 1, alignments 16/64/64 bytes".
template <class Compute, class TA, class TB, class TC>
std::string describe_product(const lt_product<TA, TB, TC>& p,
                             const std::array<std::uint32_t, 3>& align) {
  static constexpr const char* epilogues[] = {"no epilogue", "bias", "relu", "relu + bias",
                                              "gelu + bias"};
  std::string s = std::to_string(p.m) + "x" + std::to_string(p.n) + "x" + std::to_string(p.k) +
                  " " + std::string(type_name_v<TA>) + " x " + std::string(type_name_v<TB>) +
                  " -> " + std::string(type_name_v<TC>);
  if constexpr (std::is_same_v<Compute, tfloat32>) s += " (tf32)";
  s += p.trans_a ? ", A^T" : "";
  s += p.trans_b ? ", B^T" : "";
  s += std::string(", ") + epilogues[static_cast<int>(p.epilogue)] + ", batch " +
       std::to_string(p.batch) + ", alignments " + std::to_string(align[0]) + "/" +
       std::to_string(align[1]) + "/" + std::to_string(align[2]) + " bytes";
  return s;
}

/// Makes the descriptors of product p and asks cuBLASLt's heuristic for its best algorithm
/// for operands of the given alignments.
template <class Compute, class TA, class TB, class TC>
lt_plan make_lt_plan(cuda_context& ctx, const lt_product<TA, TB, TC>& p,
                     const std::array<std::uint32_t, 3>& align) {
  lt_plan plan;
  cublasLtMatmulDesc_t raw = nullptr;
  check(cublasLtMatmulDescCreate(&raw, lt_compute<Compute, TA, TB>(), CUDA_R_32F), "cublasLtMatmulDescCreate");
  plan.desc.reset(raw);
  // Column-major view: C^T (N x M) = op(B)^T (N x K) op(A)^T (K x M).
  const cublasOperation_t op_first = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;   // applies to B
  const cublasOperation_t op_second = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // applies to A
  set(raw, CUBLASLT_MATMUL_DESC_TRANSA, op_first, "cublasLtMatmulDescSetAttribute(TRANSA)");
  set(raw, CUBLASLT_MATMUL_DESC_TRANSB, op_second, "cublasLtMatmulDescSetAttribute(TRANSB)");
  set(raw, CUBLASLT_MATMUL_DESC_EPILOGUE, lt_epilogue_of(p.epilogue), "cublasLtMatmulDescSetAttribute(EPILOGUE)");
  set_call_pointers(raw, p);
  // Stored shapes (row-major) seen as column-major: a row-major R x C matrix is a
  // column-major C x R matrix with leading dimension C.
  const std::uint64_t b_rows = p.trans_b ? std::uint64_t(p.k) : std::uint64_t(p.n);
  const std::uint64_t b_cols = p.trans_b ? std::uint64_t(p.n) : std::uint64_t(p.k);
  const std::uint64_t a_rows = p.trans_a ? std::uint64_t(p.m) : std::uint64_t(p.k);
  const std::uint64_t a_cols = p.trans_a ? std::uint64_t(p.k) : std::uint64_t(p.m);
  plan.first = layout(data_type<TB>(), b_rows, b_cols, std::int64_t(b_rows), p.batch, p.k * p.n);
  plan.second = layout(data_type<TA>(), a_rows, a_cols, std::int64_t(a_rows), p.batch, p.m * p.k);
  plan.out = layout(data_type<TC>(), std::uint64_t(p.n), std::uint64_t(p.m), p.n, p.batch, p.m * p.n);

  cublasLtMatmulPreference_t rawp = nullptr;
  check(cublasLtMatmulPreferenceCreate(&rawp), "cublasLtMatmulPreferenceCreate");
  matmul_preference pref(rawp);
  const std::uint64_t ws = lt_workspace_bytes;
  check(cublasLtMatmulPreferenceSetAttribute(rawp, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
        "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)");
  // In cuBLASLt's terms A is precis's B, B is precis's A; C and D are precis's C.
  const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  const std::uint32_t align_value[4] = {align[1], align[0], align[2], align[2]};
  for (int i = 0; i < 4; ++i) {
    check(cublasLtMatmulPreferenceSetAttribute(rawp, align_attr[i], &align_value[i], sizeof align_value[i]),
          "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT)");
  }
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  check(cublasLtMatmulAlgoGetHeuristic(ctx.blas_lt(), raw, plan.first.get(), plan.second.get(), plan.out.get(),
                                       plan.out.get(), rawp, 1, &heuristic, &found),
        "cublasLtMatmulAlgoGetHeuristic");
  if (found == 0 || heuristic.state != CUBLAS_STATUS_SUCCESS) {
    throw error("precis::lt_matmul: cuBLASLt has no algorithm for the product " +
                describe_product<Compute>(p, align));
  }
  if (heuristic.workspaceSize > lt_workspace_bytes) {
    throw error("precis::lt_matmul: cuBLASLt's algorithm for the product " +
                describe_product<Compute>(p, align) + " asks for " +
                std::to_string(heuristic.workspaceSize) + " bytes of workspace, more than the " +
                std::to_string(lt_workspace_bytes) + " it was offered");
  }
  plan.algo = heuristic.algo;
  return plan;
}

}  // namespace detail::cuda

/// Runs one product (or one strided batch of them) on ctx's stream. `Compute` is the
/// policy's compute type: tfloat32 selects TF32 tensor cores for float operands; float
/// keeps them exact (pedantic). The first call for a shape makes its plan (descriptors and
/// cuBLASLt's heuristic choice); later calls reuse it.
template <class Compute, class TA, class TB, class TC>
void lt_matmul(cuda_context& ctx, const lt_product<TA, TB, TC>& p) {
  namespace cu = detail::cuda;
  constexpr bool fp8 = is_float8_v<TA> || is_float8_v<TB>;
  if (p.m <= 0 || p.n <= 0 || p.k <= 0 || p.batch <= 0 || p.batch > 2147483647) {
    throw error("precis::lt_matmul: M, N, K must be positive and the batch in [1, 2^31 - 1], got " +
                std::to_string(p.m) + ", " + std::to_string(p.n) + ", " + std::to_string(p.k) + ", " +
                std::to_string(p.batch));
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
    // cuBLASLt's own answer to a scale 4 bytes past a 16-byte boundary is "not supported"
    // at the call (its heuristic still offers algorithms), so precis says why first.
    const auto scale_bits =
        reinterpret_cast<std::uintptr_t>(p.a_scale) | reinterpret_cast<std::uintptr_t>(p.b_scale);
    if (scale_bits % 16 != 0) {
      throw error(
          "precis::lt_matmul: cuBLASLt needs the float8 scale pointers a_scale and "
          "b_scale aligned to 16 bytes (give each its own allocation or 16-byte slot)");
    }
  }
  if (p.epilogue != lt_epilogue::none && p.epilogue != lt_epilogue::relu && !p.bias) {
    throw error("precis::lt_matmul: the bias epilogues need a bias pointer");
  }
  // Leading dimensions as the layouts give them (rows of the column-major views).
  const std::array<std::uint32_t, 3> align{
      cu::alignment_of(p.a, sizeof(TA), p.trans_a ? p.m : p.k, p.batch, p.m * p.k),
      cu::alignment_of(p.b, sizeof(TB), p.trans_b ? p.k : p.n, p.batch, p.k * p.n),
      cu::alignment_of(p.c, sizeof(TC), p.n, p.batch, p.m * p.n)};
  const std::array<std::int64_t, 14> key{
      std::int64_t(cu::lt_compute<Compute, TA, TB>()), std::int64_t(cu::data_type<TA>()), std::int64_t(cu::data_type<TB>()),
      std::int64_t(cu::data_type<TC>()), p.trans_a, p.trans_b, p.m, p.n, p.k, std::int64_t(p.epilogue), p.batch,
      align[0], align[1], align[2]};
  cu::lt_plan& plan = ctx.plan<cu::lt_plan>(key, [&] { return cu::make_lt_plan<Compute>(ctx, p, align); });
  cu::set_call_pointers(plan.desc.get(), p);
  void* workspace = ctx.workspace(cu::lt_workspace_bytes);
  const cublasStatus_t status =
      cublasLtMatmul(ctx.blas_lt(), plan.desc.get(), &p.alpha, p.b, plan.first.get(), p.a,
                     plan.second.get(), &p.beta, p.c, plan.out.get(), p.c, plan.out.get(),
                     &plan.algo, workspace, cu::lt_workspace_bytes, ctx.stream());
  if (status != CUBLAS_STATUS_SUCCESS) {
    check(status, "cublasLtMatmul for the product " + cu::describe_product<Compute>(p, align));
  }
}

}  // namespace precis

#endif
