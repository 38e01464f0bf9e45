// Hardware products (products::hardware) on the CPU: built into test_kernels_onednn beside
// test_gemm.cpp and test_conv.cpp, whose float64 bounds then hold for bf16_mixed and
// fp32_hardware through oneDNN (all of conv's geometries: groups, dilation, strides,
// transposed). Here:
// which engine runs, how subnormals behave on each engine, rounding once, determinism for
// a given thread count. On a CPU without bfloat16 dot-product instructions the exact kernel
// runs, and the checks below assert exactly that.
#include <precis/kernels/conv.hpp>
#include <precis/kernels/gemm.hpp>
#include <precis/nn/conv.hpp>

#include "kernel_checks.hpp"

#include <xtensor/xview.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using namespace precis_test;
using precis::bfloat16;
using precis::host_tensor;

/// True when this build and this CPU run hardware products on oneDNN.
bool onednn_runs() { return precis::cpu_products_engine().rfind("oneDNN", 0) == 0; }

/// A 16 x 32 by 32 x 16 product of T inputs whose only nonzero term in C(0, 0) is
/// a(0, 0) * b(0, 0).
template <class P, class T = bfloat16>
float single_product(float x, float y) {
  auto a = host_tensor<T, 2>::from_shape({16, 32});
  auto b = host_tensor<T, 2>::from_shape({32, 16});
  a.fill(T(0.0F));
  b.fill(T(0.0F));
  a(0, 0) = T(x);
  b(0, 0) = T(y);
  auto c = poisoned<float, 2>(std::array<std::size_t, 2>{16, 16});
  precis::gemm<P>(precis::cpu_context{1}, a, b, c);
  return c(0, 0);
}

}  // namespace

TEST_CASE("cpu_products_engine names the engine this build and CPU use") {
  const std::string engine = precis::cpu_products_engine();
  MESSAGE("hardware products run on: " << engine);
#if PRECIS_HAS_ONEDNN
  CHECK(engine.find("oneDNN") != std::string::npos);
  CHECK(onednn_runs() == precis::detail::onednn_has_bf16_products());
#else
  CHECK(engine == "precis exact kernel (precis::onednn not linked)");
#endif
  // Float inputs need no special instructions: oneDNN runs them wherever it is linked.
  const std::string float_engine = precis::cpu_float_products_engine();
  MESSAGE("float hardware products run on: " << float_engine);
#if PRECIS_HAS_ONEDNN
  CHECK(float_engine.rfind("oneDNN", 0) == 0);
#else
  CHECK(float_engine == "precis exact kernel (precis::onednn not linked)");
#endif
}

#if PRECIS_HAS_ONEDNN
TEST_CASE("a limit on oneDNN's instruction set holds for precis's AMX kernel too") {
  // CTest runs this binary twice on a machine with AMX: as it is, and under
  // ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 (test_kernels_onednn_no_amx), where oneDNN's
  // AVX512-BF16 kernels run and precis's AMX tiles must not.
  const char* limit = std::getenv("ONEDNN_MAX_CPU_ISA");
  const std::string l = limit == nullptr ? "" : limit;
  const bool amx_allowed = l.empty() || l == "ALL" || l == "AVX512_CORE_AMX";
  MESSAGE("ONEDNN_MAX_CPU_ISA=" << l << "; oneDNN sees "
                                << std::string(precis::detail::onednn_isa_name())
                                << "; AMX usable: " << precis::detail::amx_usable());
  CHECK(precis::detail::amx_enabled() == (precis::detail::amx_usable() && amx_allowed));
  const bool tiles = precis::cpu_products_engine().find("AMX tiles") != std::string::npos;
  CHECK(tiles == precis::detail::amx_enabled());
  if (precis::detail::amx_usable() && !amx_allowed) {
    // A product past amx_takes: amx_product declines it (writing nothing; the operands are
    // never read).
    const precis::cpu_context ctx{1};
    CHECK(!precis::detail::amx_product(ctx, precis::detail::onednn_of(ctx), 1, 256, 4096, 512, {},
                                       {}, [](auto&&...) {}));
  }
}
#endif

TEST_CASE("float hardware products keep subnormals and fuse each product into the sum") {
  using P = precis::presets::fp32_hardware;
  const float tiny = std::ldexp(1.0F, -130);  // a subnormal float input
  const float small = std::ldexp(1.0F, -70);  // small * small = 2^-140, a subnormal result
  CHECK(single_product<P, float>(tiny, 1.0F) == tiny);
  CHECK(single_product<P, float>(small, small) == std::ldexp(1.0F, -140));
  CHECK(single_product<P, float>(3.0F, 5.0F) == 15.0F);
  // The same bits for a given thread count, and within float64 bounds (test_gemm and
  // test_conv hold every geometry to them under fp32_hardware).
  const std::size_t M = 130, N = 70, K = 300;
  const auto a = random_tensor<float, 2>({M, K});
  const auto b = random_tensor<float, 2>({K, N});
  for (unsigned threads : {1U, 2U, 3U}) {
    INFO("threads=" << threads);
    const precis::cpu_context ctx{threads};
    auto c1 = poisoned<float, 2>(std::array<std::size_t, 2>{M, N});
    auto c2 = c1;
    auto exact = c1;
    precis::gemm<P>(ctx, a, b, c1);
    precis::gemm<P>(ctx, a, b, c2);
    precis::gemm<precis::presets::fp32>(ctx, a, b, exact);
    CHECK(same_bits(c1, c2));
    double worst = 0, norm = 0;
    for (std::size_t e = 0; e < exact.size(); ++e) {
      worst = std::max(worst, std::abs(double(c1.data()[e]) - double(exact.data()[e])));
      norm = std::max(norm, std::abs(double(exact.data()[e])));
    }
    CHECK(worst / norm < bound<float>());
  }
}

namespace {

/// A float16 tensor's values as float (exact).
template <std::size_t N>
host_tensor<float, N> as_float(const host_tensor<precis::float16, N>& t) {
  auto f = host_tensor<float, N>::from_shape(t.shape());
  std::transform(t.begin(), t.end(), f.begin(), [](precis::float16 v) { return float(v); });
  return f;
}

}  // namespace

TEST_CASE("float16 hardware products are the float kernels' on the converted inputs") {
  using precis::float16;
  using H = precis::presets::fp16_hardware;
  using F = precis::presets::fp32_hardware;
  // Every product of two float16 values is exact in float: subnormal inputs are kept.
  const float sub = std::ldexp(1.0F, -24);  // float16's smallest subnormal
  CHECK(single_product<H, float16>(sub, 1.0F) == sub);
  CHECK(single_product<H, float16>(sub, sub) == std::ldexp(1.0F, -48));
  CHECK(single_product<H, float16>(std::ldexp(1.0F, -20), 3.0F) == 3.0F * std::ldexp(1.0F, -20));

  // Products: the bits of fp32_hardware's on the same values as float (and, for a float16
  // C, those rounded once), for each transpose, one and two threads, and batched.
  const std::size_t M = 70, N = 45, K = 300;
  for (const bool ta : {false, true}) {
    for (const bool tb : {false, true}) {
      precis::gemm_options o;
      o.trans_a = ta;
      o.trans_b = tb;
      const auto a = random_tensor<float16, 2>(ta ? std::array<std::size_t, 2>{K, M}
                                                  : std::array<std::size_t, 2>{M, K});
      const auto b = random_tensor<float16, 2>(tb ? std::array<std::size_t, 2>{N, K}
                                                  : std::array<std::size_t, 2>{K, N});
      const auto bias = random_tensor<float, 1>({N});
      for (unsigned threads : {1U, 2U}) {
        CAPTURE(ta);
        CAPTURE(tb);
        CAPTURE(threads);
        const precis::cpu_context ctx{threads};
        auto c = poisoned<float, 2>(std::array<std::size_t, 2>{M, N});
        auto ref = c;
        precis::gemm<H>(ctx, a, b, bias, c, o);
        precis::gemm<F>(ctx, as_float(a), as_float(b), bias, ref, o);
        CHECK(same_bits(c, ref));
        // Without a bias: a float16 C is written by precis from the float sums, where
        // oneDNN writes a float C itself (and, with a bias, might add it in its own order).
        auto c16 = poisoned<float16, 2>(std::array<std::size_t, 2>{M, N});
        auto ref_nobias = ref;
        precis::gemm<H>(ctx, a, b, c16, o);
        precis::gemm<F>(ctx, as_float(a), as_float(b), ref_nobias, o);
        CHECK(same_bits(c16, rounded<precis::float16>(ref_nobias)));
      }
    }
  }
  const auto qa = random_tensor<float16, 3>({3, 17, 40});
  const auto qb = random_tensor<float16, 3>({3, 26, 40});
  precis::gemm_options o;
  o.trans_b = true;
  o.alpha = 0.125F;
  auto c = poisoned<float, 3>(std::array<std::size_t, 3>{3, 17, 26});
  auto ref = c;
  precis::gemm<H>(precis::cpu_context{2}, qa, qb, c, o);
  precis::gemm<F>(precis::cpu_context{2}, as_float(qa), as_float(qb), ref, o);
  CHECK(same_bits(c, ref));
}

