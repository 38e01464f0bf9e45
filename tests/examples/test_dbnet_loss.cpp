// The DBNet example's loss (examples/dbnet/loss.hpp) against a plain double-precision
// implementation of MhLiao's L1BalanceCELoss written here (hard negatives by a full sort),
// its gradients against central differences of the loss itself (under a double policy),
// the hard-negative counts, the float16 binarization's overflow under a waived policy, and
// thread-count independence.
#include "../../examples/dbnet/loss.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <tuple>
#include <vector>

using namespace precis;

namespace {

using f32_sig = nn::values<nn::sig<float, float, 4>, nn::sig<float, float, 4>>;
using f64_sig = nn::values<nn::sig<double, double, 4>, nn::sig<double, double, 4>>;
using f64_policy = policy<double, double, double, double, double>;
using f32_loss = dbnet::basic_loss<presets::fp32, presets::fp32, f32_sig>;
using f64_loss = dbnet::basic_loss<f64_policy, f64_policy, f64_sig>;

std::uint64_t next(std::uint64_t& s) {
  s += 0x9E3779B97F4A7C15ULL;
  std::uint64_t z = s;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}
double uniform(std::uint64_t& s) { return double(next(s) >> 11) * 0x1.0p-53; }

/// Random logits, thresholds and targets on [n, 1, h, w]: text in a few boxes.
struct batch {
  host_tensor<double, 4> x, t;
  dbnet::targets y;
};

batch make_batch(std::size_t n, std::size_t h, std::size_t w, std::uint64_t seed, double text = 0.2) {
  batch b;
  const std::array<std::size_t, 4> shape{n, 1, h, w};
  b.x.resize(shape);
  b.t.resize(shape);
  for (auto* m : {&b.y.shrink, &b.y.shrink_mask, &b.y.thresh, &b.y.thresh_mask}) m->resize(shape);
  for (std::size_t i = 0; i < b.x.size(); ++i) {
    b.x.data()[i] = 8.0 * uniform(seed) - 4.0;
    b.t.data()[i] = 0.2 + 0.6 * uniform(seed);
    b.y.shrink.data()[i] = uniform(seed) < text ? 1.0F : 0.0F;
    b.y.shrink_mask.data()[i] = uniform(seed) < 0.9 ? 1.0F : 0.0F;
    b.y.thresh.data()[i] = float(0.3 + 0.4 * uniform(seed));
    b.y.thresh_mask.data()[i] = uniform(seed) < 0.5 ? 1.0F : 0.0F;
  }
  return b;
}

template <class T>
host_tensor<T, 4> as(const host_tensor<double, 4>& a) {
  host_tensor<T, 4> r(a.shape());
  for (std::size_t i = 0; i < a.size(); ++i) r.data()[i] = T(a.data()[i]);
  return r;
}

/// MhLiao's L1BalanceCELoss in double: BCE on sigmoid(x) (the with-logits form of the same
/// value), hard negatives by sorting, dice on 1 / (1 + exp(-50 (P - T))), masked L1.
double reference_loss(const host_tensor<double, 4>& x, const host_tensor<double, 4>& t, const dbnet::targets& y) {
  const std::size_t n = x.size();
  std::vector<double> neg;
  double pos_sum = 0;
  std::size_t pos = 0;
  double inter = 0, bm = 0, ym = 0, l1 = 0, l1m = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double xi = x.data()[i], g = y.shrink.data()[i], m = y.shrink_mask.data()[i];
    const double p = 1.0 / (1.0 + std::exp(-xi));
    const double bce = -(g * std::log(p) + (1 - g) * std::log1p(-p));
    if (m != 0 && g != 0) {
      pos_sum += bce;
      ++pos;
    }
    if (m != 0 && g == 0) neg.push_back(bce);
    const double b = 1.0 / (1.0 + std::exp(-50.0 * (p - t.data()[i])));
    inter += b * g * m;
    bm += b * m;
    ym += g * m;
    l1 += std::abs(t.data()[i] - double(y.thresh.data()[i])) * y.thresh_mask.data()[i];
    l1m += y.thresh_mask.data()[i];
  }
  std::sort(neg.begin(), neg.end(), std::greater<>());
  const std::size_t kept = std::min(neg.size(), std::size_t(double(pos) * 3.0));
  const double neg_sum = std::accumulate(neg.begin(), neg.begin() + std::ptrdiff_t(kept), 0.0);
  const double balance = (pos_sum + neg_sum) / (double(pos + kept) + 1e-6);
  const double dice = 1.0 - 2.0 * inter / (bm + ym + 1e-6);
  const double l1_loss = l1m == 0 ? 0.0 : l1 / l1m;
  return 5.0 * balance + dice + 10.0 * l1_loss;
}

