/// @file
/// The elementwise kernels of kernels/elementwise.hpp on device tensors, with the same calls (a
/// cuda_context in place of the cpu_context): add, mul (b broadcast over a's leading axes), relu,
/// gelu, sigmoid, tanh and their backward passes. The same functors compute every element, in the
/// same math type, rounded once; only the device's libm (erf, exp, tanh, within a few ulps of the
/// host's) differs. Shapes are checked on the host before anything is launched. Compiled by nvcc
/// only (include from a .cu file).
#pragma once

#include <precis/config.hpp>
#include <precis/kernels/cuda/common.hpp>
#include <precis/kernels/cuda_context.hpp>
#include <precis/kernels/elementwise.hpp>
#include <precis/tensor/device_tensor.hpp>

#if defined(__CUDACC__)

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace precis {

namespace detail::cuda {

// The bodies of packed_kernel (common.hpp): V elements at i, each computed alone by the
// host's functor in M and rounded once, so that packing changes no bits.

template <class M, class Fn, class X, class Y>
struct unary_body {
  const X* x;
  Y* y;
  template <int V>
  __device__ void at(std::size_t i) const {
    const auto in = load_pack<V>(x + i);
    pack<Y, V> out;
    const Fn f{};
#pragma unroll
    for (int k = 0; k < V; ++k) out.v[k] = round_to<Y>(f(device_load<M>(in.v[k])));
    store_pack<V>(y + i, out);
  }
};

template <class M, class Fn, class DY, class X, class DX>
struct unary_backward_body {
  const DY* dy;
  const X* x;
  DX* dx;
  template <int V>
  __device__ void at(std::size_t i) const {
    const auto g = load_pack<V>(dy + i);
    const auto in = load_pack<V>(x + i);
    pack<DX, V> out;
    const Fn f{};
#pragma unroll
    for (int k = 0; k < V; ++k) out.v[k] = round_to<DX>(f(device_load<M>(g.v[k]), device_load<M>(in.v[k])));
    store_pack<V>(dx + i, out);
  }
};

/// out[i] = f(a[i], b[i % nb]): b repeated over a's leading axes. The remainder is i itself
/// where nb == n, and taken by `fb` (fast_divmod by nb) where n fits 32 bits: no 64-bit
/// division per element. Where nb is a multiple of the pack or n itself (`b_packed`), a pack of
/// a meets a pack of b; otherwise b is read an element at a time.
template <class M, class Fn, class A, class B, class Out>
struct binary_body {
  const A* a;
  const B* b;
  Out* out;
  std::size_t n, nb;
  fast_divmod fb;
  bool b_packed;
  __device__ std::size_t b_index(std::size_t i) const {
    return nb == n ? i : n <= 0xffffffffULL ? std::size_t(fb.mod(std::uint32_t(i))) : i % nb;
  }
  template <int V>
  __device__ void at(std::size_t i) const {
    const auto x = load_pack<V>(a + i);
    pack<B, V> y;
    if (b_packed) {
      y = load_pack<V>(b + b_index(i));
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) y.v[k] = b[b_index(i + k)];
    }
    pack<Out, V> r;
    const Fn f{};
#pragma unroll
    for (int k = 0; k < V; ++k) r.v[k] = round_to<Out>(f(device_load<M>(x.v[k]), device_load<M>(y.v[k])));
    store_pack<V>(out + i, r);
  }
};

template <class M>
struct add_op {
  __device__ M operator()(M a, M b) const { return a + b; }
};
template <class M>
struct mul_op {
  __device__ M operator()(M a, M b) const { return a * b; }
};

template <Policy P, template <class> class Fn, class X, class Y, std::size_t N>
void unary(std::string_view name, cuda_context& ctx, const device_tensor<X, N>& x,
           device_tensor<Y, N>& y) {
  using M = math_t<op::elementwise, P, X>;
  check_shape(std::string(name) + ": y", y, x.shape());
  const std::size_t n = x.size();
  if (n == 0) return;
  constexpr int V = pack_width<X, Y>;
  launch_packed<V>(ctx.stream(), unary_body<M, Fn<M>, X, Y>{x.data(), y.data()}, n,
                   pack_aligned<V>(x.data(), y.data()), name);
}

template <Policy P, template <class> class Fn, class DY, class X, class DX, std::size_t N>
void unary_backward(std::string_view name, cuda_context& ctx, const device_tensor<DY, N>& dy,
                    const device_tensor<X, N>& x, device_tensor<DX, N>& dx) {
  using M = math_t<op::elementwise, P, DY, X>;
  check_same_shape(std::string(name) + ": dy and x", dy, x);
  check_shape(std::string(name) + ": dx", dx, x.shape());
  const std::size_t n = x.size();
  if (n == 0) return;
  constexpr int V = pack_width<DY, X, DX>;
  launch_packed<V>(ctx.stream(), unary_backward_body<M, Fn<M>, DY, X, DX>{dy.data(), x.data(), dx.data()}, n,
                   pack_aligned<V>(dy.data(), x.data(), dx.data()), name);
}

/// Launches out[i] = Op(a[i], b[i % nb]) in M for i < n on ctx's stream (binary_body), n a
/// multiple of nb; shapes are the caller's to check.
template <class M, template <class> class Op, class A, class B, class Out>
void launch_binary(std::string_view name, cuda_context& ctx, const A* a, std::size_t n, const B* b,
                   std::size_t nb, Out* out) {
  if (n == 0) return;
  // fast_divmod takes divisors up to 2^31; a b that large is a's own size (nb == n).
  const fast_divmod fb(fast_divmod::fits(nb) ? std::uint32_t(nb) : 1U);
  constexpr int V = pack_width<A, B, Out>;
  // b's packs never wrap: nb is a multiple of the pack, or b is a's size (a pack of b at i).
  const bool b_packed = (nb == n || nb % V == 0) && pack_aligned<V>(b);
  launch_packed<V>(ctx.stream(), binary_body<M, Op<M>, A, B, Out>{a, b, out, n, nb, fb, b_packed},
                   n, pack_aligned<V>(a, out), name);
}

template <Policy P, template <class> class Op, class A, std::size_t N, class B, std::size_t K,
          class Out>
void binary(std::string_view name, cuda_context& ctx, const device_tensor<A, N>& a,
            const device_tensor<B, K>& b, device_tensor<Out, N>& out) {
  check_suffix_shape(name, a, b);
  check_shape(std::string(name) + ": out", out, a.shape());
  launch_binary<math_t<op::elementwise, P, A, B>, Op>(name, ctx, a.data(), a.size(), b.data(),
                                                      b.size(), out.data());
}

template <class M>
struct identity_op {
  __device__ M operator()(M x) const { return x; }
};

/// y = x rounded once to Y through M: the copies of add_backward.
template <class M, class X, class Y>
void launch_copy(std::string_view name, cuda_context& ctx, const X* x, std::size_t n, Y* y) {
  constexpr int V = pack_width<X, Y>;
  launch_packed<V>(ctx.stream(), unary_body<M, identity_op<M>, X, Y>{x, y}, n,
                   pack_aligned<V>(x, y), name);
}

/// y = f(x) rounded once to Y, and d = the factor grad(1, x) that the backward functor
/// multiplies dy by, in float (unary_with_derivative's device form).
template <class Fn, class Grad, class X, class Y>
struct with_derivative_body {
  const X* x;
  Y* y;
  float* d;
  template <int V>
  __device__ void at(std::size_t i) const {
    const auto in = load_pack<V>(x + i);
    pack<Y, V> out;
    pack<float, V> factor;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float v = device_load<float>(in.v[k]);
      out.v[k] = round_to<Y>(Fn{}(v));
      factor.v[k] = Grad{}(1.0F, v);
    }
    store_pack<V>(y + i, out);
    store_pack<V>(d + i, factor);
  }
};

}  // namespace detail::cuda

