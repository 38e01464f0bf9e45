// conv2d forward, backward-data, backward-weights and the transposed convolution against
// float64 references from the same rounded inputs. Bounds: kernel_checks.hpp's table
// (max |kernel - reference| / max |reference|: float 1e-5, bfloat16 1e-2, float16 2e-3):
// the depths here are <= 9 * 8 taps forward and <= 2 * 15 * 15 pixels for the weights,
// so float sums stay near sqrt(depth) ulps (< 1e-6) and the output rounding dominates.
// The float64 adjoints are checked against central differences of the float64 forward.
#include <precis/kernels/conv.hpp>

#include "kernel_checks.hpp"

#include <doctest/doctest.h>
#include <xtensor/xmanipulation.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <string>
#include <vector>

namespace {

using namespace precis_test;
using precis::host_tensor;
using shape4 = std::array<std::size_t, 4>;

struct geo {
  std::size_t n, c, h, w, co, kh, kw;
  precis::conv2d_params p;
  std::size_t ho() const { return (h + 2 * p.padding[0] - p.dilation[0] * (kh - 1) - 1) / p.stride[0] + 1; }
  std::size_t wo() const { return (w + 2 * p.padding[1] - p.dilation[1] * (kw - 1) - 1) / p.stride[1] + 1; }
  shape4 xs() const { return {n, c, h, w}; }
  shape4 ws() const { return {co, c / p.groups, kh, kw}; }
  shape4 ys() const { return {n, co, ho(), wo()}; }
};

/// g in words, for the failure messages.
std::string describe(const geo& g) {
  return "x " + precis::shape_string(g.xs()) + " w " + precis::shape_string(g.ws()) + " stride " +
         std::to_string(g.p.stride[0]) + " pad " + std::to_string(g.p.padding[0]) + " dilation " +
         std::to_string(g.p.dilation[0]) + " groups " + std::to_string(g.p.groups);
}

/// Calls f(n, o, ci, ky, kx, oy, ox, iy, ix) for every in-bounds term of the convolution.
template <class F>
void for_terms(const geo& g, F f) {
  const std::size_t cg = g.c / g.p.groups, cog = g.co / g.p.groups;
  for (std::size_t n = 0; n < g.n; ++n)
    for (std::size_t o = 0; o < g.co; ++o)
      for (std::size_t oy = 0; oy < g.ho(); ++oy)
        for (std::size_t ox = 0; ox < g.wo(); ++ox)
          for (std::size_t c = 0; c < cg; ++c)
            for (std::size_t ky = 0; ky < g.kh; ++ky)
              for (std::size_t kx = 0; kx < g.kw; ++kx) {
                const long iy = long(oy * g.p.stride[0] + ky * g.p.dilation[0]) - long(g.p.padding[0]);
                const long ix = long(ox * g.p.stride[1] + kx * g.p.dilation[1]) - long(g.p.padding[1]);
                if (iy < 0 || ix < 0 || iy >= long(g.h) || ix >= long(g.w)) continue;
                f(n, o, (o / cog) * cg + c, c, ky, kx, oy, ox, std::size_t(iy), std::size_t(ix));
              }
}

host_tensor<double, 4> ref_forward(const geo& g, const host_tensor<double, 4>& x,
                                   const host_tensor<double, 4>& w) {
  auto y = host_tensor<double, 4>::from_shape(g.ys());
  y.fill(0);
  for_terms(g, [&](auto n, auto o, auto ci, auto c, auto ky, auto kx, auto oy, auto ox, auto iy, auto ix) {
    y(n, o, oy, ox) += w(o, c, ky, kx) * x(n, ci, iy, ix);
  });
  return y;
}

host_tensor<double, 4> ref_backward_data(const geo& g, const host_tensor<double, 4>& dy,
                                         const host_tensor<double, 4>& w) {
  auto dx = host_tensor<double, 4>::from_shape(g.xs());
  dx.fill(0);
  for_terms(g, [&](auto n, auto o, auto ci, auto c, auto ky, auto kx, auto oy, auto ox, auto iy, auto ix) {
    dx(n, ci, iy, ix) += w(o, c, ky, kx) * dy(n, o, oy, ox);
  });
  return dx;
}

host_tensor<double, 4> ref_backward_weights(const geo& g, const host_tensor<double, 4>& x,
                                            const host_tensor<double, 4>& dy) {
  auto dw = host_tensor<double, 4>::from_shape(g.ws());
  dw.fill(0);
  for_terms(g, [&](auto n, auto o, auto ci, auto c, auto ky, auto kx, auto oy, auto ox, auto iy, auto ix) {
    dw(o, c, ky, kx) += x(n, ci, iy, ix) * dy(n, o, oy, ox);
  });
  return dw;
}

precis::conv2d_params params(std::size_t s, std::size_t pad, std::size_t d, std::size_t groups) {
  precis::conv2d_params p;
  p.stride = {s, s + (s > 1 ? 0 : 0)};
  p.padding = {pad, pad};
  p.dilation = {d, d};
  p.groups = groups;
  return p;
}

precis::conv2d_params axes(std::array<std::size_t, 2> s, std::array<std::size_t, 2> pad,
                           std::array<std::size_t, 2> d) {
  precis::conv2d_params p;
  p.stride = s;
  p.padding = pad;
  p.dilation = d;
  return p;
}

const geo geometries[] = {
    {2, 3, 11, 13, 5, 3, 3, params(1, 1, 1, 1)},
    {1, 8, 15, 9, 6, 3, 2, params(2, 1, 1, 2)},
    {3, 4, 10, 10, 4, 3, 3, params(1, 2, 2, 4)},  // depthwise, dilated
    {2, 6, 9, 12, 9, 1, 1, params(1, 0, 1, 3)},
    {1, 5, 14, 14, 7, 5, 5, params(3, 2, 1, 1)},
    {2, 6, 11, 9, 8, 1, 1, params(2, 0, 1, 1)},  // strided 1x1: only the sampled pixels read
    {1, 8, 10, 7, 4, 1, 1, params(3, 0, 2, 2)},  // strided, grouped, dilation irrelevant
    {2, 3, 9, 11, 4, 3, 3, axes({2, 1}, {1, 2}, {1, 2})},  // stride, pad, dilation per axis
    {1, 2, 4, 5, 3, 3, 3, axes({1, 2}, {5, 4}, {3, 1})},   // padding past the kernel's reach
    // Whole blocks of 16 channels: without AMX, oneDNN's bfloat16 kernels take nChw16c
    // images, which precis moves itself.
    {2, 32, 7, 6, 16, 3, 3, params(1, 1, 1, 1)},
    {1, 16, 9, 9, 32, 3, 3, params(2, 1, 1, 1)},
};

}  // namespace

