/// @file
/// nn modules on device tensors (context cuda_context), from CUDA code.
///
///     #include <precis/nn/cuda.hpp>      // first: before any other precis/nn header
///     auto block = nn::build<bfloat16, 4, precis::cuda_context>(map, basic_block(64));
///     block.refresh(ctx);                 // round the initial masters to the working copies
///     const auto& y = block.forward(ctx, x);  // x: a device_tensor<bfloat16, 4>
///
/// Layers call their kernels by qualified name (precis::conv2d, precis::batch_norm_train):
/// the device overloads must be declared before the layers' templates are, so this header
/// includes the CUDA kernels, then nn. What runs on the device: the layers whose kernels
/// exist there (linear layers of any rank, convolutions, batch norm, layer norm,
/// activations, casts, the ViT's data layers), sequences, residuals, adds and
/// concatenations, and the multi-tensor nodes of nn/multi.hpp. A device model's
/// masters and gradients are device spans: precis::device_adamw / device_sgd step them.
#pragma once

#include <precis/config.hpp>

// Device kernels are CUDA code: outside nvcc this header declares nothing.
#if defined(__CUDACC__)

#ifdef PRECIS_NN_INCLUDED
#error "precis: include <precis/nn/cuda.hpp> before the other precis/nn headers (and before precis/precis.hpp)"
#endif

#include <precis/kernels/cuda/cast.hpp>
#include <precis/kernels/cuda/conv.hpp>
#include <precis/kernels/cuda/elementwise.hpp>
#include <precis/kernels/cuda/fused_attention.hpp>
#include <precis/kernels/cuda/gemm.hpp>
#include <precis/kernels/cuda/loss.hpp>
#include <precis/kernels/cuda/norm.hpp>
#include <precis/kernels/cuda/pooling.hpp>
#include <precis/kernels/cuda/reduce.hpp>
#include <precis/kernels/cuda/softmax.hpp>
#include <precis/kernels/cuda_context.hpp>
#include <precis/tensor/device_span.hpp>
#include <precis/tensor/device_tensor.hpp>

#include <precis/nn/cuda_float8.hpp>
#include <precis/nn/parameter.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

namespace precis::nn {

namespace detail::cuda {

// Templates, so that every translation unit may define them.

// packed_kernel's bodies (kernels/cuda/common.hpp): V elements at i, each computed alone as
// the host computes it, so that packing changes no bits.

/// out[i] = round(M(in[i]) * f): nn::scale's multiplication, as the host's.
template <class M, class T>
struct scale_body {
  const T* in;
  T* out;
  M f;
  template <int V>
  __device__ void at(std::size_t i) const {
    const auto x = precis::detail::cuda::load_pack<V>(in + i);
    precis::detail::cuda::pack<T, V> y;
#pragma unroll
    for (int k = 0; k < V; ++k) y.v[k] = round_to<T>(precis::detail::cuda::device_load<M>(x.v[k]) * f);
    precis::detail::cuda::store_pack<V>(out + i, y);
  }
};

/// nn::dropout's forward pass, element for element the host's: element i is kept when
/// unit_random(seed, call, i) >= p, and then y = round(M(x) * keep), else 0; mask[i] says
/// which.
template <class M, class T>
struct dropout_body {
  const T* x;
  T* y;
  std::uint8_t* mask;
  std::uint64_t seed, call;
  double p;
  M keep;
  template <int V>
  __device__ void at(std::size_t i) const {
    const auto in = precis::detail::cuda::load_pack<V>(x + i);
    precis::detail::cuda::pack<T, V> out;
    precis::detail::cuda::pack<std::uint8_t, V> m;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const bool kept = unit_random(seed, call, i + k) >= p;
      m.v[k] = kept ? 1 : 0;
      out.v[k] = kept ? round_to<T>(precis::detail::cuda::device_load<M>(in.v[k]) * keep) : T(0.0F);
    }
    precis::detail::cuda::store_pack<V>(y + i, out);
    precis::detail::cuda::store_pack<V>(mask + i, m);
  }
};

/// dx = round(M(dy) * keep) where the mask kept the element, else 0.
template <class M, class T>
struct dropout_backward_body {
  const T* dy;
  const std::uint8_t* mask;
  T* dx;
  M keep;
  template <int V>
  __device__ void at(std::size_t i) const {
    const auto g = precis::detail::cuda::load_pack<V>(dy + i);
    const auto m = precis::detail::cuda::load_pack<V>(mask + i);
    precis::detail::cuda::pack<T, V> out;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      out.v[k] = m.v[k] != 0 ? round_to<T>(precis::detail::cuda::device_load<M>(g.v[k]) * keep) : T(0.0F);
    }
    precis::detail::cuda::store_pack<V>(dx + i, out);
  }
};

