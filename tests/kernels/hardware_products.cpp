// Hardware products (products::hardware) on the CPU: built into test_kernels_onednn beside
// test_gemm.cpp and test_conv.cpp, whose float64 bounds then hold for bf16_mixed and
// fp32_hardware through oneDNN (all of conv's geometries: groups, dilation, strides,
// transposed). Here:
// which engine runs, how subnormals behave on each engine, rounding once, determinism for
// a given thread count. On a CPU without bfloat16 dot-product instructions the exact kernel
// runs, and the checks below assert exactly that.
#include <precis/kernels/conv.hpp>
#include <precis/kernels/gemm.hpp>

#include "kernel_checks.hpp"

#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
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
        double worst = 0, norm = 0;
        for (std::size_t e = 0; e < exact[k].size(); ++e) {
          worst = std::max(worst, std::abs(double(out[0][k].data()[e]) - double(exact[k].data()[e])));
          norm = std::max(norm, std::abs(double(exact[k].data()[e])));
        }
        CHECK(worst / norm < bound<float>());
      }
    }
  }
}

#if PRECIS_HAS_ONEDNN
TEST_CASE("the 16-bit NCHW <-> NHWC transpose matches the element-by-element one") {
  // Rows and columns below, at and past the 8 x 8 blocks, and images one after another.
  for (const std::size_t rows : {1U, 3U, 7U, 8U, 9U, 16U, 67U}) {
    for (const std::size_t cols : {1U, 5U, 8U, 15U, 49U, 784U}) {
      const std::size_t images = 3, size = images * rows * cols;
      std::vector<std::uint16_t> a(size), t(size, 0xFFFF), back(size, 0xFFFF);
      for (std::size_t i = 0; i < size; ++i) a[i] = std::uint16_t(i * 40503U + 7U);
      precis::detail::transpose_images_16(a.data(), t.data(), images, rows, cols);
      bool ok = true;
      for (std::size_t n = 0; n < images; ++n) {
        for (std::size_t i = 0; i < rows; ++i) {
          for (std::size_t j = 0; j < cols; ++j) {
            ok &= t[(n * cols + j) * rows + i] == a[(n * rows + i) * cols + j];
          }
        }
      }
      precis::detail::transpose_images_16(t.data(), back.data(), images, cols, rows);
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
      if (e.in1.move != onednn_move::pack) continue;
      ++packed;
      const std::size_t n = e.in1.user.get_size() / 2, m = e.in1.prim.get_size() / 2;
      std::vector<std::uint16_t> w(n), mine(m, 0xABCD), theirs(m, 0x1234);
      for (std::size_t i = 0; i < n; ++i) w[i] = std::uint16_t(i * 2654435761U >> 7);
      precis::detail::scratch_bytes scratch;
      dnnl::stream stream(st.engine);
      dnnl::memory user(e.in1.user, st.engine, w.data());
      dnnl::memory to_mine(e.in1.prim, st.engine, mine.data());
      dnnl::memory to_theirs(e.in1.prim, st.engine, theirs.data());
      precis::detail::onednn_move_operand(e.in1, stream, user, to_mine, scratch);
      dnnl::reorder(dnnl::reorder::primitive_desc(st.engine, e.in1.user, st.engine, e.in1.prim))
          .execute(stream, user, to_theirs);
      stream.wait();
      CHECK(mine == theirs);
      // Split into ranges of blocks, as the threads do, the packing writes the same.
      const auto& p = e.in1.packing;
      std::vector<std::uint16_t> split(m, 0xABCD);
      for (std::size_t b = 0; b < p.blocks(); b += 3) {
        p.pack(w.data(), split.data(), b, std::min(p.blocks(), b + 3),
               static_cast<std::uint16_t*>(scratch.get(p.scratch_values() * 2)));
      }
      CHECK(split == theirs);
    }
  }
  MESSAGE(packed << " weight layouts packed by precis");
  CHECK(packed > 0);
}
#endif
