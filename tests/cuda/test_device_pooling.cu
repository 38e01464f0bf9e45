// The device pooling, upsampling and batch-norm kernels against the CPU kernels on the
// same random inputs, forward and backward, within the output type's bound; outputs are
// poisoned with NaN first. Max pooling's kept indices are the host's, and its backward pass
// from them gives the bits of the one from x. Pooling covers overlapping and padded windows
// (whose backward passes gather several outputs per input), count_include_pad both ways,
// upsampling by integer and non-integer factors with and without align_corners;
// channels-last pooling and upsampling give the NCHW kernels' bits, moved, and pooling's and
// upsampling's 64-bit index paths the 32-bit paths' bits. Batch norm covers rank 2 and 4,
// channels-last images (in 16-byte packs of channels and not), the running statistics,
// inference mode, and a fused ReLU against batch norm then relu (the device's bits). Shape
// errors are thrown before any launch. Exits 77 (skipped) where no GPU is present.
#include <precis/kernels/cuda/elementwise.hpp>
#include <precis/kernels/cuda/norm.hpp>
#include <precis/kernels/cuda/pooling.hpp>

#include "device_test.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace {

using namespace precis_test;

precis::pool2d_params window(std::size_t k, std::size_t s, std::size_t pad, bool include_pad) {
  precis::pool2d_params p;
  p.kernel = {k, k};
  p.stride = {s, s};
  p.padding = {pad, pad};
  p.count_include_pad = include_pad;
  return p;
}