// Double policies run the direct loops (float64 gradient checks of nn's layers use them).
using f64_config = config<double, precis::policy<double, double, double, double>>;

TEST_CASE_TEMPLATE("conv2d forward and backward match float64", Cfg, fp32_config, fp32_hw_config,
                   bf16_config, fp16_config, fp16_hw_config, f64_config) {
  using T = typename Cfg::T;
  using P = typename Cfg::P;
  for (const geo& g : geometries) {
    INFO(describe(g));
    const auto x = random_tensor<T, 4>(g.xs());
    const auto w = random_tensor<T, 4>(g.ws());
    const auto dy = random_tensor<T, 4>(g.ys());
    const auto bias = random_tensor<T, 1>({g.co});
    const auto xd = to_double(x), wd = to_double(w), dyd = to_double(dy);
    for (unsigned threads : {1U, 2U}) {
      const precis::cpu_context ctx{threads};
      auto y = poisoned<T, 4>(g.ys());
      precis::conv2d<P>(ctx, x, w, y, g.p);
      const auto yref = ref_forward(g, xd, wd);
      CHECK(rel_error(y, yref) < bound<T>());
      auto yb = poisoned<float, 4>(g.ys());
      precis::conv2d<P>(ctx, x, w, bias, yb, g.p);
      auto yref_b = yref;
      for (std::size_t n = 0; n < g.n; ++n)
        for (std::size_t o = 0; o < g.co; ++o)
          for (std::size_t i = 0; i < g.ho(); ++i)
            for (std::size_t j = 0; j < g.wo(); ++j) yref_b(n, o, i, j) += to_double(bias(o));
      CHECK(rel_error(yb, yref_b) < bound<float>());
      auto dx = poisoned<T, 4>(g.xs());
      precis::conv2d_backward_data<P>(ctx, dy, w, dx, g.p);
      CHECK(rel_error(dx, ref_backward_data(g, dyd, wd)) < bound<T>());
      auto dw = poisoned<T, 4>(g.ws());
      precis::conv2d_backward_weights<P>(ctx, x, dy, dw, g.p);
      CHECK(rel_error(dw, ref_backward_weights(g, xd, dyd)) < bound<T>());
    }
  }
}

