// The CUDA backend's host side, which runs without a GPU: a failing CUDA call throws
// precis::cuda_error naming the call, the status and the source line (checked through the
// failure a machine without a usable device gives: making a context); the alignment
// cuBLASLt's heuristic is told; which cuDNN math types each policy accepts, and which of
// cuDNN's algorithms a convolution takes (exact products, the workspace limit); the checks of a
// transposed convolution's geometry; fused attention's head widths and plan keys; a device
// tensor's fit to another shape (its memory kept where it holds it; without a GPU, a failed
// allocation leaves it empty). Built as C++ with PRECIS_CUDA=1 (precis::cuda).
#include <precis/kernels/cuda/blas_lt.hpp>
#include <precis/kernels/cuda/conv.hpp>
#include <precis/kernels/cuda/fused_attention.hpp>
#include <precis/tensor/device_tensor.hpp>

#include <doctest/doctest.h>

#include <array>
#include <cstdint>
#include <string>
#include <utility>

TEST_CASE("a failing CUDA call throws precis::cuda_error naming the call, status and place") {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) {
    precis::cuda_context ctx;  // a device is there: making a context works
    CHECK(ctx.plan_count() == 0);
    return;
  }
  try {
    precis::cuda_context ctx;
    FAIL("a context was made without a usable device");
  } catch (const precis::cuda_error& e) {
    const std::string what = e.what();
    CHECK(what.find("cudaSetDevice failed: ") == 0);
    CHECK(what.find("(status " + std::to_string(e.status()) + ")") != std::string::npos);
    CHECK(what.find("cuda_context.hpp:") != std::string::npos);
    CHECK(e.status() != 0);
  }
  // check() on a status passes success through and reports any other.
  CHECK_NOTHROW(precis::check(cudaSuccess, "nothing"));
  CHECK_THROWS_WITH_AS(precis::check(cudaErrorInvalidValue, "cudaMemcpy"),
                       doctest::Contains("cudaMemcpy failed: invalid argument"),
                       precis::cuda_error);
  CHECK_THROWS_WITH_AS(precis::check(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmul"),
                       doctest::Contains("cublasLtMatmul failed: "), precis::cuda_error);
  CHECK_THROWS_WITH_AS(precis::check(CUDNN_STATUS_BAD_PARAM, "cudnnConvolutionForward"),
                       doctest::Contains("cudnnConvolutionForward failed: "), precis::cuda_error);
}

TEST_CASE("cuBLASLt is told the alignment the address, leading dimension and batch stride allow") {
  using precis::detail::cuda::alignment_of;
  const auto* base = reinterpret_cast<const void*>(std::uintptr_t(0x7f0000000000));
  CHECK(alignment_of(base, 2, 4096, 1, 0) == 256);
  CHECK(alignment_of(base, 2, 130, 1, 0) == 4);            // 260-byte rows
  CHECK(alignment_of(base, 2, 4096, 3, 67 * 130) == 4);    // items 17420 bytes apart
  CHECK(alignment_of(base, 2, 4096, 1, 67 * 130) == 256);  // no batch: stride unused
  CHECK(alignment_of(static_cast<const char*>(base) + 2, 2, 4096, 1, 0) == 2);
  CHECK(alignment_of(static_cast<const char*>(base) + 48, 4, 4096, 1, 0) == 16);
  CHECK(alignment_of(base, 1, 4095, 1, 0) == 1);  // float8, odd rows
}

TEST_CASE("cuDNN algorithms are taken only within the policy's math") {
  using precis::detail::cuda::math_allowed;
  // Exact float: no tensor cores.
  CHECK(math_allowed(CUDNN_FMA_MATH, CUDNN_FMA_MATH));
  CHECK_FALSE(math_allowed(CUDNN_FMA_MATH, CUDNN_TENSOR_OP_MATH));
  CHECK_FALSE(math_allowed(CUDNN_FMA_MATH, CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION));
  CHECK_FALSE(math_allowed(CUDNN_FMA_MATH, CUDNN_DEFAULT_MATH));  // TF32 on float data from sm_80 on
  // TF32 and half: tensor cores, never a down-conversion.
  CHECK(math_allowed(CUDNN_DEFAULT_MATH, CUDNN_TENSOR_OP_MATH));
  CHECK(math_allowed(CUDNN_TENSOR_OP_MATH, CUDNN_TENSOR_OP_MATH));
  CHECK(math_allowed(CUDNN_TENSOR_OP_MATH, CUDNN_FMA_MATH));
  CHECK(math_allowed(CUDNN_TENSOR_OP_MATH, CUDNN_DEFAULT_MATH));
  CHECK(math_allowed(CUDNN_DEFAULT_MATH, CUDNN_FMA_MATH));
  CHECK_FALSE(math_allowed(CUDNN_TENSOR_OP_MATH, CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION));
  // The policies' descriptor math.
  namespace presets = precis::presets;
  CHECK(precis::detail::cuda::dnn_math<presets::fp32, float>() == CUDNN_FMA_MATH);
  CHECK(precis::detail::cuda::dnn_math<presets::tf32, float>() == CUDNN_DEFAULT_MATH);
  CHECK(precis::detail::cuda::dnn_math<presets::bf16_mixed, precis::bfloat16>() ==
        CUDNN_TENSOR_OP_MATH);
}

