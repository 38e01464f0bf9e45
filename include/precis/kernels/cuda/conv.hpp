/// @file
/// conv2d forward, backward-data and backward-weights, and the transposed convolution with its two
/// backward passes, on device tensors through cuDNN, with the calls of kernels/conv.hpp (a
/// cuda_context in place of the cpu_context; NCHW or channels-last NHWC images; stride,
/// padding, dilation, groups, output_padding). Channels-last images are cuDNN's NHWC tensors,
/// and the weight is handed to cuDNN in its NHWC filter layout [O, KH, KW, I], the layout its
/// tensor-core kernels for such images read: a copy moved there before the forward and
/// backward-data passes, and the backward-weights pass's result moved back to precis's
/// [O, I, KH, KW] (cuDNN's cudnnTransformTensor, a copy; the moved weight lives in the
/// pass's plan). The policy picks cuDNN's math: bfloat16/float16 tensors on tensor cores with
/// float accumulation; float tensors exact (CUDNN_FMA_MATH) under float compute, TF32 allowed under
/// a tfloat32 compute type. x, w and y share one element type (cuDNN's rule; the signatures take
/// one T). Among the algorithms cuDNN's heuristics offer, the first deterministic one is taken, so
/// a step gives the same bits when repeated. The descriptors and that choice are made once per
/// geometry, type and pass and kept in the context (cuda_context::plan). Geometry and shapes are
/// checked on the host, with the host's messages, before anything is launched. Host code: usable
/// from .cpp files with PRECIS_CUDA=1 or from .cu files.
///
/// The bias overload of conv2d (compiled by nvcc only) keeps the host's one rounding: cuDNN
/// rounds a convolution's output to its type, so the product runs on float copies of x and
/// w into float sums, and a finishing kernel adds the bias and rounds once, as the gelu
/// epilogue of gemm does. The copies' product may run on TF32 tensor cores
/// (detail::widened_conv_policy, conv2d_params::exact_products): exact products for values
/// of the 16-bit formats, sums in the tensor cores' float accumulation.
#pragma once

#include <precis/config.hpp>
#include <precis/kernels/conv.hpp>
#include <precis/kernels/cuda/cast.hpp>
#include <precis/kernels/cuda_context.hpp>
#include <precis/tensor/device_tensor.hpp>

#if PRECIS_CUDA

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

namespace precis {

namespace detail::cuda {

template <class T>
constexpr cudnnDataType_t dnn_type() {
  if constexpr (std::is_same_v<T, float>) {
    return CUDNN_DATA_FLOAT;
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    return CUDNN_DATA_BFLOAT16;
  } else {
    static_assert(std::is_same_v<T, float16>,
                  "precis: device convolutions take float, bfloat16 or float16 tensors");
    return CUDNN_DATA_HALF;
  }
}

struct dnn_deleter {
  void operator()(cudnnTensorStruct* d) const { (void)cudnnDestroyTensorDescriptor(d); }
  void operator()(cudnnFilterStruct* d) const { (void)cudnnDestroyFilterDescriptor(d); }
  void operator()(cudnnConvolutionStruct* d) const { (void)cudnnDestroyConvolutionDescriptor(d); }
};

/// The cuDNN descriptors of one convolution x [N, C, H, W] * w [Co, C/groups, KH, KW] ->
/// y [N, Co, Ho, Wo], made from precis's geometry; channels-last geometry gives NHWC
/// tensors and an NHWC filter ([Co, KH, KW, C/groups] in memory).
struct conv_descriptors {
  std::unique_ptr<cudnnTensorStruct, dnn_deleter> x, y;
  std::unique_ptr<cudnnFilterStruct, dnn_deleter> w;
  std::unique_ptr<cudnnConvolutionStruct, dnn_deleter> conv;

