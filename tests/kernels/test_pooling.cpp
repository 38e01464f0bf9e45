// max/avg pooling and nearest/bilinear upsampling, forward and backward, against float64
// references from the same rounded inputs. Bounds: kernel_checks.hpp's table (max |kernel
// - reference| / max |reference|: float 1e-5, bfloat16 1e-2, float16 2e-3): max pooling
// and nearest upsampling are exact before the output rounding; averages and bilinear
// weights add a few float ulps (sums of <= 9 terms). The float64 backward references are
// checked against central differences of the float64 forward (max pooling: random inputs
// have no ties, so it is differentiable there).
#include <precis/kernels/pooling.hpp>

#include "kernel_checks.hpp"

#include <doctest/doctest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace {

using namespace precis_test;
using precis::host_tensor;
using shape4 = std::array<std::size_t, 4>;

struct pool_case {
  shape4 x;
  precis::pool2d_params p;
};

std::size_t out_size(std::size_t in, std::size_t k, std::size_t s, std::size_t pad) {
  return (in + 2 * pad - k) / (s == 0 ? k : s) + 1;
}

shape4 pooled(const pool_case& c) {
  const auto& p = c.p;
  return {c.x[0], c.x[1], out_size(c.x[2], p.kernel[0], p.stride[0], p.padding[0]),
          out_size(c.x[3], p.kernel[1], p.stride[1], p.padding[1])};
}

/// Calls f(n, ch, oy, ox, iy, ix, count) for every in-bounds element of every window.
template <class F>
void for_windows(const pool_case& c, F f) {
  const auto ys = pooled(c);
  const auto& p = c.p;
  const std::size_t sh = p.stride[0] ? p.stride[0] : p.kernel[0];
  const std::size_t sw = p.stride[1] ? p.stride[1] : p.kernel[1];
  for (std::size_t n = 0; n < ys[0]; ++n)
    for (std::size_t ch = 0; ch < ys[1]; ++ch)
      for (std::size_t oy = 0; oy < ys[2]; ++oy)
        for (std::size_t ox = 0; ox < ys[3]; ++ox) {
          std::size_t inside = 0;
          for (int pass = 0; pass < 2; ++pass)
            for (std::size_t ky = 0; ky < p.kernel[0]; ++ky)
              for (std::size_t kx = 0; kx < p.kernel[1]; ++kx) {
                const long iy = long(oy * sh + ky) - long(p.padding[0]);
                const long ix = long(ox * sw + kx) - long(p.padding[1]);
                if (iy < 0 || ix < 0 || iy >= long(c.x[2]) || ix >= long(c.x[3])) continue;
                if (pass == 0) {
                  ++inside;
                } else {
                  f(n, ch, oy, ox, std::size_t(iy), std::size_t(ix),
                    p.count_include_pad ? p.kernel[0] * p.kernel[1] : inside);
                }
              }
        }
}

host_tensor<double, 4> ref_max(const pool_case& c, const host_tensor<double, 4>& x) {
  auto y = host_tensor<double, 4>::from_shape(pooled(c));
  y.fill(-INFINITY);
  for_windows(c, [&](auto n, auto ch, auto oy, auto ox, auto iy, auto ix, auto) {
    y(n, ch, oy, ox) = std::max(y(n, ch, oy, ox), x(n, ch, iy, ix));
  });
  return y;
}

host_tensor<double, 4> ref_max_backward(const pool_case& c, const host_tensor<double, 4>& x,
                                        const host_tensor<double, 4>& dy) {
  const auto y = ref_max(c, x);
  auto dx = host_tensor<double, 4>::from_shape(c.x);
  dx.fill(0);
  auto done = y;
  done.fill(0);
  for_windows(c, [&](auto n, auto ch, auto oy, auto ox, auto iy, auto ix, auto) {
    if (done(n, ch, oy, ox) == 0 && x(n, ch, iy, ix) == y(n, ch, oy, ox)) {
      dx(n, ch, iy, ix) += dy(n, ch, oy, ox);
      done(n, ch, oy, ox) = 1;
    }
  });
  return dx;
}