template <class P, class T>
void check_pooling(precis::cuda_context& ctx, const precis::cpu_context& cpu,
                   const std::string& tag) {
  const std::array<std::size_t, 4> xs{2, 5, 17, 14};
  const auto x = random_tensor<T, 4>(xs);
  const auto dx_ = precis::to_device(x);
  for (const auto& p : {window(2, 2, 0, true), window(3, 2, 1, true), window(3, 2, 1, false),
                        window(3, 1, 1, false), window(5, 3, 2, true)}) {
    const std::size_t ho = (xs[2] + 2 * p.padding[0] - p.kernel[0]) / p.stride[0] + 1;
    const std::size_t wo = (xs[3] + 2 * p.padding[1] - p.kernel[1]) / p.stride[1] + 1;
    const std::array<std::size_t, 4> ys{xs[0], xs[1], ho, wo};
    const auto dy = random_tensor<T, 4>(ys);
    const auto ddy = precis::to_device(dy);
    const std::string w = tag + " k=" + std::to_string(p.kernel[0]) +
                          " s=" + std::to_string(p.stride[0]) +
                          " pad=" + std::to_string(p.padding[0]) +
                          " include_pad=" + std::to_string(p.count_include_pad);
    auto y = precis::host_tensor<T, 4>::from_shape(ys);
    auto gx = precis::host_tensor<T, 4>::from_shape(xs);
    auto d = poisoned<T, 4>(ys);
    precis::max_pool2d<P>(cpu, x, y, p);
    precis::max_pool2d<P>(ctx, dx_, d, p);
    expect(same_bits(ctx, d, y), "max_pool2d gives the host's bits" + w);
    auto dg = poisoned<T, 4>(xs);
    precis::max_pool2d_backward<P>(cpu, x, dy, gx, p);
    precis::max_pool2d_backward<P>(ctx, dx_, ddy, dg, p);
    compare("max_pool2d_backward" + w, ctx, dg, gx);
    // The indices a training pass keeps: the host's, and the backward pass from them gives
    // the backward pass from x bit for bit.
    auto at = precis::host_tensor<std::uint32_t, 4>::from_shape(ys);
    precis::max_pool2d<P>(cpu, x, y, at, p);
    auto dat = poisoned<std::uint32_t, 4>(ys);
    d = poisoned<T, 4>(ys);
    precis::max_pool2d<P>(ctx, dx_, d, dat, p);
    expect(same_bits(ctx, dat, at), "max_pool2d's indices are the host's" + w);
    expect(same_bits(ctx, d, y), "max_pool2d with indices gives the host's bits" + w);
    auto dgk = poisoned<T, 4>(xs);
    precis::max_pool2d_backward<P>(ctx, dat, ddy, dgk, p);
    expect(same_bits(ctx, dgk, precis::to_host(dg, ctx.stream())),
           "max_pool2d_backward from indices gives the bits of the one from x" + w);
    d = poisoned<T, 4>(ys);
    precis::avg_pool2d<P>(cpu, x, y, p);
    precis::avg_pool2d<P>(ctx, dx_, d, p);
    compare("avg_pool2d" + w, ctx, d, y);
    dg = poisoned<T, 4>(xs);
    precis::avg_pool2d_backward<P>(cpu, dy, gx, p);
    precis::avg_pool2d_backward<P>(ctx, ddy, dg, p);
    compare("avg_pool2d_backward" + w, ctx, dg, gx);
  }
  // Ties: the first maximum of the window takes the gradient, as on the host.
  auto flat = precis::host_tensor<T, 4>::from_shape({1, 1, 4, 4});
  for (auto& v : flat) v = T(1.0F);
  const auto dflat = precis::to_device(flat);
  const auto g1 = random_tensor<T, 4>({1, 1, 2, 2});
  auto want = precis::host_tensor<T, 4>::from_shape({1, 1, 4, 4});
  precis::max_pool2d_backward<P>(cpu, flat, g1, want, window(2, 2, 0, true));
  auto got = poisoned<T, 4>({1, 1, 4, 4});
  precis::max_pool2d_backward<P>(ctx, dflat, precis::to_device(g1), got, window(2, 2, 0, true));
  expect(same_bits(ctx, got, want), "max_pool2d_backward ties go to the first maximum" + tag);

  // Upsampling: x2 (DBNet's FPN), and 7 -> 17 / 9 -> 4 (non-integer factors, down too).
  for (const auto& out : {std::array<std::size_t, 2>{34, 28}, std::array<std::size_t, 2>{40, 31},
                          std::array<std::size_t, 2>{9, 4}}) {
    const std::array<std::size_t, 4> ys{xs[0], xs[1], out[0], out[1]};
    const auto dy = random_tensor<T, 4>(ys);
    const auto ddy = precis::to_device(dy);
    const std::string w = tag + " to " + std::to_string(out[0]) + "x" + std::to_string(out[1]);
    auto y = precis::host_tensor<T, 4>::from_shape(ys);
    auto gx = precis::host_tensor<T, 4>::from_shape(xs);
    auto d = poisoned<T, 4>(ys);
    precis::upsample_nearest2d<P>(cpu, x, y);
    precis::upsample_nearest2d<P>(ctx, dx_, d);
    expect(same_bits(ctx, d, y), "upsample_nearest2d gives the host's bits" + w);
    auto dg = poisoned<T, 4>(xs);
    precis::upsample_nearest2d_backward<P>(cpu, dy, gx);
    precis::upsample_nearest2d_backward<P>(ctx, ddy, dg);
    compare("upsample_nearest2d_backward" + w, ctx, dg, gx);
    for (bool align : {false, true}) {
      const std::string wa = w + " align_corners=" + std::to_string(align);
      d = poisoned<T, 4>(ys);
      precis::upsample_bilinear2d<P>(cpu, x, y, align);
      precis::upsample_bilinear2d<P>(ctx, dx_, d, align);
      compare("upsample_bilinear2d" + wa, ctx, d, y);
      dg = poisoned<T, 4>(xs);
      precis::upsample_bilinear2d_backward<P>(cpu, dy, gx, align);
      precis::upsample_bilinear2d_backward<P>(ctx, ddy, dg, align);
      compare("upsample_bilinear2d_backward" + wa, ctx, dg, gx);
    }
  }
  auto wrong = poisoned<T, 4>({2, 5, 8, 8});
  expect_error(
      "max_pool2d shape", [&] { precis::max_pool2d<P>(ctx, dx_, wrong, window(2, 2, 0, true)); },
      "precis::max_pool2d: y");
  expect_error(
      "pool padding", [&] { precis::avg_pool2d<P>(ctx, dx_, wrong, window(2, 2, 2, true)); },
      "padding");
}

// x [N, C, H, W] moved to [N, H, W, C].
template <class T>
precis::host_tensor<T, 4> nhwc_of(const precis::host_tensor<T, 4>& t) {
  const auto s = t.shape();
  auto r = precis::host_tensor<T, 4>::from_shape({s[0], s[2], s[3], s[1]});
  for (std::size_t n = 0; n < s[0]; ++n)
    for (std::size_t c = 0; c < s[1]; ++c)
      for (std::size_t h = 0; h < s[2]; ++h)
        for (std::size_t w = 0; w < s[3]; ++w) r(n, h, w, c) = t(n, c, h, w);
  return r;
}

