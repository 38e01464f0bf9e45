/// @file
/// Add, mul, relu, gelu, sigmoid, tanh and their gradients on host tensors.
///
/// Semantics (op::elementwise under the policy): inputs of different element types meet in
/// the widest of them and the policy's compute type (precis::promote_t), arithmetic runs in
/// its opmath type (float for the narrow formats, double for double), and each output
/// element is rounded once to its tensor's element type. In float, GELU (exact, erf form)
/// and sigmoid and their gradients run on SIMD vectors (kernels/cpu/vec_math.hpp: within a
/// few ulps, tails included; under exact-products policies the same bits under every build
/// flag, under hardware-products ones with fused multiply-adds where the build targets
/// them); tanh, the tanh GELU and double math use `std::tanh`, `std::exp`, `std::erf`. Backward
/// kernels take the forward input x, not the forward output: the output was rounded to
/// storage (8 significant bits in bfloat16), and recomputing from x costs one function
/// call per element (gelu_with_derivative keeps f'(x) from the forward pass instead).
///
/// Shapes are checked before anything is written; a mismatch throws precis::error naming
/// both shapes. Output tensors may be the input tensors (in place) for the same-shape forms.
#pragma once

#include <precis/kernels/common.hpp>
#include <precis/kernels/context.hpp>
#include <precis/kernels/cpu/support.hpp>
#include <precis/kernels/cpu/vec_math.hpp>
#include <precis/tensor/host_tensor.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numbers>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

