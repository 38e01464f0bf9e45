// The device kernels with the CPU kernels' calls (gemm with every transpose and epilogue,
// batched; elementwise with the broadcast gradients and gelu_with_derivative; softmax,
// log-softmax and logsumexp; layer norm; convolution with and without a bias, and the
// transposed convolution) against the CPU kernels on the same random inputs: max |device -
// host| / max |host| within the output type's bound (one rounding of each, plus float
// arithmetic in another order and the device's libm). Outputs are poisoned with NaN before
// each call. Shape errors are thrown before anything is launched. Exits 77 (skipped) where
// no GPU is present.
#include <precis/kernels/cuda/conv.hpp>
#include <precis/kernels/cuda/gemm.hpp>
#include <precis/kernels/cuda/norm.hpp>
#include <precis/kernels/cuda/softmax.hpp>

#include "device_test.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace {

using namespace precis_test;

template <class P, class T>
void check_gemm(precis::cuda_context& ctx, const precis::cpu_context& cpu) {
  const std::size_t M = 67, N = 96, K = 130;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (auto epi : {precis::gemm_epilogue::none, precis::gemm_epilogue::relu,
                       precis::gemm_epilogue::gelu}) {
        for (bool with_bias : {false, true}) {
          precis::gemm_options o{.trans_a = ta, .trans_b = tb, .alpha = 0.75F, .beta = 0.5F,
                                 .epilogue = epi};
          const auto a = random_tensor<T, 2>(ta ? std::array<std::size_t, 2>{K, M}
                                                : std::array<std::size_t, 2>{M, K});
          const auto b = random_tensor<T, 2>(tb ? std::array<std::size_t, 2>{N, K}
                                                : std::array<std::size_t, 2>{K, N});
          const auto bias = random_tensor<T, 1>({N});
          auto c = random_tensor<T, 2>({M, N});  // beta != 0 reads it
          const auto da = precis::to_device(a), db = precis::to_device(b);
          const auto dbias = precis::to_device(bias);
          auto dc = precis::to_device(c);
          if (with_bias) {
            precis::gemm<P>(cpu, a, b, bias, c, o);
            precis::gemm<P>(ctx, da, db, dbias, dc, o);
          } else {
            precis::gemm<P>(cpu, a, b, c, o);
            precis::gemm<P>(ctx, da, db, dc, o);
          }
          compare("gemm ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) + " epilogue=" +
                      std::to_string(int(epi)) + " bias=" + std::to_string(with_bias),
                  ctx, dc, c);
        }
      }
    }
  }
  // Batched.
  const auto a3 = random_tensor<T, 3>({3, M, K});
  const auto b3 = random_tensor<T, 3>({3, N, K});
  auto c3 = precis::host_tensor<T, 3>::from_shape({3, M, N});
  auto dc3 = poisoned<T, 3>({3, M, N});
  const precis::gemm_options o{.trans_b = true};
  precis::gemm<P>(cpu, a3, b3, c3, o);
  const auto da3 = precis::to_device(a3), db3 = precis::to_device(b3);
  precis::gemm<P>(ctx, da3, db3, dc3, o);
  compare("batched gemm", ctx, dc3, c3);
  // Batched with the gelu epilogue (one strided-batch product into float, then one kernel).
  const precis::gemm_options og{.trans_b = true, .epilogue = precis::gemm_epilogue::gelu};
  precis::gemm<P>(cpu, a3, b3, c3, og);
  dc3 = poisoned<T, 3>({3, M, N});
  precis::gemm<P>(ctx, da3, db3, dc3, og);
  compare("batched gemm, gelu", ctx, dc3, c3);
  // A repeated product reuses its plan: no new plan, and the same bits.
  const std::size_t plans = ctx.plan_count();
  const auto first = precis::to_host(dc3, ctx.stream());
  precis::gemm<P>(ctx, da3, db3, dc3, og);
  if (ctx.plan_count() != plans) {
    std::printf("FAILED: a repeated gemm made a new plan (%zu -> %zu)\n", plans, ctx.plan_count());
    ++failures;
  }
  const auto again = precis::to_host(dc3, ctx.stream());
  if (std::memcmp(first.data(), again.data(), first.size() * sizeof(T)) != 0) {
    std::printf("FAILED: a repeated gemm gave other bits\n");
    ++failures;
  }
  // An empty product (K = 0) gives epilogue(beta * C + bias), as on the host.
  {
    const precis::gemm_options o0{.beta = 0.5F, .epilogue = precis::gemm_epilogue::relu};
    const auto a0 = random_tensor<T, 2>({M, 0}), b0 = random_tensor<T, 2>({0, N});
    const auto bias = random_tensor<T, 1>({N});
    auto c0 = random_tensor<T, 2>({M, N});
    auto dc0 = precis::to_device(c0);
    precis::gemm<P>(cpu, a0, b0, bias, c0, o0);
    precis::gemm<P>(ctx, precis::to_device(a0), precis::to_device(b0), precis::to_device(bias), dc0, o0);
    compare("gemm K = 0", ctx, dc0, c0);
  }
  // gemm_backward: both gradients, in every transposition, against the host's.
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const precis::gemm_options o{.trans_a = ta, .trans_b = tb, .alpha = 0.75F};
      const std::array<std::size_t, 2> as = ta ? std::array<std::size_t, 2>{K, M} : std::array<std::size_t, 2>{M, K};
      const std::array<std::size_t, 2> bs = tb ? std::array<std::size_t, 2>{N, K} : std::array<std::size_t, 2>{K, N};
      const auto a = random_tensor<T, 2>(as), b = random_tensor<T, 2>(bs), g = random_tensor<T, 2>({M, N});
      auto ga = precis::host_tensor<T, 2>::from_shape(as);
      auto gb = precis::host_tensor<T, 2>::from_shape(bs);
      precis::gemm_backward<P>(cpu, a, b, g, ga, gb, o);
      auto dga = poisoned<T, 2>(as), dgb = poisoned<T, 2>(bs);
      precis::gemm_backward<P>(ctx, precis::to_device(a), precis::to_device(b), precis::to_device(g), dga, dgb, o);
      const std::string w = " ta=" + std::to_string(ta) + " tb=" + std::to_string(tb);
      compare("gemm_backward da" + w, ctx, dga, ga);
      compare("gemm_backward db" + w, ctx, dgb, gb);
    }
  }
  // Shapes are checked before any launch.
  {
    auto ga = poisoned<T, 2>({M, K}), gb = poisoned<T, 2>({K, N + 1});
    expect_error("gemm_backward shape",
                 [&] {
                   precis::gemm_backward<P>(ctx, precis::to_device(random_tensor<T, 2>({M, K})),
                                            precis::to_device(random_tensor<T, 2>({K, N})),
                                            precis::to_device(random_tensor<T, 2>({M, N})), ga, gb);
                 },
                 "precis::gemm_backward: db");
  }
  auto wrong = poisoned<T, 2>({M, N + 1});
  expect_error("gemm shape", [&] { precis::gemm<P>(ctx, precis::to_device(random_tensor<T, 2>({M, K})),
                                                   precis::to_device(random_tensor<T, 2>({K, N})), wrong); },
               "precis::gemm: c");
}