  conv_descriptors(const conv_geometry& g, cudnnDataType_t type, cudnnMathType_t math) {
    const cudnnTensorFormat_t format = g.channels_last() ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    cudnnTensorDescriptor_t t = nullptr;
    check(cudnnCreateTensorDescriptor(&t), "cudnnCreateTensorDescriptor");
    x.reset(t);
    check(cudnnSetTensor4dDescriptor(t, format, type, int(g.n), int(g.c), int(g.h), int(g.w)),
          "cudnnSetTensor4dDescriptor(x)");
    check(cudnnCreateTensorDescriptor(&t), "cudnnCreateTensorDescriptor");
    y.reset(t);
    check(cudnnSetTensor4dDescriptor(t, format, type, int(g.n), int(g.co), int(g.ho), int(g.wo)),
          "cudnnSetTensor4dDescriptor(y)");
    cudnnFilterDescriptor_t f = nullptr;
    check(cudnnCreateFilterDescriptor(&f), "cudnnCreateFilterDescriptor");
    w.reset(f);
    check(cudnnSetFilter4dDescriptor(f, type, format, int(g.co), int(g.cg()), int(g.kh), int(g.kw)),
          "cudnnSetFilter4dDescriptor");
    cudnnConvolutionDescriptor_t c = nullptr;
    check(cudnnCreateConvolutionDescriptor(&c), "cudnnCreateConvolutionDescriptor");
    conv.reset(c);
    check(cudnnSetConvolution2dDescriptor(c, int(g.p.padding[0]), int(g.p.padding[1]), int(g.p.stride[0]),
                                          int(g.p.stride[1]), int(g.p.dilation[0]), int(g.p.dilation[1]),
                                          CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
          "cudnnSetConvolution2dDescriptor");
    check(cudnnSetConvolutionGroupCount(c, int(g.groups)), "cudnnSetConvolutionGroupCount");
    check(cudnnSetConvolutionMathType(c, math), "cudnnSetConvolutionMathType");
  }
};

/// cuDNN's math for policy P on tensors of type T.
template <Policy P, class T>
constexpr cudnnMathType_t dnn_math() {
  if constexpr (!std::is_same_v<T, float>) {
    return CUDNN_TENSOR_OP_MATH;
  } else if constexpr (std::is_same_v<typename kernel_policy_t<op::conv, P>::compute_type,
                                      tfloat32>) {
    return CUDNN_DEFAULT_MATH;  // float data: TF32 tensor cores allowed
  } else {
    return CUDNN_FMA_MATH;  // exact float, no tensor cores
  }
}

/// Whether an algorithm reported with math type `algo` keeps to the policy's `math`: never
/// a down-conversion of the data, and, where the policy asks for exact float, FMA math
/// alone (CUDNN_DEFAULT_MATH lets float data take TF32 tensor cores from sm_80 on). The
/// plan then runs the algorithm under the math it was reported with (make_conv_plan).
inline bool math_allowed(cudnnMathType_t math, cudnnMathType_t algo) {
  if (algo == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) return false;
  return math != CUDNN_FMA_MATH || algo == CUDNN_FMA_MATH;
}

/// Whether cuDNN's algorithm transforms its operands (FFT, Winograd) and multiplies the
/// transformed values, which the math's precision rounds: such products are not exact
/// where TF32 is allowed.
inline bool transforms(cudnnConvolutionFwdAlgo_t a) {
  return a == CUDNN_CONVOLUTION_FWD_ALGO_FFT || a == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD || a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
}
/// @copydoc transforms(cudnnConvolutionFwdAlgo_t)
inline bool transforms(cudnnConvolutionBwdDataAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
}
/// @copydoc transforms(cudnnConvolutionFwdAlgo_t)
inline bool transforms(cudnnConvolutionBwdFilterAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT || a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD || a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
}

/// The first deterministic algorithm of cuDNN's ranked list that ran its checks, keeps to
/// the policy's math and needs at most `workspace_limit` bytes of workspace
/// (cuda_context::conv_workspace_limit); where the products must be exact
/// (conv2d_params::exact_products), none that transforms its operands.
template <class Perf>
auto pick_algorithm(const Perf* perf, int count, cudnnMathType_t math, bool exact, std::size_t workspace_limit,
                    std::string_view what) {
  std::size_t smallest_over = 0;  // the least workspace of those passed over for the limit alone
  for (int i = 0; i < count; ++i) {
    if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].determinism == CUDNN_DETERMINISTIC &&
        math_allowed(math, perf[i].mathType) && !(exact && transforms(perf[i].algo))) {
      if (perf[i].memory <= workspace_limit) return perf[i];
      if (smallest_over == 0 || perf[i].memory < smallest_over) smallest_over = perf[i].memory;
    }
  }
  if (smallest_over != 0) {
    throw error(std::string(what) + ": every deterministic algorithm cuDNN offers for this convolution within the "
                "policy's math needs more workspace than the context's limit of " +
                std::to_string(workspace_limit) + " bytes (the least is " + std::to_string(smallest_over) +
                "); raise cuda_context::set_conv_workspace_limit");
  }
  throw error(std::string(what) + ": cuDNN offers no deterministic algorithm for this convolution "
              "within the policy's math");
}

/// The three passes of one convolution, in cuDNN's terms.
enum class conv_pass { forward, backward_data, backward_filter };

/// Frees a plan's device buffer.
struct device_free {
  void operator()(void* p) const { (void)cudaFree(p); }
};

/// What is kept for one pass of one convolution: its descriptors, cuDNN's algorithm and,
/// for channels-last images, the buffer of the weight in cuDNN's NHWC filter layout with
/// the two views of the weight that cudnnTransformTensor moves it between.
struct conv_plan {
  conv_descriptors d;
  int algo = 0;
  std::size_t workspace = 0;
  std::unique_ptr<void, device_free> filter{};  ///< channels-last: the weight as [Co, KH, KW, C/groups]
  std::unique_ptr<cudnnTensorStruct, dnn_deleter> weight_nchw{}, weight_nhwc{};  ///< the weight's two layouts
};

inline conv_plan make_conv_plan(cuda_context& ctx, const conv_geometry& g, cudnnDataType_t type,
                                cudnnMathType_t math, bool exact, conv_pass pass, std::string_view name,
                                std::size_t element_bytes) {
  // cuDNN's convolution descriptors count elements in 32 bits.
  for (const auto& [what, count] : {std::pair{"x", g.n * g.c * g.h * g.w}, std::pair{"y", g.n * g.co * g.ho * g.wo}}) {
    if (count > std::size_t(std::numeric_limits<std::int32_t>::max())) {
      throw error(std::string(name) + ": " + what + " has " + std::to_string(count) +
                  " elements; cuDNN's convolutions take fewer than 2^31 (split the batch)");
    }
  }
  conv_plan plan{conv_descriptors(g, type, math)};
  if (g.channels_last()) {
    // Made with the plan, before any capture: the first call of a shape runs eagerly.
    plan.filter.reset(precis::detail::device_malloc(g.co * g.cg() * g.kh * g.kw * element_bytes));
    for (auto [view, format] : {std::pair{&plan.weight_nchw, CUDNN_TENSOR_NCHW}, std::pair{&plan.weight_nhwc, CUDNN_TENSOR_NHWC}}) {
      cudnnTensorDescriptor_t t = nullptr;
      check(cudnnCreateTensorDescriptor(&t), "cudnnCreateTensorDescriptor");
      view->reset(t);
      check(cudnnSetTensor4dDescriptor(t, format, type, int(g.co), int(g.cg()), int(g.kh), int(g.kw)),
            "cudnnSetTensor4dDescriptor(weight)");
    }
  }
  const conv_descriptors& d = plan.d;
  int count = 0;
  cudnnMathType_t chosen = math;
  if (pass == conv_pass::forward) {
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    check(cudnnGetConvolutionForwardAlgorithm_v7(ctx.dnn(), d.x.get(), d.w.get(), d.conv.get(), d.y.get(),
                                                 CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, perf),
          "cudnnGetConvolutionForwardAlgorithm_v7");
    const auto a = pick_algorithm(perf, count, math, exact, ctx.conv_workspace_limit(), name);
    plan.algo = int(a.algo), plan.workspace = a.memory, chosen = a.mathType;
  } else if (pass == conv_pass::backward_data) {
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    check(cudnnGetConvolutionBackwardDataAlgorithm_v7(ctx.dnn(), d.w.get(), d.y.get(), d.conv.get(), d.x.get(),
                                                      CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &count, perf),
          "cudnnGetConvolutionBackwardDataAlgorithm_v7");
    const auto a = pick_algorithm(perf, count, math, exact, ctx.conv_workspace_limit(), name);
    plan.algo = int(a.algo), plan.workspace = a.memory, chosen = a.mathType;
  } else {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    check(cudnnGetConvolutionBackwardFilterAlgorithm_v7(ctx.dnn(), d.x.get(), d.y.get(), d.conv.get(),
                                                        d.w.get(), CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
                                                        &count, perf),
          "cudnnGetConvolutionBackwardFilterAlgorithm_v7");
    const auto a = pick_algorithm(perf, count, math, exact, ctx.conv_workspace_limit(), name);
    plan.algo = int(a.algo), plan.workspace = a.memory, chosen = a.mathType;
  }
  // The heuristic ranks each algorithm under the descriptor's math and under the default
  // math; its workspace size and determinism are those of the math it was reported with, so
  // the descriptor takes that math (under a 16-bit policy the default math is tensor-core
  // math too; under exact float only FMA entries are taken: math_allowed).
  if (chosen != math) check(cudnnSetConvolutionMathType(d.conv.get(), chosen), "cudnnSetConvolutionMathType");
  // The workspace cuDNN asks for the algorithm under that math, where it says more than the
  // ranking did.
  std::size_t asked = 0;
  if (pass == conv_pass::forward) {
    check(cudnnGetConvolutionForwardWorkspaceSize(ctx.dnn(), d.x.get(), d.w.get(), d.conv.get(), d.y.get(),
                                                  cudnnConvolutionFwdAlgo_t(plan.algo), &asked),
          "cudnnGetConvolutionForwardWorkspaceSize");
  } else if (pass == conv_pass::backward_data) {
    check(cudnnGetConvolutionBackwardDataWorkspaceSize(ctx.dnn(), d.w.get(), d.y.get(), d.conv.get(), d.x.get(),
                                                       cudnnConvolutionBwdDataAlgo_t(plan.algo), &asked),
          "cudnnGetConvolutionBackwardDataWorkspaceSize");
  } else {
    check(cudnnGetConvolutionBackwardFilterWorkspaceSize(ctx.dnn(), d.x.get(), d.y.get(), d.conv.get(), d.w.get(),
                                                         cudnnConvolutionBwdFilterAlgo_t(plan.algo), &asked),
          "cudnnGetConvolutionBackwardFilterWorkspaceSize");
  }
  plan.workspace = std::max(plan.workspace, asked);
  return plan;
}

/// Runs one pass of the convolution with geometry g (x -> y with w), reusing its plan:
/// forward reads (x, w) and writes y; backward_data reads (dy, w) and writes dx;
/// backward_filter reads (x, dy) and writes dw.
template <Policy P, class T>
void run_conv(cuda_context& ctx, conv_pass pass, const conv_geometry& g, const T* in0, const T* in1,
              T* out, std::string_view name) {
  constexpr cudnnMathType_t math = dnn_math<P, T>();
  const bool exact = g.p.exact_products;
  const std::array<std::int64_t, 22> key{
      std::int64_t(pass), std::int64_t(dnn_type<T>()), std::int64_t(math), std::int64_t(exact), std::int64_t(g.channels_last()),
      std::int64_t(ctx.conv_workspace_limit()),
      std::int64_t(g.n),
      std::int64_t(g.c), std::int64_t(g.h), std::int64_t(g.w), std::int64_t(g.co), std::int64_t(g.kh),
      std::int64_t(g.kw), std::int64_t(g.ho), std::int64_t(g.wo), std::int64_t(g.p.stride[0]),
      std::int64_t(g.p.stride[1]), std::int64_t(g.p.padding[0]), std::int64_t(g.p.padding[1]),
      std::int64_t(g.p.dilation[0]), std::int64_t(g.p.dilation[1]), std::int64_t(g.groups)};
  const conv_plan& plan = ctx.plan<conv_plan>(key, [&] {
    // A plan allocates (the channels-last filter) and asks cuDNN, which a stream being
    // captured into a CUDA graph must not see.
    if (ctx.capturing()) {
      throw error(std::string(name) +
                  ": a convolution of a geometry without a plan while the stream is captured into a CUDA graph; "
                  "run it once before capturing it");
    }
    return make_conv_plan(ctx, g, dnn_type<T>(), math, exact, pass, name, sizeof(T));
  });
  const conv_descriptors& d = plan.d;
  void* ws = plan.workspace != 0 ? ctx.workspace(plan.workspace) : nullptr;
  const float one = 1.0F, zero = 0.0F;
  // Channels-last: the weight moves between precis's [Co, Cg, KH, KW] and the filter
  // layout [Co, KH, KW, Cg] through the plan's buffer.
  T* filter = static_cast<T*>(plan.filter.get());
  if (filter != nullptr && pass != conv_pass::backward_filter) {
    check(cudnnTransformTensor(ctx.dnn(), &one, plan.weight_nchw.get(), in1, &zero, plan.weight_nhwc.get(), filter),
          "cudnnTransformTensor(weight)");
    in1 = filter;
  }
  if (pass == conv_pass::forward) {
    check(cudnnConvolutionForward(ctx.dnn(), &one, d.x.get(), in0, d.w.get(), in1, d.conv.get(),
                                  cudnnConvolutionFwdAlgo_t(plan.algo), ws, plan.workspace, &zero, d.y.get(),
                                  out),
          "cudnnConvolutionForward");
  } else if (pass == conv_pass::backward_data) {
    check(cudnnConvolutionBackwardData(ctx.dnn(), &one, d.w.get(), in1, d.y.get(), in0, d.conv.get(),
                                       cudnnConvolutionBwdDataAlgo_t(plan.algo), ws, plan.workspace, &zero,
                                       d.x.get(), out),
          "cudnnConvolutionBackwardData");
  } else {
    check(cudnnConvolutionBackwardFilter(ctx.dnn(), &one, d.x.get(), in0, d.y.get(), in1, d.conv.get(),
                                         cudnnConvolutionBwdFilterAlgo_t(plan.algo), ws, plan.workspace,
                                         &zero, d.w.get(), filter != nullptr ? filter : out),
          "cudnnConvolutionBackwardFilter");
    if (filter != nullptr) {
      check(cudnnTransformTensor(ctx.dnn(), &one, plan.weight_nhwc.get(), filter, &zero, plan.weight_nchw.get(), out),
            "cudnnTransformTensor(weight gradient)");
    }
  }
}

/// Zeros: the result of a convolution pass whose sum is empty (no input channels, no
/// images), which cuDNN does not take.
template <class T>
void zero_fill(cuda_context& ctx, device_tensor<T, 4>& t) {
  check(cudaMemsetAsync(t.data(), 0, t.size() * sizeof(T), ctx.stream()), "cudaMemsetAsync");
}

}  // namespace detail::cuda