/// out = a + b on the device, b of a's shape or a suffix of it (see the host add).
template <Policy P, kernel_element A, std::size_t N, kernel_element B, std::size_t K,
          kernel_element Out>
void add(cuda_context& ctx, const device_tensor<A, N>& a, const device_tensor<B, K>& b,
         device_tensor<Out, N>& out) {
  detail::cuda::binary<P, detail::cuda::add_op>("precis::add", ctx, a, b, out);
}

/// out = a * b on the device, b broadcast as in add.
template <Policy P, kernel_element A, std::size_t N, kernel_element B, std::size_t K,
          kernel_element Out>
void mul(cuda_context& ctx, const device_tensor<A, N>& a, const device_tensor<B, K>& b,
         device_tensor<Out, N>& out) {
  detail::cuda::binary<P, detail::cuda::mul_op>("precis::mul", ctx, a, b, out);
}

/// y = max(x, 0) on the device (NaN stays NaN).
template <Policy P, kernel_element X, kernel_element Y, std::size_t N>
void relu(cuda_context& ctx, const device_tensor<X, N>& x, device_tensor<Y, N>& y) {
  detail::cuda::unary<P, detail::relu_fn>("precis::relu", ctx, x, y);
}

/// dx = dy where x > 0, else 0, on the device.
template <Policy P, kernel_element DY, kernel_element X, kernel_element DX, std::size_t N>
void relu_backward(cuda_context& ctx, const device_tensor<DY, N>& dy,
                   const device_tensor<X, N>& x, device_tensor<DX, N>& dx) {
  detail::cuda::unary_backward<P, detail::relu_grad_fn>("precis::relu_backward", ctx, dy, x, dx);
}