// add_backward and mul_backward: da has the host's bits (one product or copy an element);
// db of a broadcast b is a column sum over a's leading axes, in another order than the
// host's (within bounds), for b of rank 1 and 2; db of a b of a's shape has the host's bits.
template <class P, class T>
void check_broadcast_backward(precis::cuda_context& ctx, const precis::cpu_context& cpu,
                              const std::array<std::size_t, 3> shape) {
  const auto a = random_tensor<T, 3>(shape, 3.0F);
  const auto dy = random_tensor<T, 3>(shape);
  const auto b1 = random_tensor<T, 1>({shape[2]});
  const auto b2 = random_tensor<T, 2>({shape[1], shape[2]});
  const auto d_a = precis::to_device(a), d_dy = precis::to_device(dy);
  auto da = precis::host_tensor<T, 3>::from_shape(shape);
  const auto run = [&](const std::string& what, const auto& b) {
    constexpr std::size_t K = std::tuple_size_v<std::remove_cvref_t<decltype(b.shape())>>;
    std::array<std::size_t, K> bs{};
    for (std::size_t i = 0; i < K; ++i) bs[i] = b.shape()[i];
    auto db = precis::host_tensor<T, K>::from_shape(bs);
    const auto d_b = precis::to_device(b);
    // da: the host's bits; db: the host's bits where b has a's shape, else within bounds.
    const auto check = [&](const std::string& name, const auto& d_da, const auto& d_db) {
      expect(same_bits(ctx, d_da, da), name + " da, " + what);
      if constexpr (K == 3) {
        expect(same_bits(ctx, d_db, db), name + " db, " + what);
      } else {
        compare(name + " db, " + what, ctx, d_db, db);
      }
    };
    auto d_da = poisoned<T, 3>(shape);
    auto d_db = poisoned<T, K>(bs);
    precis::add_backward<P>(cpu, dy, da, db);
    precis::add_backward<P>(ctx, d_dy, d_da, d_db);
    check("add_backward", d_da, d_db);
    precis::mul_backward<P>(cpu, dy, a, b, da, db);
    d_da = poisoned<T, 3>(shape);
    d_db = poisoned<T, K>(bs);
    precis::mul_backward<P>(ctx, d_dy, d_a, d_b, d_da, d_db);
    check("mul_backward", d_da, d_db);
  };
  run("b of rank 1", b1);
  run("b of rank 2", b2);
  run("b of a's shape", random_tensor<T, 3>(shape));
  auto d_da = poisoned<T, 3>(shape);
  auto wrong = poisoned<T, 1>({shape[2] - 1});
  expect_error("add_backward shape", [&] { precis::add_backward<P>(ctx, d_dy, d_da, wrong); }, "suffix");
  expect_error("mul_backward shape",
               [&] { precis::mul_backward<P>(ctx, d_dy, d_a, precis::to_device(b1), d_da, wrong); },
               "precis::mul_backward: db");
}