TEST_CASE("conv2d's float64 adjoints are the gradients (central differences)") {
  const geo g{1, 4, 6, 7, 4, 3, 2, params(2, 1, 2, 2)};
  const auto xd = to_double(random_tensor<double, 4>(g.xs()));
  const auto wd = to_double(random_tensor<double, 4>(g.ws()));
  const auto dyd = to_double(random_tensor<double, 4>(g.ys()));
  const auto fx = [&](const host_tensor<double, 4>& x) { return dot(dyd, ref_forward(g, x, wd)); };
  const auto fw = [&](const host_tensor<double, 4>& w) { return dot(dyd, ref_forward(g, xd, w)); };
  CHECK(rel_error(fd_gradient(fx, xd), ref_backward_data(g, dyd, wd)) < fd_bound);
  CHECK(rel_error(fd_gradient(fw, wd), ref_backward_weights(g, xd, dyd)) < fd_bound);
}

TEST_CASE_TEMPLATE("conv_transpose2d is the adjoint of conv2d, forward and backward", Cfg,
                   fp32_config, fp32_hw_config, bf16_config, fp16_hw_config, f64_config) {
  using T = typename Cfg::T;
  using P = typename Cfg::P;
  // conv_transpose2d(x, w) with x [N, Ci, H, W] is the backward-data of the convolution
  // from Co to Ci channels whose output is x.
  const geo g{2, 6, 9, 9, 4, 3, 3, params(2, 1, 1, 2)};  // the convolution y(6ch) -> x(4ch)
  const auto xt_ = random_tensor<T, 4>(g.ys());           // transposed conv input
  const auto w = random_tensor<T, 4>(g.ws());             // [Ci=4, Co/groups=3, 3, 3]
  auto y = poisoned<T, 4>(g.xs());
  const precis::cpu_context ctx{2};
  precis::conv_transpose2d<P>(ctx, xt_, w, y, g.p);
  const auto xd = to_double(xt_), wd = to_double(w);
  CHECK(rel_error(y, ref_backward_data(g, xd, wd)) < bound<T>());
  const auto dy = random_tensor<T, 4>(g.xs());
  auto dx = poisoned<T, 4>(g.ys());
  precis::conv_transpose2d_backward_data<P>(ctx, dy, w, dx, g.p);
  CHECK(rel_error(dx, ref_forward(g, to_double(dy), wd)) < bound<T>());
  auto dw = poisoned<T, 4>(g.ws());
  precis::conv_transpose2d_backward_weights<P>(ctx, xt_, dy, dw, g.p);
  CHECK(rel_error(dw, ref_backward_weights(g, to_double(dy), xd)) < bound<T>());
}

TEST_CASE_TEMPLATE("conv_transpose2d with output_padding adds the rows a stride leaves open",
                   Cfg, fp32_config, bf16_config) {
  using T = typename Cfg::T;
  using P = typename Cfg::P;
  // The convolution y [10 x 11] -> x [5 x 6] (stride 2); conv_transpose2d of x needs
  // output_padding {1, 0} to give back 10 x 11 rather than 9 x 11.
  geo g{2, 6, 10, 11, 4, 3, 3, params(2, 1, 1, 2)};
  REQUIRE(g.ho() == 5);
  REQUIRE(g.wo() == 6);
  precis::conv2d_params p = g.p;
  p.output_padding = {1, 0};
  const auto xt_ = random_tensor<T, 4>(g.ys());
  const auto w = random_tensor<T, 4>(g.ws());
  auto y = poisoned<T, 4>(g.xs());
  const precis::cpu_context ctx{2};
  precis::conv_transpose2d<P>(ctx, xt_, w, y, p);
  CHECK(rel_error(y, ref_backward_data(g, to_double(xt_), to_double(w))) < bound<T>());
  const auto dy = random_tensor<T, 4>(g.xs());
  auto dx = poisoned<T, 4>(g.ys());
  precis::conv_transpose2d_backward_data<P>(ctx, dy, w, dx, p);
  CHECK(rel_error(dx, ref_forward(g, to_double(dy), to_double(w))) < bound<T>());
  auto dw = poisoned<T, 4>(g.ws());
  precis::conv_transpose2d_backward_weights<P>(ctx, xt_, dy, dw, p);
  CHECK(rel_error(dw, ref_backward_weights(g, to_double(dy), to_double(xt_))) < bound<T>());
  // Without it the output is one row short; too large a value, or one given to a
  // convolution, is refused before anything is written.
  auto short_y = poisoned<T, 4>(shape4{2, 6, 10, 11});
  check_error([&] { precis::conv_transpose2d<P>(ctx, xt_, w, short_y, g.p); }, "y",
              "[2, 6, 9, 11]");
  precis::conv2d_params too_big = p;
  too_big.output_padding = {2, 0};
  check_error([&] { precis::conv_transpose2d<P>(ctx, xt_, w, y, too_big); }, "output_padding 2",
              "stride (2)");
  auto yc = poisoned<T, 4>(g.ys());
  check_error([&] { precis::conv2d<P>(ctx, dy, w, yc, p); }, "conv_transpose2d only");
  CHECK(std::isnan(float(yc(0, 0, 0, 0))));
}