// Batch norm with a fused ReLU gives the device's batch norm, then relu, bit for bit: training
// (the output, saved and running statistics), inference, and the backward pass from dz and z
// against relu_backward then batch_norm_backward.
template <class P, class T, std::size_t N>
void check_fused_relu(precis::cuda_context& ctx, const precis::device_tensor<T, N>& x,
                      const precis::device_tensor<T, 1>& gamma, const precis::device_tensor<T, 1>& beta,
                      const precis::device_tensor<T, N>& dz, const precis::host_tensor<float, 1>& rm,
                      const precis::host_tensor<float, 1>& rv, const std::array<std::size_t, N>& ds,
                      const std::string& tag, precis::image_layout layout) {
  const std::size_t c = gamma.size();
  const std::string w = " with a fused relu" + tag;
  auto rm1 = precis::to_device(rm), rv1 = precis::to_device(rv), rm2 = precis::to_device(rm),
       rv2 = precis::to_device(rv);
  auto y = poisoned<T, N>(ds), z = poisoned<T, N>(ds), zf = poisoned<T, N>(ds);
  auto sm = poisoned<float, 1>({c}), sr = poisoned<float, 1>({c}), smf = poisoned<float, 1>({c}),
       srf = poisoned<float, 1>({c});
  precis::batch_norm_train<P>(ctx, x, gamma, beta, rm1, rv1, y, sm, sr, 0.1, 1e-5, layout);
  precis::relu<P>(ctx, y, z);
  precis::batch_norm_train<P>(ctx, x, gamma, beta, rm2, rv2, zf, smf, srf, 0.1, 1e-5, layout,
                              precis::fused_activation::relu);
  expect(same_bits(ctx, zf, precis::to_host(z, ctx.stream())), "batch_norm_train" + w);
  expect(same_bits(ctx, smf, precis::to_host(sm, ctx.stream())), "batch_norm_train save_mean" + w);
  expect(same_bits(ctx, srf, precis::to_host(sr, ctx.stream())), "batch_norm_train save_rstd" + w);
  expect(same_bits(ctx, rm2, precis::to_host(rm1, ctx.stream())), "batch_norm_train running_mean" + w);
  expect(same_bits(ctx, rv2, precis::to_host(rv1, ctx.stream())), "batch_norm_train running_var" + w);
  auto yi = poisoned<T, N>(ds), zi = poisoned<T, N>(ds), zif = poisoned<T, N>(ds);
  precis::batch_norm_infer<P>(ctx, x, gamma, beta, rm1, rv1, yi, 1e-5, layout);
  precis::relu<P>(ctx, yi, zi);
  precis::batch_norm_infer<P>(ctx, x, gamma, beta, rm1, rv1, zif, 1e-5, layout, precis::fused_activation::relu);
  expect(same_bits(ctx, zif, precis::to_host(zi, ctx.stream())), "batch_norm_infer" + w);
  auto dy = poisoned<T, N>(ds), dx = poisoned<T, N>(ds), dxf = poisoned<T, N>(ds);
  auto dg = poisoned<T, 1>({c}), db = poisoned<T, 1>({c}), dgf = poisoned<T, 1>({c}), dbf = poisoned<T, 1>({c});
  precis::relu_backward<P>(ctx, dz, y, dy);
  precis::batch_norm_backward<P>(ctx, dy, x, gamma, sm, sr, dx, dg, db, layout);
  precis::batch_norm_relu_backward<P>(ctx, dz, z, x, gamma, sm, sr, dxf, dgf, dbf, layout);
  expect(same_bits(ctx, dxf, precis::to_host(dx, ctx.stream())), "batch_norm_relu_backward dx" + w);
  expect(same_bits(ctx, dgf, precis::to_host(dg, ctx.stream())), "batch_norm_relu_backward dgamma" + w);
  expect(same_bits(ctx, dbf, precis::to_host(db, ctx.stream())), "batch_norm_relu_backward dbeta" + w);
}

