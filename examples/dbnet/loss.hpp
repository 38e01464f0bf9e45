// DB's training loss (MhLiao's L1BalanceCELoss) as a loss precis's trainer runs:
//
//     loss = 5 * balanced BCE(P) + 1 * dice(B) + 10 * masked L1(T)
//
//   - balanced BCE with online hard negative mining, on the probability head's logits x
//     (in the with-logits form max(x, 0) - x y + log1p(exp(-|x|)), never the log of a
//     rounded probability): the positives are the shrink map's pixels inside the shrink
//     mask, the negatives the other pixels inside it; at most 3 times as many negatives as
//     positives are kept, the ones with the largest loss (over the whole batch, as the
//     reference takes its top-k), and (sum of the kept terms) / (positives + kept negatives
//     + 1e-6);
//   - the approximate binary map B = 1 / (1 + exp(-k (P - T))), k = 50, P = sigmoid(x),
//     written as every reference implementation writes it, and the dice loss on it:
//     1 - 2 sum(B y m) / (sum(B m) + sum(y m) + 1e-6), y the shrink map, m its mask;
//   - the L1 distance of the threshold head's T to the threshold map inside the threshold
//     mask, divided by the mask's pixel count (0 when the mask is empty).
//
// Two layer tags carry the policies: `db_loss` (op::loss: the three terms and their sums)
// and `binarize` (op::exp: B and its derivative). Under the default rule set both compute
// and accumulate in float whatever the map's storage type; a map that narrows either is a
// compile error (rule fp32_operation) unless it waives the rule. Then every intermediate
// value (each one a tensor of its own in a PyTorch run) is rounded to the waived compute
// type, and every sum is kept in its accumulate type, rounded after every addition as
// precis's accumulators are (a float16 running sum stops growing at 2048 for terms below
// 1; PyTorch's float16 sum adds in float and rounds once). In float16, B's exp overflows to
// infinity for P - T < -0.222, which is every background pixel once P has fallen towards 0
// there and T has risen to at least 0.3; B is 0 and its derivative 0 * inf = NaN. Pixel
// counts (positives, kept negatives, the threshold mask's pixels) are whole numbers in
// every policy, and the BCE's and L1's divisions by them round only their quotients, as in
// the reference.
//
// Results do not depend on the thread count: terms are computed on the context's threads,
// every sum is taken in index order on one.
#pragma once

#include <precis/precis.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