TEST_CASE_TEMPLATE("conv2d_backward_bias sums dy per channel, as float64 does", Cfg, fp32_config,
                   bf16_config, fp16_config) {
  using T = typename Cfg::T;
  using P = typename Cfg::P;
  const auto dy = random_tensor<T, 4>({3, 5, 9, 7});
  std::vector<double> ref(5, 0.0);
  for (std::size_t n = 0; n < 3; ++n)
    for (std::size_t c = 0; c < 5; ++c)
      for (std::size_t i = 0; i < 9; ++i)
        for (std::size_t j = 0; j < 7; ++j) ref[c] += to_double(dy(n, c, i, j));
  host_tensor<double, 1> refd = host_tensor<double, 1>::from_shape({5});
  std::copy(ref.begin(), ref.end(), refd.begin());
  for (unsigned threads : {1U, 2U}) {
    auto db = poisoned<T, 1>(std::array<std::size_t, 1>{5});
    precis::conv2d_backward_bias<P>(precis::cpu_context{threads}, dy, db);
    CHECK(rel_error(db, refd) < bound<T>());
  }
  auto bad = poisoned<T, 1>(std::array<std::size_t, 1>{4});
  check_error([&] { precis::conv2d_backward_bias<P>(precis::cpu_context{1}, dy, bad); }, "db",
              "[4]", "[5]");
  CHECK(std::isnan(float(bad(0))));
}

TEST_CASE("convolutions with an empty sum write zeros") {
  using P = precis::presets::bf16_mixed;
  using T = precis::bfloat16;
  const precis::cpu_context ctx{2};
  const precis::conv2d_params p;
  // No images: the weight gradient is a sum over nothing.
  const auto x0 = random_tensor<T, 4>({0, 4, 6, 6}), dy0 = random_tensor<T, 4>({0, 8, 4, 4});
  auto dw = poisoned<T, 4>(shape4{8, 4, 3, 3});
  precis::conv2d_backward_weights<P>(ctx, x0, dy0, dw, p);
  for (const auto& v : dw) CHECK(float(v) == 0.0F);
  // No input channels: every output is a sum over nothing.
  const auto xc = random_tensor<T, 4>({2, 0, 6, 6}), wc = random_tensor<T, 4>({8, 0, 3, 3});
  auto y = poisoned<T, 4>(shape4{2, 8, 4, 4});
  precis::conv2d<P>(ctx, xc, wc, y, p);
  for (const auto& v : y) CHECK(float(v) == 0.0F);
  // No output channels: nothing reaches the input.
  const auto dyo = random_tensor<T, 4>({2, 0, 4, 4}), wo = random_tensor<T, 4>({0, 4, 3, 3});
  auto dx = poisoned<T, 4>(shape4{2, 4, 6, 6});
  precis::conv2d_backward_data<P>(ctx, dyo, wo, dx, p);
  for (const auto& v : dx) CHECK(float(v) == 0.0F);
}

TEST_CASE("conv2d gives the same bits on 1, 2 and 3 threads") {
  using P = precis::presets::bf16_exact;
  using T = precis::bfloat16;
  // Many pixels and few channels (the product split over pixels), and few pixels with many
  // channels, as in a network's last layers (split over channels, the pixels packed once).
  for (const geo& g : {geo{1, 16, 23, 21, 40, 3, 3, params(1, 1, 1, 1)},
                       geo{4, 16, 23, 21, 40, 3, 3, params(1, 1, 1, 1)},
                       geo{2, 64, 7, 7, 320, 3, 3, params(1, 1, 1, 1)}}) {
    INFO("x " << precis::shape_string(g.xs()) << " w " << precis::shape_string(g.ws()));
    const auto x = random_tensor<T, 4>(g.xs());
    const auto w = random_tensor<T, 4>(g.ws());
    const auto dy = random_tensor<T, 4>(g.ys());
    host_tensor<float, 4> y[3], dx[3], dw[3];
    for (unsigned t = 0; t < 3; ++t) {
      const precis::cpu_context ctx{t + 1};
      y[t] = poisoned<float, 4>(g.ys());
      dx[t] = poisoned<float, 4>(g.xs());
      dw[t] = poisoned<float, 4>(g.ws());
      precis::conv2d<P>(ctx, x, w, y[t], g.p);
      precis::conv2d_backward_data<P>(ctx, dy, w, dx[t], g.p);
      precis::conv2d_backward_weights<P>(ctx, x, dy, dw[t], g.p);
    }
    CHECK(rel_error(y[1], ref_forward(g, to_double(x), to_double(w))) < bound<float>());
    for (unsigned t = 1; t < 3; ++t) {
      CHECK(same_bits(y[0], y[t]));
      CHECK(same_bits(dx[0], dx[t]));
      CHECK(same_bits(dw[0], dw[t]));
    }
  }
}

