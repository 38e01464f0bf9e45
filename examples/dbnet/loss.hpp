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
M round_as(M v) {
  if constexpr (std::is_same_v<C, double> || (std::is_same_v<C, float> && std::is_same_v<M, float>)) {
    return v;
  } else {
    return M(C(v));
  }
}

/// An element read in the arithmetic type M.
template <class M, class T>
M load(T v) {
  if constexpr (std::is_arithmetic_v<T>) {
    return M(v);
  } else {
    return M(float(v));
  }
}

}  // namespace detail

template <Policy LossPolicy, Policy BinPolicy, class Out>
class basic_loss;

/// DB's loss under `LossPolicy` (the terms) and `BinPolicy` (the binarization), reading a
/// model's (P logits, T) edge. Use loss_t<Map, Model>.
template <Policy LossPolicy, Policy BinPolicy, class SP, class GP, class ST, class GT>
class basic_loss<LossPolicy, BinPolicy, nn::values<nn::sig<SP, GP, 4>, nn::sig<ST, GT, 4>>> {
  using CL = typename LossPolicy::compute_type;
  using AL = typename LossPolicy::accumulate_type;
  using CB = typename BinPolicy::compute_type;
  using M = opmath_t<promote_t<CL, CB>>;

 public:
  static constexpr std::string_view name = "db_loss";
  using policy_type = LossPolicy;
  using binarize_policy = BinPolicy;
  using input_type = nn::values<nn::sig<SP, GP, 4>, nn::sig<ST, GT, 4>>;
  using input_grad_type = input_type;
  static constexpr std::size_t input_rank = 0;
  using target_tensor = targets;
  using value_type = M;
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
        const M xi = detail::load<M>(x[i]);
        // The binarization, each step rounded to its compute type.
        const M p = detail::round_as<CB>(M(1) / (M(1) + std::exp(-xi)));
        const M d = detail::round_as<CB>(p - detail::load<M>(th[i]));
        const M z = detail::round_as<CB>(-k * d);
        const M e = detail::round_as<CB>(std::exp(z));
        const M u = detail::round_as<CB>(M(1) + e);
        p_[i] = p;
        e_[i] = e;
        b_[i] = detail::round_as<CB>(M(1) / u);
        term_[i] = detail::round_as<CL>(precis::detail::bce_logits_term(xi, M(gt[i])));
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
    accumulator<AL> bce_sum, inter, bm, ym, l1_sum;
    std::size_t l1_count = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const bool in = gm[i] != 0.0F;
      if (in && (gt[i] != 0.0F || keep_[i] != 0)) {
        keep_[i] = 1;
        bce_sum.add(term_[i]);
      }
      const M m = M(gm[i]), y1 = M(gt[i]);
      inter.add(detail::round_as<CL>(b_[i] * y1 * m));
      bm.add(detail::round_as<CL>(b_[i] * m));
      ym.add(detail::round_as<CL>(y1 * m));
      l1_sum.add(detail::round_as<CL>(std::abs(detail::load<M>(th[i]) - M(tm[i])) * M(tmask[i])));
      l1_count += tmask[i] != 0.0F ? 1U : 0U;
    }
    bce_den_ = M(double(positives + kept_) + o_.eps);
    const M bce = detail::round_as<CL>(M(bce_sum.value()) / bce_den_);
    inter_ = M(inter.value());
    union_ = detail::round_as<CL>(detail::round_as<CL>(M(bm.value()) + M(ym.value())) + M(o_.eps));
    const M dice = detail::round_as<CL>(M(1) - detail::round_as<CL>(M(2) * inter_ / union_));
    l1_count_ = M(double(l1_count));
    const M l1 = l1_count_ == M(0) ? M(0) : detail::round_as<CL>(M(l1_sum.value()) / l1_count_);
    terms_ = {double(bce), double(dice), double(l1), positives, kept_};
    return detail::round_as<CL>(M(o_.bce_weight) * bce + M(o_.dice_weight) * dice + M(o_.l1_weight) * l1);
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
    const M s = M(dloss), k = M(o_.k);
    const M bce_scale = detail::round_as<CL>(s * M(o_.bce_weight) / bce_den_);
    const M dice_scale = detail::round_as<CL>(-M(2) * s * M(o_.dice_weight) / (union_ * union_));
    const M l1_scale = l1_count_ == M(0) ? M(0) : detail::round_as<CL>(s * M(o_.l1_weight) / l1_count_);
    GP* dx = dx_.data();
    GT* dt = dt_.data();
    precis::detail::parallel_for(ctx, n, std::size_t(1) << 14, [&](std::size_t lo, std::size_t hi) {
      for (std::size_t i = lo; i < hi; ++i) {
        const M xi = detail::load<M>(x[i]);
        const M sig = M(1) / (M(1) + std::exp(-xi));
        const M g_bce = keep_[i] != 0 ? detail::round_as<CL>(bce_scale * (sig - M(gt[i]))) : M(0);
        // dice: d/dB of 1 - 2 I / U is -2 m (y U - I) / U^2.
        const M m = M(gm[i]);
        const M gb = detail::round_as<CL>(dice_scale * m * (M(gt[i]) * union_ - inter_));
        // B = 1 / u, u = 1 + e, e = exp(z), z = -k (p - t), p = sigmoid(x): each factor
        // rounded as the forward pass rounded its value.
        const M b = b_[i], p = p_[i];
        const M gu = detail::round_as<CB>(-gb * b * b);
        const M gz = detail::round_as<CB>(gu * e_[i]);
        const M gd = detail::round_as<CB>(-k * gz);
        const M gx_bin = detail::round_as<CB>(gd * p * (M(1) - p));
        const M th_i = detail::load<M>(th[i]);
        const M g_l1 = detail::round_as<CL>(l1_scale * M(tmask[i]) * precis::detail::sign(th_i - M(tm[i])));
        dx[i] = round_to<GP>(g_bce + gx_bin);
        dt[i] = round_to<GT>(g_l1 - gd);
      }
    });
    return {&dx_, &dt_};
  }

  /// The last forward pass's terms.
  const loss_terms& terms() const { return terms_; }
  /// B of the last forward pass (float), for pictures and tests.
  const std::vector<M>& binary_map() const { return b_; }
  std::string shape() const { return "-"; }
  /// Bytes of the buffers it keeps between forward and backward.
  std::size_t own_bytes() const {
    return (p_.capacity() + e_.capacity() + b_.capacity() + term_.capacity()) * sizeof(M) + keep_.capacity() +
           dx_.size() * sizeof(GP) + dt_.size() * sizeof(GT);
  }

 private:
  static void check(const host_tensor<SP, 4>& x, const host_tensor<ST, 4>& th, const targets& t) {
    const auto shape = x.shape();
    auto same = [&](std::string_view what, const auto& s) {
      if (s != shape) {
        throw error("dbnet::loss: " + std::string(what) + " has shape " + shape_string(s) + ", P has " +
                    shape_string(shape));
      }
    };
    if (shape[1] != 1 || x.size() == 0) throw error("dbnet::loss: P must be [N, 1, H, W] and not empty, is " + shape_string(shape));
    same("T", th.shape());
    same("the shrink map", t.shrink.shape());
    same("the shrink mask", t.shrink_mask.shape());
    same("the threshold map", t.thresh.shape());
    same("the threshold mask", t.thresh_mask.shape());
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
  M bce_den_ = 1, inter_ = 0, union_ = 1, l1_count_ = 0;
  loss_terms terms_;
  host_tensor<GP, 4> dx_;
  host_tensor<GT, 4> dt_;
};

/// DB's loss for a model built from `Map`: the terms under the policy the map gives
/// db_loss, the binarization under the one it gives binarize (both op kinds of the fp32
/// rule), reading `Model`'s output edge.
template <class Map, class Model>
using loss_t = basic_loss<policy_for_t<db_loss, Map>, policy_for_t<binarize, Map>, typename Model::output_type>;

}  // namespace dbnet