// gelu_with_derivative on the device: y has the device gelu's bits, dy * d (precis::mul)
// the device gelu_backward's, and d is within bounds of the host's factor.
template <class P, class T>
void check_gelu_with_derivative(precis::cuda_context& ctx, const precis::cpu_context& cpu,
                                const std::array<std::size_t, 3> shape) {
  const auto x = random_tensor<T, 3>(shape, 3.0F);
  const auto dy = random_tensor<T, 3>(shape);
  const auto d_x = precis::to_device(x), d_dy = precis::to_device(dy);
  auto y = poisoned<T, 3>(shape), ref = poisoned<T, 3>(shape);
  auto d = poisoned<float, 3>(shape);
  precis::gelu_with_derivative<P>(ctx, d_x, y, d);
  precis::gelu<P>(ctx, d_x, ref);
  expect(same_bits(ctx, y, precis::to_host(ref, ctx.stream())), "gelu_with_derivative: gelu's bits");
  precis::mul<P>(ctx, d_dy, d, y);
  precis::gelu_backward<P>(ctx, d_dy, d_x, ref);
  expect(same_bits(ctx, y, precis::to_host(ref, ctx.stream())),
         "gelu_with_derivative: dy * d is gelu_backward's bits");
  auto hy = precis::host_tensor<T, 3>::from_shape(shape);
  auto hd = precis::host_tensor<float, 3>::from_shape(shape);
  precis::gelu_with_derivative<P>(cpu, x, hy, hd);
  compare("gelu_with_derivative d", ctx, d, hd);
  auto wrong = poisoned<float, 3>({shape[0], shape[1], shape[2] + 1});
  expect_error("gelu_with_derivative shape", [&] { precis::gelu_with_derivative<P>(ctx, d_x, y, wrong); },
               "precis::gelu_with_derivative: d");
}