template <class P, class T, std::size_t N>
void check_batch_norm(precis::cuda_context& ctx, const precis::cpu_context& cpu,
                      const std::array<std::size_t, N>& xs, const std::string& tag,
                      precis::image_layout layout = precis::image_layout::nchw) {
  const std::size_t c = xs[1];
  const auto x = random_tensor<T, N>(xs, 2.0F, 0.5F), dy = random_tensor<T, N>(xs);
  // Channels-last: the device's inputs and the host's (NCHW) results moved to [N, H, W, C].
  const auto arranged = [&](const auto& t) {
    if constexpr (N == 4) {
      if (layout == precis::image_layout::nhwc) return nhwc_of(t);
    }
    return t;
  };
  auto ds = xs;
  if constexpr (N == 4) {
    if (layout == precis::image_layout::nhwc) ds = {xs[0], xs[2], xs[3], xs[1]};
  }
  const auto gamma = random_tensor<T, 1>({c}), beta = random_tensor<T, 1>({c});
  auto rm = random_tensor<float, 1>({c}), rv = random_tensor<float, 1>({c}, 0.1F, 1.0F);
  auto drm = precis::to_device(rm), drv = precis::to_device(rv);
  auto y = precis::host_tensor<T, N>::from_shape(xs);
  auto sm = precis::host_tensor<float, 1>::from_shape({c}), sr = sm;
  precis::batch_norm_train<P>(cpu, x, gamma, beta, rm, rv, y, sm, sr, 0.1, 1e-5);
  const auto dx_ = precis::to_device(arranged(x));
  const auto dg = precis::to_device(gamma), db = precis::to_device(beta);
  auto d = poisoned<T, N>(ds);
  auto dsm = poisoned<float, 1>({c}), dsr = poisoned<float, 1>({c});
  precis::batch_norm_train<P>(ctx, dx_, dg, db, drm, drv, d, dsm, dsr, 0.1, 1e-5, layout);
  compare("batch_norm_train" + tag, ctx, d, arranged(y));
  compare("batch_norm_train save_mean" + tag, ctx, dsm, sm);
  compare("batch_norm_train save_rstd" + tag, ctx, dsr, sr);
  compare("batch_norm_train running_mean" + tag, ctx, drm, rm);
  compare("batch_norm_train running_var" + tag, ctx, drv, rv);
  precis::batch_norm_infer<P>(cpu, x, gamma, beta, rm, rv, y, 1e-5);
  d = poisoned<T, N>(ds);
  precis::batch_norm_infer<P>(ctx, dx_, dg, db, drm, drv, d, 1e-5, layout);
  compare("batch_norm_infer" + tag, ctx, d, arranged(y));
  auto gx = precis::host_tensor<T, N>::from_shape(xs);
  auto gg = precis::host_tensor<T, 1>::from_shape({c}), gb = gg;
  precis::batch_norm_backward<P>(cpu, dy, x, gamma, sm, sr, gx, gg, gb);
  auto dgx = poisoned<T, N>(ds);
  auto dgg = poisoned<T, 1>({c}), dgb = poisoned<T, 1>({c});
  precis::batch_norm_backward<P>(ctx, precis::to_device(arranged(dy)), dx_, dg, dsm, dsr, dgx, dgg, dgb, layout);
  compare("batch_norm_backward dx" + tag, ctx, dgx, arranged(gx));
  compare("batch_norm_backward dgamma" + tag, ctx, dgg, gg);
  compare("batch_norm_backward dbeta" + tag, ctx, dgb, gb);
  check_fused_relu<P, T, N>(ctx, dx_, dg, db, precis::to_device(arranged(dy)), rm, rv, ds, tag, layout);
  const auto g7 = precis::to_device(random_tensor<T, 1>({c + 1}));
  expect_error(
      "batch_norm gamma shape",
      [&] { precis::batch_norm_train<P>(ctx, dx_, g7, db, drm, drv, d, dsm, dsr); },
      "precis::batch_norm_train: gamma");
  expect_error(
      "batch_norm momentum",
      [&] { precis::batch_norm_train<P>(ctx, dx_, dg, db, drm, drv, d, dsm, dsr, 1.5); },
      "momentum");
}

