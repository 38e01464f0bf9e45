// SGD and AdamW against float64 transcriptions of PyTorch's update rules, skipped steps,
// the schedule, and checkpoints of optimizer state.
#include <precis/optim/optim.hpp>
#include <precis/scaling/scaling.hpp>

#include "random.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <span>
#include <vector>

namespace {

using precis::bfloat16;
using precis_test::rng;

std::vector<float> random_floats(std::size_t n, float sd) {
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng());
  return v;
}

}  // namespace

TEST_CASE("sgd with momentum follows PyTorch's rule (float64 reference)") {
  for (bool nesterov : {false, true}) {
    std::vector<float> w = random_floats(37, 1.0f), b = random_floats(5, 1.0f);
    std::vector<double> rw(w.begin(), w.end()), rb(b.begin(), b.end());
    std::vector<double> vw(w.size()), vb(b.size());
    precis::sgd_options o{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01, .nesterov = nesterov};
    precis::sgd opt({std::span<float>(w), std::span<float>(b)}, o);
    for (int t = 0; t < 6; ++t) {
      std::vector<std::vector<float>> g{random_floats(w.size(), 0.3f), random_floats(b.size(), 0.3f)};
      auto ref = [&](std::vector<double>& p, std::vector<double>& v, const std::vector<float>& gr) {
        for (std::size_t k = 0; k < p.size(); ++k) {
          double d = double(gr[k]) + 0.01 * p[k];
          v[k] = t == 0 ? d : 0.9 * v[k] + d;
          d = nesterov ? d + 0.9 * v[k] : v[k];
          p[k] -= 0.05 * d;
        }
      };
      ref(rw, vw, g[0]);
      ref(rb, vb, g[1]);
      opt.step(g);
    }
    for (std::size_t k = 0; k < w.size(); ++k) CHECK(w[k] == doctest::Approx(rw[k]).epsilon(1e-5));
    for (std::size_t k = 0; k < b.size(); ++k) CHECK(b[k] == doctest::Approx(rb[k]).epsilon(1e-5));
    CHECK(opt.steps() == 6);
  }
}

TEST_CASE("adamw follows PyTorch's rule (float64 reference), with bfloat16 gradients") {
  std::vector<float> w = random_floats(101, 1.0f);
  std::vector<double> rw(w.begin(), w.end()), m(w.size()), v(w.size());
  precis::adamw_options o;
  o.lr = 0.01;
  o.weight_decay = 0.1;
  precis::adamw opt({std::span<float>(w)}, o);
  for (int t = 1; t <= 8; ++t) {
    std::vector<bfloat16> g(w.size());
    for (auto& x : g) x = bfloat16(random_floats(1, 0.5f)[0]);
    for (std::size_t k = 0; k < w.size(); ++k) {
      const double gk = float(g[k]);
      rw[k] *= 1.0 - 0.01 * 0.1;
      m[k] = 0.9 * m[k] + 0.1 * gk;
      v[k] = 0.999 * v[k] + 0.001 * gk * gk;
      const double mhat = m[k] / (1.0 - std::pow(0.9, t));
      const double denom = std::sqrt(v[k]) / std::sqrt(1.0 - std::pow(0.999, t)) + 1e-8;
      rw[k] -= 0.01 * mhat / denom;
    }
    opt.step(g);
  }
  for (std::size_t k = 0; k < w.size(); ++k) CHECK(w[k] == doctest::Approx(rw[k]).epsilon(1e-4));
}