#if PRECIS_HAS_ONEDNN
TEST_CASE("float16 hardware convolutions are the float kernels' on the converted inputs") {
  using precis::float16;
  using H = precis::presets::fp16_hardware;
  using F = precis::presets::fp32_hardware;
  using shape4 = std::array<std::size_t, 4>;
  struct case_t {
    std::size_t c, h, co, k, stride, pad;
    precis::image_layout layout;
  };
  // A 3x3 layer, and a strided 1x1 (its pixels gathered), in both layouts.
  for (const case_t t : {case_t{16, 9, 32, 3, 1, 1, precis::image_layout::nchw},
                         case_t{16, 9, 32, 3, 1, 1, precis::image_layout::nhwc},
                         case_t{32, 10, 48, 1, 2, 0, precis::image_layout::nchw},
                         case_t{32, 10, 48, 1, 2, 0, precis::image_layout::nhwc}}) {
    const bool last = t.layout == precis::image_layout::nhwc;
    const std::size_t ho = (t.h + 2 * t.pad - t.k) / t.stride + 1;
    const auto image = [&](std::size_t n, std::size_t ch, std::size_t side) {
      return last ? shape4{n, side, side, ch} : shape4{n, ch, side, side};
    };
    precis::conv2d_params p;
    p.stride = {t.stride, t.stride};
    p.padding = {t.pad, t.pad};
    p.layout = t.layout;
    precis::conv2d_params p_float = p;  // float weights with a version would be kept
    p.weights_version = 5;              // float16 weights are converted every call: nothing is kept
    for (const std::size_t n : {std::size_t(1), std::size_t(3)}) {
      const auto x = random_tensor<float16, 4>(image(n, t.c, t.h));
      const auto w = random_tensor<float16, 4>({t.co, t.c, t.k, t.k});
      const auto dy = random_tensor<float16, 4>(image(n, t.co, ho));
      const auto bias = random_tensor<float, 1>({t.co});
      for (unsigned threads : {1U, 2U}) {
        CAPTURE(t.k);
        CAPTURE(last);
        CAPTURE(n);
        CAPTURE(threads);
        const precis::cpu_context ctx{threads};
        const auto& st = precis::detail::onednn_of(ctx);
        const std::size_t reuses = st.kept_reuses, kept = st.kept.size();
        auto y = poisoned<float, 4>(image(n, t.co, ho)), y_ref = y;
        precis::conv2d<H>(ctx, x, w, bias, y, p);
        precis::conv2d<F>(ctx, as_float(x), as_float(w), bias, y_ref, p_float);
        CHECK(same_bits(y, y_ref));
        auto y16 = poisoned<float16, 4>(y.shape());
        precis::conv2d<H>(ctx, x, w, y16, p);
        precis::conv2d<H>(ctx, x, w, y16, p);
        auto y_nobias = y_ref;
        precis::conv2d<F>(ctx, as_float(x), as_float(w), y_nobias, p_float);
        CHECK(same_bits(y16, rounded<precis::float16>(y_nobias)));
        CHECK(st.kept_reuses == reuses);
        CHECK(st.kept.size() == kept);
        auto dx = poisoned<float, 4>(x.shape()), dx_ref = dx;
        precis::conv2d_backward_data<H>(ctx, dy, w, dx, p);
        precis::conv2d_backward_data<F>(ctx, as_float(dy), as_float(w), dx_ref, p_float);
        CHECK(same_bits(dx, dx_ref));
        auto dw = poisoned<float, 4>(w.shape()), dw_ref = dw;
        precis::conv2d_backward_weights<H>(ctx, x, dy, dw, p);
        precis::conv2d_backward_weights<F>(ctx, as_float(x), as_float(dy), dw_ref, p_float);
        CHECK(same_bits(dw, dw_ref));
      }
    }
  }
}

TEST_CASE(
    "nn's float16 convolutions with hardware products: the float kernels' bits, nothing kept") {
  // An nn conv layer under fp16_hardware: its output is fp32_hardware's convolution of the
  // same values as float (working weights and bias included), rounded once to float16, in
  // training and in evaluation passes; evaluation keeps no converted weights.
  namespace nn = precis::nn;
  using precis::float16;
  using shape4 = std::array<std::size_t, 4>;
  const precis::cpu_context ctx{2};
  const auto& st = precis::detail::onednn_of(ctx);
  nn::conv2d_layer<nn::tags::conv2d, precis::presets::fp16_hardware, precis::cpu_context> layer(
      nn::conv2d(32, 48, 3, {.padding = {1, 1}}));
  layer.reset(3);
  const auto x = random_tensor<float16, 4>(shape4{2, 32, 7, 7});
  precis::conv2d_params p;
  p.padding = {1, 1};
  auto ref = poisoned<float, 4>(shape4{2, 48, 7, 7});
  precis::conv2d<precis::presets::fp32_hardware>(ctx, as_float(x), as_float(layer.weight().value()),
                                                 as_float(layer.bias().value()), ref, p);
  const std::size_t reuses = st.kept_reuses, kept = st.kept.size();
  CHECK(same_bits(layer.forward(ctx, x, nn::mode::train), rounded<precis::float16>(ref)));
  CHECK(same_bits(layer.forward(ctx, x, nn::mode::eval), rounded<precis::float16>(ref)));
  CHECK(same_bits(layer.forward(ctx, x, nn::mode::eval), rounded<precis::float16>(ref)));
  CHECK(st.kept_reuses == reuses);
  CHECK(st.kept.size() == kept);
}

