// precis/kernels/cuda/conv.hpp: conv2d forward, backward-data and backward-weights on
// device tensors through cuDNN, with the calls of kernels/conv.hpp (a cuda_context in place
// of the cpu_context; NCHW; stride, padding, dilation, groups). The policy picks cuDNN's
// math: bfloat16/float16 tensors on tensor cores with float accumulation; float tensors
// exact (CUDNN_FMA_MATH) under float compute, TF32 allowed under a tfloat32 compute type.
// x, w and y share one element type (cuDNN's rule; the signatures take one T).
// Among the algorithms cuDNN's heuristics offer, the first deterministic one is taken, so a
// step gives the same bits when repeated. Geometry and shapes are checked on the host, with
// the host's messages, before anything is launched. Host code: usable from .cpp files with
// PRECIS_CUDA=1 or from .cu files.
//
// Not here yet: the bias overload (cuDNN rounds the convolution before a separate bias
// addition could happen; precis rounds once) and the transposed convolution.
#pragma once

#include <precis/config.hpp>
#include <precis/kernels/conv.hpp>
#include <precis/kernels/cuda_context.hpp>
#include <precis/tensor/device_tensor.hpp>

#if PRECIS_CUDA

#include <array>
#include <cstddef>
#include <memory>
#include <string>
#include <type_traits>

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
/// y [N, Co, Ho, Wo], made from precis's geometry.
template <class T>
struct conv_descriptors {
  std::unique_ptr<cudnnTensorStruct, dnn_deleter> x, y;
  std::unique_ptr<cudnnFilterStruct, dnn_deleter> w;
  std::unique_ptr<cudnnConvolutionStruct, dnn_deleter> conv;

  conv_descriptors(const conv_geometry& g, cudnnMathType_t math) {
    cudnnTensorDescriptor_t t = nullptr;
    check(cudnnCreateTensorDescriptor(&t), "cudnnCreateTensorDescriptor");
    x.reset(t);
    check(cudnnSetTensor4dDescriptor(x.get(), CUDNN_TENSOR_NCHW, dnn_type<T>(), int(g.n), int(g.c),
                                     int(g.h), int(g.w)),
          "cudnnSetTensor4dDescriptor(x)");
    check(cudnnCreateTensorDescriptor(&t), "cudnnCreateTensorDescriptor");
    y.reset(t);
    check(cudnnSetTensor4dDescriptor(y.get(), CUDNN_TENSOR_NCHW, dnn_type<T>(), int(g.n), int(g.co),
                                     int(g.ho), int(g.wo)),
          "cudnnSetTensor4dDescriptor(y)");
    cudnnFilterDescriptor_t f = nullptr;
    check(cudnnCreateFilterDescriptor(&f), "cudnnCreateFilterDescriptor");
    w.reset(f);
    check(cudnnSetFilter4dDescriptor(w.get(), dnn_type<T>(), CUDNN_TENSOR_NCHW, int(g.co),
                                     int(g.cg()), int(g.kh), int(g.kw)),
          "cudnnSetFilter4dDescriptor");
    cudnnConvolutionDescriptor_t c = nullptr;
    check(cudnnCreateConvolutionDescriptor(&c), "cudnnCreateConvolutionDescriptor");
    conv.reset(c);
    check(cudnnSetConvolution2dDescriptor(conv.get(), int(g.p.padding[0]), int(g.p.padding[1]),
                                          int(g.p.stride[0]), int(g.p.stride[1]),
                                          int(g.p.dilation[0]), int(g.p.dilation[1]),
                                          CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
          "cudnnSetConvolution2dDescriptor");
    check(cudnnSetConvolutionGroupCount(conv.get(), int(g.groups)), "cudnnSetConvolutionGroupCount");
    check(cudnnSetConvolutionMathType(conv.get(), math), "cudnnSetConvolutionMathType");
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

/// The first deterministic algorithm of cuDNN's ranked list that ran its checks.
template <class Perf>
auto pick_algorithm(const Perf* perf, int count, const char* what) {
  for (int i = 0; i < count; ++i) {
    if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].determinism == CUDNN_DETERMINISTIC) {
      return perf[i];
    }
  }
  throw error(std::string("precis::") + what + ": cuDNN offers no deterministic algorithm for "
              "this convolution");
}


}  // namespace detail::cuda

