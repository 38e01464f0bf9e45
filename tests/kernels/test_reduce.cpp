// Reductions against float64 sums of the same rounded inputs (bounds: kernel_checks.hpp),
// the float16-accumulator stall at 2048, errors and thread determinism.
#include <precis/kernels/reduce.hpp>

#include "kernel_checks.hpp"

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace {

using namespace precis_test;
using precis::bfloat16;
using precis::cpu_context;
using precis::float16;
using precis::host_tensor;

struct reference {
  double sum = 0, abs_sum = 0, sq = 0, max = -std::numeric_limits<double>::infinity();
};

template <class T, std::size_t N>
reference reduce_reference(const host_tensor<T, N>& x) {
  reference r;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double v = to_double(x.data()[i]);
    r.sum += v;
    r.abs_sum += std::abs(v);
    r.sq += v * v;
    r.max = std::max(r.max, v);
  }
  return r;
}

// Whether a and b have the same bits (float, bfloat16).
template <class T>
bool same_value_bits(T a, T b) {
  if constexpr (std::is_same_v<T, float>) {
    return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
  } else {
    return a.bits() == b.bits();
  }
}

}  // namespace

TEST_CASE_TEMPLATE("whole-tensor sum, mean, max, l2_norm match float64", C, fp32_config,
                   bf16_config, fp16_config) {
  using T = typename C::T;
  using P = typename C::P;
  const cpu_context ctx{2};
  // Signed values: the bound is relative to sum |x|, the sum's condition.
  const auto x = random_tensor<T, 2>({50, 100}, -2, 2);
  const auto r = reduce_reference(x);
  const auto n = double(x.size());
  const float s = precis::sum<P>(ctx, x);
  CHECK(scalar_error(s, r.sum, r.abs_sum) < scalar_bound);
  const float m = precis::mean<P>(ctx, x);
  CHECK(scalar_error(m, r.sum / n, r.abs_sum / n) < scalar_bound);
  const float l2 = precis::l2_norm<P>(ctx, x);
  CHECK(scalar_error(l2, std::sqrt(r.sq), std::sqrt(r.sq)) < scalar_bound);
  CHECK(double(precis::max<P>(ctx, x)) == r.max);  // exact
}

TEST_CASE_TEMPLATE("axis reductions match float64", C, fp32_config, bf16_config, fp16_config) {
  using T = typename C::T;
  using P = typename C::P;
  const cpu_context ctx{1};
  // Positive values, so that each output's norm is its sum's condition.
  const auto x = random_tensor<T, 3>({4, 5, 6}, 0.1, 2);
  const auto xs = random_tensor<T, 3>({4, 5, 6}, -2, 2);
  for (std::size_t axis = 0; axis < 3; ++axis) {
    INFO("axis " << axis);
    const auto shape = precis::detail::shape_without<3>(x, axis);
    auto sum_ref = host_tensor<double, 2>::from_shape(shape);
    auto sq_ref = sum_ref, max_ref = sum_ref;
    sum_ref.fill(0);
    sq_ref.fill(0);
    max_ref.fill(-std::numeric_limits<double>::infinity());
    for (std::size_t i = 0; i < 4; ++i) {
      for (std::size_t j = 0; j < 5; ++j) {
        for (std::size_t k = 0; k < 6; ++k) {
          const std::array<std::size_t, 3> idx{i, j, k};
          std::array<std::size_t, 2> o{};
          for (std::size_t a = 0, b = 0; a < 3; ++a) {
            if (a != axis) o[b++] = idx[a];
          }
          const double v = to_double(x(i, j, k));
          sum_ref(o[0], o[1]) += v;
          sq_ref(o[0], o[1]) += v * v;
          max_ref(o[0], o[1]) = std::max(max_ref(o[0], o[1]), to_double(xs(i, j, k)));
        }
      }
    }
    const double count = double(x.shape()[axis]);
    auto mean_ref = sum_ref, l2_ref = sq_ref;
    for (auto& v : mean_ref) v /= count;
    for (auto& v : l2_ref) v = std::sqrt(v);
    auto out = poisoned<T, 2>(shape);
    precis::sum<P>(ctx, x, axis, out);
    CHECK(rel_error(out, sum_ref) < bound<T>());
    poison(out);
    precis::mean<P>(ctx, x, axis, out);
    CHECK(rel_error(out, mean_ref) < bound<T>());
    poison(out);
    precis::l2_norm<P>(ctx, x, axis, out);
    CHECK(rel_error(out, l2_ref) < bound<T>());
    poison(out);
    precis::max<P>(ctx, xs, axis, out);
    CHECK(rel_error(out, max_ref) == 0.0);
    auto outf = poisoned<float, 2>(shape);
    precis::sum<P>(ctx, x, axis, outf);
    CHECK(rel_error(outf, sum_ref) < bound<float>());
  }
}