TEST_CASE("float16 product operands of any strides are converted whole") {
  // detail::onednn_product with float16 operands whose rows, columns, or neither are
  // contiguous (the last: every second element of every third row), against float64.
  using precis::float16;
  const std::size_t batch = 2, M = 19, N = 23, K = 37;
  const auto store = random_tensor<float16, 1>({batch * M * K * 6});
  const auto other = random_tensor<float16, 1>({batch * K * N});
  const precis::cpu_context ctx{2};
  struct layout_t {
    std::int64_t batch, row, col;
  };
  for (const layout_t l : {layout_t{std::int64_t(M * K), std::int64_t(K), 1},
                           layout_t{std::int64_t(M * K), 1, std::int64_t(M)},
                           layout_t{std::int64_t(3 * M * K * 2), std::int64_t(3 * K * 2), 2}}) {
    for (const bool b_transposed : {false, true}) {
      CAPTURE(l.batch);
      CAPTURE(l.row);
      CAPTURE(l.col);
      CAPTURE(b_transposed);
      auto c = poisoned<float, 1>(std::array<std::size_t, 1>{batch * M * N});
      const precis::detail::strided_operand<const float16> a{store.data(), l.batch, l.row, l.col};
      // B (k, j) at other[q K N + k N + j], or read as its transpose: at other[q K N + j K + k].
      const precis::detail::strided_operand<const float16> b{other.data(), std::int64_t(K * N),
                                                             b_transposed ? 1 : std::int64_t(N),
                                                             b_transposed ? std::int64_t(K) : 1};
      REQUIRE(precis::detail::onednn_product(
          ctx, batch, M, N, K, a, b, c.data(), std::int64_t(M * N), std::int64_t(N),
          static_cast<const float*>(nullptr), 1.0F, true,
          [](std::size_t, std::size_t, std::size_t, const float*, std::size_t) {}));
      auto ref = host_tensor<double, 1>::from_shape({batch * M * N});
      for (std::size_t q = 0; q < batch; ++q) {
        for (std::size_t i = 0; i < M; ++i) {
          for (std::size_t j = 0; j < N; ++j) {
            double sum = 0;
            for (std::size_t k = 0; k < K; ++k) {
              sum +=
                  double(float(store.data()[std::int64_t(q) * l.batch + std::int64_t(i) * l.row +
                                            std::int64_t(k) * l.col])) *
                  double(float(other.data()[q * K * N + (b_transposed ? j * K + k : k * N + j)]));
            }
            ref.data()[(q * M + i) * N + j] = sum;
          }
        }
      }
      CHECK(rel_error(c, ref) < bound<float>());
    }
  }
}
#endif

TEST_CASE("hardware products flush subnormals; exact products keep them") {
  const float tiny = std::ldexp(1.0F, -130);  // subnormal in bfloat16 (and float)
  const float small = std::ldexp(1.0F, -70);  // normal, but small * small = 2^-140 is not
  // Exact products: both terms arrive exactly.
  CHECK(single_product<precis::presets::bf16_exact>(tiny, 1.0F) == tiny);
  CHECK(single_product<precis::presets::bf16_exact>(small, small) == std::ldexp(1.0F, -140));
  CHECK(single_product<precis::presets::bf16_exact>(3.0F, 5.0F) == 15.0F);
  const float in = single_product<precis::presets::bf16_mixed>(tiny, 1.0F);
  const float out = single_product<precis::presets::bf16_mixed>(small, small);
  CHECK(single_product<precis::presets::bf16_mixed>(3.0F, 5.0F) == 15.0F);
  if (onednn_runs()) {
    // The bfloat16 dot-product instructions treat subnormal inputs as zero and flush
    // subnormal products and results.
    CHECK(in == 0.0F);
    CHECK(out == 0.0F);
  } else {
    CHECK(in == tiny);
    CHECK(out == std::ldexp(1.0F, -140));
  }
}

TEST_CASE("hardware products round the float sums once to bfloat16") {
  // The direct path (oneDNN writes bfloat16) and the float path rounded by precis agree.
  const auto a = random_tensor<bfloat16, 2>({67, 129});
  const auto b = random_tensor<bfloat16, 2>({129, 45});
  auto c16 = poisoned<bfloat16, 2>(std::array<std::size_t, 2>{67, 45});
  auto c32 = poisoned<float, 2>(std::array<std::size_t, 2>{67, 45});
  const precis::cpu_context ctx{1};
  precis::gemm<precis::presets::bf16_mixed>(ctx, a, b, c16);
  precis::gemm<precis::presets::bf16_mixed>(ctx, a, b, c32);
  std::size_t differ = 0;
  for (std::size_t i = 0; i < c16.size(); ++i) {
    if (c16.data()[i].bits() != bfloat16(c32.data()[i]).bits()) ++differ;
  }
  CHECK(differ == 0);
}

TEST_CASE("hardware products are the same bits for a given thread count, within float64 bounds") {
  const std::size_t M = 300, N = 200, K = 513;
  const auto a = random_tensor<bfloat16, 2>({M, K});
  const auto b = random_tensor<bfloat16, 2>({N, K});
  precis::gemm_options o;
  o.trans_b = true;
  const auto ad = to_double(a), bd = to_double(b);
  auto ref = host_tensor<double, 2>::from_shape({M, N});
  for (std::size_t i = 0; i < M; ++i) {
    for (std::size_t j = 0; j < N; ++j) {
      double s = 0;
      for (std::size_t k = 0; k < K; ++k) s += ad(i, k) * bd(j, k);
      ref(i, j) = s;
    }
  }
  for (unsigned threads : {1U, 2U, 3U}) {
    INFO("threads=" << threads);
    const precis::cpu_context ctx{threads};
    auto c1 = poisoned<float, 2>(std::array<std::size_t, 2>{M, N});
    auto c2 = c1;
    precis::gemm<precis::presets::bf16_mixed>(ctx, a, b, c1, o);
    precis::gemm<precis::presets::bf16_mixed>(ctx, a, b, c2, o);
    CHECK(same_bits(c1, c2));
    CHECK(rel_error(c1, ref) < bound<float>());
  }
}

TEST_CASE_TEMPLATE("batched hardware products match the per-item products", Shape,
                   std::integral_constant<int, 0>, std::integral_constant<int, 1>) {
  // Batch >= threads: split over items; 6 items on 2 threads, and 5 items on 4 threads
  // (chunks of 2: the last part has one item, and a fourth part has none).
  const bool wide = Shape::value == 1;
  const std::size_t B = wide ? 5 : 6, M = wide ? 64 : 33, N = wide ? 64 : 20, K = wide ? 64 : 48;
  const auto a = random_tensor<bfloat16, 3>({B, M, K});
  const auto b = random_tensor<bfloat16, 3>({B, K, N});
  auto c = poisoned<bfloat16, 3>(std::array<std::size_t, 3>{B, M, N});
  const precis::cpu_context ctx{wide ? 4U : 2U};
  precis::gemm_options o;
  o.alpha = 0.5F;  // through precis's epilogue
  precis::gemm<precis::presets::bf16_mixed>(ctx, a, b, c, o);
  for (std::size_t i = 0; i < B; ++i) {
    auto ai = host_tensor<bfloat16, 2>::from_shape({M, K});
    auto bi = host_tensor<bfloat16, 2>::from_shape({K, N});
    std::copy_n(a.data() + i * M * K, M * K, ai.data());
    std::copy_n(b.data() + i * K * N, K * N, bi.data());
    auto ci = poisoned<float, 2>(std::array<std::size_t, 2>{M, N});
    precis::gemm<precis::presets::bf16_exact>(precis::cpu_context{1}, ai, bi, ci, o);
    double worst = 0, norm = 0;
    for (std::size_t e = 0; e < M * N; ++e) {
      worst = std::max(worst, std::abs(double(c.data()[i * M * N + e]) - double(ci.data()[e])));
      norm = std::max(norm, std::abs(double(ci.data()[e])));
    }
    CHECK(worst / norm < bound<bfloat16>());
  }
}