// Channels-last pooling and upsampling read [N, H, W, C] in place and give the NCHW
// kernels' bits, moved: every call, forward and backward, against the NCHW call's result
// (itself checked against the host above) moved to NHWC. 5 channels: no power of two.
template <class P, class T>
void check_channels_last(precis::cuda_context& ctx, const std::string& tag) {
  using precis::image_layout;
  constexpr auto last = image_layout::nhwc;
  const std::array<std::size_t, 4> xs{2, 5, 17, 14};
  const auto x = random_tensor<T, 4>(xs);
  const auto dx_ = precis::to_device(x), dxl = precis::to_device(nhwc_of(x));
  const auto moved = [&](const auto& d) { return nhwc_of(precis::to_host(d, ctx.stream())); };
  for (const auto& p : {window(2, 2, 0, true), window(3, 2, 1, true), window(3, 1, 1, false)}) {
    const std::size_t ho = (xs[2] + 2 * p.padding[0] - p.kernel[0]) / p.stride[0] + 1;
    const std::size_t wo = (xs[3] + 2 * p.padding[1] - p.kernel[1]) / p.stride[1] + 1;
    const std::array<std::size_t, 4> ys{xs[0], xs[1], ho, wo}, ysl{xs[0], ho, wo, xs[1]}, xsl{xs[0], xs[2], xs[3], xs[1]};
    const auto dy = random_tensor<T, 4>(ys);
    const auto ddy = precis::to_device(dy), ddyl = precis::to_device(nhwc_of(dy));
    const std::string w = tag + " nhwc k=" + std::to_string(p.kernel[0]) + " s=" + std::to_string(p.stride[0]) +
                          " pad=" + std::to_string(p.padding[0]);
    auto y = poisoned<T, 4>(ys), yl = poisoned<T, 4>(ysl);
    auto at = poisoned<std::uint32_t, 4>(ys), atl = poisoned<std::uint32_t, 4>(ysl);
    precis::max_pool2d<P>(ctx, dx_, y, at, p);
    precis::max_pool2d<P>(ctx, dxl, yl, atl, p, last);
    expect(same_bits(ctx, yl, moved(y)), "max_pool2d" + w);
    expect(same_bits(ctx, atl, moved(at)), "max_pool2d's indices" + w);
    auto yp = poisoned<T, 4>(ysl);  // the overload without indices (evaluation passes)
    precis::max_pool2d<P>(ctx, dxl, yp, p, last);
    expect(same_bits(ctx, yp, moved(y)), "max_pool2d without indices" + w);
    auto g = poisoned<T, 4>(xs), gl = poisoned<T, 4>(xsl);
    precis::max_pool2d_backward<P>(ctx, dx_, ddy, g, p);
    precis::max_pool2d_backward<P>(ctx, dxl, ddyl, gl, p, last);
    expect(same_bits(ctx, gl, moved(g)), "max_pool2d_backward" + w);
    gl = poisoned<T, 4>(xsl);
    precis::max_pool2d_backward<P>(ctx, atl, ddyl, gl, p, last);
    expect(same_bits(ctx, gl, moved(g)), "max_pool2d_backward from indices" + w);
    y = poisoned<T, 4>(ys);
    yl = poisoned<T, 4>(ysl);
    precis::avg_pool2d<P>(ctx, dx_, y, p);
    precis::avg_pool2d<P>(ctx, dxl, yl, p, last);
    expect(same_bits(ctx, yl, moved(y)), "avg_pool2d" + w);
    g = poisoned<T, 4>(xs);
    gl = poisoned<T, 4>(xsl);
    precis::avg_pool2d_backward<P>(ctx, ddy, g, p);
    precis::avg_pool2d_backward<P>(ctx, ddyl, gl, p, last);
    expect(same_bits(ctx, gl, moved(g)), "avg_pool2d_backward" + w);
  }
  for (const auto& out : {std::array<std::size_t, 2>{34, 28}, std::array<std::size_t, 2>{40, 31}}) {
    const std::array<std::size_t, 4> ys{xs[0], xs[1], out[0], out[1]}, ysl{xs[0], out[0], out[1], xs[1]},
        xsl{xs[0], xs[2], xs[3], xs[1]};
    const auto dy = random_tensor<T, 4>(ys);
    const auto ddy = precis::to_device(dy), ddyl = precis::to_device(nhwc_of(dy));
    const std::string w = tag + " nhwc to " + std::to_string(out[0]) + "x" + std::to_string(out[1]);
    auto y = poisoned<T, 4>(ys), yl = poisoned<T, 4>(ysl);
    precis::upsample_nearest2d<P>(ctx, dx_, y);
    precis::upsample_nearest2d<P>(ctx, dxl, yl, last);
    expect(same_bits(ctx, yl, moved(y)), "upsample_nearest2d" + w);
    auto g = poisoned<T, 4>(xs), gl = poisoned<T, 4>(xsl);
    precis::upsample_nearest2d_backward<P>(ctx, ddy, g);
    precis::upsample_nearest2d_backward<P>(ctx, ddyl, gl, last);
    expect(same_bits(ctx, gl, moved(g)), "upsample_nearest2d_backward" + w);
    for (bool align : {false, true}) {
      y = poisoned<T, 4>(ys);
      yl = poisoned<T, 4>(ysl);
      precis::upsample_bilinear2d<P>(ctx, dx_, y, align);
      precis::upsample_bilinear2d<P>(ctx, dxl, yl, align, last);
      expect(same_bits(ctx, yl, moved(y)), "upsample_bilinear2d" + w + " align=" + std::to_string(align));
      g = poisoned<T, 4>(xs);
      gl = poisoned<T, 4>(xsl);
      precis::upsample_bilinear2d_backward<P>(ctx, ddy, g, align);
      precis::upsample_bilinear2d_backward<P>(ctx, ddyl, gl, align, last);
      expect(same_bits(ctx, gl, moved(g)), "upsample_bilinear2d_backward" + w + " align=" + std::to_string(align));
    }
  }
  // A channels-last shape that does not match is refused, saying it was read as NCHW.
  auto wrong = poisoned<T, 4>({2, 8, 7, 4});
  expect_error("max_pool2d nhwc: y of another shape",
               [&] { precis::max_pool2d<P>(ctx, dxl, wrong, window(2, 2, 0, true), last); }, "channels-last");
}

}  // namespace