/// y = conv2d(x, w) on the device (see the host conv2d).
template <Policy P, class T>
void conv2d(cuda_context& ctx, const device_tensor<T, 4>& x, const device_tensor<T, 4>& w,
            device_tensor<T, 4>& y, const conv2d_params& p = {}) {
  detail::check_conv_types<P, T, T, T>();
  const auto g = detail::conv_geometry_of("precis::conv2d", x, w, p);
  check_shape("precis::conv2d: y", y, g.y_shape());
  if (y.size() == 0) return;
  if (x.size() == 0 || w.size() == 0) return detail::cuda::zero_fill(ctx, y);
  detail::cuda::run_conv<P>(ctx, detail::cuda::conv_pass::forward, g, x.data(), w.data(), y.data(),
                            "precis::conv2d");
}

/// dx = dL/dx of y = conv2d(x, w) from dy, on the device.
template <Policy P, class T>
void conv2d_backward_data(cuda_context& ctx, const device_tensor<T, 4>& dy,
                          const device_tensor<T, 4>& w, device_tensor<T, 4>& dx,
                          const conv2d_params& p = {}) {
  detail::check_conv_types<P, T, T, T>();
  const auto g = detail::conv_geometry_of("precis::conv2d_backward_data", dx, w, p);
  check_shape("precis::conv2d_backward_data: dy", dy, g.y_shape());
  if (dx.size() == 0) return;
  if (dy.size() == 0 || w.size() == 0) return detail::cuda::zero_fill(ctx, dx);
  detail::cuda::run_conv<P>(ctx, detail::cuda::conv_pass::backward_data, g, dy.data(), w.data(),
                            dx.data(), "precis::conv2d_backward_data");
}