/// y = conv2d(x, w) on the device (see the host conv2d).
template <Policy P, class T>
void conv2d(cuda_context& ctx, const device_tensor<T, 4>& x, const device_tensor<T, 4>& w,
            device_tensor<T, 4>& y, const conv2d_params& p = {}) {
  detail::check_conv_types<P, T, T, T>();
  const auto g = detail::conv_geometry_of("precis::conv2d", x, w, p);
  check_shape("precis::conv2d: y", y, detail::dims<4>({g.n, g.co, g.ho, g.wo}));
  if (x.size() == 0 || y.size() == 0) return;
  detail::cuda::conv_descriptors<T> d(g, detail::cuda::dnn_math<P, T>());
  cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  int count = 0;
  check(cudnnGetConvolutionForwardAlgorithm_v7(ctx.dnn(), d.x.get(), d.w.get(), d.conv.get(), d.y.get(),
                                               CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, perf),
        "cudnnGetConvolutionForwardAlgorithm_v7");
  const auto algo = detail::cuda::pick_algorithm(perf, count, "conv2d");
  void* ws = algo.memory != 0 ? ctx.workspace(algo.memory) : nullptr;
  const float one = 1.0F, zero = 0.0F;
  check(cudnnConvolutionForward(ctx.dnn(), &one, d.x.get(), x.data(), d.w.get(), w.data(), d.conv.get(),
                                algo.algo, ws, algo.memory, &zero, d.y.get(), y.data()),
        "cudnnConvolutionForward");
}

/// dx = dL/dx of y = conv2d(x, w) from dy, on the device.
template <Policy P, class T>
void conv2d_backward_data(cuda_context& ctx, const device_tensor<T, 4>& dy,
                          const device_tensor<T, 4>& w, device_tensor<T, 4>& dx,
                          const conv2d_params& p = {}) {
  detail::check_conv_types<P, T, T, T>();
  const auto g = detail::conv_geometry_of("precis::conv2d_backward_data", dx, w, p);
  check_shape("precis::conv2d_backward_data: dy", dy, detail::dims<4>({g.n, g.co, g.ho, g.wo}));
  if (dx.size() == 0) return;
  detail::cuda::conv_descriptors<T> d(g, detail::cuda::dnn_math<P, T>());
  cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
  int count = 0;
  check(cudnnGetConvolutionBackwardDataAlgorithm_v7(ctx.dnn(), d.w.get(), d.y.get(), d.conv.get(), d.x.get(),
                                                    CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &count, perf),
        "cudnnGetConvolutionBackwardDataAlgorithm_v7");
  const auto algo = detail::cuda::pick_algorithm(perf, count, "conv2d_backward_data");
  void* ws = algo.memory != 0 ? ctx.workspace(algo.memory) : nullptr;
  const float one = 1.0F, zero = 0.0F;
  check(cudnnConvolutionBackwardData(ctx.dnn(), &one, d.w.get(), w.data(), d.y.get(), dy.data(), d.conv.get(),
                                     algo.algo, ws, algo.memory, &zero, d.x.get(), dx.data()),
        "cudnnConvolutionBackwardData");
}

/// dw = dL/dw of y = conv2d(x, w) from x and dy, summed over the batch, on the device.
template <Policy P, class T>
void conv2d_backward_weights(cuda_context& ctx, const device_tensor<T, 4>& x,
                             const device_tensor<T, 4>& dy, device_tensor<T, 4>& dw,
                             const conv2d_params& p = {}) {
  detail::check_conv_types<P, T, T, T>();
  const auto g = detail::conv_geometry_of("precis::conv2d_backward_weights", x, dw, p);
  check_shape("precis::conv2d_backward_weights: dy", dy, detail::dims<4>({g.n, g.co, g.ho, g.wo}));
  if (dw.size() == 0) return;
  detail::cuda::conv_descriptors<T> d(g, detail::cuda::dnn_math<P, T>());
  cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
  int count = 0;
  check(cudnnGetConvolutionBackwardFilterAlgorithm_v7(ctx.dnn(), d.x.get(), d.y.get(), d.conv.get(),
                                                      d.w.get(), CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
                                                      &count, perf),
        "cudnnGetConvolutionBackwardFilterAlgorithm_v7");
  const auto algo = detail::cuda::pick_algorithm(perf, count, "conv2d_backward_weights");
  void* ws = algo.memory != 0 ? ctx.workspace(algo.memory) : nullptr;
  const float one = 1.0F, zero = 0.0F;
  check(cudnnConvolutionBackwardFilter(ctx.dnn(), &one, d.x.get(), x.data(), d.y.get(), dy.data(), d.conv.get(),
                                       algo.algo, ws, algo.memory, &zero, d.w.get(), dw.data()),
        "cudnnConvolutionBackwardFilter");
}

}  // namespace precis

#endif