/// y = gelu(x) on the device, exact (erf) by default or the tanh approximation.
template <Policy P, kernel_element X, kernel_element Y, std::size_t N>
void gelu(cuda_context& ctx, const device_tensor<X, N>& x, device_tensor<Y, N>& y,
          gelu_approximation approximate = gelu_approximation::none) {
  if (approximate == gelu_approximation::tanh) {
    detail::cuda::unary<P, detail::gelu_tanh_fn>("precis::gelu", ctx, x, y);
  } else {
    detail::cuda::unary<P, detail::gelu_erf_fn>("precis::gelu", ctx, x, y);
  }
}

/// y = gelu(x) (the exact, erf form) and d = gelu'(x) in one pass on the device (see the
/// host gelu_with_derivative): y has gelu's bits, and dy * d rounded once (precis::mul
/// under P) has gelu_backward's, both on the device. Needs float math under P (a compile
/// error otherwise); d must not be y; shapes are checked before anything is launched.
template <Policy P, kernel_element X, kernel_element Y, std::size_t N>
void gelu_with_derivative(cuda_context& ctx, const device_tensor<X, N>& x, device_tensor<Y, N>& y,
                          device_tensor<float, N>& d) {
  static_assert(std::is_same_v<detail::math_t<op::elementwise, P, X>, float>,
                "precis: this function has no one-pass form with its derivative under this policy "
                "(it needs float math and a vector form that gives the factor)");
  check_shape("precis::gelu_with_derivative: y", y, x.shape());
  check_shape("precis::gelu_with_derivative: d", d, x.shape());
  constexpr int V = detail::cuda::pack_width<X, Y, float>;
  detail::cuda::launch_packed<V>(
      ctx.stream(),
      detail::cuda::with_derivative_body<detail::gelu_erf_fn<float>,
                                         detail::gelu_erf_grad_fn<float>, X, Y>{x.data(), y.data(),
                                                                                d.data()},
      x.size(), detail::cuda::pack_aligned<V>(x.data(), y.data(), d.data()),
      "precis::gelu_with_derivative");
}

/// dx = dy * gelu'(x) on the device, for the same approximation as the forward pass.
template <Policy P, kernel_element DY, kernel_element X, kernel_element DX, std::size_t N>
void gelu_backward(cuda_context& ctx, const device_tensor<DY, N>& dy,
                   const device_tensor<X, N>& x, device_tensor<DX, N>& dx,
                   gelu_approximation approximate = gelu_approximation::none) {
  if (approximate == gelu_approximation::tanh) {
    detail::cuda::unary_backward<P, detail::gelu_tanh_grad_fn>("precis::gelu_backward", ctx, dy,
                                                               x, dx);
  } else {
    detail::cuda::unary_backward<P, detail::gelu_erf_grad_fn>("precis::gelu_backward", ctx, dy,
                                                              x, dx);
  }
}

/// y = 1 / (1 + exp(-x)) on the device.
template <Policy P, kernel_element X, kernel_element Y, std::size_t N>
void sigmoid(cuda_context& ctx, const device_tensor<X, N>& x, device_tensor<Y, N>& y) {
  detail::cuda::unary<P, detail::sigmoid_fn>("precis::sigmoid", ctx, x, y);
}

/// dx = dy * s (1 - s), s = sigmoid(x), on the device.
template <Policy P, kernel_element DY, kernel_element X, kernel_element DX, std::size_t N>
void sigmoid_backward(cuda_context& ctx, const device_tensor<DY, N>& dy,
                      const device_tensor<X, N>& x, device_tensor<DX, N>& dx) {
  detail::cuda::unary_backward<P, detail::sigmoid_grad_fn>("precis::sigmoid_backward", ctx, dy, x,
                                                           dx);
}

/// y = tanh(x) on the device.
template <Policy P, kernel_element X, kernel_element Y, std::size_t N>
void tanh(cuda_context& ctx, const device_tensor<X, N>& x, device_tensor<Y, N>& y) {
  detail::cuda::unary<P, detail::tanh_fn>("precis::tanh", ctx, x, y);
}

/// dx = dy * (1 - tanh(x)^2) on the device.
template <Policy P, kernel_element DY, kernel_element X, kernel_element DX, std::size_t N>
void tanh_backward(cuda_context& ctx, const device_tensor<DY, N>& dy,
                   const device_tensor<X, N>& x, device_tensor<DX, N>& dx) {
  detail::cuda::unary_backward<P, detail::tanh_grad_fn>("precis::tanh_backward", ctx, dy, x, dx);
}

}  // namespace precis

#endif