/// dw = dL/dw of y = conv2d(x, w) from x and dy, summed over the batch, on the device.
template <Policy P, class T>
void conv2d_backward_weights(cuda_context& ctx, const device_tensor<T, 4>& x,
                             const device_tensor<T, 4>& dy, device_tensor<T, 4>& dw,
                             const conv2d_params& p = {}) {
  detail::check_conv_types<P, T, T, T>();
  const auto g = detail::conv_geometry_of("precis::conv2d_backward_weights", x, dw, p);
  check_shape("precis::conv2d_backward_weights: dy", dy, g.y_shape());
  if (dw.size() == 0) return;
  if (x.size() == 0 || dy.size() == 0) return detail::cuda::zero_fill(ctx, dw);
  detail::cuda::run_conv<P>(ctx, detail::cuda::conv_pass::backward_filter, g, x.data(), dy.data(),
                            dw.data(), "precis::conv2d_backward_weights");
}

/// y = conv_transpose2d(x, w) on the device (see the host conv_transpose2d: w [Ci, Co /
/// groups, KH, KW], output_padding < stride): cuDNN's backward-data of the
/// convolution y -> x.
template <Policy P, class T>
void conv_transpose2d(cuda_context& ctx, const device_tensor<T, 4>& x, const device_tensor<T, 4>& w,
                      device_tensor<T, 4>& y, const conv2d_params& p = {}) {
  detail::check_conv_types<P, T, T, T>();
  const auto g = detail::transpose_geometry("precis::conv_transpose2d", x, w, y, p);
  if (y.size() == 0) return;
  if (x.size() == 0 || w.size() == 0) return detail::cuda::zero_fill(ctx, y);
  detail::cuda::run_conv<P>(ctx, detail::cuda::conv_pass::backward_data, g, x.data(), w.data(),
                            y.data(), "precis::conv_transpose2d");
}