/// Packs every panel of many geometries with the im2col packers of widths MR (pixel panels)
/// and NR (tap panels) and checks each element against the reader; returns the panels.
template <std::size_t MR, std::size_t NR>
std::size_t check_im2col_packers() {
  // The packers read runs of pixels along output rows, with bounds worked out once per run;
  // the reader's operator() checks each element on its own. Geometries with padding on one
  // side only, strides and dilations that differ between the axes, kernels wider than the
  // image plus padding on one side, rows shorter and longer than a panel, and panels that
  // start anywhere (across rows and images).
  using precis::detail::im2col_reader;
  std::size_t panels = 0;
  for (const std::array<std::size_t, 4>& hw :
       {std::array<std::size_t, 4>{5, 7, 3, 2}, {9, 1, 1, 1}, {4, 23, 2, 3}, {11, 13, 1, 3}}) {
    for (std::size_t k = 1; k <= 5; k += 2) {
      for (std::size_t s = 1; s <= 3; ++s) {
        for (std::size_t pad = 0; pad <= 2; ++pad) {
          for (std::size_t d = 1; d <= 2; ++d) {
            precis::conv2d_params p;
            p.stride = {s, 4 - s};
            p.padding = {pad, 2 - pad};
            p.dilation = {d, 3 - d};
            const std::size_t n = 2, c = hw[2], h = hw[0], w = hw[1];
            const std::size_t kh = k, kw = hw[3];
            if (h + 2 * p.padding[0] < p.dilation[0] * (kh - 1) + 1 ||
                w + 2 * p.padding[1] < p.dilation[1] * (kw - 1) + 1) {
              continue;
            }
            host_tensor<float, 4> x({n, c, h, w});
            for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = float(i + 1);  // no zeros
            const host_tensor<float, 4> wt({3, c, kh, kw});
            const auto g = precis::detail::conv_geometry_of("test", x, wt, p);
            INFO("x " << precis::shape_string(x.shape()) << " kernel " << kh << "x" << kw
                      << " stride " << p.stride[0] << "," << p.stride[1] << " pad " << p.padding[0]
                      << "," << p.padding[1] << " dilation " << p.dilation[0] << ","
                      << p.dilation[1]);
            const im2col_reader col(g, x.data(), c * h * w);
            const std::size_t J = n * g.pixels(), T = g.taps();
            std::vector<float> out(std::max(MR, NR) * (J + T));
            // Whether out holds kc rows of `width` values, value(kk, i) in the first `used`
            // of each row and zeros after them.
            const auto panel_is = [&out](std::size_t kc, std::size_t width, std::size_t used,
                                         const auto& value) {
              for (std::size_t kk = 0; kk < kc; ++kk) {
                for (std::size_t i = 0; i < width; ++i) {
                  if (out[kk * width + i] != (i < used ? value(kk, i) : 0.0F)) return false;
                }
              }
              return true;
            };
            // Pixel panels: rows j0 .. j0 + rows, taps t0 .. t0 + kc.
            const precis::detail::im2col_pixel_packer<MR> pixels{&col};
            for (std::size_t j0 = 0; j0 < J; ++j0) {
              const std::size_t rows = std::min(MR, J - j0), t0 = j0 % T, kc = T - t0;
              std::fill(out.begin(), out.end(), -1.0F);
              pixels(j0, rows, t0, kc, out.data());
              const auto value = [&](std::size_t kk, std::size_t r) {
                return col(t0 + kk, col.at(j0 + r));
              };
              CHECK_MESSAGE(panel_is(kc, MR, rows, value), "pixel panel from j0 = " << j0);
              ++panels;
            }
            // Tap panels: columns t0 .. t0 + cols, pixels j0 .. j0 + kc.
            const precis::detail::im2col_tap_packer<NR> taps{&col};
            for (std::size_t t0 = 0; t0 < T; t0 += 3) {
              for (std::size_t j0 = 0; j0 < J; j0 += 5) {
                const std::size_t cols = std::min(NR, T - t0), kc = J - j0;
                std::fill(out.begin(), out.end(), -1.0F);
                taps(t0, cols, j0, kc, out.data());
                const auto value = [&](std::size_t kk, std::size_t cc) {
                  return col(t0 + cc, col.at(j0 + kk));
                };
                CHECK_MESSAGE(panel_is(kc, NR, cols, value),
                              "tap panel from t0 = " << t0 << ", j0 = " << j0);
                ++panels;
              }
            }
          }
        }
      }
    }
  }
  return panels;
}