TEST_CASE("hardware convolutions: subnormals, thread counts, batch split or not") {
  using T = bfloat16;
  using shape4 = std::array<std::size_t, 4>;
  precis::conv2d_params p;
  p.padding = {1, 1};
  // One product per output: x = 2^-70 everywhere, w = 2^-70 at the centre tap only.
  auto x = host_tensor<T, 4>::from_shape({2, 16, 6, 6});
  auto w = host_tensor<T, 4>::from_shape({16, 16, 3, 3});
  x.fill(T(std::ldexp(1.0F, -70)));
  w.fill(T(0.0F));
  w(0, 0, 1, 1) = T(std::ldexp(1.0F, -70));
  auto y = poisoned<float, 4>(shape4{2, 16, 6, 6});
  precis::conv2d<precis::presets::bf16_mixed>(precis::cpu_context{2}, x, w, y, p);
  CHECK(y(1, 0, 3, 3) == (onednn_runs() ? 0.0F : std::ldexp(1.0F, -140)));
  precis::conv2d<precis::presets::bf16_exact>(precis::cpu_context{2}, x, w, y, p);
  CHECK(y(1, 0, 3, 3) == std::ldexp(1.0F, -140));

  // A ResNet-like layer; batch 3 on 2 threads splits the images (2 + 1), batch 1 runs on
  // oneDNN's own threads. Each: the same bits twice, and close to the exact kernel.
  for (std::size_t n : {std::size_t(1), std::size_t(3)}) {
    const auto xs = random_tensor<T, 4>({n, 32, 14, 14});
    const auto ws = random_tensor<T, 4>({48, 32, 3, 3});
    const auto dys = random_tensor<T, 4>({n, 48, 14, 14});
    for (unsigned threads : {1U, 2U}) {
      INFO("n=" << n << " threads=" << threads);
      const precis::cpu_context ctx{threads};
      host_tensor<float, 4> out[2][3];
      for (int rep = 0; rep < 2; ++rep) {
        out[rep][0] = poisoned<float, 4>(shape4{n, 48, 14, 14});
        out[rep][1] = poisoned<float, 4>(shape4{n, 32, 14, 14});
        out[rep][2] = poisoned<float, 4>(shape4{48, 32, 3, 3});
        precis::conv2d<precis::presets::bf16_mixed>(ctx, xs, ws, out[rep][0], p);
        precis::conv2d_backward_data<precis::presets::bf16_mixed>(ctx, dys, ws, out[rep][1], p);
        precis::conv2d_backward_weights<precis::presets::bf16_mixed>(ctx, xs, dys, out[rep][2], p);
      }
      host_tensor<float, 4> exact[3] = {poisoned<float, 4>(shape4{n, 48, 14, 14}),
                                        poisoned<float, 4>(shape4{n, 32, 14, 14}),
                                        poisoned<float, 4>(shape4{48, 32, 3, 3})};
      precis::conv2d<precis::presets::bf16_exact>(ctx, xs, ws, exact[0], p);
      precis::conv2d_backward_data<precis::presets::bf16_exact>(ctx, dys, ws, exact[1], p);
      precis::conv2d_backward_weights<precis::presets::bf16_exact>(ctx, xs, dys, exact[2], p);
      for (int k = 0; k < 3; ++k) {
        CHECK(same_bits(out[0][k], out[1][k]));
        // (rel_error is infinite where an output is NaN: every element was written.)
        CHECK(rel_error(out[0][k], to_double(exact[k])) < bound<float>());
      }
    }
  }
}

namespace {

/// dL/dw of y = conv2d(x, w) in float64 (stride s, padding k / 2; images in `layout`).
host_tensor<double, 4> reference_weight_gradient(const host_tensor<double, 4>& x,
                                                 const host_tensor<double, 4>& dy,
                                                 precis::image_layout layout, std::size_t co,
                                                 std::size_t k, std::size_t s) {
  const bool last = layout == precis::image_layout::nhwc;
  const std::size_t n = x.shape()[0], c = x.shape()[last ? 3 : 1], h = x.shape()[last ? 1 : 2];
  const std::size_t ho = dy.shape()[last ? 1 : 2], pad = k / 2;
  // Both images as NCHW values, so that the sums below walk plain arrays.
  const auto nchw = [&](const host_tensor<double, 4>& t, std::size_t ch, std::size_t side) {
    std::vector<double> v(n * ch * side * side);
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t a = 0; a < ch; ++a) {
        for (std::size_t r = 0; r < side * side; ++r) {
          v[(i * ch + a) * side * side + r] = last ? t.data()[(i * side * side + r) * ch + a]
                                                   : t.data()[(i * ch + a) * side * side + r];
        }
      }
    }
    return v;
  };
  const std::vector<double> xs = nchw(x, c, h), gs = nchw(dy, co, ho);
  auto dw = host_tensor<double, 4>::from_shape({co, c, k, k});
  dw.fill(0.0);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t o = 0; o < co; ++o) {
      for (std::size_t r = 0; r < ho * ho; ++r) {
        const double g = gs[(i * co + o) * ho * ho + r];
        for (std::size_t a = 0; a < k; ++a) {
          for (std::size_t b = 0; b < k; ++b) {
            const std::size_t yy = (r / ho) * s + a, xx = (r % ho) * s + b;
            if (yy < pad || xx < pad || yy - pad >= h || xx - pad >= h) continue;
            const double* xp = xs.data() + (i * c * h + yy - pad) * h + (xx - pad);
            double* dp = dw.data() + (o * c * k + a) * k + b;
            for (std::size_t ch = 0; ch < c; ++ch) dp[ch * k * k] += g * xp[ch * h * h];
          }
        }
      }
    }
  }
  return dw;
}

}  // namespace

TEST_CASE_TEMPLATE("hardware weight gradients split by output channels", T, bfloat16, float) {
  // Layers whose weight gradient outweighs its images (deep layers: small images, many
  // channels): oneDNN computes it in chunks of output channels, each over every image. Here
  // chunks with a tail (80 = 48 + 32 on 2 threads, 32 + 32 + 16 on 3), input channels
  // outside oneDNN's 16-channel blocks (24), a stride, and several chunks per thread (512
  // -> 384 channels: 3 x 128 on 1 thread, 4 x 96 on 2); both image layouts; float and
  // bfloat16 gradients (bfloat16 on the small geometries); against float64, and the same
  // bits twice.
  using P = std::conditional_t<std::is_same_v<T, float>, precis::presets::fp32_hardware,
                               precis::presets::bf16_mixed>;
  struct shape {
    std::size_t n, c, h, co, k, s;
  };
  std::size_t chunked = 0;
  for (const shape g :
       {shape{2, 48, 4, 80, 3, 1}, shape{2, 24, 7, 64, 3, 2}, shape{1, 512, 2, 384, 3, 1}}) {
    const std::size_t ho = (g.h + 2 * (g.k / 2) - g.k) / g.s + 1;
    for (const auto layout : {precis::image_layout::nchw, precis::image_layout::nhwc}) {
      precis::conv2d_params p;
      p.stride = {g.s, g.s};
      p.padding = {g.k / 2, g.k / 2};
      p.layout = layout;
      const auto x = random_tensor<T, 4>(precis::image_shape(layout, g.n, g.c, g.h, g.h));
      const auto dy = random_tensor<T, 4>(precis::image_shape(layout, g.n, g.co, ho, ho));
      const auto ref =
          reference_weight_gradient(to_double(x), to_double(dy), layout, g.co, g.k, g.s);
      // (The large one on 1 and 2 threads, with float gradients: its checks dominate the
      // test's time under the sanitizers.)
      const bool large = g.c * g.co > 100000;
      for (unsigned threads : {1U, 2U, 3U}) {
        if (large && threads == 3) continue;
        CAPTURE(g.c);
        CAPTURE(g.co);
        CAPTURE(int(layout));
        CAPTURE(threads);
        const precis::cpu_context ctx{threads};
#if PRECIS_HAS_ONEDNN
        if (precis::detail::onednn_has_products<T>()) {
          auto w = host_tensor<T, 4>::from_shape({g.co, g.c, g.k, g.k});
          const auto geo = precis::detail::conv_geometry_of("test", x, w, p);
          const auto key = precis::detail::onednn_key(
              geo, precis::detail::onednn_conv_kind::backward_weights, 0, false);
          const std::size_t chunk = precis::detail::onednn_weight_chunk(key, threads);
          CHECK(chunk < g.co);
          chunked += chunk > 0;
        }
#endif
        host_tensor<float, 4> dw[2] = {poisoned<float, 4>(std::array{g.co, g.c, g.k, g.k}),
                                       poisoned<float, 4>(std::array{g.co, g.c, g.k, g.k})};
        for (auto& d : dw) precis::conv2d_backward_weights<P>(ctx, x, dy, d, p);
        CHECK(rel_error(dw[0], ref) < bound<float>());
        CHECK(same_bits(dw[0], dw[1]));
        if (large) continue;
        auto dw16 = poisoned<bfloat16, 4>(std::array{g.co, g.c, g.k, g.k});
        precis::conv2d_backward_weights<P>(ctx, x, dy, dw16, p);
        CHECK(rel_error(dw16, ref) < bound<bfloat16>());
      }
    }
  }
  if (onednn_runs()) {
    // Every run but the 1-thread ones of the two small geometries is split by channels.
    CHECK(chunked == 12);
  }
}