/// out[i] = round((0 + in_0[i]) + in_1[i] + ...), the sum in A: the host's n-ary
/// add_rounded, term for term in its order (K inputs of one type T, in 16-byte packs).
template <class A, class Out, class T, std::size_t K>
struct add_all_body {
  Out* out;
  const T* in[K];
  template <int V>
  __device__ void at(std::size_t i) const {
    precis::detail::cuda::pack<T, V> x[K];
#pragma unroll
    for (std::size_t j = 0; j < K; ++j) x[j] = precis::detail::cuda::load_pack<V>(in[j] + i);
    precis::detail::cuda::pack<Out, V> r;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      A sum = A(0);
#pragma unroll
      for (std::size_t j = 0; j < K; ++j) sum = sum + precis::detail::cuda::device_load<A>(x[j].v[k]);
      r.v[k] = round_to<Out>(sum);
    }
    precis::detail::cuda::store_pack<V>(out + i, r);
  }
};

/// The same sum over inputs of several types (a fork's branches' gradients), an element per
/// thread.
template <class A, class Out, class... In>
__global__ void add_all_kernel(Out* out, std::size_t n, const In*... in) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    out[i] = round_to<Out>((A(0) + ... + precis::detail::cuda::device_load<A>(in[i])));
  }
}

/// out[i] = round(A(a[i]) - A(b[i])): nn::subtract's difference, as the host's.
template <class A, class T>
struct subtract_body {
  const T* a;
  const T* b;
  T* out;
  template <int V>
  __device__ void at(std::size_t i) const {
    const auto x = precis::detail::cuda::load_pack<V>(a + i), y = precis::detail::cuda::load_pack<V>(b + i);
    precis::detail::cuda::pack<T, V> r;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      r.v[k] = round_to<T>(precis::detail::cuda::device_load<A>(x.v[k]) - precis::detail::cuda::device_load<A>(y.v[k]));
    }
    precis::detail::cuda::store_pack<V>(out + i, r);
  }
};

/// out[i] = -in[i], exact (through float, which holds every value of the 8- and 16-bit
/// formats; double stays double).
template <class T>
struct negate_body {
  const T* in;
  T* out;
  template <int V>
  __device__ void at(std::size_t i) const {
    using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
    const auto x = precis::detail::cuda::load_pack<V>(in + i);
    precis::detail::cuda::pack<T, V> r;
#pragma unroll
    for (int k = 0; k < V; ++k) r.v[k] = round_to<T>(-precis::detail::cuda::device_load<A>(x.v[k]));
    precis::detail::cuda::store_pack<V>(out + i, r);
  }
};

}  // namespace detail::cuda