TEST_CASE("a convolution's algorithm is cuDNN's first that is deterministic, within the math, exact where asked "
          "and within the workspace limit") {
  using precis::detail::cuda::pick_algorithm;
  using precis::detail::cuda::transforms;
  // The transforming algorithms of each pass, and the direct ones.
  CHECK(transforms(CUDNN_CONVOLUTION_FWD_ALGO_FFT));
  CHECK(transforms(CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING));
  CHECK(transforms(CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD));
  CHECK(transforms(CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED));
  CHECK_FALSE(transforms(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM));
  CHECK_FALSE(transforms(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM));
  CHECK_FALSE(transforms(CUDNN_CONVOLUTION_FWD_ALGO_GEMM));
  CHECK_FALSE(transforms(CUDNN_CONVOLUTION_FWD_ALGO_DIRECT));
  CHECK(transforms(CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT));
  CHECK(transforms(CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING));
  CHECK(transforms(CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD));
  CHECK(transforms(CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED));
  CHECK_FALSE(transforms(CUDNN_CONVOLUTION_BWD_DATA_ALGO_0));
  CHECK_FALSE(transforms(CUDNN_CONVOLUTION_BWD_DATA_ALGO_1));
  CHECK(transforms(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT));
  CHECK(transforms(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING));
  CHECK(transforms(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED));
  CHECK_FALSE(transforms(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0));
  CHECK_FALSE(transforms(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1));
  CHECK_FALSE(transforms(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3));

  // A ranked list as cuDNN's heuristic gives it: each entry passed over for one reason.
  const auto entry = [](cudnnConvolutionFwdAlgo_t algo, cudnnMathType_t math, std::size_t memory,
                        cudnnStatus_t status = CUDNN_STATUS_SUCCESS,
                        cudnnDeterminism_t det = CUDNN_DETERMINISTIC) {
    cudnnConvolutionFwdAlgoPerf_t p{};
    p.algo = algo;
    p.status = status;
    p.time = -1;
    p.memory = memory;
    p.determinism = det;
    p.mathType = math;
    return p;
  };
  constexpr std::size_t MiB = std::size_t(1) << 20;
  constexpr auto none = precis::cuda_context::no_workspace_limit;
  const std::array<cudnnConvolutionFwdAlgoPerf_t, 6> list{
      entry(CUDNN_CONVOLUTION_FWD_ALGO_GEMM, CUDNN_TENSOR_OP_MATH, 0, CUDNN_STATUS_NOT_SUPPORTED),
      entry(CUDNN_CONVOLUTION_FWD_ALGO_DIRECT, CUDNN_TENSOR_OP_MATH, 0, CUDNN_STATUS_SUCCESS,
            CUDNN_NON_DETERMINISTIC),
      entry(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION, 0),
      entry(CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING, CUDNN_TENSOR_OP_MATH, 900 * MiB),
      entry(CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED, CUDNN_TENSOR_OP_MATH, 40 * MiB),
      entry(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, CUDNN_TENSOR_OP_MATH, 2 * MiB)};
  const auto pick = [&](int count, cudnnMathType_t math, bool exact, std::size_t limit) {
    return pick_algorithm(list.data(), count, math, exact, limit, "precis::conv2d").algo;
  };
  CHECK(pick(6, CUDNN_TENSOR_OP_MATH, false, none) == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING);
  CHECK(pick(6, CUDNN_TENSOR_OP_MATH, true, none) == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM);
  CHECK(pick(6, CUDNN_TENSOR_OP_MATH, false, 512 * MiB) == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED);
  CHECK(pick(6, CUDNN_TENSOR_OP_MATH, false, 40 * MiB) == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED);
  CHECK(pick(6, CUDNN_TENSOR_OP_MATH, false, 40 * MiB - 1) == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM);
  // Exact float takes none of the tensor-core entries.
  CHECK_THROWS_WITH_AS(pick(6, CUDNN_FMA_MATH, false, none),
                       doctest::Contains("precis::conv2d: cuDNN offers no deterministic algorithm"), precis::error);
  // Nothing fits the limit: the error names it and the least workspace asked for.
  CHECK_THROWS_WITH_AS(pick(6, CUDNN_TENSOR_OP_MATH, false, MiB),
                       doctest::Contains("limit of 1048576 bytes (the least is 2097152)"), precis::error);
  CHECK_THROWS_WITH_AS(pick(3, CUDNN_TENSOR_OP_MATH, false, none), doctest::Contains("no deterministic algorithm"),
                       precis::error);
  CHECK_THROWS_WITH_AS(pick(0, CUDNN_TENSOR_OP_MATH, false, none), doctest::Contains("no deterministic algorithm"),
                       precis::error);
}