// Packed (16-byte) accesses: {5, 37, 29} ends in a partial pack and broadcasts b an element at
// a time (29 is no multiple of a pack); {6, 7, 64} is whole packs, b's packs read whole.
template <class P, class T>
void check_elementwise(precis::cuda_context& ctx, const precis::cpu_context& cpu, const std::array<std::size_t, 3> shape) {
  const auto x = random_tensor<T, 3>(shape, 3.0F);
  const auto dy = random_tensor<T, 3>(shape);
  const auto b = random_tensor<T, 1>({shape[2]});
  const auto dx_ = precis::to_device(x), ddy = precis::to_device(dy);
  const auto db = precis::to_device(b);
  auto y = precis::host_tensor<T, 3>::from_shape(shape);
  auto dy_out = poisoned<T, 3>(shape);
#define PRECIS_CHECK_UNARY(fn)                                           \
  precis::fn<P>(cpu, x, y);                                              \
  dy_out = poisoned<T, 3>(shape);                                        \
  precis::fn<P>(ctx, dx_, dy_out);                                       \
  compare(#fn, ctx, dy_out, y);                                          \
  precis::fn##_backward<P>(cpu, dy, x, y);                               \
  dy_out = poisoned<T, 3>(shape);                                        \
  precis::fn##_backward<P>(ctx, ddy, dx_, dy_out);                       \
  compare(#fn "_backward", ctx, dy_out, y);
  PRECIS_CHECK_UNARY(relu)
  PRECIS_CHECK_UNARY(gelu)
  PRECIS_CHECK_UNARY(sigmoid)
  PRECIS_CHECK_UNARY(tanh)
#undef PRECIS_CHECK_UNARY
  precis::gelu<P>(cpu, x, y, precis::gelu_approximation::tanh);
  dy_out = poisoned<T, 3>(shape);
  precis::gelu<P>(ctx, dx_, dy_out, precis::gelu_approximation::tanh);
  compare("gelu tanh", ctx, dy_out, y);
  precis::add<P>(cpu, x, b, y);
  dy_out = poisoned<T, 3>(shape);
  precis::add<P>(ctx, dx_, db, dy_out);
  compare("add (broadcast)", ctx, dy_out, y);
  precis::mul<P>(cpu, x, dy, y);
  dy_out = poisoned<T, 3>(shape);
  precis::mul<P>(ctx, dx_, ddy, dy_out);
  compare("mul", ctx, dy_out, y);
  const auto wrong_b = precis::to_device(random_tensor<T, 1>({shape[2] - 1}));
  expect_error("add shape", [&] { precis::add<P>(ctx, dx_, wrong_b, dy_out); }, "suffix");
  check_broadcast_backward<P, T>(ctx, cpu, shape);
  check_gelu_with_derivative<P, T>(ctx, cpu, shape);
}

template <class P, class T>
void check_softmax(precis::cuda_context& ctx, const precis::cpu_context& cpu) {
  // Rows held in registers by a warp up to 1024 columns (8 slots a lane up to 256: 10, 256;
  // 300 rows of 197, attention's, over 38 blocks; 32 beyond: 1000 and 1024 read in 16-byte
  // packs, 1001 not), by a block of 64 to 512 threads up to 8192 (4096 and 8192 in packs,
  // 1030 and 4099 not), and read once per pass beyond (8200, 16390). Enough rows that each
  // row group takes several, the next one's reads in flight (resident_rows_per_group): 8200
  // rows of 96 (a warp 2 rows), 16400 of 96 (a warp 4), 1100 of 1030 (a block 2), 2051 of
  // 1030 (a block 4, the last 3), and the same in 16-byte packs: 1100 and 2051 of 2048.
  for (const auto& [rows, cols] : std::initializer_list<std::pair<std::size_t, std::size_t>>{
           {7, 1}, {7, 10}, {7, 256}, {300, 197}, {7, 1000}, {7, 1001}, {9, 1024}, {7, 1030}, {7, 4096},
           {7, 4099}, {3, 8192}, {3, 8200}, {3, 16390}, {8200, 96}, {16400, 96}, {1100, 1030}, {2051, 1030},
           {1100, 2048}, {2051, 2048}}) {
    const std::array<std::size_t, 2> shape{rows, cols};
    const auto x = random_tensor<T, 2>(shape, 4.0F);
    const auto dy = random_tensor<T, 2>(shape);
    const auto dx_ = precis::to_device(x), ddy = precis::to_device(dy);
    auto y = precis::host_tensor<T, 2>::from_shape(shape);
    auto g = precis::host_tensor<T, 2>::from_shape(shape);
    const std::string n = " cols=" + std::to_string(cols);
    precis::softmax<P>(cpu, x, y);
    auto d = poisoned<T, 2>(shape);
    precis::softmax<P>(ctx, dx_, d);
    compare("softmax" + n, ctx, d, y);
    precis::softmax_backward<P>(cpu, dy, y, g);
    auto dg = poisoned<T, 2>(shape);
    precis::softmax_backward<P>(ctx, ddy, precis::to_device(y), dg);
    compare("softmax_backward" + n, ctx, dg, g);
    precis::log_softmax<P>(cpu, x, y);
    d = poisoned<T, 2>(shape);
    precis::log_softmax<P>(ctx, dx_, d);
    compare("log_softmax" + n, ctx, d, y);
    precis::log_softmax_backward<P>(cpu, dy, y, g);
    dg = poisoned<T, 2>(shape);
    precis::log_softmax_backward<P>(ctx, ddy, precis::to_device(y), dg);
    compare("log_softmax_backward" + n, ctx, dg, g);
    auto l = precis::host_tensor<T, 1>::from_shape({rows});
    precis::logsumexp<P>(cpu, x, l);
    auto dl = poisoned<T, 1>({rows});
    precis::logsumexp<P>(ctx, dx_, dl);
    compare("logsumexp" + n, ctx, dl, l);
    const auto gl = random_tensor<T, 1>({rows});
    precis::logsumexp_backward<P>(cpu, gl, x, l, g);
    dg = poisoned<T, 2>(shape);
    precis::logsumexp_backward<P>(ctx, precis::to_device(gl), dx_, precis::to_device(l), dg);
    compare("logsumexp_backward" + n, ctx, dg, g);
  }
  // logsumexp's special rows, against the host's values: an infinite maximum (+inf, and a
  // row all -inf) is the row's value, NaN wins over +inf, and rows of no column are -inf
  // (the block kernel beyond 8192 columns, as every row of no column takes).
  for (const std::size_t cols : {std::size_t(5), std::size_t(8200)}) {
    auto x = precis::host_tensor<T, 2>::from_shape({3, cols});
    for (auto& v : x) v = T(1.0F);
    x(0, 2) = T(INFINITY);
    for (std::size_t j = 0; j < cols; ++j) x(1, j) = T(-INFINITY);
    x(2, 1) = T(INFINITY);
    x(2, 3) = T(NAN);
    auto l = precis::host_tensor<T, 1>::from_shape({3});
    precis::logsumexp<P>(cpu, x, l);
    auto dl = poisoned<T, 1>({3});
    precis::logsumexp<P>(ctx, precis::to_device(x), dl);
    const auto got = precis::to_host(dl, ctx.stream());
    const double g0 = double(got(0)), g1 = double(got(1)), g2 = double(got(2));
    expect(g0 == INFINITY && double(l(0)) == INFINITY, "logsumexp of a row holding +inf");
    expect(g1 == -INFINITY && double(l(1)) == -INFINITY, "logsumexp of a row of -inf");
    expect(std::isnan(g2) && std::isnan(double(l(2))), "logsumexp of a row holding NaN and +inf");
  }
  {
    auto dl = poisoned<T, 1>({4});
    precis::logsumexp<P>(ctx, poisoned<T, 2>({4, 0}), dl);
    const auto got = precis::to_host(dl, ctx.stream());
    bool ok = true;
    for (const auto v : got) ok &= double(v) == -INFINITY;
    expect(ok, "logsumexp of rows of no column is -inf");
  }
  auto short_l = poisoned<T, 1>({6});
  expect_error("logsumexp shape",
               [&] { precis::logsumexp<P>(ctx, precis::to_device(random_tensor<T, 2>({7, 10})), short_l); },
               "precis::logsumexp: out");
  auto small = poisoned<T, 2>({7, 9});
  expect_error("softmax shape",
               [&] { precis::softmax<P>(ctx, precis::to_device(random_tensor<T, 2>({7, 10})), small); },
               "precis::softmax: y");
}

template <class P, class T>
void check_layer_norm(precis::cuda_context& ctx, const precis::cpu_context& cpu) {
  // Columns: held by a warp (96, 768 and 1024 in 16-byte packs; 1, 197 and 1001 not), by a
  // block (3000 and 8192 in packs, 2050 not), read once per pass (8200). Up to 3000 columns
  // the backward pass sums dgamma's and dbeta's columns in the kernel that computes dx
  // (fused_norm_rows_for): blocks of 8 warps, 6 from 769 to 1024 columns (1001 and 1024
  // here), or one block per row, of 8 rows for 15 rows (the second block cut short), 8 for
  // 2,100 (a warp one row, or two of 6 warps at 1024), 32 for 8,220 rows of 96 (a warp 4
  // rows), 64 for 16,410 (a warp 8), 4 for 1,050 rows of 2050 or 3000 and 8 for 2,100 (a
  // block 4 or 8 rows); the same blocks whether a row is read in 16-byte packs or not. At
  // 8192 and 8200 a block's sums exceed its shared memory: column sums after the rows, in
  // slabs of 64 rows.
  for (const auto& [rows, cols] : std::initializer_list<std::pair<std::size_t, std::size_t>>{
           {5, 1}, {5, 96}, {5, 197}, {5, 768}, {5, 1001}, {5, 2050}, {5, 3000}, {2, 8192}, {2, 8200},
           {700, 96}, {700, 768}, {700, 1024}, {2740, 96}, {5470, 96}, {350, 2050}, {700, 2050}, {350, 3000},
           {700, 3000}}) {
    const std::array<std::size_t, 3> shape{3, rows, cols};
    const auto x = random_tensor<T, 3>(shape, 2.0F);
    const auto dy = random_tensor<T, 3>(shape);
    const auto gamma = random_tensor<T, 1>({cols}), beta = random_tensor<T, 1>({cols});
    auto y = precis::host_tensor<T, 3>::from_shape(shape);
    auto mean = precis::host_tensor<float, 2>::from_shape({3, rows});
    auto rstd = mean;
    precis::layer_norm<P>(cpu, x, gamma, beta, y, mean, rstd);
    const auto dx_ = precis::to_device(x);
    const auto dg = precis::to_device(gamma);
    auto dyo = poisoned<T, 3>(shape);
    auto dmean = poisoned<float, 2>({3, rows}), drstd = poisoned<float, 2>({3, rows});
    precis::layer_norm<P>(ctx, dx_, dg, precis::to_device(beta), dyo, dmean, drstd);
    const std::string n = " rows=" + std::to_string(3 * rows) + " cols=" + std::to_string(cols);
    compare("layer_norm" + n, ctx, dyo, y);
    compare("layer_norm mean" + n, ctx, dmean, mean);
    compare("layer_norm rstd" + n, ctx, drstd, rstd);
    auto gx = precis::host_tensor<T, 3>::from_shape(shape);
    auto ggamma = precis::host_tensor<T, 1>::from_shape({cols}), gbeta = ggamma;
    precis::layer_norm_backward<P>(cpu, dy, x, gamma, mean, rstd, gx, ggamma, gbeta);
    auto dgx = poisoned<T, 3>(shape);
    auto dgg = poisoned<T, 1>({cols}), dgb = poisoned<T, 1>({cols});
    // The device's own statistics: the same values within float rounding.
    precis::layer_norm_backward<P>(ctx, precis::to_device(dy), dx_, dg, dmean, drstd, dgx, dgg, dgb);
    // dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy gamma: the terms are rstd |g|,
    // and they cancel exactly where a row has one column (dx = 0 on the host, rounding
    // residue times rstd = 1/sqrt(eps) on the device, whose compiler contracts to FMAs).
    double terms = 0;
    for (std::size_t r = 0; r < mean.size(); ++r) {
      for (std::size_t j = 0; j < cols; ++j) {
        terms = std::max(
            terms, double(rstd.data()[r]) *
                       std::abs(double(float(dy.data()[r * cols + j])) * double(float(gamma(j)))));
      }
    }
    compare("layer_norm_backward dx" + n, ctx, dgx, gx, bound<T>(), terms);
    compare("layer_norm_backward dgamma" + n, ctx, dgg, ggamma);
    compare("layer_norm_backward dbeta" + n, ctx, dgb, gbeta);
  }
  auto y = poisoned<T, 2>({4, 8});
  auto m = poisoned<float, 1>({4}), r = poisoned<float, 1>({4});
  const auto x = precis::to_device(random_tensor<T, 2>({4, 8}));
  const auto g7 = precis::to_device(random_tensor<T, 1>({7}));
  expect_error("layer_norm shape", [&] { precis::layer_norm<P>(ctx, x, g7, g7, y, m, r); },
               "precis::layer_norm: gamma");
}

template <class P, class T>
void check_conv(precis::cuda_context& ctx, const precis::cpu_context& cpu) {
  // cuDNN's deterministic float algorithms include FFT and Winograd ones, whose error can
  // reach several float ulps of the largest output: float convolutions get 5e-5.
  const double conv_bound = std::is_same_v<T, float> ? 5e-5 : bound<T>();
  struct case_ {
    std::size_t n, c, h, w, co, k, stride, pad, dilation, groups;
  };
  for (const case_& k : {case_{2, 8, 17, 15, 16, 3, 1, 1, 1, 1}, case_{3, 16, 14, 14, 32, 3, 2, 1, 1, 1},
                         case_{2, 12, 11, 13, 12, 3, 1, 2, 2, 3}, case_{1, 8, 9, 9, 8, 3, 1, 1, 1, 8},
                         case_{2, 64, 7, 7, 128, 1, 1, 0, 1, 1}}) {
    precis::conv2d_params p;
    p.stride = {k.stride, k.stride};
    p.padding = {k.pad, k.pad};
    p.dilation = {k.dilation, k.dilation};
    p.groups = k.groups;
    const std::size_t ho = (k.h + 2 * k.pad - k.dilation * (k.k - 1) - 1) / k.stride + 1;
    const std::size_t wo = (k.w + 2 * k.pad - k.dilation * (k.k - 1) - 1) / k.stride + 1;
    const std::array<std::size_t, 4> xs{k.n, k.c, k.h, k.w}, ws{k.co, k.c / k.groups, k.k, k.k},
        ys{k.n, k.co, ho, wo};
    const auto x = random_tensor<T, 4>(xs), w = random_tensor<T, 4>(ws), dy = random_tensor<T, 4>(ys);
    const auto dx_ = precis::to_device(x), dw_ = precis::to_device(w), ddy = precis::to_device(dy);
    const std::string n = " case c=" + std::to_string(k.c) + " co=" + std::to_string(k.co) +
                          " groups=" + std::to_string(k.groups);
    auto y = precis::host_tensor<T, 4>::from_shape(ys);
    precis::conv2d<P>(cpu, x, w, y, p);
    auto d = poisoned<T, 4>(ys);
    precis::conv2d<P>(ctx, dx_, dw_, d, p);
    compare("conv2d" + n, ctx, d, y, conv_bound);
    // The workspace limit is part of a plan's key: a changed limit makes a new plan, and one
    // above every algorithm's need takes the same algorithm (the same bits).
    {
      const std::size_t plans = ctx.plan_count();
      auto limited = poisoned<T, 4>(ys);
      ctx.set_conv_workspace_limit(std::size_t(1) << 50);
      precis::conv2d<P>(ctx, dx_, dw_, limited, p);
      ctx.set_conv_workspace_limit(precis::cuda_context::no_workspace_limit);
      expect(ctx.plan_count() == plans + 1, "conv2d under a workspace limit makes its own plan" + n);
      expect(same_bits(ctx, limited, precis::to_host(d, ctx.stream())),
             "conv2d under a workspace limit no algorithm reaches gives the same bits" + n);
    }
    // With a bias, added to the float sums before the one rounding (float copies of x and w
    // for 16-bit tensors).
    const auto bias = random_tensor<T, 1>({k.co});
    precis::conv2d<P>(cpu, x, w, bias, y, p);
    d = poisoned<T, 4>(ys);
    precis::conv2d<P>(ctx, dx_, dw_, precis::to_device(bias), d, p);
    compare("conv2d with a bias" + n, ctx, d, y, conv_bound);
    auto gx = precis::host_tensor<T, 4>::from_shape(xs);
    precis::conv2d_backward_data<P>(cpu, dy, w, gx, p);
    auto dgx = poisoned<T, 4>(xs);
    precis::conv2d_backward_data<P>(ctx, ddy, dw_, dgx, p);
    compare("conv2d_backward_data" + n, ctx, dgx, gx, conv_bound);
    auto gw = precis::host_tensor<T, 4>::from_shape(ws);
    precis::conv2d_backward_weights<P>(cpu, x, dy, gw, p);
    auto dgw = poisoned<T, 4>(ws);
    precis::conv2d_backward_weights<P>(ctx, dx_, ddy, dgw, p);
    compare("conv2d_backward_weights" + n, ctx, dgw, gw, conv_bound);
    // Both in one call: the bits of the two calls above.
    auto both_x = poisoned<T, 4>(xs), both_w = poisoned<T, 4>(ws);
    precis::conv2d_backward<P>(ctx, dx_, ddy, dw_, both_x, both_w, p);
    expect(same_bits(ctx, both_x, precis::to_host(dgx, ctx.stream())) &&
               same_bits(ctx, both_w, precis::to_host(dgw, ctx.stream())),
           "conv2d_backward: the bits of backward_data and backward_weights" + n);
  }
  // Transposed convolutions (DBNet's upsampling head), with output_padding, in all passes.
  for (const case_& k : {case_{2, 16, 8, 9, 8, 2, 2, 0, 1, 1}, case_{2, 12, 7, 7, 6, 3, 2, 1, 1, 3}}) {
    precis::conv2d_params p;
    p.stride = {k.stride, k.stride};
    p.padding = {k.pad, k.pad};
    p.groups = k.groups;
    p.output_padding = {1, 1};
    const std::size_t ho = (k.h - 1) * k.stride + (k.k - 1) + 1 + 1 - 2 * k.pad;
    const std::size_t wo = (k.w - 1) * k.stride + (k.k - 1) + 1 + 1 - 2 * k.pad;
    const std::array<std::size_t, 4> xs{k.n, k.c, k.h, k.w}, ws{k.c, k.co / k.groups, k.k, k.k},
        ys{k.n, k.co, ho, wo};
    const auto x = random_tensor<T, 4>(xs), w = random_tensor<T, 4>(ws), dy = random_tensor<T, 4>(ys);
    const auto dx_ = precis::to_device(x), dw_ = precis::to_device(w), ddy = precis::to_device(dy);
    const std::string n = " (transposed, c=" + std::to_string(k.c) + " groups=" + std::to_string(k.groups) + ")";
    auto y = precis::host_tensor<T, 4>::from_shape(ys);
    precis::conv_transpose2d<P>(cpu, x, w, y, p);
    auto d = poisoned<T, 4>(ys);
    precis::conv_transpose2d<P>(ctx, dx_, dw_, d, p);
    compare("conv_transpose2d" + n, ctx, d, y, conv_bound);
    auto gx = precis::host_tensor<T, 4>::from_shape(xs);
    precis::conv_transpose2d_backward_data<P>(cpu, dy, w, gx, p);
    auto dgx = poisoned<T, 4>(xs);
    precis::conv_transpose2d_backward_data<P>(ctx, ddy, dw_, dgx, p);
    compare("conv_transpose2d_backward_data" + n, ctx, dgx, gx, conv_bound);
    auto gw = precis::host_tensor<T, 4>::from_shape(ws);
    precis::conv_transpose2d_backward_weights<P>(cpu, x, dy, gw, p);
    auto dgw = poisoned<T, 4>(ws);
    precis::conv_transpose2d_backward_weights<P>(ctx, dx_, ddy, dgw, p);
    compare("conv_transpose2d_backward_weights" + n, ctx, dgw, gw, conv_bound);
    auto both_x = poisoned<T, 4>(xs), both_w = poisoned<T, 4>(ws);
    precis::conv_transpose2d_backward<P>(ctx, dx_, ddy, dw_, both_x, both_w, p);
    expect(same_bits(ctx, both_x, precis::to_host(dgx, ctx.stream())) &&
               same_bits(ctx, both_w, precis::to_host(dgw, ctx.stream())),
           "conv_transpose2d_backward: the bits of its two passes" + n);
  }
  // Empty sums: no images (the weight gradient is zero) and no input channels (y is zero).
  {
    precis::conv2d_params p;
    const auto x0 = random_tensor<T, 4>({0, 4, 6, 6}), dy0 = random_tensor<T, 4>({0, 8, 4, 4});
    auto gw = precis::host_tensor<T, 4>::from_shape({8, 4, 3, 3});
    precis::conv2d_backward_weights<P>(cpu, x0, dy0, gw, p);
    auto dgw = poisoned<T, 4>({8, 4, 3, 3});
    precis::conv2d_backward_weights<P>(ctx, precis::to_device(x0), precis::to_device(dy0), dgw, p);
    compare("conv2d_backward_weights of no images", ctx, dgw, gw);
    const auto xc = random_tensor<T, 4>({2, 0, 6, 6}), wc = random_tensor<T, 4>({8, 0, 3, 3});
    auto yc = precis::host_tensor<T, 4>::from_shape({2, 8, 4, 4});
    precis::conv2d<P>(cpu, xc, wc, yc, p);
    auto dyc = poisoned<T, 4>({2, 8, 4, 4});
    precis::conv2d<P>(ctx, precis::to_device(xc), precis::to_device(wc), dyc, p);
    compare("conv2d of no input channels", ctx, dyc, yc);
    // With a bias, an empty sum leaves each channel's bias, rounded once: the host's bits.
    const auto bc = random_tensor<T, 1>({8});
    precis::conv2d<P>(cpu, xc, wc, bc, yc, p);
    dyc = poisoned<T, 4>({2, 8, 4, 4});
    precis::conv2d<P>(ctx, precis::to_device(xc), precis::to_device(wc), precis::to_device(bc), dyc, p);
    expect(same_bits(ctx, dyc, yc), "conv2d with a bias of no input channels: the bias");
  }
  // A bias on channels-last images (each element's channel is its last index).
  {
    precis::conv2d_params p;
    p.padding = {1, 1};
    p.layout = precis::image_layout::nhwc;
    const auto x = random_tensor<T, 4>({2, 9, 7, 8}), w = random_tensor<T, 4>({12, 8, 3, 3});
    const auto bias = random_tensor<T, 1>({12});
    auto y = precis::host_tensor<T, 4>::from_shape({2, 9, 7, 12});
    precis::conv2d<P>(cpu, x, w, bias, y, p);
    auto d = poisoned<T, 4>({2, 9, 7, 12});
    precis::conv2d<P>(ctx, precis::to_device(x), precis::to_device(w), precis::to_device(bias), d, p);
    compare("conv2d with a bias, channels-last", ctx, d, y, conv_bound);
    const auto short_bias = precis::to_device(random_tensor<T, 1>({11}));
    expect_error("conv2d bias shape",
                 [&] { precis::conv2d<P>(ctx, precis::to_device(x), precis::to_device(w), short_bias, d, p); },
                 "precis::conv2d: bias");
  }
  // y must be 1 x 4 x 5 x 5 (7 - 3 + 1 = 5); one row too many is refused before any work.
  auto bad = poisoned<T, 4>({1, 4, 6, 5});
  const auto x = precis::to_device(random_tensor<T, 4>({1, 3, 7, 7}));
  const auto w = precis::to_device(random_tensor<T, 4>({4, 3, 3, 3}));
  expect_error("conv2d shape", [&] { precis::conv2d<P>(ctx, x, w, bad); }, "precis::conv2d: y");
  precis::conv2d_params op;
  op.stride = {2, 2};
  op.output_padding = {2, 2};
  expect_error("conv_transpose2d output_padding",
               [&] { precis::conv_transpose2d<P>(ctx, precis::to_device(random_tensor<T, 4>({1, 4, 5, 5})), w, bad, op); },
               "output_padding 2");
}

}  // namespace

int main() {
  if (!precis_test::have_gpu()) return precis_test::skipped;
  precis::cuda_context ctx;
  {
    // Each context's id() is its own, and a moved-from context has none (0).
    precis::cuda_context other;
    expect(other.id() != 0 && other.id() != ctx.id(), "cuda_context::id: each context its own");
    const auto id = other.id();
    precis::cuda_context moved = std::move(other);
    expect(moved.id() == id && other.id() == 0, "cuda_context::id: moves with the context");
  }
  const precis::cpu_context cpu{2};
  using precis::bfloat16;
  using precis::float16;
  namespace presets = precis::presets;
  check_gemm<presets::bf16_mixed, bfloat16>(ctx, cpu);
  check_gemm<presets::fp16_mixed, float16>(ctx, cpu);
  check_gemm<presets::fp32, float>(ctx, cpu);
  check_elementwise<presets::bf16_mixed, bfloat16>(ctx, cpu, {5, 37, 29});
  check_elementwise<presets::bf16_mixed, bfloat16>(ctx, cpu, {6, 7, 64});
  check_elementwise<presets::fp16_mixed, float16>(ctx, cpu, {5, 37, 29});
  check_elementwise<presets::fp16_mixed, float16>(ctx, cpu, {6, 7, 64});
  check_elementwise<presets::fp32, float>(ctx, cpu, {5, 37, 29});
  check_elementwise<presets::fp32, float>(ctx, cpu, {6, 7, 64});
  check_softmax<presets::bf16_mixed, bfloat16>(ctx, cpu);
  check_softmax<presets::fp16_mixed, float16>(ctx, cpu);
  check_softmax<presets::fp32, float>(ctx, cpu);
  check_layer_norm<presets::bf16_mixed, bfloat16>(ctx, cpu);
  check_layer_norm<presets::fp16_mixed, float16>(ctx, cpu);
  check_layer_norm<presets::fp32, float>(ctx, cpu);
  // Double sums: the fused backward's blocks up to 2048 columns (2050 and beyond take the
  // column sums after the rows).
  check_layer_norm<precis::policy<float, float, double, float>, float>(ctx, cpu);
  check_conv<presets::bf16_mixed, bfloat16>(ctx, cpu);
  check_conv<presets::fp16_mixed, float16>(ctx, cpu);
  check_conv<presets::fp32, float>(ctx, cpu);
  ctx.synchronize();
  return precis_test::finish();
}