#if PRECIS_HAS_ONEDNN
TEST_CASE("weights moved to oneDNN's layout are kept under a weights_version until it changes") {
  // conv2d (forward primitive) and conv_transpose2d (backward-data primitive), bf16_mixed:
  // a call with a nonzero weights_version gives the bits of a call without one, and a later
  // call with the same weights and version reuses what the first moved. New values written
  // to the same address under the same version (a caller breaking its promise) are not
  // seen, which shows that nothing was moved again; a new version moves them.
  using P = precis::presets::bf16_mixed;
  using shape4 = std::array<std::size_t, 4>;
  const bool kept = precis::detail::onednn_has_products<bfloat16>();
  for (unsigned threads : {1U, 2U}) {
    for (const bool transposed : {false, true}) {
      CAPTURE(threads);
      CAPTURE(transposed);
      const precis::cpu_context ctx{threads};
      const auto& st = precis::detail::onednn_of(ctx);
      const auto x = random_tensor<bfloat16, 4>(shape4{2, 32, 6, 6});
      // conv2d: [out 64, in 32, 3, 3]; conv_transpose2d: [in 32, out 64, 3, 3].
      auto w = random_tensor<bfloat16, 4>(transposed ? shape4{32, 64, 3, 3} : shape4{64, 32, 3, 3});
      const auto run = [&](std::uint64_t version) {
        precis::conv2d_params p;
        p.padding = {1, 1};
        p.weights_version = version;
        auto y = poisoned<float, 4>(shape4{2, 64, 6, 6});
        if (transposed) {
          precis::conv_transpose2d<P>(ctx, x, w, y, p);
        } else {
          precis::conv2d<P>(ctx, x, w, y, p);
        }
        return y;
      };
      const auto before = run(0);
      const std::size_t reuses = st.kept_reuses;
      CHECK(same_bits(run(7), before));  // moved, and kept
      CHECK(st.kept_reuses == reuses);
      CHECK(same_bits(run(7), before));  // kept
      CHECK(st.kept_reuses == reuses + (kept ? 1 : 0));
      CHECK(same_bits(run(0), before));  // no version: moved, nothing kept is touched

      const auto other = random_tensor<bfloat16, 4>(w.shape());
      std::copy(other.begin(), other.end(), w.begin());
      const auto after = run(0);
      REQUIRE_FALSE(same_bits(after, before));
      CHECK(same_bits(run(7), kept ? before : after));
      CHECK(same_bits(run(8), after));
      CHECK(same_bits(run(8), after));
      CHECK(st.kept_reuses == reuses + (kept ? 3 : 0));
    }
  }
}

TEST_CASE("nn's convolutions keep their moved weights while evaluating, until a refresh") {
  // An evaluation pass names the weight's version (parameter::version()); training passes
  // name none. Both give the same bits.
  namespace nn = precis::nn;
  using P = precis::presets::bf16_mixed;
  using shape4 = std::array<std::size_t, 4>;
  const std::size_t kept = precis::detail::onednn_has_products<bfloat16>() ? 1 : 0;
  const precis::cpu_context ctx{2};
  const auto& st = precis::detail::onednn_of(ctx);
  nn::conv2d_layer<nn::tags::conv2d, P, precis::cpu_context> layer(
      nn::conv2d(32, 64, 3, {.padding = {1, 1}}));
  layer.reset(1);
  const auto x = random_tensor<bfloat16, 4>(shape4{2, 32, 6, 6});
  const host_tensor<bfloat16, 4> trained = layer.forward(ctx, x, nn::mode::train);
  const std::size_t reuses = st.kept_reuses;
  CHECK(same_bits(layer.forward(ctx, x, nn::mode::eval), trained));
  CHECK(same_bits(layer.forward(ctx, x, nn::mode::eval), trained));
  CHECK(same_bits(layer.forward(ctx, x, nn::mode::train), trained));
  CHECK(st.kept_reuses == reuses + kept);
  // An optimizer's step: the master weights change, then the working copy is refreshed.
  layer.weight().master()(5, 3, 1, 1) += 0.5F;
  layer.weight().refresh(ctx);
  const host_tensor<bfloat16, 4> stepped = layer.forward(ctx, x, nn::mode::train);
  REQUIRE_FALSE(same_bits(stepped, trained));
  CHECK(same_bits(layer.forward(ctx, x, nn::mode::eval), stepped));
  CHECK(st.kept_reuses == reuses + kept);
  CHECK(same_bits(layer.forward(ctx, x, nn::mode::eval), stepped));
  CHECK(st.kept_reuses == reuses + 2 * kept);
}

TEST_CASE_TEMPLATE(
    "large weights are reordered in blocks of output channels split over the threads", T, bfloat16,
    float) {
  // 256 x 256 x 3x3 weights (past onednn_block_reorder::min_bytes), two images on two
  // threads: each image is one single-threaded part, and the weights' move is split over
  // both threads by blocks of output channels. Each image alone on one thread runs the same
  // primitive with the weights moved by one reorder: the same bits, forward and backward
  // data, unless the split move misplaced a value.
  using P = std::conditional_t<std::is_same_v<T, float>, precis::presets::fp32_hardware,
                               precis::presets::bf16_mixed>;
  using shape4 = std::array<std::size_t, 4>;
  const std::size_t c = 256, h = 7;
  const auto x = random_tensor<T, 4>(shape4{2, c, h, h});
  const auto w = random_tensor<T, 4>(shape4{c, c, 3, 3});
  precis::conv2d_params p;
  p.padding = {1, 1};
  const precis::cpu_context two{2}, one{1};
  auto y = poisoned<float, 4>(shape4{2, c, h, h});
  auto dx = poisoned<float, 4>(shape4{2, c, h, h});
  precis::conv2d<P>(two, x, w, y, p);
  precis::conv2d_backward_data<P>(two, x, w, dx, p);
  for (std::size_t i = 0; i < 2; ++i) {
    CAPTURE(i);
    host_tensor<T, 4> xi = xt::view(x, xt::range(i, i + 1));
    auto yi = poisoned<float, 4>(shape4{1, c, h, h});
    auto dxi = poisoned<float, 4>(shape4{1, c, h, h});
    precis::conv2d<P>(one, xi, w, yi, p);
    precis::conv2d_backward_data<P>(one, xi, w, dxi, p);
    const host_tensor<float, 4> y_i = xt::view(y, xt::range(i, i + 1));
    const host_tensor<float, 4> dx_i = xt::view(dx, xt::range(i, i + 1));
    CHECK(same_bits(y_i, yi));
    CHECK(same_bits(dx_i, dxi));
  }
}