/// What nn needs of cuda_context: device tensors, passed the context by non-const
/// reference, and the few operations besides the kernels (see nn::context_traits).
template <>
struct context_traits<cuda_context> {
  /// The tensor a module on the device holds: a device_tensor.
  template <class T, std::size_t N>
  using tensor = device_tensor<T, N>;
  /// How modules take the context.
  using ref = cuda_context&;
  /// How a model hands out its master weights and gradients: device spans, which host
  /// algorithms refuse at compile time.
  template <class T>
  using span = device_span<T>;
  /// Whether nn::attention may run its scores, softmax and context pieces as one fused kernel
  /// (cuDNN's flash attention; the target links precis::cudnn_frontend).
  static constexpr bool fused_attention = has_fused_attention;
  /// The engine that runs them (kernels/cuda/fused_attention.hpp).
  using fused_attention_engine = precis::fused_attention_engine;
  /// The geometry it takes.
  using fused_attention_shape = precis::fused_attention_shape;
  /// Pooling and upsampling read channels-last images in place (kernels/cuda/pooling.hpp):
  /// a channels-last model moves nothing around them.
  static constexpr bool channels_last_pooling = true;
  /// nn::linear's float8 products run on the device (nn/cuda_float8.hpp).
  static constexpr bool float8_linear = true;
  /// The float8 state of nn::linear under float8 policy P on rank-R tensors: device recipes
  /// and cuBLASLt's float8 products (nn/cuda_float8.hpp).
  template <Policy P, std::size_t R>
  using float8_linear_state = detail::device_float8_linear_state<P, R>;