host_tensor<double, 4> ref_avg(const pool_case& c, const host_tensor<double, 4>& x) {
  auto y = host_tensor<double, 4>::from_shape(pooled(c));
  y.fill(0);
  for_windows(c, [&](auto n, auto ch, auto oy, auto ox, auto iy, auto ix, auto count) {
    y(n, ch, oy, ox) += x(n, ch, iy, ix) / double(count);
  });
  return y;
}

host_tensor<double, 4> ref_avg_backward(const pool_case& c, const host_tensor<double, 4>& dy) {
  auto dx = host_tensor<double, 4>::from_shape(c.x);
  dx.fill(0);
  for_windows(c, [&](auto n, auto ch, auto oy, auto ox, auto iy, auto ix, auto count) {
    dx(n, ch, iy, ix) += dy(n, ch, oy, ox) / double(count);
  });
  return dx;
}

precis::pool2d_params pp(std::size_t k, std::size_t s, std::size_t pad, bool include_pad = true) {
  precis::pool2d_params p;
  p.kernel = {k, k};
  p.stride = {s, s};
  p.padding = {pad, pad};
  p.count_include_pad = include_pad;
  return p;
}

const pool_case pool_cases[] = {
    {{2, 3, 9, 11}, pp(2, 0, 0)},
    {{1, 4, 13, 10}, pp(3, 2, 1)},        // ResNet's stem pooling, odd sizes
    {{2, 2, 7, 7}, pp(3, 1, 1, false)},
    {{1, 3, 8, 5}, pp(2, 3, 1)},
};

/// Bilinear/nearest references in double (PyTorch's index rules).
double src_bilinear(std::size_t d, std::size_t in, std::size_t out, bool ac) {
  if (ac) return out > 1 ? double(d) * double(in - 1) / double(out - 1) : 0.0;
  return std::max(0.0, (double(d) + 0.5) * double(in) / double(out) - 0.5);
}

template <class F>
void for_bilinear(const shape4& xs, const shape4& ys, bool ac, F f) {
  for (std::size_t n = 0; n < xs[0]; ++n)
    for (std::size_t ch = 0; ch < xs[1]; ++ch)
      for (std::size_t oy = 0; oy < ys[2]; ++oy)
        for (std::size_t ox = 0; ox < ys[3]; ++ox) {
          const double sy = src_bilinear(oy, xs[2], ys[2], ac), sx = src_bilinear(ox, xs[3], ys[3], ac);
          const std::size_t y0 = std::min(std::size_t(sy), xs[2] - 1), x0 = std::min(std::size_t(sx), xs[3] - 1);
          const std::size_t y1 = std::min(y0 + 1, xs[2] - 1), x1 = std::min(x0 + 1, xs[3] - 1);
          const double fy = sy - double(y0), fx = sx - double(x0);
          f(n, ch, oy, ox, y0, x0, (1 - fy) * (1 - fx));
          f(n, ch, oy, ox, y0, x1, (1 - fy) * fx);
          f(n, ch, oy, ox, y1, x0, fy * (1 - fx));
          f(n, ch, oy, ox, y1, x1, fy * fx);
        }
}

}  // namespace

// Double math, and bfloat16 sums rounded after every addition: the backward pass's general
// path besides the float one.
using f64_config = config<double, precis::policy<double, double, double, double>>;
using bf16_sums_config =
    config<precis::bfloat16, precis::policy<precis::bfloat16, precis::bfloat16, precis::bfloat16>>;

/// The bound of a window's or a gradient's sum: the output's one rounding, and with bfloat16
/// sums up to 8 more (<= 9 terms), each at most 2^-9 of a partial sum no larger than the
/// sum of the terms' sizes: 4x the bound covers them (seen up to 1.1x).
template <class Cfg>
double sum_bound() {
  using T = typename Cfg::T;
  return std::is_same_v<Cfg, bf16_sums_config> ? 4 * bound<T>() : bound<T>();
}