TEST_CASE("kept weights are limited in number and bytes; the least recently used are given up") {
  using P = precis::presets::bf16_mixed;
  using shape4 = std::array<std::size_t, 4>;
  if (!precis::detail::onednn_has_products<bfloat16>()) {
    MESSAGE("skipped: no bfloat16 dot-product instructions here, nothing is kept");
    return;
  }
  const precis::cpu_context ctx{1};
  auto& st = precis::detail::onednn_of(ctx);
  constexpr std::size_t limit = precis::detail::onednn_state::kept_limit;
  const auto x = random_tensor<bfloat16, 4>(shape4{1, 16, 3, 3});
  std::vector<host_tensor<bfloat16, 4>> ws;
  for (std::size_t i = 0; i <= limit; ++i)
    ws.push_back(random_tensor<bfloat16, 4>(shape4{32, 16, 3, 3}));
  const auto run = [&](std::size_t i, std::uint64_t version) {
    precis::conv2d_params p;
    p.padding = {1, 1};
    p.weights_version = version;
    auto y = poisoned<float, 4>(shape4{1, 32, 3, 3});
    precis::conv2d<P>(ctx, x, ws[i], y, p);
    return y;
  };
  std::vector<host_tensor<float, 4>> fresh;
  for (std::size_t i = 0; i <= limit; ++i) fresh.push_back(run(i, 0));
  REQUIRE(st.kept.empty());  // no version, nothing kept
  for (std::size_t i = 0; i < limit; ++i) CHECK(same_bits(run(i, 100 + i), fresh[i]));
  CHECK(st.kept.size() == limit);
  const std::size_t reuses = st.kept_reuses;
  CHECK(same_bits(run(0, 100), fresh[0]));  // weights 0 are now the most recently used
  CHECK(st.kept_reuses == reuses + 1);
  CHECK(same_bits(run(limit, 100 + limit), fresh[limit]));  // gives up weights 1
  CHECK(st.kept.size() == limit);
  CHECK(same_bits(run(0, 100), fresh[0]));
  CHECK(same_bits(run(2, 102), fresh[2]));
  CHECK(st.kept_reuses == reuses + 3);
  CHECK(same_bits(run(1, 101), fresh[1]));  // moved again
  CHECK(st.kept_reuses == reuses + 3);

  // A limit in bytes that holds three of these: the least recently used go, freed.
  const std::size_t each = st.kept.front()->bytes;
  CHECK(each >= ws[0].size() * sizeof(bfloat16));
  st.kept_bytes_limit = 3 * each;
  CHECK(same_bits(run(4, 104), fresh[4]));  // kept before: reused, the others given up
  CHECK(st.kept_reuses == reuses + 4);
  REQUIRE(st.kept.size() == 3);
  CHECK(same_bits(run(1, 101), fresh[1]));
  CHECK(same_bits(run(4, 104), fresh[4]));
  CHECK(st.kept_reuses == reuses + 6);
  CHECK(same_bits(run(5, 105), fresh[5]));  // weights 5 were given up: moved again
  CHECK(st.kept_reuses == reuses + 6);
  CHECK(st.kept.size() == 3);
  // A tensor larger than the limit is still kept for its own call, alone.
  st.kept_bytes_limit = each / 2;
  CHECK(same_bits(run(6, 106), fresh[6]));
  CHECK(st.kept.size() == 1);
  CHECK(same_bits(run(6, 106), fresh[6]));
  CHECK(st.kept_reuses == reuses + 7);
}
#endif

#if PRECIS_HAS_ONEDNN
TEST_CASE("precis's unblocking of float weight gradients matches oneDNN's reorder") {
  // ABcd16b16a ([O/16][I/16][KH][KW][16 i][16 o]) back to OIHW, 1x1 to 7x7, against
  // oneDNN's reorder; other layouts and partial blocks are left to the reorder.
  precis::cpu_context ctx{1};
  auto& st = precis::detail::onednn_of(ctx);
  using md = dnnl::memory::desc;
  using tag = dnnl::memory::format_tag;
  const auto f32 = dnnl::memory::data_type::f32;
  struct shape {
    std::int64_t o, i, k;
  };
  for (const shape s : {shape{16, 16, 1}, shape{32, 48, 3}, shape{64, 16, 7}, shape{48, 32, 2}}) {
    CAPTURE(s.o);
    CAPTURE(s.i);
    CAPTURE(s.k);
    const dnnl::memory::dims d{s.o, s.i, s.k, s.k};
    const md blocked(d, f32, tag::ABcd16b16a), plain(d, f32, tag::oihw);
    const auto u = precis::detail::onednn_weight_unblocking::of(blocked);
    REQUIRE(u.has_value());
    const std::size_t n = std::size_t(s.o * s.i * s.k * s.k);
    std::vector<float> src(n), mine(n, -1.0F), theirs(n, -2.0F);
    for (std::size_t e = 0; e < n; ++e) src[e] = float(e) * 0.5F + 1.0F;
    u->unpack(src.data(), mine.data());
    dnnl::stream stream(st.engine);
    dnnl::memory from(blocked, st.engine, src.data()), to(plain, st.engine, theirs.data());
    dnnl::reorder(dnnl::reorder::primitive_desc(st.engine, blocked, st.engine, plain))
        .execute(stream, from, to);
    stream.wait();
    CHECK(mine == theirs);
  }
  CHECK_FALSE(precis::detail::onednn_weight_unblocking::of(md({32, 32, 3, 3}, f32, tag::ABcd16a16b))
                  .has_value());
  CHECK_FALSE(precis::detail::onednn_weight_unblocking::of(md({24, 32, 3, 3}, f32, tag::ABcd16b16a))
                  .has_value());
  CHECK_FALSE(
      precis::detail::onednn_weight_unblocking::of(md({32, 32, 3, 3}, f32, tag::oihw)).has_value());
}
#endif

#if PRECIS_HAS_ONEDNN
TEST_CASE_TEMPLATE("the NCHW <-> NHWC transpose matches the element-by-element one", U,
                   std::uint16_t, std::uint32_t, std::uint64_t) {
  // Rows and columns below, at and past the 8 x 8 blocks, and images one after another.
  for (const std::size_t rows : {1U, 3U, 7U, 8U, 9U, 16U, 67U}) {
    for (const std::size_t cols : {1U, 5U, 8U, 15U, 49U, 784U}) {
      const std::size_t images = 3, size = images * rows * cols;
      std::vector<U> a(size), t(size, U(0xFFFF)), back(size, U(0xFFFF));
      for (std::size_t i = 0; i < size; ++i) a[i] = U(i * 40503U + 7U);
      precis::detail::transpose_images(a.data(), t.data(), images, rows, cols);
      bool ok = true;
      for (std::size_t n = 0; n < images; ++n) {
        for (std::size_t i = 0; i < rows; ++i) {
          for (std::size_t j = 0; j < cols; ++j) {
            ok &= t[(n * cols + j) * rows + i] == a[(n * rows + i) * cols + j];
          }
        }
      }
      precis::detail::transpose_images(t.data(), back.data(), images, cols, rows);
      CAPTURE(rows);
      CAPTURE(cols);
      CHECK(ok);
      CHECK(back == a);
    }
  }
}
#endif

