// Typed gradients: the fused unscale on every gradient format (subnormal, infinite, NaN
// inputs), accumulation over micro-batches, clipping after unscaling.
#include <precis/scaling/scaling.hpp>

#include "random.hpp"

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

namespace {

using precis::bfloat16;
using precis::float16;

using precis_test::rng;

template <class T>
std::vector<T> random_values(std::size_t n, float spread) {
  std::normal_distribution<float> d(0.0f, spread);
  std::vector<T> v(n);
  for (auto& x : v) x = T(d(rng()));
  return v;
}

template <class T>
std::uint32_t bits_of(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return std::bit_cast<std::uint32_t>(x);
  } else {
    return x.bits();
  }
}

}  // namespace

TEST_CASE_TEMPLATE("the fused unscale multiplies by 1/scale, rounds once, and finds non-finite values",
                   T, float, bfloat16, float16) {
  const float scale = 1024.0f;
  auto data = random_values<T>(10007, 3000.0f);
  // Special inputs: subnormals of the format, the largest values, zeros.
  data[0] = std::numeric_limits<T>::denorm_min();
  data[1] = -std::numeric_limits<T>::denorm_min();
  data[2] = std::numeric_limits<T>::max();
  data[3] = T(-0.0f);
  data[4] = std::numeric_limits<T>::min();
  const auto before = data;
  // The reference: the float product of each value and 1/scale, rounded once to T.
  const float inv = 1.0f / scale;
  const bool found = precis::unscale_and_check(std::span<T>(data), inv);
  CHECK(!found);
  for (std::size_t i = 0; i < data.size(); ++i) {
    const T expected = T(float(before[i]) * inv);
    REQUIRE(bits_of(data[i]) == bits_of(expected));
  }
  for (float bad : {INFINITY, -INFINITY, NAN}) {
    auto d = before;
    d[d.size() / 2] = T(bad);
    CHECK(precis::unscale_and_check(std::span<T>(d), inv));
  }
  // A value that overflows when unscaled by a scale below 1 is found too.
  auto d = before;
  d[7] = std::numeric_limits<T>::max();
  CHECK(precis::unscale_and_check(std::span<T>(d), 4.0f));
}

TEST_CASE("unscale over several tensors of different formats") {
  using grads = std::tuple<std::vector<float>, std::vector<std::vector<bfloat16>>, std::vector<float16>>;
  grads g{{65536.0f, -131072.0f}, {{bfloat16(65536.0f)}, {bfloat16(3.0f * 65536.0f)}}, {float16(32768.0f)}};
  auto u = precis::unscale(precis::scaled<grads>(std::move(g), 65536.0f));
  CHECK(!u.found_inf());
  CHECK(std::get<0>(u.values())[1] == -2.0f);
  CHECK(float(std::get<1>(u.values())[1][0]) == 3.0f);
  CHECK(float(std::get<2>(u.values())[0]) == 0.5f);

  grads h{{1.0f}, {{bfloat16(NAN)}}, {float16(1.0f)}};
  CHECK(precis::unscale(precis::scaled<grads>(std::move(h), 2.0f)).found_inf());
}

TEST_CASE("micro-batches accumulate scaled and unscale once at the boundary") {
  const float scale = 4096.0f;
  const int k = 4;
  std::vector<std::vector<float>> per_batch(k);
  std::vector<double> expected(64, 0.0);
  for (auto& b : per_batch) {
    b = random_values<float>(64, 1e-3f);
    for (std::size_t i = 0; i < b.size(); ++i) expected[i] += b[i];
  }
  auto scaled_batch = [&](int i) {
    std::vector<float> g = per_batch[std::size_t(i)];
    for (auto& v : g) v *= scale;  // what backward of the scaled loss yields
    return precis::scaled<std::vector<float>>(std::move(g), scale);
  };
  auto total = scaled_batch(0);
  for (int i = 1; i < k; ++i) total.accumulate(scaled_batch(i));
  auto u = precis::unscale(std::move(total));
  for (std::size_t i = 0; i < expected.size(); ++i) {
    CHECK(double(u.values()[i]) == doctest::Approx(expected[i]).epsilon(1e-5));
  }
  // A window whose scale changed is refused.
  auto a = precis::scaled<std::vector<float>>({1.0f}, 2.0f);
  CHECK_THROWS_AS(a.accumulate(precis::scaled<std::vector<float>>({1.0f}, 4.0f)), precis::error);
  // Mismatched shapes are refused.
  auto b = precis::scaled<std::vector<float>>({1.0f, 2.0f}, 2.0f);
  CHECK_THROWS_AS(b.accumulate(precis::scaled<std::vector<float>>({1.0f}, 2.0f)), precis::error);
}