const cpu_context one{1}, two{2};

}  // namespace

TEST_CASE("the loss against MhLiao's definition written in double") {
  for (std::uint64_t seed : {1ULL, 2ULL, 3ULL}) {
    const auto b = make_batch(2, 16, 24, seed);
    const auto xf = as<float>(b.x), tf = as<float>(b.t);
    // The reference reads the float inputs, so only the loss's arithmetic differs.
    const double want = reference_loss(as<double>(xf), as<double>(tf), b.y);
    f32_loss loss;
    const double got = loss.forward(two, std::tuple{&xf, &tf}, b.y);
    CHECK(got == doctest::Approx(want).epsilon(2e-6));
    f64_loss loss64;
    CHECK(double(loss64.forward(two, std::tuple{&b.x, &b.t}, b.y)) ==
          doctest::Approx(reference_loss(b.x, b.t, b.y)).epsilon(1e-13));
  }
}

TEST_CASE("hard negatives: at most three per positive, the largest terms") {
  auto b = make_batch(1, 10, 10, 7, 0.0);
  for (std::size_t i = 0; i < b.x.size(); ++i) b.y.shrink_mask.data()[i] = 1.0F;
  for (std::size_t i = 0; i < 5; ++i) b.y.shrink.data()[i * 7] = 1.0F;
  f64_loss loss;
  (void)loss.forward(one, std::tuple{&b.x, &b.t}, b.y);
  CHECK(loss.terms().positives == 5);
  CHECK(loss.terms().negatives_kept == 15);
  // With every pixel positive but 4, all 4 negatives are kept.
  for (std::size_t i = 0; i < b.x.size(); ++i) b.y.shrink.data()[i] = i < 96 ? 1.0F : 0.0F;
  (void)loss.forward(one, std::tuple{&b.x, &b.t}, b.y);
  CHECK(loss.terms().positives == 96);
  CHECK(loss.terms().negatives_kept == 4);
  // No positives: no BCE term at all.
  for (std::size_t i = 0; i < b.x.size(); ++i) b.y.shrink.data()[i] = 0.0F;
  (void)loss.forward(one, std::tuple{&b.x, &b.t}, b.y);
  CHECK(loss.terms().negatives_kept == 0);
  CHECK(loss.terms().bce == 0.0);
}

TEST_CASE("gradients against central differences (double policy)") {
  auto b = make_batch(2, 6, 8, 11);
  const double scale = 4.0;
  f64_loss loss;
  (void)loss.forward(one, std::tuple{&b.x, &b.t}, b.y);
  const auto [dx, dt] = loss.backward(one, scale);
  auto value = [&] { return double(loss.forward(one, std::tuple{&b.x, &b.t}, b.y)); };
  double worst = 0;
  for (auto [v, g] : {std::pair{&b.x, dx}, std::pair{&b.t, dt}}) {
    for (std::size_t i = 0; i < v->size(); i += 3) {
      double& e = v->data()[i];
      const double keep = e, hstep = 1e-6;
      e = keep + hstep;
      const double up = value();
      e = keep - hstep;
      const double down = value();
      e = keep;
      const double numeric = scale * (up - down) / (2 * hstep);
      worst = std::max(worst, std::abs(numeric - g->data()[i]) / (1.0 + std::abs(numeric)));
    }
  }
  CHECK(worst < 1e-6);
}