namespace dbnet {

using namespace precis;

/// The loss terms and their sums (op::loss).
struct db_loss : layer<op::loss> {
  static constexpr std::string_view name = "db_loss";
};
/// The binarization B = 1 / (1 + exp(-k (P - T))) (op::exp).
struct binarize : layer<op::exp> {
  static constexpr std::string_view name = "binarize";
};

/// A batch's targets, each [N, 1, H, W] and 0 / 1 apart from the threshold map (labels.hpp's
/// label_maps stacked).
struct targets {
  host_tensor<float, 4> shrink, shrink_mask, thresh, thresh_mask;
};

/// The reference's settings.
struct loss_options {
  double k = 50;               ///< the binarization's steepness
  double negative_ratio = 3;   ///< negatives kept per positive
  double bce_weight = 5, dice_weight = 1, l1_weight = 10;
  double eps = 1e-6;
};

/// The last forward pass's terms (each before its weight) and counts.
struct loss_terms {
  double bce = 0, dice = 0, l1 = 0;
  std::size_t positives = 0, negatives_kept = 0;
};

namespace detail {

/// `v` rounded to type C and read back in the arithmetic type M (identity for double C, and
/// for float C when M is float).
template <class C, class M>
PRECIS_HOST_DEVICE M round_as(M v) {
  if constexpr (std::is_same_v<C, double> || (std::is_same_v<C, float> && std::is_same_v<M, float>)) {
    return v;
  } else {
    return M(C(v));
  }
}

/// An element read in the arithmetic type M.
template <class M, class T>
PRECIS_HOST_DEVICE M load(T v) {
  if constexpr (std::is_arithmetic_v<T>) {
    return M(v);
  } else {
    return M(float(v));
  }
}

/// One pixel's forward values: P = sigmoid(x), e = exp(-k (P - T)), B = 1 / (1 + e) and the
/// BCE-with-logits term, each step rounded to its compute type (CB for the binarization, CL
/// for the loss). The host and the device both compute a pixel with this function.
template <class M>
struct pixel_values {
  M p, e, b, term;
};

/// See pixel_values: x the logit, t the threshold head's T, gt the shrink map's value.
template <class CB, class CL, class M>
PRECIS_HOST_DEVICE pixel_values<M> pixel_forward(M x, M t, M gt, M k) {
  namespace math = precis::detail::math;
  const M p = round_as<CB>(M(1) / (M(1) + math::exp(-x)));
  const M d = round_as<CB>(p - t);
  const M z = round_as<CB>(-k * d);
  const M e = round_as<CB>(math::exp(z));
  const M u = round_as<CB>(M(1) + e);
  return {p, e, round_as<CB>(M(1) / u), round_as<CL>(precis::detail::bce_logits_term(x, gt))};
}

/// One pixel's terms of the dice and L1 sums, each rounded to CL: B y m, B m, y m and
/// |T - t| tm (y the shrink map, m its mask, t the threshold map, tm its mask).
template <class CL, class M>
PRECIS_HOST_DEVICE void pixel_terms(M b, M y, M m, M th, M t, M tm, M out[4]) {
  using precis::detail::mul;
  out[0] = round_as<CL>(mul(mul(b, y), m));
  out[1] = round_as<CL>(mul(b, m));
  out[2] = round_as<CL>(mul(y, m));
  out[3] = round_as<CL>(mul(precis::detail::math::abs(th - t), tm));
}

/// What backward() reads of the forward pass: the BCE's denominator (positives + kept
/// negatives + eps), the dice's intersection and union, the L1's pixel count.
template <class M>
struct loss_scalars {
  M bce_den, inter, union_, l1_count;
};

/// The loss and its three terms from the sums (BCE over the kept pixels, B y m, B m, y m,
/// the L1 terms) and the counts: the reference's formulas, each quotient rounded to CL.
/// Fills `s` for backward(); host and device.
template <class CL, class M>
PRECIS_HOST_DEVICE M finish_loss(const M sums[5], double positives, double kept, double l1_count,
                                 const loss_options& o, loss_scalars<M>& s, M terms[3]) {
  using precis::detail::mul;
  s.bce_den = M(positives + kept + o.eps);
  const M bce = round_as<CL>(sums[0] / s.bce_den);
  s.inter = sums[1];
  s.union_ = round_as<CL>(round_as<CL>(sums[2] + sums[3]) + M(o.eps));
  const M dice = round_as<CL>(M(1) - round_as<CL>(M(2) * s.inter / s.union_));
  s.l1_count = M(l1_count);
  const M l1 = s.l1_count == M(0) ? M(0) : round_as<CL>(sums[4] / s.l1_count);
  terms[0] = bce;
  terms[1] = dice;
  terms[2] = l1;
  return round_as<CL>(mul(M(o.bce_weight), bce) + mul(M(o.dice_weight), dice) + mul(M(o.l1_weight), l1));
}

/// The three gradient scales for loss scale (or dloss) `dloss`.
template <class CL, class M>
struct gradient_scales {
  M bce, dice, l1;
  PRECIS_HOST_DEVICE gradient_scales(M dloss, const loss_scalars<M>& s, const loss_options& o)
      : bce(round_as<CL>(dloss * M(o.bce_weight) / s.bce_den)),
        dice(round_as<CL>(-M(2) * dloss * M(o.dice_weight) / (s.union_ * s.union_))),
        l1(s.l1_count == M(0) ? M(0) : round_as<CL>(dloss * M(o.l1_weight) / s.l1_count)) {}
};

/// One pixel's gradients (before their rounding to the model's types): dx of the logit
/// (the BCE's, where the pixel is kept, plus the binarization's) and dt of T (the L1's
/// minus the binarization's). Each factor is rounded as the forward pass rounded its value;
/// host and device.
template <class CB, class CL, class M>
PRECIS_HOST_DEVICE void pixel_backward(M x, M th, M gt, M m, M t, M tm, bool kept, const pixel_values<M>& v,
                                       const gradient_scales<CL, M>& g, const loss_scalars<M>& s, M k, M& dx,
                                       M& dt) {
  using precis::detail::mul;
  namespace math = precis::detail::math;
  const M sig = M(1) / (M(1) + math::exp(-x));
  const M g_bce = kept ? round_as<CL>(mul(g.bce, sig - gt)) : M(0);
  // dice: d/dB of 1 - 2 I / U is -2 m (y U - I) / U^2.
  const M gb = round_as<CL>(mul(mul(g.dice, m), mul(gt, s.union_) - s.inter));
  // B = 1 / u, u = 1 + e, e = exp(z), z = -k (p - t), p = sigmoid(x).
  const M gu = round_as<CB>(-gb * v.b * v.b);
  const M gz = round_as<CB>(gu * v.e);
  const M gd = round_as<CB>(mul(-k, gz));
  const M gx_bin = round_as<CB>(mul(gd * v.p, M(1) - v.p));
  const M g_l1 = round_as<CL>(mul(mul(g.l1, tm), precis::detail::sign(th - t)));
  dx = g_bce + gx_bin;
  dt = g_l1 - gd;
}

/// Throws precis::error unless P is [N, 1, H, W] (or [N, H, W, 1] from a channels-last model:
/// one channel, so the same values in memory) and not empty, and T and the four target maps
/// have its shape (naming the first that does not).
template <class Shape, class Targets>
void check_shapes(const Shape& shape, const Shape& th, const Targets& t) {
  auto same = [&](std::string_view what, const auto& s) {
    if (s != shape) {
      throw error("dbnet::loss: " + std::string(what) + " has shape " + shape_string(s) + ", P has " +
                  shape_string(shape));
    }
  };
  if ((shape[1] != 1 && shape[3] != 1) || shape[0] * shape[1] * shape[2] * shape[3] == 0) {
    throw error("dbnet::loss: P must be [N, 1, H, W] or [N, H, W, 1] and not empty, is " + shape_string(shape));
  }
  same("T", th);
  same("the shrink map", t.shrink.shape());
  same("the shrink mask", t.shrink_mask.shape());
  same("the threshold map", t.thresh.shape());
  same("the threshold mask", t.thresh_mask.shape());
}

}  // namespace detail

template <Policy LossPolicy, Policy BinPolicy, class Out, class Ctx = cpu_context>
class basic_loss;

/// The types the loss on either context shares: its policies, the (P logits, T) edge it
/// reads and returns gradients for, and the type its value is computed in.
template <Policy LossPolicy, Policy BinPolicy, class SP, class GP, class ST, class GT>
struct loss_types {
  /// The name of the loss's layer in nn::describe.
  static constexpr std::string_view name = "db_loss";
  /// The terms' and sums' policy (tag db_loss).
  using policy_type = LossPolicy;
  /// The binarization's policy (tag binarize).
  using binarize_policy = BinPolicy;
  /// The edge it reads: P's logits and T, each [N, 1, H, W].
  using input_type = nn::values<nn::sig<SP, GP, 4>, nn::sig<ST, GT, 4>>;
  /// The gradients it returns: the same edge.
  using input_grad_type = input_type;
  /// 0: it reads a multi-tensor edge.
  static constexpr std::size_t input_rank = 0;
  /// The type the loss value and every intermediate are computed in.
  using value_type = opmath_t<promote_t<typename LossPolicy::compute_type, typename BinPolicy::compute_type>>;
};

/// DB's loss under `LossPolicy` (the terms) and `BinPolicy` (the binarization), reading a
/// model's (P logits, T) edge. Use loss_t<Map, Model>.
template <Policy LossPolicy, Policy BinPolicy, class SP, class GP, class ST, class GT>
class basic_loss<LossPolicy, BinPolicy, nn::values<nn::sig<SP, GP, 4>, nn::sig<ST, GT, 4>>, cpu_context>
    : public loss_types<LossPolicy, BinPolicy, SP, GP, ST, GT> {
  using CL = typename LossPolicy::compute_type;
  using AL = typename LossPolicy::accumulate_type;
  using CB = typename BinPolicy::compute_type;
  using M = typename loss_types<LossPolicy, BinPolicy, SP, GP, ST, GT>::value_type;

 public:
  /// The targets: the four maps on the host.
  using target_tensor = targets;
  /// The gradients backward() returns.
  using grad_tuple = std::tuple<const host_tensor<GP, 4>*, const host_tensor<GT, 4>*>;

  explicit basic_loss(loss_options o = {}) : o_(o) {
    if (!(o.k > 0) || !(o.negative_ratio >= 0 && o.negative_ratio <= 1e6) || !(o.eps > 0) ||
        !std::isfinite(o.k + o.eps)) {
      throw error("dbnet::loss: k and eps must be positive and finite, negative_ratio in [0, 1e6]");
    }
  }

  /// The loss of (P logits, T) against `t`. Throws precis::error on shapes that differ.
  M forward(const cpu_context& ctx, const std::tuple<const host_tensor<SP, 4>*, const host_tensor<ST, 4>*>& y,
            const targets& t) {
    x_ = std::get<0>(y);
    th_ = std::get<1>(y);
    t_ = &t;
    check(*x_, *th_, t);
    const std::size_t n = x_->size();
    const SP* x = x_->data();
    const ST* th = th_->data();
    const float* gt = t.shrink.data();
    const float* gm = t.shrink_mask.data();
    const float* tm = t.thresh.data();
    const float* tmask = t.thresh_mask.data();
    p_.resize(n);
    e_.resize(n);
    b_.resize(n);
    term_.resize(n);
    keep_.assign(n, 0);
    const M k = M(o_.k);
    precis::detail::parallel_for(ctx, n, std::size_t(1) << 14, [&](std::size_t lo, std::size_t hi) {
      for (std::size_t i = lo; i < hi; ++i) {
        const auto v = detail::pixel_forward<CB, CL>(detail::load<M>(x[i]), detail::load<M>(th[i]), M(gt[i]), k);
        p_[i] = v.p;
        e_[i] = v.e;
        b_[i] = v.b;
        term_[i] = v.term;
      }
    });
    // Balanced BCE: positives and the hardest negatives.
    std::size_t positives = 0, negatives = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const bool in = gm[i] != 0.0F;
      positives += in && gt[i] != 0.0F ? 1U : 0U;
      negatives += in && gt[i] == 0.0F ? 1U : 0U;
    }
    const auto limit = static_cast<std::size_t>(double(positives) * o_.negative_ratio);
    kept_ = std::min(negatives, limit);
    select_negatives(gt, gm);
    accumulator<AL> sums[5];  // the kept BCE terms, B y m, B m, y m, the L1 terms
    std::size_t l1_count = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const bool in = gm[i] != 0.0F;
      if (in && (gt[i] != 0.0F || keep_[i] != 0)) {
        keep_[i] = 1;
        sums[0].add(term_[i]);
      }
      M parts[4];
      detail::pixel_terms<CL>(b_[i], M(gt[i]), M(gm[i]), detail::load<M>(th[i]), M(tm[i]), M(tmask[i]), parts);
      for (int j = 0; j < 4; ++j) sums[j + 1].add(parts[j]);
      l1_count += tmask[i] != 0.0F ? 1U : 0U;
    }
    const M totals[5] = {M(sums[0].value()), M(sums[1].value()), M(sums[2].value()), M(sums[3].value()),
                         M(sums[4].value())};
    M terms[3];
    const M loss = detail::finish_loss<CL>(totals, double(positives), double(kept_), double(l1_count), o_, scalars_, terms);
    terms_ = {double(terms[0]), double(terms[1]), double(terms[2]), positives, kept_};
    return loss;
  }

  /// The gradients of dloss * loss with respect to P logits and T (pass the loss scale as
  /// dloss when scaling), each element rounded once to the model's gradient types.
  grad_tuple backward(const cpu_context& ctx, double dloss = 1.0) {
    if (x_ == nullptr) throw error("dbnet::loss::backward: no forward pass to differentiate");
    dx_.resize(x_->shape());
    dt_.resize(th_->shape());
    const std::size_t n = x_->size();
    const SP* x = x_->data();
    const ST* th = th_->data();
    const float* gt = t_->shrink.data();
    const float* gm = t_->shrink_mask.data();
    const float* tm = t_->thresh.data();
    const float* tmask = t_->thresh_mask.data();
    const M k = M(o_.k);
    const detail::gradient_scales<CL, M> g(M(dloss), scalars_, o_);
    GP* dx = dx_.data();
    GT* dt = dt_.data();
    precis::detail::parallel_for(ctx, n, std::size_t(1) << 14, [&](std::size_t lo, std::size_t hi) {
      for (std::size_t i = lo; i < hi; ++i) {
        M gx, gt_;
        detail::pixel_backward<CB, CL>(detail::load<M>(x[i]), detail::load<M>(th[i]), M(gt[i]), M(gm[i]), M(tm[i]),
                                       M(tmask[i]), keep_[i] != 0, {p_[i], e_[i], b_[i], term_[i]}, g, scalars_, k,
                                       gx, gt_);
        dx[i] = round_to<GP>(gx);
        dt[i] = round_to<GT>(gt_);
      }
    });
    return {&dx_, &dt_};
  }

  /// The last forward pass's terms.
  const loss_terms& terms() const { return terms_; }
  /// B of the last forward pass (float), for pictures and tests.
  const std::vector<M>& binary_map() const { return b_; }
  /// Which pixels the last forward pass's BCE took (1: a positive or a kept negative).
  const std::vector<std::uint8_t>& kept() const { return keep_; }
  std::string shape() const { return "-"; }
  /// Bytes of the buffers it keeps between forward and backward.
  std::size_t own_bytes() const {
    return (p_.capacity() + e_.capacity() + b_.capacity() + term_.capacity()) * sizeof(M) + keep_.capacity() +
           dx_.size() * sizeof(GP) + dt_.size() * sizeof(GT);
  }

 private:
  static void check(const host_tensor<SP, 4>& x, const host_tensor<ST, 4>& th, const targets& t) {
    detail::check_shapes(x.shape(), th.shape(), t);
  }

  /// Marks in keep_ the kept_ negatives with the largest terms (NaN counting as the
  /// largest, as torch.topk does; among equal terms the first in index order).
  void select_negatives(const float* gt, const float* gm) {
    const std::size_t n = term_.size();
    auto key = [&](std::size_t i) { return std::isnan(term_[i]) ? M(INFINITY) : term_[i]; };
    if (kept_ == 0) return;
    std::vector<M> keys;
    keys.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      if (gm[i] != 0.0F && gt[i] == 0.0F) keys.push_back(key(i));
    }
    std::nth_element(keys.begin(), keys.begin() + std::ptrdiff_t(kept_ - 1), keys.end(), std::greater<M>());
    const M cut = keys[kept_ - 1];
    std::size_t above = 0;
    for (const M v : keys) above += v > cut ? 1U : 0U;
    std::size_t at_cut = kept_ - above;
    for (std::size_t i = 0; i < n; ++i) {
      if (gm[i] == 0.0F || gt[i] != 0.0F) continue;
      const M v = key(i);
      if (v > cut) {
        keep_[i] = 1;
      } else if (v == cut && at_cut > 0) {
        keep_[i] = 1;
        --at_cut;
      }
    }
  }

  loss_options o_;
  const host_tensor<SP, 4>* x_ = nullptr;
  const host_tensor<ST, 4>* th_ = nullptr;
  const targets* t_ = nullptr;
  std::vector<M> p_, e_, b_, term_;
  std::vector<std::uint8_t> keep_;
  std::size_t kept_ = 0;
  detail::loss_scalars<M> scalars_{1, 0, 1, 0};
  loss_terms terms_;
  host_tensor<GP, 4> dx_;
  host_tensor<GT, 4> dt_;
};

/// DB's loss for a model built from `Map`: the terms under the policy the map gives
/// db_loss, the binarization under the one it gives binarize (both op kinds of the fp32
/// rule), reading `Model`'s output edge.
template <class Map, class Model>
using loss_t = basic_loss<policy_for_t<db_loss, Map>, policy_for_t<binarize, Map>, typename Model::output_type,
                          typename Model::context_type>;

}  // namespace dbnet