TEST_CASE("summing 10^6 ones: a float16 accumulator stalls at 2048, a float one is exact") {
  const cpu_context ctx{2};
  auto ones = host_tensor<float16, 1>::from_shape({1000000});
  ones.fill(float16(1.0f));
  // 2048 + 1 = 2049 is not a float16 (11 significand bits: the step above 2048 is 2); it
  // ties, and rounds to the even 2048, forever.
  using fp16_accumulate =
      precis::unsafe<precis::policy<float16, float16, float16>, precis::rule::fp32_operation>;
  CHECK(precis::sum<fp16_accumulate>(ctx, ones) == 2048.0f);
  CHECK(precis::sum<precis::presets::fp16_mixed>(ctx, ones) == 1000000.0f);
  // Without the waiver the rule set raises the reduction's accumulator to float.
  CHECK(precis::sum<precis::policy<float16, float16, float16>>(ctx, ones) == 1000000.0f);
  // Along an axis too.
  auto rows = host_tensor<float16, 2>::from_shape({2, 5000});
  rows.fill(float16(1.0f));
  auto out = poisoned<float, 1>(std::array<std::size_t, 1>{2});
  precis::sum<fp16_accumulate>(ctx, rows, 1, out);
  CHECK(out(0) == 2048.0f);
  CHECK(out(1) == 2048.0f);
  precis::sum<precis::presets::fp16_mixed>(ctx, rows, 1, out);
  CHECK(out(0) == 5000.0f);
}

TEST_CASE("max propagates NaN") {
  const cpu_context ctx{1};
  host_tensor<float, 1> x = {1.0f, std::numeric_limits<float>::quiet_NaN(), 3.0f};
  CHECK(std::isnan(precis::max<precis::presets::fp32>(ctx, x)));
}

TEST_CASE("reduction errors: bad axis, wrong output shape, empty input") {
  const cpu_context ctx{1};
  using P = precis::presets::fp32;
  const auto x = random_tensor<float, 2>({3, 4});
  auto out = poisoned<float, 1>(std::array<std::size_t, 1>{3});
  check_error([&] { precis::sum<P>(ctx, x, 2, out); }, "precis::sum", "axis 2", "rank 2");
  check_error([&] { precis::mean<P>(ctx, x, 0, out); }, "precis::mean", "[3]", "[4]");
  for (float v : out) CHECK(std::isnan(v));
  const auto empty = host_tensor<float, 2>::from_shape({0, 4});
  CHECK(precis::sum<P>(ctx, empty) == 0.0f);
  check_error([&] { (void)precis::mean<P>(ctx, empty); }, "precis::mean", "[0, 4]");
  check_error([&] { (void)precis::max<P>(ctx, empty); }, "precis::max", "[0, 4]");
  const auto empty_axis = host_tensor<float, 2>::from_shape({3, 0});
  check_error([&] { precis::max<P>(ctx, empty_axis, 1, out); }, "precis::max", "[3, 0]", "empty");
}

TEST_CASE("axis reductions are bit-identical for 1 and 2 threads") {
  using P = precis::presets::bf16_mixed;
  const auto x = random_tensor<bfloat16, 2>({300, 1000});
  for (std::size_t axis = 0; axis < 2; ++axis) {
    auto a = poisoned<float, 1>(std::array<std::size_t, 1>{axis == 0 ? 1000U : 300U}), b = a;
    precis::l2_norm<P>(cpu_context{1}, x, axis, a);
    precis::l2_norm<P>(cpu_context{2}, x, axis, b);
    CHECK(same_bits(a, b));
    precis::sum<P>(cpu_context{1}, x, axis, a);
    precis::sum<P>(cpu_context{2}, x, axis, b);
    CHECK(same_bits(a, b));
  }
  CHECK(precis::sum<P>(cpu_context{1}, x) == precis::sum<P>(cpu_context{2}, x));
}

TEST_CASE("float axis sums and means add each output's terms in k order, one float sum each") {
  // The reference: one float running sum per output element, terms in k order.
  using P = precis::presets::bf16_mixed;
  const auto x = random_tensor<bfloat16, 3>({3, 257, 45}, -2, 2);
  const auto xf = random_tensor<float, 3>({3, 257, 45}, -2, 2);
  for (unsigned threads : {1U, 2U, 3U}) {
    INFO("threads=" << threads);
    const cpu_context ctx{threads};
    auto sum16 = poisoned<float, 2>(std::array<std::size_t, 2>{3, 45});
    auto sum32 = sum16, mean32 = sum16;
    precis::sum<P>(ctx, x, 1, sum16);
    precis::sum<precis::presets::fp32>(ctx, xf, 1, sum32);
    precis::mean<precis::presets::fp32>(ctx, xf, 1, mean32);
    std::size_t differ = 0;
    for (std::size_t o = 0; o < 3; ++o) {
      for (std::size_t i = 0; i < 45; ++i) {
        float s16 = 0.0F, s32 = 0.0F;
        for (std::size_t k = 0; k < 257; ++k) {
          s16 += float(x(o, k, i));
          s32 += xf(o, k, i);
        }
        differ += std::bit_cast<std::uint32_t>(s16) != std::bit_cast<std::uint32_t>(sum16(o, i));
        differ += std::bit_cast<std::uint32_t>(s32) != std::bit_cast<std::uint32_t>(sum32(o, i));
        differ += std::bit_cast<std::uint32_t>(s32 / 257.0F) !=
                  std::bit_cast<std::uint32_t>(mean32(o, i));
      }
    }
    CHECK(differ == 0);
  }
}