namespace {

// The update rules one element at a time in float, as the optimizers' comments state them
// (std::fma for each fused operation; AdamW's decay as its own pass over the tensor, so no
// product is fused into the addition that follows it).
void reference_sgd(std::vector<float>& w, std::vector<float>& buf, const std::vector<float>& g,
                   const precis::sgd_options& o, bool first) {
  const float wd = float(o.weight_decay), momentum = float(o.momentum),
              kept = float(1.0 - o.dampening), minus_lr = float(-o.lr);
  for (std::size_t k = 0; k < w.size(); ++k) {
    float d = std::fma(w[k], wd, g[k]);
    const float old = buf[k] * momentum;
    buf[k] = first ? d : std::fma(d, kept, old);
    d = o.nesterov ? std::fma(buf[k], momentum, d) : buf[k];
    w[k] = std::fma(d, minus_lr, w[k]);
  }
}

void reference_adamw(std::vector<float>& w, std::vector<float>& m, std::vector<float>& v,
                     const std::vector<float>& g, const precis::adamw_options& o, int t) {
  const float keep = float(1.0 - o.lr * o.weight_decay), lerp = float(1.0 - o.beta1),
              beta2 = float(o.beta2), one_minus_beta2 = float(1.0 - o.beta2),
              step = float(-(o.lr / (1.0 - std::pow(o.beta1, t)))),
              bias2_sqrt = float(std::sqrt(1.0 - std::pow(o.beta2, t))), eps = float(o.eps);
  for (auto& x : w) x *= keep;
  for (std::size_t k = 0; k < w.size(); ++k) {
    m[k] = std::fma(lerp, g[k] - m[k], m[k]);
    const float a = one_minus_beta2 * g[k], b = v[k] * beta2;
    v[k] = std::fma(a, g[k], b);
    const float denom = std::sqrt(v[k]) / bias2_sqrt + eps;
    const float u = step * m[k];
    w[k] = w[k] + u / denom;
  }
}

// Tensors around the vector width and the blocks, and two large enough to be split over
// two threads.
constexpr std::size_t update_sizes[] = {1, 15, 16, 17, 2047, 2049, 70001, 131072};

template <class T>
void check_update_bits(unsigned threads) {
  const precis::cpu_context ctx{threads};
  const precis::sgd_options so{.lr = 0.05, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01};
  const precis::adamw_options ao{
      .lr = 3e-3, .beta1 = 0.85, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.1};
  std::vector<std::vector<float>> sw, aw, ref_sw, ref_aw, buf, m, v;
  for (std::size_t n : update_sizes) {
    sw.push_back(random_floats(n, 1.0f));
    aw.push_back(random_floats(n, 1.0f));
    buf.emplace_back(n, 0.0f);
    m.emplace_back(n, 0.0f);
    v.emplace_back(n, 0.0f);
  }
  ref_sw = sw;
  ref_aw = aw;
  std::vector<std::span<float>> sspans(sw.begin(), sw.end()), aspans(aw.begin(), aw.end());
  precis::sgd sgd(sspans, so, {}, ctx);
  precis::adamw adamw(aspans, ao, {}, ctx);
  for (int t = 1; t <= 3; ++t) {
    std::vector<std::vector<T>> g;
    for (std::size_t n : update_sizes) {
      const auto f = random_floats(n, 0.3f);
      g.emplace_back(f.begin(), f.end());  // rounded to T
    }
    for (std::size_t i = 0; i < g.size(); ++i) {
      const std::vector<float> gf(g[i].begin(), g[i].end());
      reference_sgd(ref_sw[i], buf[i], gf, so, t == 1);
      reference_adamw(ref_aw[i], m[i], v[i], gf, ao, t);
    }
    sgd.step(g);
    adamw.step(g);
  }
  for (std::size_t i = 0; i < sw.size(); ++i) {
    CAPTURE(update_sizes[i]);
    CHECK(std::memcmp(sw[i].data(), ref_sw[i].data(), sw[i].size() * sizeof(float)) == 0);
    CHECK(std::memcmp(aw[i].data(), ref_aw[i].data(), aw[i].size() * sizeof(float)) == 0);
  }
}

}  // namespace

TEST_CASE("the vectorised, threaded updates give the element-by-element rule's bits") {
  for (unsigned threads : {1U, 2U, 3U}) {
    CAPTURE(threads);
    check_update_bits<float>(threads);
    check_update_bits<bfloat16>(threads);
    check_update_bits<precis::float16>(threads);
  }
}