TEST_CASE_TEMPLATE("max and avg pooling match float64, forward and backward", Cfg, fp32_config,
                   bf16_config, fp16_config, f64_config, bf16_sums_config) {
  using T = typename Cfg::T;
  using P = typename Cfg::P;
  for (const auto& c : pool_cases) {
    INFO("x " << precis::shape_string(c.x) << " kernel " << c.p.kernel[0] << " stride "
              << c.p.stride[0] << " pad " << c.p.padding[0] << " include_pad " << c.p.count_include_pad);
    const auto x = random_tensor<T, 4>(c.x);
    const auto dy = random_tensor<T, 4>(pooled(c));
    const auto xd = to_double(x), dyd = to_double(dy);
    for (unsigned threads : {1U, 2U}) {
      const precis::cpu_context ctx{threads};
      auto y = poisoned<T, 4>(pooled(c));
      precis::max_pool2d<P>(ctx, x, y, c.p);
      CHECK(rel_error(y, ref_max(c, xd)) < bound<T>());
      auto dx = poisoned<T, 4>(c.x);
      precis::max_pool2d_backward<P>(ctx, x, dy, dx, c.p);
      CHECK(rel_error(dx, ref_max_backward(c, xd, dyd)) < sum_bound<Cfg>());
      // With the indices a training pass keeps: the same maxima, and the backward pass
      // from them gives the bits of the one from x.
      auto y_kept = poisoned<T, 4>(pooled(c));
      auto indices = host_tensor<std::uint32_t, 4>::from_shape(pooled(c));
      precis::max_pool2d<P>(ctx, x, y_kept, indices, c.p);
      CHECK(same_bits(y_kept, y));
      auto dx_kept = poisoned<T, 4>(c.x);
      precis::max_pool2d_backward<P>(ctx, indices, dy, dx_kept, c.p);
      CHECK(same_bits(dx_kept, dx));
      precis::avg_pool2d<P>(ctx, x, y, c.p);
      CHECK(rel_error(y, ref_avg(c, xd)) < sum_bound<Cfg>());
      poison(dx);
      precis::avg_pool2d_backward<P>(ctx, dy, dx, c.p);
      CHECK(rel_error(dx, ref_avg_backward(c, dyd)) < sum_bound<Cfg>());
    }
  }
}

TEST_CASE("pooling's float64 backward references are the gradients (central differences)") {
  // (Tie-free values: with random ones two values of a window can lie within the step of
  // each other, and the difference quotient then straddles the change of winner.)
  const pool_case c{{1, 2, 7, 8}, pp(3, 2, 1, false)};
  const auto xd = tie_free_tensor<4>(c.x);
  const auto dyd = to_double(random_tensor<double, 4>(pooled(c)));
  const auto fmax = [&](const host_tensor<double, 4>& x) { return dot(dyd, ref_max(c, x)); };
  const auto favg = [&](const host_tensor<double, 4>& x) { return dot(dyd, ref_avg(c, x)); };
  CHECK(rel_error(fd_gradient(fmax, xd), ref_max_backward(c, xd, dyd)) < fd_bound);
  CHECK(rel_error(fd_gradient(favg, xd), ref_avg_backward(c, dyd)) < fd_bound);
}