  // fill, upload and download serve initialisation and checkpoints, not the training step:
  // they take no context, so they first wait for the whole device (cudaDeviceSynchronize),
  // which orders them after the kernels queued on any context's non-blocking stream (a plain
  // cudaMemcpy on the legacy stream is not ordered with those).
  /// Sets every element to v (a copy from the host, after the device's queued work).
  template <class T, std::size_t N>
  static void fill(device_tensor<T, N>& t, T v) {
    upload(t, std::vector<T>(t.size(), v));
  }
  /// Copies host values in, after the device's queued work has finished; throws
  /// precis::error when values.size() != t.size(), or when the copy fails.
  template <class T, std::size_t N>
  static void upload(device_tensor<T, N>& t, const std::vector<T>& values) {
    if (values.size() != t.size()) throw error("precis::nn: uploading a tensor of another size");
    if (t.size() == 0) return;
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    check(cudaMemcpy(t.data(), values.data(), t.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
    // From pageable memory cudaMemcpy may return before the DMA lands: wait for it too, so
    // that kernels queued next on a non-blocking stream read the new values.
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  /// The values, copied to the host after the device's queued work has finished (so a
  /// checkpoint reads what the last step wrote); throws precis::error when the copy fails.
  template <class T, std::size_t N>
  static std::vector<T> download(const device_tensor<T, N>& t) {
    std::vector<T> out(t.size());
    if (t.size() == 0) return out;
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    check(cudaMemcpy(out.data(), t.data(), t.size() * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy");
    return out;
  }
  /// Sets every element to zero: a memset queued on the context's stream (all-zero bits are
  /// zero in every element type precis stores).
  template <class T, std::size_t N>
  static void zero(ref ctx, device_tensor<T, N>& t) {
    if (t.size() != 0) {
      check(cudaMemsetAsync(t.data(), 0, t.size() * sizeof(T), ctx.stream()), "cudaMemsetAsync");
    }
  }
  /// sum += part elementwise on the context's stream, added in float and rounded once to
  /// sum's type (part already rounded to its own type).
  template <class M, class G, std::size_t N>
  static void accumulate(ref ctx, device_tensor<M, N>& sum, const device_tensor<G, N>& part) {
    precis::add<policy<G, float, float, float, G>>(ctx, sum, part, sum);
  }
  /// out = in converted, each value rounded once (nearest-even), on the context's stream.
  template <class In, class Out, std::size_t N>
  static void cast(ref ctx, const device_tensor<In, N>& in, device_tensor<Out, N>& out) {
    precis::cast(ctx, in, out);
  }
  /// out = the sum of the inputs, added in float (double for double tensors) in the host's
  /// order and rounded once, on the context's stream.
  template <class Out, std::size_t N, class... In>
  static void add_rounded(ref ctx, device_tensor<Out, N>& out, const device_tensor<In, N>&... in) {
    if constexpr (sizeof...(In) == 2) {
      [&](const auto& a, const auto& b) { precis::add<policy<Out, float, float, float, Out>>(ctx, a, b, out); }(in...);
    } else {
      using A = std::conditional_t<(std::is_same_v<Out, double> || ... || std::is_same_v<In, double>), double, float>;
      const std::size_t n = out.size();
      if (((in.size() != n) || ...)) throw error("precis::nn: adding tensors of another size");
      using T = std::tuple_element_t<0, std::tuple<In...>>;
      if constexpr ((std::is_same_v<In, T> && ...)) {
        constexpr int V = precis::detail::cuda::pack_width<Out, T>;
        const detail::cuda::add_all_body<A, Out, T, sizeof...(In)> body{out.data(), {in.data()...}};
        precis::detail::cuda::launch_packed<V>(ctx.stream(), body, n,
                                               precis::detail::cuda::pack_aligned<V>(out.data(), in.data()...),
                                               "precis::nn::add_all");
      } else if (n != 0) {
        detail::cuda::add_all_kernel<A><<<precis::detail::cuda::grid_for(n), 256, 0, ctx.stream()>>>(out.data(), n,
                                                                                                    in.data()...);
        check(cudaGetLastError(), "precis::nn::add_all");
      }
    }
  }
  /// out = a - b elementwise, in float (double for double tensors) and rounded once, on the
  /// context's stream (nn::subtract).
  template <class T, std::size_t N>
  static void subtract_rounded(ref ctx, device_tensor<T, N>& out, const device_tensor<T, N>& a,
                               const device_tensor<T, N>& b) {
    using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
    const std::size_t n = out.size();
    if (a.size() != n || b.size() != n) throw error("precis::nn::subtract: tensors of another size");
    if (n == 0) return;
    constexpr int V = precis::detail::cuda::pack_width<T>;
    precis::detail::cuda::launch_packed<V>(ctx.stream(), detail::cuda::subtract_body<A, T>{a.data(), b.data(), out.data()},
                                           n, precis::detail::cuda::pack_aligned<V>(a.data(), b.data(), out.data()),
                                           "precis::nn::subtract");
  }
  /// y[n, c, ...] = round(sums[n, c, ...] + bias[c]) on the context's stream (channels-last:
  /// y[n, h, w, c]): a convolution's bias added to its sums and rounded once, as on the host.
  template <class M, class S, std::size_t N>
  static void add_channel_bias(ref ctx, const device_tensor<M, N>& sums, const device_tensor<S, 1>& bias,
                               device_tensor<S, N>& y, image_layout layout = image_layout::nchw) {
    const std::size_t channels = bias.size(), n = sums.size();
    if (y.size() != n) throw error("precis::nn: a convolution's sums and output differ in size");
    if (sums.shape()[layout == image_layout::nhwc ? N - 1 : 1] != channels) {
      throw error("precis::nn: a convolution's sums " + shape_string(sums.shape()) + " do not have the bias's " +
                  std::to_string(channels) + " channels");
    }
    precis::detail::cuda::add_channel_bias(ctx, sums.data(), bias.data(), y.data(), n,
                                           std::size_t(sums.shape()[0]), channels, layout,
                                           "precis::nn: convolution bias");
  }
  /// out = -in elementwise (exact), on the context's stream.
  template <class T, std::size_t N>
  static void negate(ref ctx, const device_tensor<T, N>& in, device_tensor<T, N>& out) {
    const std::size_t n = in.size();
    if (out.size() != n) throw error("precis::nn::subtract: tensors of another size");
    if (n == 0) return;
    constexpr int V = precis::detail::cuda::pack_width<T>;
    precis::detail::cuda::launch_packed<V>(ctx.stream(), detail::cuda::negate_body<T>{in.data(), out.data()}, n,
                                           precis::detail::cuda::pack_aligned<V>(in.data(), out.data()),
                                           "precis::nn::subtract");
  }
  /// Copies the rows plan `p` names (rank 2, unit inner strides: the concatenations' parts)
  /// as one strided-copy launch on the context's stream.
  template <class T>
  static void copy_rows(std::string_view name, ref ctx, const T* from, T* to, const precis::detail::copy_plan<2>& p) {
    strided_copy(name, ctx, from, to, p);
  }
  /// to[0, n) = from[0, n), a device-to-device copy on the context's stream (the reshaping
  /// layers' copies).
  template <class T>
  static void copy(ref ctx, const T* from, T* to, std::size_t n) {
    if (n != 0) check(cudaMemcpyAsync(to, from, n * sizeof(T), cudaMemcpyDeviceToDevice, ctx.stream()), "cudaMemcpyAsync");
  }
  /// out = in * f elementwise in math type M, each value rounded once (nn::scale).
  template <class M, class T>
  static void scale(ref ctx, const T* in, T* out, std::size_t n, M f) {
    constexpr int V = precis::detail::cuda::pack_width<T>;
    precis::detail::cuda::launch_packed<V>(ctx.stream(), detail::cuda::scale_body<M, T>{in, out, f}, n,
                                           precis::detail::cuda::pack_aligned<V>(in, out), "precis::nn::scale");
  }
  /// nn::dropout's forward pass (mask from (seed, call, index), as on the host), writing
  /// the mask to `mask` (device bytes).
  template <class M, class T>
  static void dropout(ref ctx, const T* x, T* y, std::uint8_t* mask, std::size_t n, std::uint64_t seed,
                      std::uint64_t call, double p, M keep) {
    constexpr int V = precis::detail::cuda::pack_width<T>;
    precis::detail::cuda::launch_packed<V>(ctx.stream(), detail::cuda::dropout_body<M, T>{x, y, mask, seed, call, p, keep},
                                           n, precis::detail::cuda::pack_aligned<V>(x, y, mask), "precis::nn::dropout");
  }
  /// nn::dropout's backward pass from its mask.
  template <class M, class T>
  static void dropout_backward(ref ctx, const T* dy, const std::uint8_t* mask, T* dx, std::size_t n, M keep) {
    constexpr int V = precis::detail::cuda::pack_width<T>;
    precis::detail::cuda::launch_packed<V>(ctx.stream(), detail::cuda::dropout_backward_body<M, T>{dy, mask, dx, keep}, n,
                                           precis::detail::cuda::pack_aligned<V>(dy, mask, dx), "precis::nn::dropout");
  }
  /// Runs copy plan `p` (precis::detail::copy_plan: a permutation, gather or broadcast of
  /// the data layers: patchify, select_token, class_token, attention's heads) as one launch
  /// on the context's stream. Throws precis::error, naming `name`, when the launch fails.
  template <class T, std::size_t R>
  static void strided_copy(std::string_view name, ref ctx, const T* from, T* to,
                           const precis::detail::copy_plan<R>& p) {
    precis::detail::cuda::strided_copy(ctx.stream(), from, to, p, name);
  }
  /// y = Fn(x) elementwise on the context's stream, computed in P's opmath type and rounded
  /// once; `name` names the kernel in errors (precis::error for a shape mismatch).
  template <Policy P, template <class> class Fn, class X, class Y, std::size_t N>
  static void unary(std::string_view name, ref ctx, const device_tensor<X, N>& x, device_tensor<Y, N>& y) {
    precis::detail::cuda::unary<P, Fn>(name, ctx, x, y);
  }
  /// dx = Fn(dy, x) elementwise on the context's stream, Fn an activation's gradient: as
  /// unary().
  template <Policy P, template <class> class Fn, class DY, class X, class DX, std::size_t N>
  static void unary_backward(std::string_view name, ref ctx, const device_tensor<DY, N>& dy,
                             const device_tensor<X, N>& x, device_tensor<DX, N>& dx) {
    precis::detail::cuda::unary_backward<P, Fn>(name, ctx, dy, x, dx);
  }
};

}  // namespace precis::nn

#include <precis/nn/nn.hpp>
#include <precis/nn/cuda_train.hpp>

#endif  // __CUDACC__