TEST_CASE("the im2col packers give the reader's value for every element of every panel") {
  // The panel widths of the portable micro-kernel, of AVX2's and of AVX-512's, whichever
  // this build runs.
  CHECK(check_im2col_packers<4, 8>() > 1000);
  CHECK(check_im2col_packers<6, 16>() > 1000);
  CHECK(check_im2col_packers<12, 32>() > 1000);
}

TEST_CASE("conv2d rejects bad shapes and arguments, naming them, and writes nothing") {
  using P = precis::presets::fp32;
  const precis::cpu_context ctx{1};
  const auto x = random_tensor<float, 4>({1, 4, 8, 8});
  const auto w = random_tensor<float, 4>({6, 4, 3, 3});
  auto y = poisoned<float, 4>(shape4{1, 6, 7, 7});
  check_error([&] { precis::conv2d<P>(ctx, x, w, y); }, "precis::conv2d: y", "[1, 6, 7, 7]",
              "[1, 6, 6, 6]");
  CHECK(std::isnan(y(0, 0, 0, 0)));
  const auto w_bad = random_tensor<float, 4>({6, 3, 3, 3});
  auto y6 = poisoned<float, 4>(shape4{1, 6, 6, 6});
  check_error([&] { precis::conv2d<P>(ctx, x, w_bad, y6); }, "w", "[6, 3, 3, 3]", "[6, 4, 3, 3]");
  precis::conv2d_params p;
  p.groups = 3;
  check_error([&] { precis::conv2d<P>(ctx, x, w, y6, p); }, "groups");
  const auto big = random_tensor<float, 4>({6, 4, 9, 9});
  auto y1 = poisoned<float, 4>(shape4{1, 6, 1, 1});
  check_error([&] { precis::conv2d<P>(ctx, x, big, y1); }, "does not fit");
  auto dw = poisoned<float, 4>(shape4{6, 4, 3, 3});
  check_error([&] { precis::conv2d_backward_weights<P>(ctx, x, y, dw); }, "dy", "[1, 6, 7, 7]",
              "[1, 6, 6, 6]");
  CHECK(std::isnan(dw(0, 0, 0, 0)));
}

namespace {

/// t [N, C, H, W] as [N, H, W, C] (the same values), and back.
template <class T>
host_tensor<T, 4> nhwc_of(const host_tensor<T, 4>& t) {
  return xt::transpose(t, {0, 2, 3, 1});
}
template <class T>
host_tensor<T, 4> nchw_of(const host_tensor<T, 4>& t) {
  return xt::transpose(t, {0, 3, 1, 2});
}
shape4 nhwc_shape(const shape4& s) { return {s[0], s[2], s[3], s[1]}; }

/// g's parameters for the transposed convolution of g's output: the output_padding that
/// gives back x's size (the rows and columns g's last stride step leaves out).
precis::conv2d_params transposed_params(const geo& g) {
  precis::conv2d_params p = g.p;
  for (std::size_t a = 0; a < 2; ++a) {
    const std::size_t in = a == 0 ? g.h : g.w, k = a == 0 ? g.kh : g.kw;
    p.output_padding[a] = (in + 2 * g.p.padding[a] - g.p.dilation[a] * (k - 1) - 1) % g.p.stride[a];
  }
  return p;
}

}  // namespace