TEST_CASE_TEMPLATE("nearest and bilinear upsampling match float64, forward and backward", Cfg,
                   fp32_config, bf16_config, fp16_config) {
  using T = typename Cfg::T;
  using P = typename Cfg::P;
  const shape4 xs{2, 3, 5, 7};
  for (const shape4 ys : {shape4{2, 3, 10, 14}, shape4{2, 3, 11, 9}, shape4{2, 3, 3, 4}}) {
    INFO("y " << precis::shape_string(ys));
    const auto x = random_tensor<T, 4>(xs);
    const auto dy = random_tensor<T, 4>(ys);
    const auto xd = to_double(x), dyd = to_double(dy);
    const precis::cpu_context ctx{2};
    // nearest
    auto yref = host_tensor<double, 4>::from_shape(ys);
    auto dxref = host_tensor<double, 4>::from_shape(xs);
    dxref.fill(0);
    for (std::size_t n = 0; n < 2; ++n)
      for (std::size_t ch = 0; ch < 3; ++ch)
        for (std::size_t oy = 0; oy < ys[2]; ++oy)
          for (std::size_t ox = 0; ox < ys[3]; ++ox) {
            const std::size_t iy = oy * xs[2] / ys[2], ix = ox * xs[3] / ys[3];
            yref(n, ch, oy, ox) = xd(n, ch, iy, ix);
            dxref(n, ch, iy, ix) += dyd(n, ch, oy, ox);
          }
    auto y = poisoned<T, 4>(ys);
    precis::upsample_nearest2d<P>(ctx, x, y);
    CHECK(rel_error(y, yref) < bound<T>());
    auto dx = poisoned<T, 4>(xs);
    precis::upsample_nearest2d_backward<P>(ctx, dy, dx);
    CHECK(rel_error(dx, dxref) < bound<T>());
    for (bool ac : {false, true}) {
      INFO("align_corners " << ac);
      yref.fill(0);
      dxref.fill(0);
      for_bilinear(xs, ys, ac, [&](auto n, auto ch, auto oy, auto ox, auto iy, auto ix, double wgt) {
        yref(n, ch, oy, ox) += wgt * xd(n, ch, iy, ix);
        dxref(n, ch, iy, ix) += wgt * dyd(n, ch, oy, ox);
      });
      poison(y);
      precis::upsample_bilinear2d<P>(ctx, x, y, ac);
      CHECK(rel_error(y, yref) < bound<T>());
      poison(dx);
      precis::upsample_bilinear2d_backward<P>(ctx, dy, dx, ac);
      CHECK(rel_error(dx, dxref) < bound<T>());
      // The adjoint is the gradient of sum(dy * forward).
      const auto f = [&](const host_tensor<double, 4>& xx) {
        auto yy = host_tensor<double, 4>::from_shape(ys);
        yy.fill(0);
        for_bilinear(xs, ys, ac, [&](auto n, auto ch, auto oy, auto ox, auto iy, auto ix, double wgt) {
          yy(n, ch, oy, ox) += wgt * xx(n, ch, iy, ix);
        });
        return dot(dyd, yy);
      };
      CHECK(rel_error(fd_gradient(f, xd), dxref) < fd_bound);
    }
  }
}

namespace {

/// The bits of a float or a 16-bit format.
template <class T>
std::uint32_t bits_of(T v) {
  if constexpr (sizeof(T) == 4) {
    return std::bit_cast<std::uint32_t>(v);
  } else {
    return std::bit_cast<std::uint16_t>(v);
  }
}

/// Values with many ties (-0 and +0 among them), infinities and NaNs of two payloads and
/// both signs: where max pooling's first maximum differs from any other maximum.
template <class T>
host_tensor<T, 4> tie_tensor(const shape4& shape, std::uint32_t seed) {
  const float nan_a = std::bit_cast<float>(0x7fc10000U), nan_b = std::bit_cast<float>(0xffc20000U);
  const float pool[] = {-2.0F, -1.0F, -0.0F, 0.0F, 1.0F, 2.0F, INFINITY, -INFINITY, nan_a, nan_b};
  auto t = host_tensor<T, 4>::from_shape(shape);
  std::uint32_t r = seed;
  for (auto& v : t) {
    r = r * 1664525U + 1013904223U;
    // NaNs rarer than the rest, so most windows have none.
    const std::uint32_t k = (r >> 16) % 64;
    v = T(k < 60 ? pool[k % 8] : pool[8 + k % 2]);
  }
  return t;
}

}  // namespace

