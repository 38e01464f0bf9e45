// The device reductions, losses and tensor casts against the CPU kernels on the same
// random inputs. Axis sums, means and maxima, and global average pooling (both layouts,
// both directions), add in the host's order and must give the host's bits; whole-tensor reductions are held to the exact (double) result and to the
// host's, losses to the host's within a bound (another order of additions, the device's
// libm), and must give the same bits on every call. Losses are checked with dloss given on the host
// and read from device memory; cross-entropy with an out-of-range target gives NaN, not a read out
// of bounds. Outputs are poisoned with NaN first. Exits 77 (skipped) where no GPU is present.
#include <precis/kernels/cuda/cast.hpp>
#include <precis/kernels/cuda/loss.hpp>
#include <precis/kernels/cuda/reduce.hpp>

#include "device_test.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>

namespace {

using namespace precis_test;

/// The one value of a {1} device tensor.
template <class T>
double scalar(precis::cuda_context& ctx, const precis::device_tensor<T, 1>& d) {
  return double(precis::to_host(d, ctx.stream())(0));
}

void expect_close(const std::string& what, double got, double want, double rel) {
  const double err = std::abs(got - want);
  if (!(err <= rel * std::max(1.0, std::abs(want)))) {
    std::printf("FAILED: %s: device %.9g, host %.9g\n", what.c_str(), got, want);
    ++failures;
  }
}

template <class P, class T>
void check_reductions(precis::cuda_context& ctx, const precis::cpu_context& cpu,
                      const std::string& tag) {
  // Whole tensor: sizes around the first pass's block boundaries.
  for (std::size_t n : {1U, 255U, 4097U, 1000003U}) {
    const auto x = random_tensor<T, 1>({n}, 1.0F, 0.5F);
    const auto dx = precis::to_device(x);
    auto out = poisoned<float, 1>({1});
    const std::string w = tag + " n=" + std::to_string(n);
    // The exact sums of the rounded inputs: the device's tree of float sums stays within
    // 1e-5 of them; the host's single running float sum drifts by up to ~1e-4 over 1M
    // values, so the device is held to the exact value and to the host within 1e-3.
    double exact = 0, squares = 0;
    for (const auto& v : x) {
      exact += double(v);
      squares += double(v) * double(v);
    }
    precis::sum<P>(ctx, dx, out);
    const double s1 = scalar(ctx, out);
    expect_close("sum" + w, s1, exact, 1e-5);
    expect_close("sum vs host" + w, s1, double(precis::sum<P>(cpu, x)), 1e-3);
    precis::sum<P>(ctx, dx, out);
    expect(scalar(ctx, out) == s1, "sum repeats its bits" + w);
    precis::mean<P>(ctx, dx, out);
    expect_close("mean" + w, scalar(ctx, out), exact / double(n), 1e-5);
    expect_close("mean vs host" + w, scalar(ctx, out), double(precis::mean<P>(cpu, x)), 1e-3);
    precis::max<P>(ctx, dx, out);
    expect(scalar(ctx, out) == double(precis::max<P>(cpu, x)), "max" + w);
    precis::l2_norm<P>(ctx, dx, out);
    expect_close("l2_norm" + w, scalar(ctx, out), std::sqrt(squares), 1e-5);
    expect_close("l2_norm vs host" + w, scalar(ctx, out), double(precis::l2_norm<P>(cpu, x)), 1e-3);
  }
  // NaN wins in max.
  auto xn = random_tensor<T, 1>({5000});
  xn(4321) = std::numeric_limits<T>::quiet_NaN();
  auto out = poisoned<float, 1>({1});
  precis::max<P>(ctx, precis::to_device(xn), out);
  expect(std::isnan(scalar(ctx, out)), "max with a NaN is NaN" + tag);
  // Along each axis: the host's order, so the host's bits. [7, 129, 33] reads global memory
  // one thread per output (counts below axis_stage_min_count) and stages axis 1 (129 values
  // per output, 231 outputs: tiles of 16); the others stage rows (inner 1) and columns, tiles
  // of 16 and of 32 outputs (8192 or more), tiles crossing from one outer index to the next,
  // and several stages with a short last one.
  const std::array<std::array<std::size_t, 3>, 5> shapes{
      {{7, 129, 33}, {5, 1000, 3}, {2, 3, 1500}, {8200, 70, 1}, {1, 100, 8300}}};
  const auto dx = precis::to_device(random_tensor<T, 3>({7, 129, 33}));
  for (const auto& dims : shapes) {
    const auto x = random_tensor<T, 3>(dims);
    const auto dxs = precis::to_device(x);
    for (std::size_t axis = 0; axis < 3; ++axis) {
      std::array<std::size_t, 2> shape{};
      for (std::size_t i = 0, j = 0; i < 3; ++i) {
        if (i != axis) shape[j++] = x.shape()[i];
      }
      auto want = precis::host_tensor<float, 2>::from_shape(shape);
      auto got = poisoned<float, 2>(shape);
      const std::string w = tag + " " + precis::shape_string(x.shape()) + " axis " + std::to_string(axis);
#define PRECIS_CHECK_AXIS(fn)         \
  precis::fn<P>(cpu, x, axis, want);  \
  got = poisoned<float, 2>(shape);    \
  precis::fn<P>(ctx, dxs, axis, got); \
  expect(same_bits(ctx, got, want), #fn + w);
      PRECIS_CHECK_AXIS(sum)
      PRECIS_CHECK_AXIS(mean)
      PRECIS_CHECK_AXIS(max)
#undef PRECIS_CHECK_AXIS
      // Squares may be fused into the additions on the device (one rounding fewer).
      precis::l2_norm<P>(cpu, x, axis, want);
      got = poisoned<float, 2>(shape);
      precis::l2_norm<P>(ctx, dxs, axis, got);
      compare("l2_norm" + w, ctx, got, want, 1e-6);
    }
  }
  {
    // NaN wins in a staged max along an axis (its row only).
    auto x = random_tensor<T, 3>({2, 3, 1500});
    x(1, 2, 700) = std::numeric_limits<T>::quiet_NaN();
    auto got = poisoned<float, 2>({2, 3});
    precis::max<P>(ctx, precis::to_device(x), 2, got);
    const auto h = precis::to_host(got, ctx.stream());
    expect(std::isnan(h(1, 2)) && std::isfinite(h(1, 1)) && std::isfinite(h(0, 2)),
           "a staged max along an axis with a NaN is NaN in its row only" + tag);
  }
  // Global average pooling: the host's bits in both layouts, forward (one thread per plane,
  // pixels in order; 4096 pixels stage the axis) and backward (an element a thread), with
  // planes of 1, 63 and 4096 pixels.
  for (const auto& s : std::array<std::array<std::size_t, 4>, 3>{{{3, 5, 7, 9}, {2, 7, 1, 1}, {2, 3, 64, 64}}}) {
    for (const auto layout : {precis::image_layout::nchw, precis::image_layout::nhwc}) {
      const bool last = layout == precis::image_layout::nhwc;
      const std::array<std::size_t, 4> in = last ? std::array<std::size_t, 4>{s[0], s[2], s[3], s[1]} : s;
      const std::string w = tag + " " + precis::shape_string(in) + (last ? " nhwc" : " nchw");
      const auto x = random_tensor<T, 4>(in);
      auto want = precis::host_tensor<T, 2>::from_shape({s[0], s[1]});
      precis::global_avg_pool<P>(cpu, x, want, layout);
      auto got = poisoned<T, 2>({s[0], s[1]});
      precis::global_avg_pool<P>(ctx, precis::to_device(x), got, layout);
      expect(same_bits(ctx, got, want), "global_avg_pool" + w);
      const auto dy = random_tensor<T, 2>({s[0], s[1]});
      auto dx_want = precis::host_tensor<T, 4>::from_shape(in);
      precis::global_avg_pool_backward<P>(cpu, dy, dx_want, layout);
      auto dx_got = poisoned<T, 4>(in);
      precis::global_avg_pool_backward<P>(ctx, precis::to_device(dy), dx_got, layout);
      expect(same_bits(ctx, dx_got, dx_want), "global_avg_pool_backward" + w);
    }
  }
  {
    auto y = poisoned<T, 2>({3, 9});  // [N, W]: not [N, C]
    expect_error(
        "global_avg_pool y shape",
        [&] { precis::global_avg_pool<P>(ctx, precis::to_device(random_tensor<T, 4>({3, 5, 7, 9})), y); },
        "precis::global_avg_pool: y");
  }
  auto wrong = poisoned<float, 2>({7, 34});
  expect_error(
      "sum axis shape", [&] { precis::sum<P>(ctx, dx, 1, wrong); }, "precis::sum: out");
  expect_error(
      "sum axis range", [&] { precis::sum<P>(ctx, dx, 3, wrong); }, "axis 3");
  auto two = poisoned<float, 1>({2});
  expect_error(
      "sum out shape", [&] { precis::sum<P>(ctx, dx, two); }, "precis::sum: out");
  const precis::device_tensor<T, 1> empty({0});
  expect_error(
      "mean of empty", [&] { precis::mean<P>(ctx, empty, out); }, "precis::mean: x");
}

template <class P, class T>
void check_losses(precis::cuda_context& ctx, const precis::cpu_context& cpu, const std::string& tag,
                  double limit) {
  // The scale a device scaler would hold, in device memory.
  precis::host_tensor<float, 1> scale_h({1});
  scale_h(0) = 1024.0F;
  const auto scale_d = precis::to_device(scale_h);
  auto loss = poisoned<float, 1>({1});

  // Cross-entropy: rows held by a warp (10, 256, 1000 and 1001 classes; 256 and 1000 read in
  // 16-byte packs), by a block (4096 in packs, 2050 not), and read once per pass (20000), in
  // batches of 37; and batches large enough that a row group takes two or four rows, the
  // next one's reads in flight, forward and backward (8200 and 16400 of 10 classes: a warp 2
  // and 4; 1100 and 2051 of 2050: a block 2 and 4; 1100 and 2051 of 2048, the same in 16-byte
  // packs).
  for (const auto& [B, C] : std::initializer_list<std::pair<std::size_t, std::size_t>>{
           {37, 10}, {37, 256}, {37, 1000}, {37, 1001}, {37, 2050}, {37, 4096}, {37, 20000}, {8200, 10},
           {16400, 10}, {1100, 2050}, {2051, 2050}, {1100, 2048}, {2051, 2048}}) {
    const std::string t = tag + " B=" + std::to_string(B) + " C=" + std::to_string(C);
    const auto logits = random_tensor<T, 2>({B, C}, 3.0F);
    auto targets = precis::host_tensor<std::int32_t, 1>::from_shape({B});
    std::uniform_int_distribution<std::int32_t> cls(0, std::int32_t(C) - 1);
    for (auto& target : targets) target = cls(rng);
    const auto dl = precis::to_device(logits);
    auto dt = precis::to_device(targets);
    precis::cross_entropy<P>(ctx, dl, dt, loss);
    // The mean of B row losses summed in two orders: the rows' own error, and B float
    // roundings of the sum at worst.
    expect_close("cross_entropy" + t, scalar(ctx, loss), double(precis::cross_entropy<P>(cpu, logits, targets)),
                 1e-5 + double(B) * 0x1p-24);
    auto g = precis::host_tensor<T, 2>::from_shape({B, C});
    auto dg = poisoned<T, 2>({B, C});
    precis::cross_entropy_backward<P>(cpu, logits, targets, g, 1024.0);
    precis::cross_entropy_backward<P>(ctx, dl, dt, dg, scale_d.data());
    compare("cross_entropy_backward (device dloss)" + t, ctx, dg, g, limit);
    dg = poisoned<T, 2>({B, C});
    precis::cross_entropy_backward<P>(ctx, dl, dt, dg, 1024.0);
    compare("cross_entropy_backward (host dloss)" + t, ctx, dg, g, limit);
    targets(5) = std::int32_t(C);  // out of range
    dt = precis::to_device(targets);
    precis::cross_entropy<P>(ctx, dl, dt, loss);
    expect(std::isnan(scalar(ctx, loss)), "cross_entropy with a bad target is NaN" + t);
    precis::cross_entropy_backward<P>(ctx, dl, dt, dg);
    const auto hg = precis::to_host(dg, ctx.stream());
    expect(std::isnan(float(hg(5, 0))) && std::isnan(float(hg(5, C - 1))) && std::isfinite(float(hg(4, 0))) &&
               std::isfinite(float(hg(6, C - 1))),
           "bad target: its row only is NaN" + t);
    if (C == 10) {
      const auto short_targets = precis::to_device(precis::host_tensor<std::int32_t, 1>::from_shape({B - 1}));
      expect_error(
          "cross_entropy targets shape", [&] { precis::cross_entropy<P>(ctx, dl, short_targets, loss); },
          "precis::cross_entropy: targets");
    }
  }

  // The pointwise losses, on a DBNet-sized map with 0/1 and probability targets. The host
  // sums 38k terms in one running float sum (relative drift ~1e-5), hence 1e-4.
  const std::array<std::size_t, 3> shape{3, 97, 131};
  const auto x = random_tensor<T, 3>(shape, 2.0F);
  auto probs = precis::host_tensor<T, 3>::from_shape(shape);
  auto binary = probs;
  std::uniform_real_distribution<float> u(0.0F, 1.0F);
  for (std::size_t i = 0; i < probs.size(); ++i) {
    probs.data()[i] = T(u(rng));
    binary.data()[i] = T(u(rng) < 0.3F ? 1.0F : 0.0F);
  }
  const auto dx = precis::to_device(x), dp = precis::to_device(probs),
             db = precis::to_device(binary);
  auto gh = precis::host_tensor<T, 3>::from_shape(shape);
  auto gd = poisoned<T, 3>(shape);

  precis::bce_with_logits<P>(ctx, dx, db, loss);
  expect_close("bce_with_logits" + tag, scalar(ctx, loss),
               double(precis::bce_with_logits<P>(cpu, x, binary)), 1e-4);
  precis::bce_with_logits_backward<P>(cpu, x, binary, gh, 1024.0);
  precis::bce_with_logits_backward<P>(ctx, dx, db, gd, scale_d.data());
  compare("bce_with_logits_backward" + tag, ctx, gd, gh, limit);

  precis::dice_loss<P>(ctx, dp, db, loss, 1.0);
  const double dice = scalar(ctx, loss);
  expect_close("dice_loss" + tag, dice, double(precis::dice_loss<P>(cpu, probs, binary, 1.0)),
               1e-4);
  precis::dice_loss<P>(ctx, dp, db, loss, 1.0);
  expect(scalar(ctx, loss) == dice, "dice_loss repeats its bits" + tag);
  precis::dice_loss_backward<P>(cpu, probs, binary, gh, 1.0, 1024.0);
  gd = poisoned<T, 3>(shape);
  precis::dice_loss_backward<P>(ctx, dp, db, gd, 1.0, scale_d.data());
  compare("dice_loss_backward" + tag, ctx, gd, gh, limit);
  expect_error(
      "dice eps", [&] { precis::dice_loss<P>(ctx, dp, db, loss, -1.0); }, "eps");

  precis::l1_loss<P>(ctx, dx, dp, loss);
  expect_close("l1_loss" + tag, scalar(ctx, loss), double(precis::l1_loss<P>(cpu, x, probs)), 1e-4);
  precis::l1_loss_backward<P>(cpu, x, probs, gh, 1024.0);
  gd = poisoned<T, 3>(shape);
  precis::l1_loss_backward<P>(ctx, dx, dp, gd, scale_d.data());
  compare("l1_loss_backward" + tag, ctx, gd, gh, limit);

  precis::smooth_l1_loss<P>(ctx, dx, dp, loss, 0.5);
  expect_close("smooth_l1_loss" + tag, scalar(ctx, loss),
               double(precis::smooth_l1_loss<P>(cpu, x, probs, 0.5)), 1e-4);
  precis::smooth_l1_loss_backward<P>(cpu, x, probs, gh, 0.5, 1024.0);
  gd = poisoned<T, 3>(shape);
  precis::smooth_l1_loss_backward<P>(ctx, dx, dp, gd, 0.5, scale_d.data());
  compare("smooth_l1_loss_backward" + tag, ctx, gd, gh, limit);
  expect_error(
      "smooth_l1 beta", [&] { precis::smooth_l1_loss<P>(ctx, dx, dp, loss, NAN); }, "beta");

  const auto other = precis::to_device(random_tensor<T, 3>({3, 97, 130}));
  expect_error(
      "pointwise loss shapes", [&] { precis::l1_loss<P>(ctx, dx, other, loss); },
      "precis::l1_loss: input and target");
}

template <precis::rounding R, precis::overflow O, class To>
void check_cast(precis::cuda_context& ctx, const precis::cpu_context& cpu) {
  // Every float16 value as input, plus large and tiny floats around the target's range.
  auto x = precis::host_tensor<float, 2>::from_shape({3, 65536});
  for (std::uint32_t i = 0; i < 65536; ++i) {
    x(0, i) = float(precis::float16::from_bits(std::uint16_t(i)));
    x(1, i) = std::ldexp(float(i) - 32768.0F, 3);
    x(2, i) = std::ldexp(float(i) - 32768.0F, -40);
  }
  auto want = precis::host_tensor<To, 2>::from_shape({3, 65536});
  precis::cast<R, O>(cpu, x, want);
  auto got = poisoned<To, 2>({3, 65536});
  precis::cast<R, O>(ctx, precis::to_device(x), got);
  expect(same_bits(ctx, got, want), "cast float -> " + std::to_string(sizeof(To)) +
                                        " bytes, modes " + std::to_string(int(R)) +
                                        std::to_string(int(O)));
  // Through spans that start one element in: not aligned for 16-byte packs, so one element
  // per thread, with the same bits.
  {
    const auto dx = precis::to_device(x);
    auto shifted = poisoned<To, 2>({3, 65536});
    const std::size_t n = x.size() - 1;
    precis::cast<R, O>(ctx, std::span<const float>(dx.data() + 1, n), std::span<To>(shifted.data() + 1, n));
    const auto h = precis::to_host(shifted, ctx.stream());
    expect(std::memcmp(h.data() + 1, want.data() + 1, n * sizeof(To)) == 0,
           "cast float -> " + std::to_string(sizeof(To)) + " bytes through unaligned spans");
  }
  // And back: widening is exact.
  auto back = precis::host_tensor<float, 2>::from_shape({3, 65536});
  precis::cast(cpu, want, back);
  auto dback = poisoned<float, 2>({3, 65536});
  precis::cast(ctx, precis::to_device(want), dback);
  expect(same_bits(ctx, dback, back), "cast back to float");
}

}  // namespace

int main() {
  if (!precis_test::have_gpu()) return precis_test::skipped;
  precis::cuda_context ctx;
  const precis::cpu_context cpu{2};
  namespace presets = precis::presets;
  using precis::bfloat16;
  using precis::float16;
  check_reductions<presets::bf16_mixed, bfloat16>(ctx, cpu, " (bf16)");
  check_reductions<presets::fp16_mixed, float16>(ctx, cpu, " (fp16)");
  check_reductions<presets::fp32, float>(ctx, cpu, " (fp32)");
  check_losses<presets::bf16_mixed, bfloat16>(ctx, cpu, " (bf16)", 1e-2);
  check_losses<presets::fp16_mixed, float16>(ctx, cpu, " (fp16)", 2e-3);
  check_losses<presets::fp32, float>(ctx, cpu, " (fp32)", 1e-5);
  using precis::overflow;
  using precis::rounding;
  check_cast<rounding::nearest_even, overflow::infinity, float16>(ctx, cpu);
  check_cast<rounding::toward_zero, overflow::saturate, bfloat16>(ctx, cpu);
  check_cast<rounding::nearest_even, overflow::saturate, precis::float8_e4m3>(ctx, cpu);
  check_cast<rounding::nearest_even, overflow::infinity, precis::float8_e5m2>(ctx, cpu);
  ctx.synchronize();
  return precis_test::finish();
}