/// dx of y = conv_transpose2d(x, w) (same `p`), on the device: the forward convolution of
/// dy with w.
template <Policy P, class T>
void conv_transpose2d_backward_data(cuda_context& ctx, const device_tensor<T, 4>& dy,
                                    const device_tensor<T, 4>& w, device_tensor<T, 4>& dx,
                                    const conv2d_params& p = {}) {
  conv2d<P>(ctx, dy, w, dx, detail::adjoint_params(p));
}

/// dw of y = conv_transpose2d(x, w) (same `p`), on the device: the weight gradient of the
/// convolution dy -> x.
template <Policy P, class T>
void conv_transpose2d_backward_weights(cuda_context& ctx, const device_tensor<T, 4>& x,
                                       const device_tensor<T, 4>& dy, device_tensor<T, 4>& dw,
                                       const conv2d_params& p = {}) {
  conv2d_backward_weights<P>(ctx, dy, x, dw, detail::adjoint_params(p));
}

/// dx and dw of y = conv2d(x, w) from dy in one call, on the device: conv2d_backward_data's
/// dx and conv2d_backward_weights's dw (see the host conv2d_backward). Every shape is checked
/// before anything is queued.
template <Policy P, class T>
void conv2d_backward(cuda_context& ctx, const device_tensor<T, 4>& x, const device_tensor<T, 4>& dy,
                     const device_tensor<T, 4>& w, device_tensor<T, 4>& dx, device_tensor<T, 4>& dw,
                     const conv2d_params& p = {}) {
  detail::check_conv_types<P, T, T, T>();
  const auto g = detail::conv_geometry_of("precis::conv2d_backward", x, w, p);
  check_shape("precis::conv2d_backward: dy", dy, g.y_shape());
  check_shape("precis::conv2d_backward: dx", dx, g.x_shape());
  check_shape("precis::conv2d_backward: dw", dw, detail::shape_array<4>(w));
  conv2d_backward_data<P>(ctx, dy, w, dx, p);
  conv2d_backward_weights<P>(ctx, x, dy, dw, p);
}

