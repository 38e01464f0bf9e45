/// @file
/// The per-element updates of SGD and AdamW, written once for the host and the device: the
/// host optimizers (precis::sgd, precis::adamw) apply them to SIMD vectors of floats, a
/// device optimizer applies them to one float per thread, and both give the same bits.
///
/// An update is written in three operations of a `Math` type, besides IEEE addition,
/// subtraction and division: `fma(a, b, c)` (one rounding), `mul(a, b)` (a product rounded
/// on its own, never fused into the addition it feeds) and `sqrt(a)` (correctly rounded).
/// precis::scalar_update_math provides them for float on the host (std::fma, an unfused
/// product, std::sqrt) and in device code (__fmaf_rn, __fmul_rn, __fsqrt_rn); the host
/// optimizers provide them for their vectors. The constants of a step are formed in double
/// from the options and rounded to float once, as PyTorch's kernels take them
/// (make_adamw_constants, make_sgd_constants: host code, since they call std::pow).
#pragma once

#include <precis/config.hpp>
#include <precis/numeric/detail/unfused.hpp>

#include <cmath>
#include <cstdint>

namespace precis {

/// Options of sgd: PyTorch's SGD, whose hyperparameters are doubles (Python floats).
struct sgd_options {
  double lr = 0.01;           ///< the learning rate
  double momentum = 0.0;      ///< the momentum factor (0: none)
  double dampening = 0.0;     ///< the gradient's weight in the momentum buffer is 1 - dampening
  double weight_decay = 0.0;  ///< L2 penalty added to the gradient
  bool nesterov = false;      ///< Nesterov momentum (needs momentum and no dampening)
};

/// Options of adamw: PyTorch's AdamW defaults, doubles as PyTorch's hyperparameters are.
struct adamw_options {
  double lr = 1e-3;            ///< the learning rate
  double beta1 = 0.9;          ///< decay rate of the first moment (the gradients' mean)
  double beta2 = 0.999;        ///< decay rate of the second moment (the squared gradients' mean)
  double eps = 1e-8;           ///< added to the bias-corrected sqrt(v)
  double weight_decay = 0.01;  ///< decoupled: w *= 1 - lr * weight_decay
};

/// The operations of an update on single floats: on the host std::fma, a product through
/// detail::mul (which the compiler cannot contract into an FMA) and std::sqrt; in device code
/// the round-to-nearest intrinsics, which nvcc does not contract either. Both are IEEE
/// operations rounded once, so host and device give the same bits.
struct scalar_update_math {
  /// a * b + c, rounded once.
  PRECIS_HOST_DEVICE static float fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
    return __fmaf_rn(a, b, c);
#else
    return std::fma(a, b, c);
#endif
  }
  /// a * b, rounded, never fused into the addition it feeds.
  PRECIS_HOST_DEVICE static float mul(float a, float b) { return detail::mul(a, b); }
  /// The square root, correctly rounded.
  PRECIS_HOST_DEVICE static float sqrt(float a) {
#if defined(__CUDA_ARCH__)
    return __fsqrt_rn(a);
#else
    return std::sqrt(a);
#endif
  }
};

/// The constants of one SGD step, each rounded to float from the double options (V: float,
/// or the host's SIMD vector of them).
template <class V>
struct sgd_constants {
  V momentum;          ///< the momentum factor
  V kept;              ///< 1 - dampening: the gradient's weight in the momentum buffer
  V minus_lr;          ///< -lr
  V weight_decay;      ///< the L2 factor added to the gradient
  bool first;          ///< the first step: the momentum buffer starts as the gradient
  bool with_momentum;  ///< momentum != 0: the buffer is read and written
  bool nesterov;       ///< Nesterov momentum
};