// The first maximum of each window in row-major order (the first NaN where there is one),
// found element by element: an oracle independent of the kernel's separable search.
TEST_CASE_TEMPLATE(
    "max pooling takes each window's first maximum, bit for bit, with ties and "
    "NaNs",
    T, float, precis::bfloat16) {
  using P = std::conditional_t<std::is_same_v<T, float>, precis::presets::fp32,
                               precis::presets::bf16_mixed>;
  const pool_case cases[] = {
      {{2, 3, 13, 17}, pp(3, 2, 1)},
      {{1, 2, 9, 11}, pp(2, 0, 0)},
      {{1, 2, 12, 13}, pp(3, 1, 1)},
      {{1, 3, 10, 16}, pp(4, 3, 2)},
      {{2, 1, 7, 9}, pp(1, 1, 0)},
      {{1, 2, 5, 40}, pp(3, 2, 0)},
      {{1, 1, 6, 6}, pp(5, 2, 2)},
      // Rows of at least a vector of outputs (4, 8 or 16 lanes) take the vectorised passes
      // for strides 1 and 2: whole vectors, a last one that overlaps, and clipped edges.
      {{1, 2, 9, 70}, pp(3, 1, 1)},
      {{2, 1, 6, 75}, pp(3, 2, 1)},
      {{1, 1, 5, 64}, pp(2, 2, 0)},
      {{1, 2, 4, 37}, pp(3, 2, 1)},
      {{1, 1, 3, 33}, pp(2, 1, 0)},
  };
  std::uint32_t seed = 1;
  for (const auto& c : cases) {
    INFO("x " << precis::shape_string(c.x) << " kernel " << c.p.kernel[0] << " stride "
              << c.p.stride[0] << " padding " << c.p.padding[0]);
    const auto ys = pooled(c);
    const auto x = tie_tensor<T>(c.x, seed++);
    // Small integers: every sum of them is exact, so any order gives the oracle's bits.
    auto dy = host_tensor<T, 4>::from_shape(ys);
    for (std::size_t i = 0; i < dy.size(); ++i) dy.data()[i] = T(float(int(i % 7) - 3));
    // The oracle: index of each window's first maximum, and the gradient it receives.
    auto first = host_tensor<std::size_t, 4>::from_shape(ys);
    auto best = host_tensor<float, 4>::from_shape(ys);
    auto done = host_tensor<int, 4>::from_shape(ys);
    done.fill(0);
    for_windows(c, [&](auto n, auto ch, auto oy, auto ox, auto iy, auto ix, auto) {
      const float v = float(x(n, ch, iy, ix));
      float& b = best(n, ch, oy, ox);
      if (done(n, ch, oy, ox) == 0) {
        done(n, ch, oy, ox) = 1;
      } else if (std::isnan(b) || !(v > b || std::isnan(v))) {
        return;
      }
      b = v;
      first(n, ch, oy, ox) = iy * c.x[3] + ix;
    });
    auto dx_ref = host_tensor<double, 4>::from_shape(c.x);
    dx_ref.fill(0.0);
    for (std::size_t n = 0; n < ys[0]; ++n)
      for (std::size_t ch = 0; ch < ys[1]; ++ch)
        for (std::size_t oy = 0; oy < ys[2]; ++oy)
          for (std::size_t ox = 0; ox < ys[3]; ++ox) {
            const std::size_t at = first(n, ch, oy, ox);
            dx_ref(n, ch, at / c.x[3], at % c.x[3]) += double(float(dy(n, ch, oy, ox)));
          }
    for (unsigned threads : {1U, 2U}) {
      const precis::cpu_context ctx{threads};
      auto y = poisoned<T, 4>(ys);
      precis::max_pool2d<P>(ctx, x, y, c.p);
      std::size_t wrong = 0;
      for (std::size_t n = 0; n < ys[0]; ++n)
        for (std::size_t ch = 0; ch < ys[1]; ++ch)
          for (std::size_t oy = 0; oy < ys[2]; ++oy)
            for (std::size_t ox = 0; ox < ys[3]; ++ox) {
              const std::size_t at = first(n, ch, oy, ox);
              wrong += bits_of(y(n, ch, oy, ox)) != bits_of(x(n, ch, at / c.x[3], at % c.x[3]));
            }
      CHECK(wrong == 0);
      auto dx = poisoned<float, 4>(c.x);
      precis::max_pool2d_backward<P>(ctx, x, dy, dx, c.p);
      std::size_t wrong_dx = 0;
      for (std::size_t i = 0; i < dx.size(); ++i)
        wrong_dx += double(dx.data()[i]) != dx_ref.data()[i];
      CHECK(wrong_dx == 0);
      // The kept indices are the oracle's, and the backward pass from them gives its dx.
      auto indices = host_tensor<std::uint32_t, 4>::from_shape(ys);
      indices.fill(UINT32_MAX);
      precis::max_pool2d<P>(ctx, x, y, indices, c.p);
      std::size_t wrong_at = 0;
      for (std::size_t i = 0; i < indices.size(); ++i)
        wrong_at += std::size_t(indices.data()[i]) != first.data()[i];
      CHECK(wrong_at == 0);
      poison(dx);
      precis::max_pool2d_backward<P>(ctx, indices, dy, dx, c.p);
      wrong_dx = 0;
      for (std::size_t i = 0; i < dx.size(); ++i)
        wrong_dx += double(dx.data()[i]) != dx_ref.data()[i];
      CHECK(wrong_dx == 0);
    }
  }
}