// Pooling's 64-bit index path (taken where a tensor has 2^32 elements or more) gives the
// bits of the 32-bit path that the calls take here: its kernels launched directly, in both
// layouts, on overlapping padded windows.
template <class P, class T>
void check_wide_index(precis::cuda_context& ctx, const std::string& tag) {
  namespace dc = precis::detail::cuda;
  using M = precis::detail::math_t<precis::op::pooling, P, T>;
  using Acc = precis::detail::accumulate_t<precis::op::pooling, P>;
  const auto p = window(3, 2, 1, false);
  for (const auto layout : {precis::image_layout::nchw, precis::image_layout::nhwc}) {
    const bool last = layout == precis::image_layout::nhwc;
    const std::array<std::size_t, 4> xs = last ? std::array<std::size_t, 4>{2, 17, 14, 5}
                                               : std::array<std::size_t, 4>{2, 5, 17, 14};
    const std::array<std::size_t, 4> ys = last ? std::array<std::size_t, 4>{2, 9, 7, 5}
                                               : std::array<std::size_t, 4>{2, 5, 9, 7};
    const std::string w = tag + (last ? " nhwc" : " nchw");
    const auto x = precis::to_device(random_tensor<T, 4>(xs));
    const auto dy = precis::to_device(random_tensor<T, 4>(ys));
    const auto xv = dc::as_nchw(x, layout);
    const auto g = precis::detail::pool_geometry_of("wide", xv, p);
    const auto pm = dc::plane_map_of(xv, layout);
    expect(precis::detail::pool_index::fits(g.planes, g.h, g.w, g.ho, g.wo, pm.channels, g.kh, g.kw, g.sh, g.sw, g.ph,
                                            g.pw),
           "the calls take the 32-bit path" + w);
    const dc::wide_pool_index wide{{g, pm}};
    auto y = poisoned<T, 4>(ys), yw = poisoned<T, 4>(ys);
    auto at = poisoned<std::uint32_t, 4>(ys), atw = poisoned<std::uint32_t, 4>(ys);
    precis::max_pool2d<P>(ctx, x, y, at, p, layout);
    dc::launch_over(ctx, y.size(), "wide", dc::max_pool_indices_kernel<M, T, T, dc::wide_pool_index>, x.data(),
                    yw.data(), atw.data(), g, wide);
    expect(same_bits(ctx, yw, precis::to_host(y, ctx.stream())), "max_pool2d, 64-bit indices" + w);
    expect(same_bits(ctx, atw, precis::to_host(at, ctx.stream())), "max_pool2d's kept indices, 64-bit" + w);
    yw = poisoned<T, 4>(ys);
    dc::launch_over(ctx, y.size(), "wide", dc::max_pool_kernel<M, T, T, dc::wide_pool_index>, x.data(), yw.data(),
                    g, wide);
    expect(same_bits(ctx, yw, precis::to_host(y, ctx.stream())), "max_pool2d without indices, 64-bit" + w);
    auto dx = poisoned<T, 4>(xs), dxw = poisoned<T, 4>(xs);
    precis::max_pool2d_backward<P>(ctx, x, dy, dx, p, layout);
    dc::launch_over(ctx, dx.size(), "wide", dc::max_pool_backward_kernel<M, Acc, T, T, T, dc::wide_pool_index>,
                    x.data(), dy.data(), dxw.data(), g, wide);
    expect(same_bits(ctx, dxw, precis::to_host(dx, ctx.stream())), "max_pool2d_backward, 64-bit" + w);
    dxw = poisoned<T, 4>(xs);
    dc::launch_over(ctx, dx.size(), "wide", dc::max_pool_backward_indices_kernel<M, Acc, T, T, dc::wide_pool_index>,
                    at.data(), dy.data(), dxw.data(), g, wide);
    expect(same_bits(ctx, dxw, precis::to_host(dx, ctx.stream())), "max_pool2d_backward from indices, 64-bit" + w);
    y = poisoned<T, 4>(ys);
    yw = poisoned<T, 4>(ys);
    precis::avg_pool2d<P>(ctx, x, y, p, layout);
    dc::launch_over(ctx, y.size(), "wide", dc::avg_pool_kernel<M, Acc, T, T, dc::wide_pool_index>, x.data(),
                    yw.data(), g, p.count_include_pad, wide);
    expect(same_bits(ctx, yw, precis::to_host(y, ctx.stream())), "avg_pool2d, 64-bit" + w);
    dx = poisoned<T, 4>(xs);
    dxw = poisoned<T, 4>(xs);
    precis::avg_pool2d_backward<P>(ctx, dy, dx, p, layout);
    dc::launch_over(ctx, dx.size(), "wide", dc::avg_pool_backward_kernel<M, Acc, T, T, dc::wide_pool_index>,
                    dy.data(), dxw.data(), g, p.count_include_pad, wide);
    expect(same_bits(ctx, dxw, precis::to_host(dx, ctx.stream())), "avg_pool2d_backward, 64-bit" + w);
  }
}