/// SGD's constants for options `o`; `first` for the optimizer's first step. Host code.
inline sgd_constants<float> make_sgd_constants(const sgd_options& o, bool first) {
  return {static_cast<float>(o.momentum), static_cast<float>(1.0 - o.dampening),
          static_cast<float>(-o.lr),      static_cast<float>(o.weight_decay),
          first,                          o.momentum != 0.0,
          o.nesterov};
}

/// One SGD update of a weight `w` (and its momentum buffer `b`) from the gradient `g`, in
/// PyTorch's order:
///   d = fma(w, weight_decay, g)                          (where `decays`)
///   b = d on the first step, else fma(d, 1 - dampening, b * momentum)
///   d = nesterov ? fma(b, momentum, d) : b               (with momentum)
///   w = fma(d, -lr, w)
/// `b` is read only with momentum after the first step, and written only with momentum.
template <class Math, class V>
PRECIS_HOST_DEVICE void sgd_update(V& w, V& b, V g, const sgd_constants<V>& c, bool decays) {
  V d = g;
  if (decays) d = Math::fma(w, c.weight_decay, d);
  if (c.with_momentum) {
    b = c.first ? d : Math::fma(d, c.kept, Math::mul(b, c.momentum));
    d = c.nesterov ? Math::fma(b, c.momentum, d) : b;
  }
  w = Math::fma(d, c.minus_lr, w);
}

/// The constants of AdamW's step t (counting applied steps from 1), each formed in double from
/// the options and rounded to float (V: float, or the host's SIMD vector of them).
template <class V>
struct adamw_constants {
  V keep;             ///< 1 - lr * weight_decay, the decoupled decay's factor
  V lerp;             ///< the weight of PyTorch's lerp(m, g, 1 - beta1) in the form it takes
  V beta2;            ///< beta2
  V one_minus_beta2;  ///< 1 - beta2
  V step_size;        ///< -lr / (1 - beta1^t)
  V bias2_sqrt;       ///< sqrt(1 - beta2^t)
  V eps;              ///< eps
  /// |1 - beta1| < 0.5: the lerp is fma(w, g - m, m); otherwise fma(w - 1, g - m, g), as
  /// PyTorch's lerp switches form.
  bool small_weight;
};

/// AdamW's constants for options `o` at step `t` (>= 1). Host code (std::pow in double).
inline adamw_constants<float> make_adamw_constants(const adamw_options& o, std::uint64_t t) {
  const float lerp_weight = static_cast<float>(1.0 - o.beta1);
  const bool small_weight = std::fabs(lerp_weight) < 0.5f;
  return {static_cast<float>(1.0 - detail::mul(o.lr, o.weight_decay)),
          small_weight ? lerp_weight : lerp_weight - 1.0f,
          static_cast<float>(o.beta2),
          static_cast<float>(1.0 - o.beta2),
          static_cast<float>(-(o.lr / (1.0 - std::pow(o.beta1, double(t))))),
          static_cast<float>(std::pow(1.0 - std::pow(o.beta2, double(t)), 0.5)),
          static_cast<float>(o.eps),
          small_weight};
}

/// One AdamW update of a weight `w` and its moments `m`, `v` from the gradient `g`, in
/// PyTorch's order:
///   w = w * (1 - lr * weight_decay)                      (where `decays`; rounded on its own,
///                                                         as PyTorch's separate pass is)
///   m = lerp(m, g, 1 - beta1)
///   v = fma((1 - beta2) * g, g, v * beta2)
///   w = w + (-lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
template <class Math, class V>
PRECIS_HOST_DEVICE void adamw_update(V& w, V& m, V& v, V g, const adamw_constants<V>& c,
                                     bool decays) {
  if (decays) w = Math::mul(w, c.keep);
  m = Math::fma(c.lerp, g - m, c.small_weight ? m : g);
  v = Math::fma(Math::mul(c.one_minus_beta2, g), g, Math::mul(v, c.beta2));
  const V denom = Math::sqrt(v) / c.bias2_sqrt + c.eps;
  w = w + Math::mul(c.step_size, m) / denom;
}

}  // namespace precis