#if PRECIS_HAS_ONEDNN
TEST_CASE("precis's packing of bfloat16 weights matches oneDNN's reorder bit for bit") {
  // Forward and backward-data weights of convolutions whose channel counts fall below, at
  // and past oneDNN's blocks (16, 32, 64), 1x1 to 7x7; the layouts are the ones oneDNN
  // picks for this CPU. Each packing is checked against oneDNN's own reorder between the
  // same two layouts, padding included.
  if (!precis::detail::onednn_has_bf16_products()) {
    MESSAGE("skipped: this CPU has no bfloat16 dot products, so oneDNN takes no bf16 weights");
    return;
  }
  using precis::detail::onednn_conv_kind;
  using precis::detail::onednn_move;
  precis::cpu_context ctx{1};
  auto& st = precis::detail::onednn_of(ctx);
  const auto bf16 = int(dnnl::memory::data_type::bf16);
  int packed = 0;
  std::vector<std::string> layouts;
  struct shape {
    std::int64_t c, co, k, stride;
  };
  for (const shape s :
       {shape{3, 64, 7, 2}, shape{16, 16, 3, 1}, shape{64, 64, 3, 1}, shape{64, 128, 1, 2},
        shape{40, 72, 3, 1}, shape{17, 33, 3, 2}, shape{256, 512, 3, 2}, shape{96, 48, 2, 2}}) {
    for (const auto kind : {onednn_conv_kind::forward, onednn_conv_kind::backward_data}) {
      const std::int64_t h = 14, pad = s.k / 2, ho = (h + 2 * pad - s.k) / s.stride + 1;
      const precis::detail::onednn_conv_key key{2,  s.c, h,        h,        s.co,  s.k, s.k, ho,
                                                ho, 1,   s.stride, s.stride, pad,   pad, pad, pad,
                                                0,  0,   kind,     bf16,     false, 1,   bf16};
      const auto& e = st.conv(key);
      CAPTURE(s.c);
      CAPTURE(s.co);
      CAPTURE(s.k);
      CAPTURE(int(kind));
      // Packed by precis or not (oneDNN's reorder is the faster on some CPUs), every
      // layout of this family is checked.
      const auto packing = precis::detail::onednn_weight_packing::of(e.in1.prim);
      if (!packing) continue;
      CHECK((e.in1.move == onednn_move::pack) ==
            (precis::detail::onednn_isa() == dnnl::cpu_isa::avx512_core_amx));
      ++packed;
      precis::detail::onednn_operand op = e.in1;
      op.move = onednn_move::pack;
      op.packing = *packing;
      const std::size_t n = e.in1.user.get_size() / 2, m = e.in1.prim.get_size() / 2;
      std::vector<std::uint16_t> w(n), mine(m, 0xABCD), theirs(m, 0x1234);
      for (std::size_t i = 0; i < n; ++i) w[i] = std::uint16_t(i * 2654435761U >> 7);
      precis::detail::scratch_bytes scratch;
      dnnl::stream stream(st.engine);
      dnnl::memory user(e.in1.user, st.engine, w.data());
      dnnl::memory to_mine(e.in1.prim, st.engine, mine.data());
      dnnl::memory to_theirs(e.in1.prim, st.engine, theirs.data());
      precis::detail::onednn_move_operand(op, stream, user, to_mine, scratch);
      dnnl::reorder(dnnl::reorder::primitive_desc(st.engine, e.in1.user, st.engine, e.in1.prim))
          .execute(stream, user, to_theirs);
      stream.wait();
      CHECK(mine == theirs);
      // Split into ranges of blocks, as the threads do, the packing writes the same.
      const auto& p = *packing;
      std::vector<std::uint16_t> split(m, 0xABCD);
      for (std::size_t b = 0; b < p.blocks(); b += 3) {
        p.pack(w.data(), split.data(), b, std::min(p.blocks(), b + 3),
               static_cast<std::uint16_t*>(scratch.get(p.scratch_values() * 2)));
      }
      CHECK(split == theirs);
    }
  }
  MESSAGE(packed << " weight layouts packed by precis's packing");
  CHECK(packed > 0);
}
#endif

#if PRECIS_HAS_ONEDNN
namespace {

/// n bfloat16 integers in [-4, 4] from a fixed linear congruential sequence: products of
/// them sum exactly in float over any K used here, so a product's result is exact.
std::vector<bfloat16> small_integers(std::size_t n, std::uint32_t seed) {
  std::vector<bfloat16> v(n);
  std::uint32_t x = seed;
  for (auto& e : v) {
    x = x * 1664525U + 1013904223U;
    e = bfloat16(float(int((x >> 28) % 9U) - 4));
  }
  return v;
}

/// The first 64-byte aligned element of v (within its first 32).
const bfloat16* aligned64(const std::vector<bfloat16>& v) {
  const auto at = reinterpret_cast<std::uintptr_t>(v.data());
  return v.data() + ((64 - at % 64) % 64) / sizeof(bfloat16);
}

/// An operand's layout in a test: element (r, c) at p[r * row + c * col].
struct test_layout {
  std::int64_t row, col;
  std::size_t offset;  // values before the first element (an odd one misaligns the words)
  std::size_t extent(std::size_t rows, std::size_t cols) const {
    return offset + std::size_t(std::int64_t(rows - 1) * row + std::int64_t(cols - 1) * col) + 1;
  }
};

}  // namespace

TEST_CASE("precis's AMX product is exact on integer sums for every layout and edge" *
          doctest::skip(!precis::detail::amx_enabled())) {
  // amx_product called directly, whatever amx_takes says: sizes across the 16- and 32-wide
  // tiles and K's 32-value steps, A row-major, transposed or strided, B row-major,
  // transposed (32-bit word pairs, or value by value where K is odd or the pointer
  // misaligned) or strided. A row-major with K = 64 or 128 from a 64-byte aligned start is
  // read in place (its last rows past a multiple of 32 copied); K = 300 is summed in two
  // ranges of k (amx_k_block). Every element must be written once, equal to the exact sum.
  using precis::detail::strided_operand;
  const std::size_t Ms[] = {1, 33, 70}, Ns[] = {1, 17, 33, 80}, Ks[] = {1, 31, 64, 100, 128, 300};
  std::size_t products = 0;
  for (std::size_t M : Ms) {
    for (std::size_t N : Ns) {
      for (std::size_t K : Ks) {
        const test_layout a_layouts[] = {
            {std::int64_t(K), 1, 0}, {1, std::int64_t(M), 0}, {std::int64_t(2 * K + 3), 2, 1}};
        const test_layout b_layouts[] = {{std::int64_t(N), 1, 0},
                                         {1, std::int64_t(K), 0},
                                         {1, std::int64_t(K + K % 2), 1},
                                         {3, std::int64_t(3 * K + 1), 0}};
        for (const auto& la : a_layouts) {
          for (const auto& lb : b_layouts) {
            for (unsigned threads : {1U, 2U}) {
              const std::size_t batch = threads == 1 ? 1 : 3;  // 3 items on 2 threads: split
              const std::size_t a_item = la.extent(M, K), b_item = lb.extent(K, N);
              const auto av = small_integers(a_item * batch + 32, std::uint32_t(M * 7 + K));
              const auto bv = small_integers(b_item * batch, std::uint32_t(N * 5 + K));
              std::vector<float> c(batch * M * N, std::nanf(""));
              std::vector<int> writes(batch * M * N, 0);
              const precis::cpu_context ctx{threads};
              auto& st = precis::detail::onednn_of(ctx);
              const bool ran = precis::detail::amx_product(
                  ctx, st, batch, M, N, K,
                  strided_operand<const bfloat16>{aligned64(av) + la.offset, std::int64_t(a_item),
                                                  la.row, la.col},
                  strided_operand<const bfloat16>{bv.data() + lb.offset, std::int64_t(b_item),
                                                  lb.row, lb.col},
                  [&](std::size_t item, std::size_t i0, std::size_t rows, std::size_t j0,
                      const float* v, std::size_t n) {
                    for (std::size_t r = 0; r < rows; ++r) {
                      for (std::size_t j = 0; j < n; ++j) {
                        const std::size_t at = (item * M + i0 + r) * N + j0 + j;
                        c[at] = v[r * 32 + j];
                        ++writes[at];
                      }
                    }
                  });
              REQUIRE(ran);
              std::size_t wrong = 0, rewritten = 0;
              for (std::size_t item = 0; item < batch; ++item) {
                const bfloat16* pa = aligned64(av) + item * a_item + la.offset;
                const bfloat16* pb = bv.data() + item * b_item + lb.offset;
                for (std::size_t i = 0; i < M; ++i) {
                  for (std::size_t j = 0; j < N; ++j) {
                    double s = 0;
                    for (std::size_t k = 0; k < K; ++k) {
                      s += double(float(pa[std::int64_t(i) * la.row + std::int64_t(k) * la.col])) *
                           double(float(pb[std::int64_t(k) * lb.row + std::int64_t(j) * lb.col]));
                    }
                    const std::size_t at = (item * M + i) * N + j;
                    if (double(c[at]) != s) ++wrong;
                    if (writes[at] != 1) ++rewritten;
                  }
                }
              }
              INFO("M=" << M << " N=" << N << " K=" << K << " a(" << la.row << "," << la.col
                        << ") b(" << lb.row << "," << lb.col << ") +" << lb.offset
                        << " threads=" << threads);
              CHECK(wrong == 0);
              CHECK(rewritten == 0);
              ++products;
            }
          }
        }
      }
    }
  }
  CHECK(products == 3 * 4 * 6 * 3 * 4 * 2);
}