TEST_CASE("pooling gives the same bits on 1 and 2 threads") {
  using P = precis::presets::bf16_mixed;
  const pool_case c{{4, 8, 17, 19}, pp(3, 2, 1)};
  const auto x = random_tensor<precis::bfloat16, 4>(c.x);
  const auto dy = random_tensor<precis::bfloat16, 4>(pooled(c));
  auto d1 = poisoned<float, 4>(c.x), d2 = d1;
  precis::avg_pool2d_backward<P>(precis::cpu_context{1}, dy, d1, c.p);
  precis::avg_pool2d_backward<P>(precis::cpu_context{2}, dy, d2, c.p);
  CHECK(same_bits(d1, d2));
  auto u1 = poisoned<float, 4>(shape4{4, 8, 34, 38}), u2 = u1;
  precis::upsample_bilinear2d<P>(precis::cpu_context{1}, x, u1);
  precis::upsample_bilinear2d<P>(precis::cpu_context{2}, x, u2);
  CHECK(same_bits(u1, u2));
}

TEST_CASE("pooling rejects bad shapes and arguments, naming them, and writes nothing") {
  using P = precis::presets::fp32;
  const precis::cpu_context ctx{1};
  const auto x = random_tensor<float, 4>({1, 2, 8, 8});
  auto y = poisoned<float, 4>(shape4{1, 2, 5, 4});
  check_error([&] { precis::max_pool2d<P>(ctx, x, y); }, "precis::max_pool2d: y", "[1, 2, 5, 4]",
              "[1, 2, 4, 4]");
  CHECK(std::isnan(y(0, 0, 0, 0)));
  check_error([&] { precis::avg_pool2d<P>(ctx, x, y, pp(2, 1, 2)); }, "padding");
  check_error([&] { precis::max_pool2d<P>(ctx, x, y, pp(9, 1, 0)); }, "does not fit");
  // Indices: their shape is the output's, and each must lie in its plane.
  auto indices = host_tensor<std::uint32_t, 4>::from_shape({1, 2, 4, 5});
  auto y4 = poisoned<float, 4>(shape4{1, 2, 4, 4});
  check_error([&] { precis::max_pool2d<P>(ctx, x, y4, indices); }, "precis::max_pool2d: indices",
              "[1, 2, 4, 5]", "[1, 2, 4, 4]");
  CHECK(std::isnan(y4(0, 0, 0, 0)));
  auto good = host_tensor<std::uint32_t, 4>::from_shape({1, 2, 4, 4});
  precis::max_pool2d<P>(ctx, x, y4, good);
  auto dx = poisoned<float, 4>(shape4{1, 2, 8, 8});
  check_error([&] { precis::max_pool2d_backward<P>(ctx, indices, y4, dx); },
              "precis::max_pool2d_backward: indices", "[1, 2, 4, 5]", "[1, 2, 4, 4]");
  auto outside = good;
  outside(0, 1, 3, 3) = 64;  // the plane holds 8 x 8 elements
  check_error([&] { precis::max_pool2d_backward<P>(ctx, outside, y4, dx); },
              "precis::max_pool2d_backward", "outside its plane of 8 x 8");
  std::size_t written = 0;
  for (std::size_t i = 0; i < dx.size(); ++i) written += !std::isnan(dx.data()[i]);
  CHECK(written == 0);
  const auto no_pixels = random_tensor<float, 4>({1, 1, 0, 4});
  auto y1 = poisoned<float, 4>(shape4{1, 1, 1, 3});
  check_error([&] { precis::max_pool2d<P>(ctx, no_pixels, y1, pp(2, 2, 1)); }, "[1, 1, 0, 4]",
              "has no pixels");
  auto u = poisoned<float, 4>(shape4{1, 3, 16, 16});
  check_error([&] { precis::upsample_bilinear2d<P>(ctx, x, u); }, "[1, 3, 16, 16]", "[1, 2, 16, 16]");
  CHECK(std::isnan(u(0, 0, 0, 0)));
}