/// dx and dw of y = conv_transpose2d(x, w) (same `p`) in one call, on the device:
/// conv_transpose2d_backward_data's dx and conv_transpose2d_backward_weights's dw. Every
/// shape is checked before anything is queued.
template <Policy P, class T>
void conv_transpose2d_backward(cuda_context& ctx, const device_tensor<T, 4>& x,
                               const device_tensor<T, 4>& dy, const device_tensor<T, 4>& w,
                               device_tensor<T, 4>& dx, device_tensor<T, 4>& dw,
                               const conv2d_params& p = {}) {
  detail::check_conv_types<P, T, T, T>();
  // The convolution dy -> x (transpose_geometry checks x, w, p and dy's shape).
  (void)detail::transpose_geometry("precis::conv_transpose2d_backward", x, w, dy, p);
  check_shape("precis::conv_transpose2d_backward: dx", dx, detail::shape_array<4>(x));
  check_shape("precis::conv_transpose2d_backward: dw", dw, detail::shape_array<4>(w));
  conv_transpose2d_backward_data<P>(ctx, dy, w, dx, p);
  conv_transpose2d_backward_weights<P>(ctx, x, dy, dw, p);
}

#if defined(__CUDACC__)

namespace detail::cuda {

/// y[i] = round(sums[i] + bias[(i / inner) % channels]) in M: a convolution's bias added to
/// its float sums, one rounding (the host's). The channel comes from two fast_divmods where
/// the tensor has fewer than 2^32 elements (`fast`), else from 64-bit division.
template <class M, class B, class S>
struct channel_bias_body {
  const M* sums;
  const B* bias;
  S* y;
  std::size_t channels, inner;
  fast_divmod by_inner, by_channels;
  bool fast;
  __device__ std::size_t channel(std::size_t i) const {
    if (fast) return by_channels.mod(by_inner.div(std::uint32_t(i)));
    return (i / inner) % channels;
  }
  template <int V>
  __device__ void at(std::size_t i) const {
    const auto s = load_pack<V>(sums + i);
    pack<S, V> r;
#pragma unroll
    for (int k = 0; k < V; ++k) r.v[k] = round_to<S>(s.v[k] + device_load<M>(bias[channel(i + k)]));
    store_pack<V>(y + i, r);
  }
};

/// y = round(sums + bias[channel]) on ctx's stream for n elements of `images` images of
/// bias's `channels` channels, NCHW or channels-last (y may be sums).
template <class M, class B, class S>
void add_channel_bias(cuda_context& ctx, const M* sums, const B* bias, S* y, std::size_t n,
                      std::size_t images, std::size_t channels, image_layout layout,
                      std::string_view name) {
  const std::size_t planes = images * channels;
  if (n == 0 || planes == 0) return;
  // Element i's channel is (i / inner) % channels: inner is a plane's pixels in NCHW, 1
  // channels-last.
  const std::size_t inner = layout == image_layout::nhwc ? 1 : n / planes;
  const bool fast = n <= 0xffffffffULL && fast_divmod::fits(inner) && fast_divmod::fits(channels);
  const channel_bias_body<M, B, S> body{sums,
                                        bias,
                                        y,
                                        channels,
                                        inner,
                                        fast_divmod(fast ? std::uint32_t(inner) : 1U),
                                        fast_divmod(fast ? std::uint32_t(channels) : 1U),
                                        fast};
  constexpr int V = pack_width<M, S>;
  launch_packed<V>(ctx.stream(), body, n, pack_aligned<V>(sums, y), name);
}

}  // namespace detail::cuda