TEST_CASE("float16 binarization (waived): exp overflows on the background, its gradient is NaN") {
  using half_waived = unsafe<policy<float16, float16, float16, float, float16>, rule::fp32_operation>;
  using sig16 = nn::values<nn::sig<float16, float16, 4>, nn::sig<float16, float16, 4>>;
  using seed_loss = dbnet::basic_loss<half_waived, half_waived, sig16>;
  using safe_loss = dbnet::basic_loss<kernel_policy_t<op::loss, presets::fp16_mixed>,
                                      kernel_policy_t<op::exp, presets::fp16_mixed>, sig16>;
  auto b = make_batch(1, 4, 4, 5);
  // One background pixel: P ~ 0.018 (x = -4), T = 0.5: -50 (P - T) = 24 > log(65504).
  b.x.data()[0] = -4.0;
  b.t.data()[0] = 0.5;
  b.y.shrink.data()[0] = 0.0F;
  b.y.shrink_mask.data()[0] = 1.0F;
  const auto x = as<float16>(b.x), t = as<float16>(b.t);
  seed_loss narrow;
  (void)narrow.forward(one, std::tuple{&x, &t}, b.y);
  CHECK(narrow.binary_map()[0] == 0.0F);
  const auto [dx16, dt16] = narrow.backward(one);
  CHECK(std::isnan(float(dx16->data()[0])));
  CHECK(std::isnan(float(dt16->data()[0])));
  safe_loss safe;
  (void)safe.forward(one, std::tuple{&x, &t}, b.y);
  CHECK(safe.binary_map()[0] > 0.0F);
  CHECK(safe.binary_map()[0] < 1e-9F);
  const auto [dx, dt] = safe.backward(one);
  for (std::size_t i = 0; i < dx->size(); ++i) {
    CHECK(std::isfinite(float(dx->data()[i])));
    CHECK(std::isfinite(float(dt->data()[i])));
  }
}

TEST_CASE("the same bits on one thread and two") {
  const auto b = make_batch(2, 64, 96, 21);
  const auto x = as<float>(b.x), t = as<float>(b.t);
  f32_loss l1, l2;
  const float v1 = l1.forward(one, std::tuple{&x, &t}, b.y), v2 = l2.forward(two, std::tuple{&x, &t}, b.y);
  CHECK(v1 == v2);
  const auto g1 = l1.backward(one, 128.0), g2 = l2.backward(two, 128.0);
  for (std::size_t i = 0; i < x.size(); ++i) {
    REQUIRE(std::get<0>(g1)->data()[i] == std::get<0>(g2)->data()[i]);
    REQUIRE(std::get<1>(g1)->data()[i] == std::get<1>(g2)->data()[i]);
  }
}

TEST_CASE("shapes and options are checked") {
  auto b = make_batch(1, 4, 4, 3);
  const auto x = as<float>(b.x);
  const host_tensor<float, 4> t({1, 1, 4, 5});
  f32_loss loss;
  CHECK_THROWS_AS((void)loss.forward(one, std::tuple{&x, &t}, b.y), error);
  b.y.thresh_mask.resize({1, 1, 2, 2});
  const auto t_ok = as<float>(b.t);
  CHECK_THROWS_AS((void)loss.forward(one, std::tuple{&x, &t_ok}, b.y), error);
  CHECK_THROWS_AS(f32_loss({.k = 0}), error);
  CHECK_THROWS_AS(f32_loss({.negative_ratio = -1}), error);
  CHECK_THROWS_AS(f32_loss({.negative_ratio = 1e300}), error);
  f32_loss fresh;
  CHECK_THROWS_AS((void)fresh.backward(one), error);
}