// Channels-last images hold the same values at other places: every pass gives NCHW's bits
// (whose float64 bounds the tests above check), and each result is held to float64 too.
TEST_CASE_TEMPLATE("channels-last convolutions give the NCHW convolutions' bits", Cfg, fp32_config,
                   fp32_hw_config, bf16_config, fp16_config, fp16_hw_config, f64_config) {
  using T = typename Cfg::T;
  using P = typename Cfg::P;
  for (const geo& g : geometries) {
    INFO(describe(g));
    const auto x = random_tensor<T, 4>(g.xs());
    const auto w = random_tensor<T, 4>(g.ws());
    const auto dy = random_tensor<T, 4>(g.ys());
    const auto bias = random_tensor<T, 1>({g.co});
    const auto xl = nhwc_of(x), dyl = nhwc_of(dy);
    precis::conv2d_params pl = g.p;
    pl.layout = precis::image_layout::nhwc;
    const auto xd = to_double(x), wd = to_double(w), dyd = to_double(dy);
    for (unsigned threads : {1U, 2U}) {
      INFO("threads " << threads);
      const precis::cpu_context ctx{threads};
      auto y = poisoned<T, 4>(g.ys()), yl = poisoned<T, 4>(nhwc_shape(g.ys()));
      precis::conv2d<P>(ctx, x, w, y, g.p);
      precis::conv2d<P>(ctx, xl, w, yl, pl);
      CHECK(same_bits(nchw_of(yl), y));
      CHECK(rel_error(nchw_of(yl), ref_forward(g, xd, wd)) < bound<T>());
      auto yb = poisoned<float, 4>(g.ys()), ybl = poisoned<float, 4>(nhwc_shape(g.ys()));
      precis::conv2d<P>(ctx, x, w, bias, yb, g.p);
      precis::conv2d<P>(ctx, xl, w, bias, ybl, pl);
      CHECK(same_bits(nchw_of(ybl), yb));
      auto dx = poisoned<T, 4>(g.xs()), dxl = poisoned<T, 4>(nhwc_shape(g.xs()));
      precis::conv2d_backward_data<P>(ctx, dy, w, dx, g.p);
      precis::conv2d_backward_data<P>(ctx, dyl, w, dxl, pl);
      CHECK(same_bits(nchw_of(dxl), dx));
      CHECK(rel_error(nchw_of(dxl), ref_backward_data(g, dyd, wd)) < bound<T>());
      auto dw = poisoned<T, 4>(g.ws()), dwl = poisoned<T, 4>(g.ws());
      precis::conv2d_backward_weights<P>(ctx, x, dy, dw, g.p);
      precis::conv2d_backward_weights<P>(ctx, xl, dyl, dwl, pl);
      CHECK(same_bits(dwl, dw));
      CHECK(rel_error(dwl, ref_backward_weights(g, xd, dyd)) < bound<T>());
      auto db = poisoned<T, 1>(std::array<std::size_t, 1>{g.co});
      auto dbl = poisoned<T, 1>(std::array<std::size_t, 1>{g.co});
      precis::conv2d_backward_bias<P>(ctx, dy, db);
      precis::conv2d_backward_bias<P>(ctx, dyl, dbl, precis::image_layout::nhwc);
      CHECK(same_bits(dbl, db));
      // The transposed convolution of dy (the adjoint of this one, with the output_padding
      // that gives back x's size), and its gradients.
      const precis::conv2d_params pt = transposed_params(g);
      precis::conv2d_params ptl = pl;
      ptl.output_padding = pt.output_padding;
      auto t = poisoned<T, 4>(g.xs()), tl = poisoned<T, 4>(nhwc_shape(g.xs()));
      precis::conv_transpose2d<P>(ctx, dy, w, t, pt);
      precis::conv_transpose2d<P>(ctx, dyl, w, tl, ptl);
      CHECK(same_bits(nchw_of(tl), t));
      auto tdx = poisoned<T, 4>(g.ys()), tdxl = poisoned<T, 4>(nhwc_shape(g.ys()));
      precis::conv_transpose2d_backward_data<P>(ctx, x, w, tdx, pt);
      precis::conv_transpose2d_backward_data<P>(ctx, xl, w, tdxl, ptl);
      CHECK(same_bits(nchw_of(tdxl), tdx));
      auto tdw = poisoned<T, 4>(g.ws()), tdwl = poisoned<T, 4>(g.ws());
      precis::conv_transpose2d_backward_weights<P>(ctx, dy, x, tdw, pt);
      precis::conv_transpose2d_backward_weights<P>(ctx, dyl, xl, tdwl, ptl);
      CHECK(same_bits(tdwl, tdw));
    }
  }
}