TEST_CASE_TEMPLATE(
    "global_avg_pool: each plane's float sum in pixel order, divided once, in either layout", C,
    fp32_config, bf16_config) {
  // The reference: one float running sum per (image, channel) over its pixels in row-major
  // order, divided once by the pixel count and rounded once; backward, dy / count in float,
  // rounded once, at every pixel of the plane. (float: a multiplication by 1 / count in
  // place of the division differs from it for some dy.)
  using T = typename C::T;
  using P = typename C::P;
  const std::size_t n = 2, c = 5, h = 7, w = 9;
  const auto x = random_tensor<T, 4>({n, c, h, w}, -2, 2);
  auto x_last = host_tensor<T, 4>::from_shape({n, h, w, c});
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t ch = 0; ch < c; ++ch)
      for (std::size_t y = 0; y < h; ++y)
        for (std::size_t z = 0; z < w; ++z) x_last(i, y, z, ch) = x(i, ch, y, z);
  const auto dy = random_tensor<T, 2>({n, c}, -2, 2);
  for (unsigned threads : {1U, 2U}) {
    INFO("threads=" << threads);
    const cpu_context ctx{threads};
    auto y = poisoned<T, 2>(std::array<std::size_t, 2>{n, c}), y_last = y;
    precis::global_avg_pool<P>(ctx, x, y);
    precis::global_avg_pool<P>(ctx, x_last, y_last, precis::image_layout::nhwc);
    auto dx = poisoned<T, 4>(std::array<std::size_t, 4>{n, c, h, w});
    auto dx_last = poisoned<T, 4>(std::array<std::size_t, 4>{n, h, w, c});
    precis::global_avg_pool_backward<P>(ctx, dy, dx);
    precis::global_avg_pool_backward<P>(ctx, dy, dx_last, precis::image_layout::nhwc);
    std::size_t differ = 0;
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t ch = 0; ch < c; ++ch) {
        float s = 0.0F;
        for (std::size_t y0 = 0; y0 < h; ++y0)
          for (std::size_t z = 0; z < w; ++z) s += float(x(i, ch, y0, z));
        const T mean = T(s / float(h * w));
        differ += !same_value_bits(mean, y(i, ch));
        differ += !same_value_bits(mean, y_last(i, ch));
        const T share = T(float(dy(i, ch)) / float(h * w));
        for (std::size_t y0 = 0; y0 < h; ++y0) {
          for (std::size_t z = 0; z < w; ++z) {
            differ += !same_value_bits(share, dx(i, ch, y0, z));
            differ += !same_value_bits(share, dx_last(i, y0, z, ch));
          }
        }
      }
    }
    CHECK(differ == 0);
  }
}

TEST_CASE("global_avg_pool errors: planes of no pixel, a pooled tensor of another shape") {
  const cpu_context ctx{1};
  using P = precis::presets::fp32;
  const auto x = random_tensor<float, 4>({2, 3, 4, 5});
  auto y = poisoned<float, 2>(std::array<std::size_t, 2>{2, 5});  // [N, W]: not [N, C]
  check_error([&] { precis::global_avg_pool<P>(ctx, x, y); }, "precis::global_avg_pool: y",
              "[2, 3]", "[2, 5]");
  // Read channels-last, the same x is [N, H, W, C] = [2, 3, 4, 5]: y [2, 5] fits.
  CHECK_NOTHROW(precis::global_avg_pool<P>(ctx, x, y, precis::image_layout::nhwc));
  auto y3 = poisoned<float, 2>(std::array<std::size_t, 2>{2, 3});
  const auto empty = host_tensor<float, 4>::from_shape({2, 3, 0, 5});
  check_error([&] { precis::global_avg_pool<P>(ctx, empty, y3); }, "precis::global_avg_pool",
              "no pixel", "[2, 3, 0, 5]");
  for (float v : y3) CHECK(std::isnan(v));
  auto dx = poisoned<float, 4>(std::array<std::size_t, 4>{2, 3, 4, 5});
  check_error([&] { precis::global_avg_pool_backward<P>(ctx, y, dx); },
              "precis::global_avg_pool_backward: dy", "[2, 3]", "[2, 5]");
  for (float v : dx) CHECK(std::isnan(v));
}