// Nearest and bilinear upsampling's 64-bit index path gives the bits of the 32-bit path that
// the calls take here: their kernels launched directly, in both layouts, enlarging by a
// non-integer factor and shrinking, bilinear with and without align_corners.
template <class P, class T>
void check_wide_resample(precis::cuda_context& ctx, const std::string& tag) {
  namespace dc = precis::detail::cuda;
  using M = precis::detail::math_t<precis::op::pooling, P, T>;
  using Acc = precis::detail::accumulate_t<precis::op::pooling, P>;
  for (const auto layout : {precis::image_layout::nchw, precis::image_layout::nhwc}) {
    for (const auto out : {std::array<std::size_t, 2>{16, 11}, std::array<std::size_t, 2>{3, 4}}) {
      const bool last = layout == precis::image_layout::nhwc;
      const auto shape = [&](std::size_t h, std::size_t w) {
        return last ? std::array<std::size_t, 4>{2, h, w, 5} : std::array<std::size_t, 4>{2, 5, h, w};
      };
      const auto xs = shape(7, 9), ys = shape(out[0], out[1]);
      const std::string w = tag + (last ? " nhwc" : " nchw") + " to " + std::to_string(out[0]) + "x" +
                            std::to_string(out[1]);
      const auto x = precis::to_device(random_tensor<T, 4>(xs));
      const auto dy = precis::to_device(random_tensor<T, 4>(ys));
      const auto xv = dc::as_nchw(x, layout), yv = dc::as_nchw(dy, layout);
      const auto g = dc::resample_geometry_of(xv, yv);
      const auto pm = dc::plane_map_of(xv, layout);
      expect(precis::detail::resample_index::fits(g.planes, g.h, g.w, g.ho, g.wo, pm.channels) &&
                 precis::detail::nearest_index::fits(g.planes, g.h, g.w, g.ho, g.wo, pm.channels),
             "the calls take the 32-bit path" + w);
      const dc::wide_nearest_index nearest{{g, pm}};
      const dc::wide_resample_index wide{{g, pm}};
      auto y = poisoned<T, 4>(ys), yw = poisoned<T, 4>(ys);
      precis::upsample_nearest2d<P>(ctx, x, y, layout);
      dc::launch_over(ctx, y.size(), "wide", dc::nearest_kernel<M, T, T, dc::wide_nearest_index>, x.data(),
                      yw.data(), nearest, y.size());
      expect(same_bits(ctx, yw, precis::to_host(y, ctx.stream())), "upsample_nearest2d, 64-bit" + w);
      auto dx = poisoned<T, 4>(xs), dxw = poisoned<T, 4>(xs);
      precis::upsample_nearest2d_backward<P>(ctx, dy, dx, layout);
      dc::launch_over(ctx, dx.size(), "wide", dc::nearest_backward_kernel<M, Acc, T, T, dc::wide_nearest_index>,
                      dy.data(), dxw.data(), nearest, dx.size());
      expect(same_bits(ctx, dxw, precis::to_host(dx, ctx.stream())), "upsample_nearest2d_backward, 64-bit" + w);
      for (const bool align : {false, true}) {
        const std::string wa = w + " align=" + std::to_string(align);
        y = poisoned<T, 4>(ys);
        yw = poisoned<T, 4>(ys);
        precis::upsample_bilinear2d<P>(ctx, x, y, align, layout);
        dc::launch_over(ctx, y.size(), "wide", dc::bilinear_kernel<M, T, T, dc::wide_resample_index>, x.data(),
                        yw.data(), g, align, wide);
        expect(same_bits(ctx, yw, precis::to_host(y, ctx.stream())), "upsample_bilinear2d, 64-bit" + wa);
        dx = poisoned<T, 4>(xs);
        dxw = poisoned<T, 4>(xs);
        precis::upsample_bilinear2d_backward<P>(ctx, dy, dx, align, layout);
        dc::launch_over(ctx, dx.size(), "wide",
                        dc::bilinear_backward_kernel<M, Acc, T, T, dc::wide_resample_index>, dy.data(), dxw.data(),
                        g, align, wide);
        expect(same_bits(ctx, dxw, precis::to_host(dx, ctx.stream())), "upsample_bilinear2d_backward, 64-bit" + wa);
      }
    }
  }
}