TEST_CASE("moved-from gradients cannot be unscaled or stepped again") {
  auto s = precis::scaled<std::vector<float>>({1.0f}, 2.0f);
  auto moved = std::move(s);
  CHECK_THROWS_WITH_AS(precis::unscale(std::move(s)), doctest::Contains("moved from or already unscaled"),
                       precis::error);
  auto u = precis::unscale(std::move(moved));
  struct opt {
    int n = 0;
    void step(std::vector<float>&) { ++n; }
  } o;
  precis::no_scaling scaler;
  auto u2 = std::move(u);
  CHECK_THROWS_AS(scaler.step(o, std::move(u)), precis::error);
  CHECK(scaler.step(o, std::move(u2)).applied);
  CHECK(o.n == 1);
  CHECK_THROWS_AS((precis::scaled<std::vector<float>>({1.0f}, 0.0f)), precis::error);
}

TEST_CASE("clipping after unscaling: gradients scaled by 65536 end with norm <= max_norm") {
  const float scale = 65536.0f;
  auto g = random_values<float>(1000, 0.5f);  // norm about 16
  const std::vector<float> original = g;
  for (auto& v : g) v *= scale;
  precis::dynamic_scaler scaler;
  auto u = precis::unscale(scaler.scaled_gradients(std::move(g)));
  const double norm_before = precis::clip_grad_norm(u, 1.0);
  double reference = 0.0;
  for (float v : original) reference += double(v) * double(v);
  CHECK(norm_before == doctest::Approx(std::sqrt(reference)).epsilon(1e-6));
  CHECK(precis::grad_norm(u) <= 1.0);
  CHECK(precis::grad_norm(u) == doctest::Approx(1.0).epsilon(1e-5));
  // Direction is kept.
  CHECK(u.values()[3] / u.values()[5] == doctest::Approx(original[3] / original[5]).epsilon(1e-5));

  precis::clip_grad_value(u, 0.01f);
  for (float v : u.values()) CHECK(std::fabs(v) <= 0.01f);
  CHECK_THROWS_AS(precis::clip_grad_norm(u, 0.0), precis::error);
}

TEST_CASE("grad_norm of several tensors of any length matches a long double sum") {
  // Lengths around the eight running sums' multiple, and one long tensor: every tail and
  // the hand-over of sums between tensors.
  std::vector<std::vector<float>> g;
  for (const std::size_t n : {1UL, 7UL, 8UL, 9UL, 15UL, 16UL, 17UL, 100003UL})
    g.push_back(random_values<float>(n, 3.0f));
  g[1][2] = 1e-30F;  // a square far below the others
  g[3][0] = 3e19F;   // and one whose square is past float's range
  long double reference = 0.0L;
  for (const auto& t : g)
    for (float v : t) reference += static_cast<long double>(v) * static_cast<long double>(v);
  const double expected = static_cast<double>(std::sqrt(reference));
  auto u = precis::unscale(precis::scaled<std::vector<std::vector<float>>>(std::move(g), 1.0f));
  // Sums of 100k positive doubles: a few ulps of double.
  CHECK(std::fabs(precis::grad_norm(u) - expected) <= 1e-14 * expected);
}

TEST_CASE("bfloat16 gradients clip in place") {
  std::vector<bfloat16> g{bfloat16(3.0f * 256.0f), bfloat16(4.0f * 256.0f)};
  auto u = precis::unscale(precis::scaled<std::vector<bfloat16>>(std::move(g), 256.0f));
  CHECK(precis::clip_grad_norm(u, 1.0) == doctest::Approx(5.0));
  CHECK(float(u.values()[0]) == doctest::Approx(0.6f).epsilon(1e-2));
  CHECK(float(u.values()[1]) == doctest::Approx(0.8f).epsilon(1e-2));
}