/// y = conv2d(x, w) plus bias [Co] on every pixel of its channel, rounded once, on the
/// device (see the host overload). cuDNN rounds its output to its type, so for 16-bit
/// tensors the product runs on float copies of x and w into float sums (all three
/// stream-ordered scratch of this call), on TF32 tensor cores where the GPU has them, with
/// exact products (detail::widened_conv_policy, conv2d_params::exact_products), then one
/// kernel adds the bias in float and rounds to y's type; for float tensors the sums are y
/// itself, under P. Every shape is checked before anything is queued.
template <Policy P, class T, kernel_element TBias>
void conv2d(cuda_context& ctx, const device_tensor<T, 4>& x, const device_tensor<T, 4>& w,
            const device_tensor<TBias, 1>& bias, device_tensor<T, 4>& y,
            const conv2d_params& p = {}) {
  detail::check_conv_types<P, T, T, T>();
  const auto g = detail::conv_geometry_of("precis::conv2d", x, w, p);
  check_shape("precis::conv2d: bias", bias, detail::dims<1>({g.co}));
  check_shape("precis::conv2d: y", y, g.y_shape());
  if (y.size() == 0) return;
  const auto finish = [&](const float* sums) {
    detail::cuda::add_channel_bias(ctx, sums, bias.data(), y.data(), y.size(), g.n, g.co, p.layout,
                                   "precis::conv2d");
  };
  if constexpr (std::is_same_v<T, float>) {
    conv2d<P>(ctx, x, w, y, p);
    finish(y.data());
  } else {
    device_tensor<float, 4> xf(detail::shape_array<4>(x), ctx.stream()),
        wf(detail::shape_array<4>(w), ctx.stream()), sums(detail::shape_array<4>(y), ctx.stream());
    cast(ctx, x, xf);
    cast(ctx, w, wf);
    conv2d_params exact = p;
    exact.exact_products = true;
    conv2d<detail::widened_conv_policy>(ctx, xf, wf, sums, exact);
    finish(sums.data());
  }
}

#endif  // __CUDACC__

}  // namespace precis

#endif