TEST_CASE(
    "bfloat16 products past amx_takes run on AMX tiles: exact sums, one rounding, "
    "flushed subnormals, any thread count" *
    doctest::skip(!precis::detail::amx_enabled())) {
  // Through precis::gemm at sizes where onednn_product hands the product to the AMX kernel:
  // M = 256, K = 512, N = 4096 (B of 2^21 values, enough for every layout).
  const std::size_t M = 256, K = 512, N = 4096;
  REQUIRE(precis::detail::amx_takes(M, N, K, true));
  REQUIRE(!precis::detail::amx_takes(M, N / 4, K, false));
  using P = precis::presets::bf16_mixed;
  const auto av = small_integers(M * K, 11), bv = small_integers(K * N, 12);
  auto a = host_tensor<bfloat16, 2>::from_shape({M, K});
  auto at = host_tensor<bfloat16, 2>::from_shape({K, M});
  auto b = host_tensor<bfloat16, 2>::from_shape({K, N});
  auto bt = host_tensor<bfloat16, 2>::from_shape({N, K});
  for (std::size_t i = 0; i < M; ++i) {
    for (std::size_t k = 0; k < K; ++k) a(i, k) = at(k, i) = av[i * K + k];
  }
  for (std::size_t k = 0; k < K; ++k) {
    for (std::size_t j = 0; j < N; ++j) b(k, j) = bt(j, k) = bv[k * N + j];
  }
  auto bias = host_tensor<bfloat16, 1>::from_shape({N});
  for (std::size_t j = 0; j < N; ++j) bias(j) = bfloat16(float(int(j % 11) - 5));
  // Every 9th row against the exact sums.
  const auto exact = [&](std::size_t i, std::size_t j) {
    double s = 0;
    for (std::size_t k = 0; k < K; ++k) s += double(float(a(i, k))) * double(float(b(k, j)));
    return s;
  };
  for (unsigned threads : {1U, 2U}) {
    INFO("threads=" << threads);
    const precis::cpu_context ctx{threads};
    for (int layout = 0; layout < 3; ++layout) {
      INFO("layout=" << layout << " (0: plain, 1: A transposed, 2: B transposed)");
      precis::gemm_options o;
      o.trans_a = layout == 1;
      o.trans_b = layout == 2;
      auto c = poisoned<float, 2>(std::array<std::size_t, 2>{M, N});
      precis::gemm<P>(ctx, layout == 1 ? at : a, layout == 2 ? bt : b, c, o);
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < M; i += 9) {
        for (std::size_t j = 0; j < N; ++j) wrong += double(c(i, j)) != exact(i, j) ? 1U : 0U;
      }
      CHECK(wrong == 0);
    }
    // bfloat16 output with a bfloat16 bias (written straight from the tiles), and alpha
    // (through precis's epilogue): each the exact value rounded once.
    auto c16 = poisoned<bfloat16, 2>(std::array<std::size_t, 2>{M, N});
    precis::gemm_options tb;
    tb.trans_b = true;
    precis::gemm<P>(ctx, a, bt, bias, c16, tb);
    auto half = poisoned<float, 2>(std::array<std::size_t, 2>{M, N});
    precis::gemm_options o;
    o.alpha = 0.5F;
    precis::gemm<P>(ctx, a, b, half, o);
    std::size_t wrong16 = 0, wrong_half = 0;
    for (std::size_t i = 0; i < M; i += 9) {
      for (std::size_t j = 0; j < N; ++j) {
        const double s = exact(i, j);
        wrong16 += c16(i, j).bits() != bfloat16(float(s + double(float(bias(j))))).bits() ? 1U : 0U;
        wrong_half += double(half(i, j)) != 0.5 * s ? 1U : 0U;
      }
    }
    CHECK(wrong16 == 0);
    CHECK(wrong_half == 0);
  }
  // Subnormals: a subnormal input counts as zero, a subnormal product is flushed, a NaN
  // input gives NaN (also through the bfloat16 store).
  auto z = host_tensor<bfloat16, 2>::from_shape({M, K});
  z.fill(bfloat16(0.0F));
  auto e = host_tensor<bfloat16, 2>::from_shape({K, N});
  e.fill(bfloat16(0.0F));
  z(0, 0) = bfloat16(std::ldexp(1.0F, -130));
  z(1, 0) = bfloat16(std::ldexp(1.0F, -70));
  z(2, 0) = bfloat16(3.0F);
  z(3, 0) = bfloat16(std::nanf(""));
  e(0, 0) = bfloat16(std::ldexp(1.0F, -70));
  e(0, 1) = bfloat16(1.0F);
  auto cz = poisoned<float, 2>(std::array<std::size_t, 2>{M, N});
  auto cz16 = poisoned<bfloat16, 2>(std::array<std::size_t, 2>{M, N});
  precis::gemm<P>(precis::cpu_context{1}, z, e, cz);
  precis::gemm<P>(precis::cpu_context{1}, z, e, cz16);
  CHECK(cz(0, 1) == 0.0F);                   // 2^-130 x 1: subnormal input
  CHECK(cz(1, 0) == 0.0F);                   // 2^-70 x 2^-70 = 2^-140: flushed
  CHECK(cz(1, 1) == std::ldexp(1.0F, -70));  // a normal product is kept
  CHECK(cz(2, 1) == 3.0F);
  CHECK(std::isnan(cz(3, 1)));
  CHECK(std::isnan(float(cz16(3, 1))));
  CHECK(float(cz16(2, 1)) == 3.0F);
  CHECK(cz(4, 1) == 0.0F);
  // Random values: the same bits on 1 and 2 threads (every element is one chain of tile
  // steps however the product is split), within float64 bounds.
  const auto ra = random_tensor<bfloat16, 2>({M, K});
  const auto rb = random_tensor<bfloat16, 2>({K, N});
  auto r1 = poisoned<float, 2>(std::array<std::size_t, 2>{M, N});
  auto r2 = r1;
  precis::gemm<P>(precis::cpu_context{1}, ra, rb, r1);
  precis::gemm<P>(precis::cpu_context{2}, ra, rb, r2);
  CHECK(same_bits(r1, r2));
  const auto rad = to_double(ra), rbd = to_double(rb);
  double worst = 0, norm = 0;
  for (std::size_t i = 0; i < M; i += 9) {
    for (std::size_t j = 0; j < N; ++j) {
      double s = 0;
      for (std::size_t k = 0; k < K; ++k) s += rad(i, k) * rbd(k, j);
      worst = std::max(worst, std::fabs(double(r1(i, j)) - s));
      norm = std::max(norm, std::fabs(s));
    }
  }
  CHECK(worst / norm < bound<float>());
}
#endif