TEST_CASE("channels-last convolutions check NHWC shapes, naming them, and write nothing") {
  using P = precis::presets::bf16_mixed;
  using T = precis::bfloat16;
  const precis::cpu_context ctx{1};
  precis::conv2d_params p;
  p.layout = precis::image_layout::nhwc;
  const auto x = random_tensor<T, 4>({1, 8, 8, 4});  // [N, H, W, C]
  const auto w = random_tensor<T, 4>({5, 4, 3, 3});
  auto y = poisoned<T, 4>(shape4{1, 6, 6, 5});
  precis::conv2d<P>(ctx, x, w, y, p);
  CHECK(!std::isnan(float(y(0, 5, 5, 4))));
  auto y_nchw = poisoned<T, 4>(shape4{1, 5, 6, 6});  // NCHW's shape
  check_error([&] { precis::conv2d<P>(ctx, x, w, y_nchw, p); }, "precis::conv2d: y", "[1, 5, 6, 6]",
              "expected [1, 6, 6, 5]");
  CHECK(std::isnan(float(y_nchw(0, 0, 0, 0))));
  // An NCHW tensor read as NHWC has 8 channels, which w's 4 do not match.
  const auto x_nchw = random_tensor<T, 4>({1, 4, 8, 8});
  check_error([&] { precis::conv2d<P>(ctx, x_nchw, w, y_nchw, p); }, "w", "[5, 4, 3, 3]",
              "[5, 8, 3, 3]");
  CHECK(std::isnan(float(y_nchw(0, 0, 0, 0))));
  auto dx = poisoned<T, 4>(shape4{1, 8, 8, 4});
  const auto dy_nchw = random_tensor<T, 4>({1, 5, 6, 6});
  check_error([&] { precis::conv2d_backward_data<P>(ctx, dy_nchw, w, dx, p); }, "dy",
              "[1, 5, 6, 6]", "[1, 6, 6, 5]");
  CHECK(std::isnan(float(dx(0, 0, 0, 0))));
  auto t = poisoned<T, 4>(shape4{1, 4, 8, 8});
  check_error([&] { precis::conv_transpose2d<P>(ctx, y, w, t, p); }, "y", "[1, 4, 8, 8]",
              "[1, 8, 8, 4]");
  CHECK(std::isnan(float(t(0, 0, 0, 0))));
}

// conv2d_backward and conv_transpose2d_backward compute both passes in one call (with the
// hardware's products, dy moved to oneDNN's layout once): the separate calls' bits.
TEST_CASE_TEMPLATE("the paired backward passes give the separate passes' bits", Cfg, fp32_config,
                   fp32_hw_config, bf16_config, fp16_config, fp16_hw_config, f64_config) {
  using T = typename Cfg::T;
  using P = typename Cfg::P;
  for (const geo& g : geometries) {
    INFO(describe(g));
    const auto x = random_tensor<T, 4>(g.xs());
    const auto w = random_tensor<T, 4>(g.ws());
    const auto dy = random_tensor<T, 4>(g.ys());
    const precis::conv2d_params pt = transposed_params(g);  // dy's gives back x's size
    for (unsigned threads : {1U, 2U}) {
      INFO("threads " << threads);
      const precis::cpu_context ctx{threads};
      auto dx = poisoned<T, 4>(g.xs()), dx2 = poisoned<T, 4>(g.xs());
      auto dw = poisoned<T, 4>(g.ws()), dw2 = poisoned<T, 4>(g.ws());
      precis::conv2d_backward_data<P>(ctx, dy, w, dx, g.p);
      precis::conv2d_backward_weights<P>(ctx, x, dy, dw, g.p);
      precis::conv2d_backward<P>(ctx, x, dy, w, dx2, dw2, g.p);
      CHECK(same_bits(dx2, dx));
      CHECK(same_bits(dw2, dw));
      // The transposed convolution dy -> [x's shape]: its input is dy, its output gradient x.
      auto tdx = poisoned<T, 4>(g.ys()), tdx2 = poisoned<T, 4>(g.ys());
      auto tdw = poisoned<T, 4>(g.ws()), tdw2 = poisoned<T, 4>(g.ws());
      precis::conv_transpose2d_backward_data<P>(ctx, x, w, tdx, pt);
      precis::conv_transpose2d_backward_weights<P>(ctx, dy, x, tdw, pt);
      precis::conv_transpose2d_backward<P>(ctx, dy, x, w, tdx2, tdw2, pt);
      CHECK(same_bits(tdx2, tdx));
      CHECK(same_bits(tdw2, tdw));
      CHECK(rel_error(tdx2, ref_forward(g, to_double(x), to_double(w))) < bound<T>());
    }
  }
  // Shapes are checked before anything is written.
  const geo& g = geometries[0];
  const auto x = random_tensor<T, 4>(g.xs());
  const auto w = random_tensor<T, 4>(g.ws());
  const auto dy = random_tensor<T, 4>(g.ys());
  auto dx = poisoned<T, 4>(g.xs());
  auto dw_bad = poisoned<T, 4>(shape4{g.co, g.c, g.kh, g.kw + 1});
  check_error(
      [&] { precis::conv2d_backward<P>(precis::cpu_context{1}, x, dy, w, dx, dw_bad, g.p); },
      "precis::conv2d_backward: dw");
  CHECK(std::isnan(double(dx(0, 0, 0, 0))));
}