int main() {
  if (!precis_test::have_gpu()) return precis_test::skipped;
  precis::cuda_context ctx;
  const precis::cpu_context cpu{2};
  namespace presets = precis::presets;
  using precis::bfloat16;
  using precis::float16;
  check_pooling<presets::bf16_mixed, bfloat16>(ctx, cpu, " (bf16)");
  check_pooling<presets::fp16_mixed, float16>(ctx, cpu, " (fp16)");
  check_pooling<presets::fp32, float>(ctx, cpu, " (fp32)");
  check_channels_last<presets::bf16_mixed, bfloat16>(ctx, " (bf16)");
  check_channels_last<presets::fp32, float>(ctx, " (fp32)");
  check_wide_index<presets::bf16_mixed, bfloat16>(ctx, " (bf16)");
  check_wide_resample<presets::bf16_mixed, bfloat16>(ctx, " (bf16)");
  check_wide_resample<presets::fp32, float>(ctx, " (fp32)");
  check_batch_norm<presets::bf16_mixed, bfloat16, 4>(ctx, cpu, {4, 6, 9, 11}, " (bf16, rank 4)");
  check_batch_norm<presets::fp16_mixed, float16, 4>(ctx, cpu, {4, 6, 9, 11}, " (fp16, rank 4)");
  check_batch_norm<presets::fp32, float, 4>(ctx, cpu, {4, 6, 9, 11}, " (fp32, rank 4)");
  check_batch_norm<presets::fp32, float, 2>(ctx, cpu, {300, 17}, " (fp32, rank 2)");
  // [N, C] runs every pass as channels-last rows: 64 channels of bf16 in packs of 8.
  check_batch_norm<presets::bf16_mixed, bfloat16, 2>(ctx, cpu, {300, 64}, " (bf16, rank 2, packs)");
  // Planes of more than 4096 elements: two segments of each channel's reduction (and of its
  // moments, in 16-byte packs); y and dx in 16-byte packs (planes of 99 and rows of 17 one
  // element at a time).
  check_batch_norm<presets::fp32, float, 4>(ctx, cpu, {2, 3, 80, 70}, " (fp32, planes of 5600)");
  check_batch_norm<presets::bf16_mixed, bfloat16, 4>(ctx, cpu, {3, 5, 64, 90}, " (bf16, planes of 5760)");
  // Channels-last: 16 channels in 16-byte packs (8 of 16-bit, 4 of float), 5 and 6 one
  // element at a time (6 floats are no whole number of packs), over more rows than one slab
  // of the column reduction (4096); 256 channels (bf16) and 128 (float) also summed in packs
  // of channels. 67,600 rows of 8 channels: 1,057 slabs of 64 rows for the moments' 1,024
  // blocks, the first 33 joining two slabs each.
  const auto nhwc = precis::image_layout::nhwc;
  check_batch_norm<presets::bf16_mixed, bfloat16, 4>(ctx, cpu, {3, 16, 40, 37}, " (bf16, nhwc, packs)", nhwc);
  check_batch_norm<presets::bf16_mixed, bfloat16, 4>(ctx, cpu, {2, 256, 9, 5}, " (bf16, nhwc, 256 channels)", nhwc);
  check_batch_norm<presets::fp32, float, 4>(ctx, cpu, {3, 128, 50, 30}, " (fp32, nhwc, 128 channels)", nhwc);
  check_batch_norm<presets::fp16_mixed, float16, 4>(ctx, cpu, {2, 5, 9, 11}, " (fp16, nhwc, 5 channels)", nhwc);
  check_batch_norm<presets::fp32, float, 4>(ctx, cpu, {3, 16, 40, 37}, " (fp32, nhwc, packs)", nhwc);
  check_batch_norm<presets::fp32, float, 4>(ctx, cpu, {2, 6, 50, 45}, " (fp32, nhwc, 6 channels)", nhwc);
  check_batch_norm<presets::fp32, float, 4>(ctx, cpu, {4, 8, 130, 130}, " (fp32, nhwc, slabs joined)", nhwc);
  ctx.synchronize();
  return precis_test::finish();
}