TEST_CASE("the transposed convolution's geometry is the adjoint convolution's, and checked") {
  struct shaped {  // the part of a tensor the geometry checks read
    std::array<std::size_t, 4> s;
    const std::array<std::size_t, 4>& shape() const { return s; }
    std::size_t dimension() const { return 4; }
  };
  precis::conv2d_params p;
  p.stride = {2, 2};
  p.padding = {1, 1};
  p.output_padding = {1, 0};
  const shaped x{{2, 12, 7, 7}}, w{{12, 2, 3, 3}}, y{{2, 6, 14, 13}};
  p.groups = 3;
  const auto g = precis::detail::transpose_geometry("t", x, w, y, p);
  CHECK(g.n == 2);
  CHECK(g.c == 6);  // the adjoint reads y's channels
  CHECK(g.co == 12);
  CHECK(g.h == 14);
  CHECK(g.w == 13);
  CHECK(g.ho == 7);
  CHECK(g.wo == 7);
  CHECK(g.p.output_padding == std::array<std::size_t, 2>{0, 0});
  // output_padding must stay below the stride, even where the dilation is larger.
  precis::conv2d_params q = p;
  q.stride = {1, 1};
  q.dilation = {2, 2};
  q.output_padding = {1, 1};
  CHECK_THROWS_WITH_AS(precis::detail::transpose_geometry("t", x, w, y, q),
                       doctest::Contains("output_padding 1 must be less than the stride (1)"),
                       precis::error);
  q = p;
  q.stride = {0, 2};
  CHECK_THROWS_WITH_AS(precis::detail::transpose_geometry("t", x, w, y, q),
                       doctest::Contains("stride, dilation and groups must be at least 1"),
                       precis::error);
  const shaped y_wrong{{2, 6, 13, 13}};
  CHECK_THROWS_WITH_AS(precis::detail::transpose_geometry("t", x, w, y_wrong, p),
                       doctest::Contains("t: y"), precis::error);
}

TEST_CASE("fused attention takes head widths that are multiples of 8 up to 128, and says what to do otherwise") {
  using engine = precis::fused_attention_engine;
  for (std::int64_t ok : {8, 16, 64, 128}) CHECK_NOTHROW(engine::check_geometry(ok, 2, true, "attention"));
  // One token: cuDNN's backward refuses it, a forward pass alone is fine.
  CHECK_NOTHROW(engine::check_geometry(64, 1, false, "attention"));
  CHECK_THROWS_WITH_AS(engine::check_geometry(64, 1, true, "precis::nn::attention"),
                       doctest::Contains("at least 2 tokens, got 1"), precis::error);
  for (std::int64_t bad : {0, 4, 12, 136, 256}) {
    try {
      engine::check_geometry(bad, 16, false, "precis::nn::attention");
      FAIL("head width " << bad << " was taken");
    } catch (const precis::error& e) {
      const std::string what = e.what();
      CHECK(what.find("precis::nn::attention") != std::string::npos);
      CHECK(what.find("got " + std::to_string(bad)) != std::string::npos);
      CHECK(what.find("products::exact") != std::string::npos);
    }
  }
  // Plan keys: shapes equal member by member.
  const precis::fused_attention_shape a{2, 4, 65, 16, false, 0.25F};
  precis::fused_attention_shape b = a;
  CHECK(a == b);
  b.half = true;
  CHECK_FALSE(a == b);
  b = a;
  b.tokens = 64;
  CHECK_FALSE(a == b);
}

TEST_CASE("device_tensor::fit keeps its memory for a shape it holds and allocates for a larger one") {
  using shape = std::array<std::size_t, 2>;
  precis::device_tensor<float, 2> t;
  CHECK(t.capacity() == 0);
  CHECK_FALSE(t.fit(shape{0, 5}));  // nothing to hold: nothing allocated
  CHECK(t.shape() == shape{0, 5});
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    // Without a device the allocation fails: the tensor is left empty, not half changed.
    CHECK_THROWS_AS(t.fit(shape{4, 8}), precis::cuda_error);
    CHECK(t.size() == 0);
    CHECK(t.capacity() == 0);
    CHECK(t.data() == nullptr);
    return;
  }
  CHECK(t.fit(shape{4, 8}));
  const float* p = t.data();
  CHECK(t.capacity() == 32);
  CHECK_FALSE(t.fit(shape{3, 8}));  // a smaller last batch: the same memory
  CHECK((t.data() == p && t.size() == 24 && t.capacity() == 32));
  CHECK_FALSE(t.fit(shape{4, 8}));  // and back to the full one
  CHECK(t.data() == p);
  CHECK(t.fit(shape{5, 8}));  // larger: allocated anew
  CHECK((t.capacity() == 40 && t.size() == 40));
  precis::device_tensor<float, 2> u(std::move(t));
  CHECK((u.capacity() == 40 && t.capacity() == 0 && t.data() == nullptr));
}