namespace precis {

/// Which GELU: `none` is the exact x * Phi(x) with Phi(x) = (1 + erf(x / sqrt 2)) / 2 (the
/// default, as in PyTorch and the original ViT); `tanh` is Hendrycks and Gimpel's
/// approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), which differs from it by
/// at most about 5e-4 and which some checkpoints (GPT-2, BERT ports) were trained with.
/// The names follow PyTorch's `approximate=` argument.
enum class gelu_approximation { none, tanh };

namespace detail {

/// Throws precis::error unless `b`'s shape is `a`'s shape or a suffix of it (b broadcast
/// over a's leading axes, as a bias is). Host or device tensors alike: the device's
/// broadcasting kernels (kernels/cuda/elementwise.hpp) check with it too.
template <class TA, class TB>
void check_suffix_shape(std::string_view what, const TA& a, const TB& b,
                        std::string_view operand = "b") {
  constexpr std::size_t N = std::tuple_size_v<std::remove_cvref_t<decltype(a.shape())>>;
  constexpr std::size_t M = std::tuple_size_v<std::remove_cvref_t<decltype(b.shape())>>;
  static_assert(M <= N, "precis: the broadcast operand b must not have a higher rank than a");
  bool ok = true;
  for (std::size_t i = 0; ok && i < M; ++i)
    ok = std::size_t(b.shape()[i]) == std::size_t(a.shape()[N - M + i]);
  if (!ok) {
    throw error(std::string(what) + ": " + std::string(operand) + " has shape " + shape_string(b.shape()) +
                ", expected a's shape " + shape_string(a.shape()) + " or a suffix of it");
  }
}

// The functors below are shared by the host kernels and the device ones
// (kernels/cuda/elementwise.hpp): on the host they call the C++ library's functions, in
// device code CUDA's, for float and double alike.
namespace math {
#if PRECIS_DEVICE_CODE
template <class M>
PRECIS_HOST_DEVICE M erf(M x) { return ::erf(x); }
template <class M>
PRECIS_HOST_DEVICE M exp(M x) { return ::exp(x); }
template <class M>
PRECIS_HOST_DEVICE M tanh(M x) { return ::tanh(x); }
template <class M>
PRECIS_HOST_DEVICE M log(M x) { return ::log(x); }
template <class M>
PRECIS_HOST_DEVICE M log1p(M x) { return ::log1p(x); }
template <class M>
PRECIS_HOST_DEVICE M abs(M x) { return ::fabs(x); }
#else
template <class M>
PRECIS_HOST_DEVICE M erf(M x) { return std::erf(x); }
template <class M>
PRECIS_HOST_DEVICE M exp(M x) { return std::exp(x); }
template <class M>
PRECIS_HOST_DEVICE M tanh(M x) { return std::tanh(x); }
template <class M>
PRECIS_HOST_DEVICE M log(M x) { return std::log(x); }
template <class M>
PRECIS_HOST_DEVICE M log1p(M x) { return std::log1p(x); }
template <class M>
PRECIS_HOST_DEVICE M abs(M x) { return std::abs(x); }
#endif
}  // namespace math

template <class M>
struct relu_fn {
  PRECIS_HOST_DEVICE M operator()(M x) const { return x < M(0) ? M(0) : x; }  // keeps NaN
};
template <class M>
struct relu_grad_fn {
  PRECIS_HOST_DEVICE M operator()(M dy, M x) const { return x > M(0) ? dy : M(0); }
};

template <class M>
struct gelu_erf_fn {
  PRECIS_HOST_DEVICE M operator()(M x) const { return M(0.5) * x * (M(1) + math::erf(x * M(std::numbers::sqrt2 / 2))); }
};
template <class M>
struct gelu_erf_grad_fn {
  // d/dx x Phi(x) = Phi(x) + x phi(x)
  PRECIS_HOST_DEVICE M operator()(M dy, M x) const {
    const M cdf = M(0.5) * (M(1) + math::erf(x * M(std::numbers::sqrt2 / 2)));
    const M pdf = math::exp(M(-0.5) * x * x) * M(std::numbers::inv_sqrtpi / std::numbers::sqrt2);
    return dy * add(cdf, x * pdf);
  }
};

inline constexpr double gelu_k = 0.7978845608028654;  // sqrt(2 / pi)
inline constexpr double gelu_c = 0.044715;

template <class M>
struct gelu_tanh_fn {
  PRECIS_HOST_DEVICE M operator()(M x) const {
    return M(0.5) * x * (M(1) + math::tanh(M(gelu_k) * (x + mul(M(gelu_c) * x * x, x))));
  }
};
template <class M>
struct gelu_tanh_grad_fn {
  PRECIS_HOST_DEVICE M operator()(M dy, M x) const {
    const M t = math::tanh(M(gelu_k) * (x + mul(M(gelu_c) * x * x, x)));
    const M dinner = M(gelu_k) * (M(1) + mul(M(3 * gelu_c) * x, x));
    return dy * add(M(0.5) * (M(1) + t), M(0.5) * x * (M(1) - mul(t, t)) * dinner);
  }
};

template <class M>
struct sigmoid_fn {
  // exp(-x) overflows to infinity for x < -88 (float); 1 / (1 + inf) is then the exact 0.
  PRECIS_HOST_DEVICE M operator()(M x) const { return M(1) / (M(1) + math::exp(-x)); }
};
template <class M>
struct sigmoid_grad_fn {
  PRECIS_HOST_DEVICE M operator()(M dy, M x) const {
    const M s = sigmoid_fn<M>{}(x);
    return dy * s * (M(1) - s);
  }
};

template <class M>
struct tanh_fn {
  PRECIS_HOST_DEVICE M operator()(M x) const { return math::tanh(x); }
};
template <class M>
struct tanh_grad_fn {
  PRECIS_HOST_DEVICE M operator()(M dy, M x) const {
    const M t = math::tanh(x);
    return dy * (M(1) - mul(t, t));
  }
};

/// The float SIMD form of an elementwise functor F (the functor instantiated for float),
/// where there is one: `apply` takes and returns vmath::vf. The backward forms compute
/// dy * factor(x), one product rounded once, and give `factor` too (the value tables below
/// hold it). Keyed on the functor's type, not its template: compilers differ on whether an
/// alias template (nn's activation_functions::fn) matches a specialisation for the template
/// it names, and a miss would quietly take the scalar loop (other bits, slower).
template <class F>
struct vector_form : std::false_type {};
template <>
struct vector_form<gelu_erf_fn<float>> : std::true_type {
  template <class A>
  static vmath::vf apply(vmath::vf x) { return vmath::gelu<A>(x); }
  /// apply(x), with the backward form's factor at x stored to `factor`, in one pass.
  template <class A>
  static vmath::vf apply(vmath::vf x, vmath::vf& factor) {
    return vmath::gelu_and_grad_factor<A>(x, factor);
  }
};
template <>
struct vector_form<gelu_erf_grad_fn<float>> : std::true_type {
  template <class A>
  static vmath::vf factor(vmath::vf x) { return vmath::gelu_grad_factor<A>(x); }
  template <class A>
  static vmath::vf apply(vmath::vf dy, vmath::vf x) { return dy * factor<A>(x); }
};
template <>
struct vector_form<sigmoid_fn<float>> : std::true_type {
  template <class A>
  static vmath::vf apply(vmath::vf x) { return vmath::sigmoid<A>(x); }
};
template <>
struct vector_form<sigmoid_grad_fn<float>> : std::true_type {
  template <class A>
  static vmath::vf factor(vmath::vf x) { return vmath::sigmoid_grad_factor<A>(x); }
  template <class A>
  static vmath::vf apply(vmath::vf dy, vmath::vf x) { return dy * factor<A>(x); }
};

/// Inputs of 16 bits or fewer (bfloat16, float16, the float8 formats) have at most 65536
/// values: a vector form's float function of x is read from a table of its value at every
/// one of them, made once per program by the same vector code, so the results are the same
/// bits as computing it, for an L2-resident load instead of about a hundred vector
/// operations per 16 elements.
template <class X>
inline constexpr bool tabulated_input_v = precis_format<X> && sizeof(X) <= 2;

/// A vector form's function of x alone in arithmetic A, as a type (value_table's key): its
/// value, or for a backward form the factor dy is multiplied by.
template <class Form, class A>
struct form_values {
  vmath::vf operator()(vmath::vf x) const { return Form::template apply<A>(x); }
};
template <class Form, class A>
struct form_factors {
  vmath::vf operator()(vmath::vf x) const { return Form::template factor<A>(x); }
};

/// The table of F(x) (F: vf -> vf) for every value of X, indexed by X's bits; one per
/// program for each F and X.
template <class X, class F>
const float* value_table() {
  static const std::vector<float> table = [] {
    constexpr std::size_t n = std::size_t(1) << (8 * sizeof(X));
    std::vector<float> in(n), out(n);
    for (std::size_t i = 0; i < n; ++i) {
      in[i] = load<float>(X::from_bits(static_cast<typename X::storage_type>(i)));
    }
    vmath::map(in.data(), out.data(), n, [](vmath::vf v) { return F{}(v); });
    return out;
  }();
  return table.data();
}

/// value_table's entries rounded to Y (as the kernels round their float results), for a
/// forward pass that reads its output directly.
template <class X, class F, class Y>
const Y* output_table() {
  if constexpr (std::is_same_v<Y, float>) {
    return value_table<X, F>();
  } else {
    static const std::vector<Y> table = [] {
      constexpr std::size_t n = std::size_t(1) << (8 * sizeof(X));
      std::vector<Y> out(n);
      store_block(value_table<X, F>(), out.data(), n);
      return out;
    }();
    return table.data();
  }
}

/// y = f(x) elementwise.
template <Policy P, template <class> class Fn, kernel_element X, kernel_element Y, std::size_t N>
void unary(std::string_view name, const cpu_context& ctx, const host_tensor<X, N>& x,
           host_tensor<Y, N>& y) {
  using M = math_t<op::elementwise, P, X>;
  check_shape(std::string(name) + ": y", y, shape_array<N>(x));
  if constexpr (std::is_same_v<M, float> && vector_form<Fn<M>>::value && tabulated_input_v<X>) {
    const Y* table = output_table<X, form_values<vector_form<Fn<M>>, arith_t<P>>, Y>();
    const X* xs = x.data();
    Y* ys = y.data();
    parallel_for(ctx, element_count(x), elements_per_thread,
                 [table, xs, ys](std::size_t begin, std::size_t end) {
                   for (std::size_t i = begin; i < end; ++i) ys[i] = table[xs[i].bits()];
                 });
    return;
  }
  map_blocks<M>(
      ctx, element_count(x), y.data(),
      [](std::size_t, std::size_t len, M* r, const M* v) {
        if constexpr (std::is_same_v<M, float> && vector_form<Fn<M>>::value) {
          vmath::map(v, r, len,
                     [](vmath::vf a) { return vector_form<Fn<M>>::template apply<arith_t<P>>(a); });
        } else {
          const Fn<M> f{};
          for (std::size_t i = 0; i < len; ++i) r[i] = f(v[i]);
        }
      },
      x.data());
}

/// True when f's float math can compute f'(x) in the same pass as f(x), for less than the
/// two passes cost (a vector form with apply(x, factor): GELU), under policy P for input X.
template <Policy P, template <class> class Fn, class X>
inline constexpr bool derivative_form_v =
    std::is_same_v<math_t<op::elementwise, P, X>, float> &&
    requires(vmath::vf v) { vector_form<Fn<float>>::template apply<vmath::exact_arith>(v, v); };

/// y = f(x) and d = f'(x) elementwise in one pass (see derivative_form_v): d is the factor
/// the backward form multiplies dy by, so for float or 16-bit dy, dy * d rounded once
/// (precis::mul under P) is unary_backward's result, bit for bit. d must not be y.
template <Policy P, template <class> class Fn, kernel_element X, kernel_element Y, std::size_t N>
void unary_with_derivative(std::string_view name, const cpu_context& ctx,
                           const host_tensor<X, N>& x, host_tensor<Y, N>& y,
                           host_tensor<float, N>& d) {
  static_assert(derivative_form_v<P, Fn, X>,
                "precis: this function has no one-pass form with its derivative under this policy "
                "(it needs float math and a vector form that gives the factor)");
  check_shape(std::string(name) + ": y", y, shape_array<N>(x));
  check_shape(std::string(name) + ": d", d, shape_array<N>(x));
  float* ds = d.data();
  map_blocks<float>(
      ctx, element_count(x), y.data(),
      [ds](std::size_t start, std::size_t len, float* r, const float* v) {
        vmath::map_two_outputs(v, r, ds + start, len, [](vmath::vf a, vmath::vf& factor) {
          return vector_form<Fn<float>>::template apply<arith_t<P>>(a, factor);
        });
      },
      x.data());
}

/// dx = g(dy, x) elementwise.
template <Policy P, template <class> class Fn, kernel_element DY, kernel_element X,
          kernel_element DX, std::size_t N>
void unary_backward(std::string_view name, const cpu_context& ctx, const host_tensor<DY, N>& dy,
                    const host_tensor<X, N>& x, host_tensor<DX, N>& dx) {
  using M = math_t<op::elementwise, P, DY, X>;
  check_same_shape(std::string(name) + ": dy and x", dy, x);
  check_shape(std::string(name) + ": dx", dx, shape_array<N>(x));
  if constexpr (std::is_same_v<M, float> && vector_form<Fn<M>>::value && tabulated_input_v<X>) {
    const float* table = value_table<X, form_factors<vector_form<Fn<M>>, arith_t<P>>>();
    const X* xs = x.data();
    map_blocks<M>(
        ctx, element_count(x), dx.data(),
        [table, xs](std::size_t start, std::size_t len, M* r, const M* g) {
          for (std::size_t i = 0; i < len; ++i) {
            r[i] = g[i] * table[xs[start + i].bits()];
          }
        },
        dy.data());
    return;
  }
  map_blocks<M>(
      ctx, element_count(x), dx.data(),
      [](std::size_t, std::size_t len, M* r, const M* g, const M* v) {
        if constexpr (std::is_same_v<M, float> && vector_form<Fn<M>>::value) {
          vmath::map2(g, v, r, len,
                      [](vmath::vf a, vmath::vf b) {
                        return vector_form<Fn<M>>::template apply<arith_t<P>>(a, b);
                      });
        } else {
          const Fn<M> f{};
          for (std::size_t i = 0; i < len; ++i) r[i] = f(g[i], v[i]);
        }
      },
      dy.data(), x.data());
}

/// out = f(a, b) with b broadcast over a's leading axes.
template <class M, class Fn, class A, std::size_t N, class B, std::size_t K, class Out>
void binary(const cpu_context& ctx, const host_tensor<A, N>& a, const host_tensor<B, K>& b,
            host_tensor<Out, N>& out, Fn fn) {
  const std::size_t n = element_count(a), bn = element_count(b);
  if (n == bn) {
    map_blocks<M>(ctx, n, out.data(),
                  [fn](std::size_t, std::size_t len, M* r, const M* x, const M* y) {
                    for (std::size_t i = 0; i < len; ++i) r[i] = fn(x[i], y[i]);
                  },
                  a.data(), b.data());
    return;
  }
  std::vector<M> bm(bn);
  load_block(b.data(), bm.data(), bn);
  map_blocks<M>(ctx, n, out.data(),
                [fn, &bm, bn](std::size_t start, std::size_t len, M* r, const M* x) {
                  std::size_t j = start % bn;
                  for (std::size_t i = 0; i < len; ++i) {
                    r[i] = fn(x[i], bm[j]);
                    if (++j == bn) j = 0;
                  }
                },
                a.data());
}

/// out[j] = sum over rows r of f(r * cols + j), for the gradient of a broadcast operand:
/// one sum per output element, in row order, so results do not depend on the thread split.
template <class M, class Acc, class Out, class F>
void sum_rows(const cpu_context& ctx, std::size_t rows, std::size_t cols, Out* out, F f) {
  const std::size_t per_thread = std::max<std::size_t>(1, elements_per_thread / std::max<std::size_t>(1, rows));
  parallel_for(ctx, cols, per_thread, [&](std::size_t begin, std::size_t end) {
    std::vector<accumulator<Acc>> acc(end - begin);
    for (std::size_t r = 0; r < rows; ++r) {
      for (std::size_t j = begin; j < end; ++j) accumulate(acc[j - begin], f(r * cols + j));
    }
    for (std::size_t j = begin; j < end; ++j) out[j] = round_to<Out>(acc[j - begin].value());
  });
}

}  // namespace detail

/// out = a + b. `b` has a's shape or a suffix of it (a bias of shape [C] added to every
/// row of [N, C]); out has a's shape.
template <Policy P, kernel_element A, std::size_t N, kernel_element B, std::size_t K,
          kernel_element Out>
void add(const cpu_context& ctx, const host_tensor<A, N>& a, const host_tensor<B, K>& b,
         host_tensor<Out, N>& out) {
  using M = detail::math_t<op::elementwise, P, A, B>;
  detail::check_suffix_shape("precis::add", a, b);
  check_shape("precis::add: out", out, detail::shape_array<N>(a));
  detail::binary<M>(ctx, a, b, out, [](M x, M y) { return x + y; });
}

/// out = a * b, with b broadcast as in add.
template <Policy P, kernel_element A, std::size_t N, kernel_element B, std::size_t K,
          kernel_element Out>
void mul(const cpu_context& ctx, const host_tensor<A, N>& a, const host_tensor<B, K>& b,
         host_tensor<Out, N>& out) {
  using M = detail::math_t<op::elementwise, P, A, B>;
  detail::check_suffix_shape("precis::mul", a, b);
  check_shape("precis::mul: out", out, detail::shape_array<N>(a));
  detail::binary<M>(ctx, a, b, out, [](M x, M y) { return x * y; });
}

/// Gradients of out = a + b: da = dy, db = dy summed over the axes b was broadcast along
/// (a sum in the reduction rule's accumulate type, at least float by default).
template <Policy P, kernel_element DY, std::size_t N, kernel_element DA, kernel_element DB,
          std::size_t K>
void add_backward(const cpu_context& ctx, const host_tensor<DY, N>& dy, host_tensor<DA, N>& da,
                  host_tensor<DB, K>& db) {
  using M = detail::math_t<op::elementwise, P, DY>;
  check_shape("precis::add_backward: da", da, detail::shape_array<N>(dy));
  detail::check_suffix_shape("precis::add_backward", dy, db, "db");
  const std::size_t n = detail::element_count(dy), bn = detail::element_count(db);
  const DY* g = dy.data();
  if (n == bn) {
    detail::map_blocks<M>(ctx, n, db.data(), [](std::size_t, std::size_t len, M* r, const M* v) {
      for (std::size_t i = 0; i < len; ++i) r[i] = v[i];
    }, g);
  } else if (bn != 0) {
    using MR = detail::math_t<op::reduction, P, DY>;
    detail::sum_rows<MR, detail::accumulate_t<op::reduction, P>>(
        ctx, n / bn, bn, db.data(), [g](std::size_t i) { return detail::load<MR>(g[i]); });
  }
  detail::map_blocks<M>(ctx, n, da.data(), [](std::size_t, std::size_t len, M* r, const M* v) {
    for (std::size_t i = 0; i < len; ++i) r[i] = v[i];
  }, g);
}

/// Gradients of out = a * b: da = dy * b (b broadcast), db = dy * a summed over the axes b
/// was broadcast along.
template <Policy P, kernel_element DY, std::size_t N, kernel_element A, kernel_element B,
          std::size_t K, kernel_element DA, kernel_element DB>
void mul_backward(const cpu_context& ctx, const host_tensor<DY, N>& dy, const host_tensor<A, N>& a,
                  const host_tensor<B, K>& b, host_tensor<DA, N>& da, host_tensor<DB, K>& db) {
  using M = detail::math_t<op::elementwise, P, DY, A, B>;
  check_same_shape("precis::mul_backward: dy and a", dy, a);
  detail::check_suffix_shape("precis::mul_backward", a, b);
  check_shape("precis::mul_backward: da", da, detail::shape_array<N>(a));
  check_shape("precis::mul_backward: db", db, detail::shape_array<K>(b));
  const std::size_t n = detail::element_count(a), bn = detail::element_count(b);
  if (n == bn) {
    detail::map_blocks<M>(ctx, n, db.data(),
                          [](std::size_t, std::size_t len, M* r, const M* g, const M* v) {
                            for (std::size_t i = 0; i < len; ++i) r[i] = g[i] * v[i];
                          },
                          dy.data(), a.data());
  } else if (bn != 0) {
    using MR = detail::math_t<op::reduction, P, DY, A>;
    const DY* g = dy.data();
    const A* v = a.data();
    detail::sum_rows<MR, detail::accumulate_t<op::reduction, P>>(
        ctx, n / bn, bn, db.data(),
        [g, v](std::size_t i) { return detail::load<MR>(g[i]) * detail::load<MR>(v[i]); });
  }
  detail::binary<M>(ctx, dy, b, da, [](M x, M y) { return x * y; });
}

/// y = max(x, 0) (NaN stays NaN).
template <Policy P, kernel_element X, kernel_element Y, std::size_t N>
void relu(const cpu_context& ctx, const host_tensor<X, N>& x, host_tensor<Y, N>& y) {
  detail::unary<P, detail::relu_fn>("precis::relu", ctx, x, y);
}

/// dx = dy where x > 0, else 0 (the subgradient 0 at x = 0, as PyTorch).
template <Policy P, kernel_element DY, kernel_element X, kernel_element DX, std::size_t N>
void relu_backward(const cpu_context& ctx, const host_tensor<DY, N>& dy, const host_tensor<X, N>& x,
                   host_tensor<DX, N>& dx) {
  detail::unary_backward<P, detail::relu_grad_fn>("precis::relu_backward", ctx, dy, x, dx);
}

/// y = gelu(x), exact (erf) by default or the tanh approximation (see gelu_approximation).
template <Policy P, kernel_element X, kernel_element Y, std::size_t N>
void gelu(const cpu_context& ctx, const host_tensor<X, N>& x, host_tensor<Y, N>& y,
          gelu_approximation approximate = gelu_approximation::none) {
  if (approximate == gelu_approximation::tanh) {
    detail::unary<P, detail::gelu_tanh_fn>("precis::gelu", ctx, x, y);
  } else {
    detail::unary<P, detail::gelu_erf_fn>("precis::gelu", ctx, x, y);
  }
}

/// y = gelu(x) (the exact, erf form) and d = gelu'(x) in one pass, for a training step
/// that keeps d for its backward pass: there dx = dy * d (precis::mul under P, dy float or
/// 16-bit) is gelu_backward's result, bit for bit. The derivative shares |x|, -x^2 / 2 and
/// the erfc with the forward value and adds one exp, so the pass costs less than gelu
/// followed by gelu_backward's recomputation. Meant for float x: with
/// 16-bit inputs gelu and gelu_backward read tables and are cheaper. Needs float math under
/// P (a compile error otherwise); d must not be y; shapes are checked before anything is
/// written.
template <Policy P, kernel_element X, kernel_element Y, std::size_t N>
void gelu_with_derivative(const cpu_context& ctx, const host_tensor<X, N>& x, host_tensor<Y, N>& y,
                          host_tensor<float, N>& d) {
  detail::unary_with_derivative<P, detail::gelu_erf_fn>("precis::gelu_with_derivative", ctx, x,
                                                        y, d);
}

/// dx = dy * gelu'(x), for the same approximation as the forward pass.
template <Policy P, kernel_element DY, kernel_element X, kernel_element DX, std::size_t N>
void gelu_backward(const cpu_context& ctx, const host_tensor<DY, N>& dy, const host_tensor<X, N>& x,
                   host_tensor<DX, N>& dx, gelu_approximation approximate = gelu_approximation::none) {
  if (approximate == gelu_approximation::tanh) {
    detail::unary_backward<P, detail::gelu_tanh_grad_fn>("precis::gelu_backward", ctx, dy, x, dx);
  } else {
    detail::unary_backward<P, detail::gelu_erf_grad_fn>("precis::gelu_backward", ctx, dy, x, dx);
  }
}

/// y = 1 / (1 + exp(-x)).
template <Policy P, kernel_element X, kernel_element Y, std::size_t N>
void sigmoid(const cpu_context& ctx, const host_tensor<X, N>& x, host_tensor<Y, N>& y) {
  detail::unary<P, detail::sigmoid_fn>("precis::sigmoid", ctx, x, y);
}

/// dx = dy * s (1 - s) with s = sigmoid(x) recomputed from x.
template <Policy P, kernel_element DY, kernel_element X, kernel_element DX, std::size_t N>
void sigmoid_backward(const cpu_context& ctx, const host_tensor<DY, N>& dy,
                      const host_tensor<X, N>& x, host_tensor<DX, N>& dx) {
  detail::unary_backward<P, detail::sigmoid_grad_fn>("precis::sigmoid_backward", ctx, dy, x, dx);
}

/// y = tanh(x).
template <Policy P, kernel_element X, kernel_element Y, std::size_t N>
void tanh(const cpu_context& ctx, const host_tensor<X, N>& x, host_tensor<Y, N>& y) {
  detail::unary<P, detail::tanh_fn>("precis::tanh", ctx, x, y);
}

/// dx = dy * (1 - tanh(x)^2), tanh recomputed from x.
template <Policy P, kernel_element DY, kernel_element X, kernel_element DX, std::size_t N>
void tanh_backward(const cpu_context& ctx, const host_tensor<DY, N>& dy, const host_tensor<X, N>& x,
                   host_tensor<DX, N>& dx) {
  detail::unary_backward<P, detail::tanh_grad_fn>("precis::tanh_backward", ctx, dy, x, dx);
}

}  // namespace precis