TEST_CASE("the shared updates on single floats, a device optimizer's path, give the optimizers' bits") {
  // precis::sgd_update / adamw_update with scalar_update_math, one element at a time as a
  // device thread runs them, against the host optimizers (SIMD vectors, two threads), over
  // both forms of AdamW's lerp, SGD with and without momentum and Nesterov, and tensors
  // with and without weight decay.
  const precis::cpu_context ctx{2};
  const precis::sgd_options sgd_configs[] = {
      {.lr = 0.1},
      {.lr = 0.05, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01},
      {.lr = 0.02, .momentum = 0.8, .weight_decay = 0.02, .nesterov = true}};
  const precis::adamw_options adamw_configs[] = {
      {},
      {.lr = 3e-3, .beta1 = 0.3, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.1},
      {.lr = 1e-2, .beta1 = 0.95, .beta2 = 0.9, .weight_decay = 0.0}};
  const std::size_t sizes[] = {1, 17, 2049, 70001};
  const std::vector<bool> decay = {true, false, true, false};
  for (int config = 0; config < 3; ++config) {
    CAPTURE(config);
    std::vector<std::vector<float>> sw, aw, b, m, v;
    for (std::size_t n : sizes) {
      sw.push_back(random_floats(n, 1.0f));
      aw.push_back(random_floats(n, 1.0f));
      b.emplace_back(n, 0.0f);
      m.emplace_back(n, 0.0f);
      v.emplace_back(n, 0.0f);
    }
    auto ref_sw = sw, ref_aw = aw;
    std::vector<std::span<float>> sspans(sw.begin(), sw.end()), aspans(aw.begin(), aw.end());
    precis::sgd sgd(sspans, sgd_configs[config], decay, ctx);
    precis::adamw adamw(aspans, adamw_configs[config], decay, ctx);
    for (std::uint64_t t = 1; t <= 4; ++t) {
      std::vector<std::vector<bfloat16>> g;
      for (std::size_t n : sizes) {
        const auto f = random_floats(n, 0.3f);
        g.emplace_back(f.begin(), f.end());
      }
      const auto sc = precis::make_sgd_constants(sgd_configs[config], t == 1);
      const auto ac = precis::make_adamw_constants(adamw_configs[config], t);
      for (std::size_t i = 0; i < g.size(); ++i) {
        const bool sgd_decays = decay[i] && sgd_configs[config].weight_decay != 0.0;
        const bool adamw_decays = decay[i] && adamw_configs[config].weight_decay != 0.0;
        for (std::size_t k = 0; k < g[i].size(); ++k) {
          precis::sgd_update<precis::scalar_update_math>(ref_sw[i][k], b[i][k], float(g[i][k]), sc,
                                                         sgd_decays);
          precis::adamw_update<precis::scalar_update_math>(ref_aw[i][k], m[i][k], v[i][k],
                                                           float(g[i][k]), ac, adamw_decays);
        }
      }
      sgd.step(g);
      adamw.step(g);
      for (std::size_t i = 0; i < sw.size(); ++i) {
        CAPTURE(t);
        CAPTURE(sizes[i]);
        REQUIRE(std::memcmp(sw[i].data(), ref_sw[i].data(), sw[i].size() * sizeof(float)) == 0);
        REQUIRE(std::memcmp(aw[i].data(), ref_aw[i].data(), aw[i].size() * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("weight decay applies only to the tensors the decay flags name") {
  // Zero gradients: a step only decays. AdamW's decoupled decay multiplies by 1 - lr * wd;
  // SGD's L2 term adds wd * w to the gradient, then w = fma(d, -lr, w). The undecayed tensor must not move.
  std::vector<float> w = random_floats(9, 1.0f), b = random_floats(3, 1.0f);
  const auto w0 = w, b0 = b;
  precis::adamw opt({std::span<float>(w), std::span<float>(b)}, {.lr = 0.1, .weight_decay = 0.5}, {true, false});
  std::vector<std::vector<float>> g{std::vector<float>(9, 0.0f), std::vector<float>(3, 0.0f)};
  opt.step(g);
  for (std::size_t k = 0; k < w.size(); ++k) CHECK(w[k] == w0[k] * static_cast<float>(1.0 - 0.1 * 0.5));
  CHECK(b == b0);
  std::vector<float> sw = w0, sb = b0;
  precis::sgd s({std::span<float>(sw), std::span<float>(sb)}, {.lr = 0.1, .weight_decay = 0.5}, {false, true});
  s.step(g);
  CHECK(sw == w0);
  for (std::size_t k = 0; k < sb.size(); ++k) CHECK(sb[k] == std::fma(0.5f * b0[k], -0.1f, b0[k]));
  // One flag per tensor, or none.
  CHECK_THROWS_AS(precis::adamw({std::span<float>(w), std::span<float>(b)}, {}, {true}), precis::error);
}

TEST_CASE("a skipped step changes neither weights nor state, and the schedule waits") {
  std::vector<float> w = random_floats(16, 1.0f);
  precis::adamw opt({std::span<float>(w)});
  precis::dynamic_scaler scaler;
  precis::warmup_cosine schedule(1e-3f, 2, 10);
  auto one_step = [&](bool poison) {
    std::vector<float> g = random_floats(w.size(), 1.0f);
    if (poison) g[3] = NAN;
    for (auto& x : g) x *= scaler.scale();
    const auto r = scaler.step(opt, scaler.scaled_gradients(std::move(g)));
    schedule.advance(r.applied);
    opt.set_lr(schedule.lr());
    return r;
  };
  CHECK(one_step(false).applied);
  const auto weights = w;
  const auto state = precis::save_state(opt);
  const auto r = one_step(true);
  CHECK(!r.applied);
  CHECK(w == weights);
  CHECK(precis::save_state(opt) == state);
  CHECK(opt.steps() == 1);
  CHECK(schedule.step() == 1);
  CHECK(one_step(false).applied);
  CHECK(opt.steps() == 2);
  CHECK(schedule.step() == 2);
}

TEST_CASE("warmup_cosine") {
  precis::warmup_cosine s(1.0f, 4, 12, 0.1f);
  CHECK(s.lr() == doctest::Approx(0.25));
  for (int i = 0; i < 3; ++i) s.advance(true);
  CHECK(s.lr() == doctest::Approx(1.0));
  s.advance(false);
  CHECK(s.step() == 3);
  for (int i = 0; i < 9; ++i) s.advance(true);
  CHECK(s.lr() == doctest::Approx(0.1));
  CHECK_THROWS_AS(precis::warmup_cosine(1.0f, 5, 4), precis::error);
}

TEST_CASE("warmup_cosine's table holds the rates of the next applied steps") {
  // From step 2 of a 4-step warmup to 1.0 and a cosine to 0.1 at step 12: 0.75 and 1.0
  // (steps 2, 3), 0.1 + 0.45 (1 + cos(pi k / 8)) at step 4 + k for k = 0..8, then 0.1.
  precis::warmup_cosine s(1.0, 4, 12, 0.1);
  s.advance(true);
  s.advance(true);
  const auto table = s.lr_table(14);
  REQUIRE(table.size() == 14);
  CHECK(table[0] == doctest::Approx(0.75));
  CHECK(table[1] == doctest::Approx(1.0));
  for (int k = 0; k <= 8; ++k) {
    CAPTURE(k);
    CHECK(table[std::size_t(k + 2)] ==
          doctest::Approx(0.1 + 0.45 * (1.0 + std::cos(3.14159265358979323846 * k / 8.0))));
  }
  for (std::size_t k = 11; k < 14; ++k) CHECK(table[k] == doctest::Approx(0.1));
  // The schedule itself did not move, and stepping it gives the table's values exactly.
  CHECK(s.step() == 2);
  for (double lr : table) {
    CHECK(s.lr() == lr);
    s.advance(true);
  }
  CHECK(s.lr_table(0).empty());
}

TEST_CASE("optimizer state survives a checkpoint and continues identically") {
  std::vector<float> w1 = random_floats(20, 1.0f), w2 = w1;
  precis::sgd a({std::span<float>(w1)}, {.lr = 0.1, .momentum = 0.9});
  for (int t = 0; t < 3; ++t) {
    std::vector<float> g = random_floats(20, 1.0f);
    a.step(g);
  }
  w2 = w1;
  precis::sgd b({std::span<float>(w2)});
  precis::load_state(b, precis::save_state(a));
  CHECK(b.steps() == 3);
  CHECK(b.lr() == 0.1);
  std::vector<float> g = random_floats(20, 1.0f), g2 = g;
  a.step(g);
  b.step(g2);
  CHECK(w1 == w2);
  // A state for other parameter sizes is refused and changes nothing.
  std::vector<float> other(7);
  precis::sgd c({std::span<float>(other)});
  const auto before = precis::save_state(c);
  CHECK_THROWS_AS(precis::load_state(c, precis::save_state(a)), precis::error);
  CHECK(precis::save_state(c) == before);
}

TEST_CASE("gradients that do not match the parameters are refused before any update") {
  std::vector<float> w(4, 1.0f), b(2, 1.0f);
  precis::sgd opt({std::span<float>(w), std::span<float>(b)}, {0.1f});
  std::vector<std::vector<float>> wrong{std::vector<float>(4, 1.0f), std::vector<float>(3, 1.0f)};
  CHECK_THROWS_WITH_AS(opt.step(wrong), doctest::Contains("gradient tensor 1 has 3 elements, the parameter has 2"),
                       precis::error);
  CHECK(w == std::vector<float>(4, 1.0f));
  std::vector<std::vector<float>> few{std::vector<float>(4, 1.0f)};
  CHECK_THROWS_AS(opt.step(few), precis::error);
  CHECK_THROWS_AS(precis::sgd({std::span<float>(w)}, {.lr = 0.1, .nesterov = true}), precis::error);
}
