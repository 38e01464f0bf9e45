// gemm, batched gemm and gemm_backward against float64 references computed from the same
// (rounded) inputs; the error measure and the per-format bounds are kernel_checks.hpp's
// (max |kernel - reference| / max |reference|):
//
//   output   bound   why
//   float    1e-5    float sums of K <= 150 exact products: about sqrt(K) float ulps of the
//                    typical term, ~1e-6 of the output's max norm; alpha/beta/bias add 3 ulps
//   bfloat16 1e-2    one rounding of the output (2^-9 relative) dominates
//   float16  2e-3    one rounding (2^-11) dominates
// tfloat32 inputs: the reference is computed from the inputs rounded to 10 mantissa bits,
// so the float bound holds; against the unrounded inputs the error is ~2^-11 (checked too).
// Backward: the analytic float64 adjoint (dA = dC B^T, dB = A^T dC with the transposes)
// is itself checked against central differences of the float64 forward (bound 1e-6).
#include <precis/kernels/gemm.hpp>

#include "kernel_checks.hpp"

#include <xtensor/xview.hpp>

#include <doctest/doctest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace precis_test;
using precis::host_tensor;

/// op(X)(i, k) for a stored 2-D tensor.
double at(const host_tensor<double, 2>& x, bool trans, std::size_t i, std::size_t k) {
  return trans ? x(k, i) : x(i, k);
}

enum class act { none, relu, gelu };

double activate(act e, double v) {
  if (e == act::relu) return v < 0 ? 0 : v;
  if (e == act::gelu) return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
  return v;
}

/// float64 alpha * op(A) op(B) + beta * C0 + bias, activation.
host_tensor<double, 2> reference(const host_tensor<double, 2>& a, const host_tensor<double, 2>& b,
                                 const host_tensor<double, 2>* c0, const host_tensor<double, 1>* bias,
                                 const precis::gemm_options& o) {
  const std::size_t M = o.trans_a ? a.shape()[1] : a.shape()[0];
  const std::size_t K = o.trans_a ? a.shape()[0] : a.shape()[1];
  const std::size_t N = o.trans_b ? b.shape()[0] : b.shape()[1];
  host_tensor<double, 2> r = host_tensor<double, 2>::from_shape({M, N});
  const act e = o.epilogue == precis::gemm_epilogue::relu   ? act::relu
                : o.epilogue == precis::gemm_epilogue::gelu ? act::gelu
                                                            : act::none;
  for (std::size_t i = 0; i < M; ++i) {
    for (std::size_t j = 0; j < N; ++j) {
      double s = 0;
      for (std::size_t k = 0; k < K; ++k) s += at(a, o.trans_a, i, k) * at(b, !o.trans_b, j, k);
      double v = double(o.alpha) * s;
      if (o.beta != 0.0F) v += double(o.beta) * (*c0)(i, j);
      if (bias) v += (*bias)(j);
      r(i, j) = activate(e, v);
    }
  }
  return r;
}

std::array<std::size_t, 2> stored(bool trans, std::size_t r, std::size_t c) {
  return trans ? std::array<std::size_t, 2>{c, r} : std::array<std::size_t, 2>{r, c};
}

template <class Cfg, class TC>
void check_forward(std::size_t M, std::size_t N, std::size_t K, const precis::gemm_options& o,
                   bool with_bias, unsigned threads) {
  using T = typename Cfg::T;
  using P = typename Cfg::P;
  INFO("M=" << M << " N=" << N << " K=" << K << " trans_a=" << o.trans_a << " trans_b=" << o.trans_b
            << " alpha=" << o.alpha << " beta=" << o.beta << " bias=" << with_bias
            << " epilogue=" << int(o.epilogue) << " threads=" << threads);
  const auto a = random_tensor<T, 2>(stored(o.trans_a, M, K));
  const auto b = random_tensor<T, 2>(stored(o.trans_b, K, N));
  const auto c0 = random_tensor<TC, 2>({M, N});
  const auto bias = random_tensor<T, 1>({N});
  auto c = poisoned<TC, 2>(std::array<std::size_t, 2>{M, N});
  if (o.beta != 0.0F) c = c0;
  const precis::cpu_context ctx{threads};
  if (with_bias) {
    precis::gemm<P>(ctx, a, b, bias, c, o);
  } else {
    precis::gemm<P>(ctx, a, b, c, o);
  }
  const auto c0d = to_double(c0);
  const auto biasd = to_double(bias);
  const auto ref = reference(to_double(a), to_double(b), &c0d, with_bias ? &biasd : nullptr, o);
  CHECK(rel_error(c, ref) < bound<TC>());
}

}  // namespace

TEST_CASE_TEMPLATE("gemm matches float64 on odd sizes, transposes, alpha/beta, bias, epilogues",
                   Cfg, fp32_config, fp32_hw_config, bf16_config, fp16_config, fp16_hw_config) {
  using T = typename Cfg::T;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      precis::gemm_options o;
      o.trans_a = ta;
      o.trans_b = tb;
      check_forward<Cfg, T>(37, 53, 61, o, false, 1);
      check_forward<Cfg, float>(13, 7, 150, o, false, 2);
      check_forward<Cfg, T>(1, 1, 1, o, false, 1);
      o.alpha = 0.3F;  // a scale alone, no bias
      check_forward<Cfg, T>(31, 40, 26, o, false, 2);
      o.alpha = 0.75F;
      o.beta = -1.5F;
      check_forward<Cfg, T>(29, 70, 33, o, true, 2);
      o.beta = 0.0F;
      o.epilogue = precis::gemm_epilogue::relu;
      check_forward<Cfg, float>(45, 19, 17, o, true, 1);
      o.epilogue = precis::gemm_epilogue::gelu;
      check_forward<Cfg, T>(45, 100, 17, o, true, 2);
    }
  }
}

TEST_CASE("gemm spans several cache blocks (K > 256, N > 1024, M > 96)") {
  precis::gemm_options o;
  check_forward<bf16_config, float>(131, 1100, 300, o, false, 2);
  o.trans_b = true;
  check_forward<fp16_config, precis::float16>(200, 45, 530, o, true, 2);
}

TEST_CASE("gemm sums narrow products exactly in float, in k order") {
  // 2^-9 (a bfloat16 product below half a float ulp of 2^15) added 64 times to 2^15:
  // a float accumulator loses each one (round to even), the exact sum does not; what the
  // kernel returns must be what float does, since that is the documented semantics.
  const std::size_t K = 65;
  auto a = host_tensor<precis::bfloat16, 2>::from_shape({1, K});
  auto b = host_tensor<precis::bfloat16, 2>::from_shape({K, 1});
  a.fill(precis::bfloat16(1.0F / 64));
  b.fill(precis::bfloat16(1.0F / 8));
  a(0, 0) = precis::bfloat16(256.0F);
  b(0, 0) = precis::bfloat16(128.0F);
  auto c = poisoned<float, 2>(std::array<std::size_t, 2>{1, 1});
  precis::gemm<precis::presets::bf16_exact>(precis::cpu_context{1}, a, b, c);
  float expect = 32768.0F;
  for (std::size_t k = 1; k < K; ++k) expect += (1.0F / 64) * (1.0F / 8);
  CHECK(c(0, 0) == expect);
  CHECK(c(0, 0) == 32768.0F);
}

TEST_CASE("float products are fused into their sums in k order, on every build and CPU") {
  // The reference is the chain s = fma(a_ik, b_kj, s) over k, which is what the engine
  // documents for float inputs whatever the build's flags; K crosses the depth blocks.
  const std::size_t M = 13, N = 37, K = 300;
  std::mt19937_64 gen(5);
  std::normal_distribution<float> d(0.0F, 1.0F);
  auto a = host_tensor<float, 2>::from_shape({M, K});
  auto b = host_tensor<float, 2>::from_shape({K, N});
  for (auto& v : a) v = d(gen);
  for (auto& v : b) v = d(gen);
  auto c = poisoned<float, 2>(std::array<std::size_t, 2>{M, N});
  precis::gemm<precis::presets::fp32>(precis::cpu_context{2}, a, b, c);
  std::size_t unfused_differs = 0;
  for (std::size_t i = 0; i < M; ++i) {
    for (std::size_t j = 0; j < N; ++j) {
      float s = 0.0F, u = 0.0F;
      for (std::size_t k = 0; k < K; ++k) {
        s = std::fma(a(i, k), b(k, j), s);
        volatile float p = a(i, k) * b(k, j);  // rounded on its own
        u += p;
      }
      CHECK(std::bit_cast<std::uint32_t>(c(i, j)) == std::bit_cast<std::uint32_t>(s));
      unfused_differs += s != u ? 1U : 0U;
    }
  }
  CHECK(unfused_differs > 0);  // the test tells fused from unfused sums
}

TEST_CASE("the portable micro-kernel (a CPU without FMA) gives the SIMD kernel's bits") {
  using namespace precis::detail;
  const std::size_t kc = 77, ldc = gemm_nr + 3;
  std::mt19937_64 gen(6);
  std::normal_distribution<float> d(0.0F, 1.0F);
  std::vector<float> ap(kc * gemm_mr), bp(kc * gemm_nr), start(gemm_mr * ldc);
  for (auto& v : ap) v = d(gen);
  for (auto& v : bp) v = d(gen);
  for (auto& v : start) v = d(gen);
  for (const std::size_t cols : {gemm_nr, std::size_t(1)}) {  // both vectors, or only the first
    const std::size_t used = cols == gemm_nr ? gemm_nr : gemm_nr / 2;
    for (const bool first : {true, false}) {
      auto simd = start, portable = start;
      if (first) {
        gemm_micro<true>(kc, ap.data(), bp.data(), simd.data(), ldc, cols);
        gemm_micro_portable<true>(kc, ap.data(), bp.data(), portable.data(), ldc, cols);
      } else {
        gemm_micro<false>(kc, ap.data(), bp.data(), simd.data(), ldc, cols);
        gemm_micro_portable<false>(kc, ap.data(), bp.data(), portable.data(), ldc, cols);
      }
      for (std::size_t r = 0; r < gemm_mr; ++r) {
        for (std::size_t j = 0; j < used; ++j) {
          CHECK(std::bit_cast<std::uint32_t>(simd[r * ldc + j]) ==
                std::bit_cast<std::uint32_t>(portable[r * ldc + j]));
        }
      }
    }
  }
}

TEST_CASE("gemm under tf32 rounds float inputs to 10 mantissa bits first") {
  const std::size_t M = 23, N = 31, K = 47;
  const auto a = random_tensor<float, 2>({M, K});
  const auto b = random_tensor<float, 2>({K, N});
  auto c = poisoned<float, 2>(std::array<std::size_t, 2>{M, N});
  precis::gemm<precis::presets::tf32>(precis::cpu_context{2}, a, b, c);
  auto ar = to_double(a), br = to_double(b);
  // Round to nearest-even at 10 mantissa bits, in double.
  const auto tf32 = [](double v) {
    int e = 0;
    const double m = std::frexp(v, &e);  // |m| in [0.5, 1): 11 significant bits = m * 2^11
    return std::ldexp(std::nearbyint(std::ldexp(m, 11)), e - 11);
  };
  for (auto& v : ar) v = tf32(v);
  for (auto& v : br) v = tf32(v);
  precis::gemm_options o;
  CHECK(rel_error(c, reference(ar, br, nullptr, nullptr, o)) < 1e-5);
  const double unrounded = rel_error(c, reference(to_double(a), to_double(b), nullptr, nullptr, o));
  CHECK(unrounded > 1e-6);  // the rounding happened
  CHECK(unrounded < 4e-3);  // and is tf32's: 2^-11 relative per input
}

TEST_CASE("gemm with an unsafe float16 accumulator rounds every partial sum") {
  using P = precis::unsafe<precis::policy<precis::float16, precis::float16, precis::float16, float>,
                           precis::rule::narrow_accumulate>;
  const std::size_t K = 4096;
  auto a = host_tensor<precis::float16, 2>::from_shape({1, K});
  auto b = host_tensor<precis::float16, 2>::from_shape({K, 1});
  a.fill(precis::float16(1.0F));
  b.fill(precis::float16(1.0F));
  auto c = poisoned<float, 2>(std::array<std::size_t, 2>{1, 1});
  precis::gemm<P>(precis::cpu_context{1}, a, b, c);
  CHECK(c(0, 0) == 2048.0F);  // float16 stalls at 2048: 2048 + 1 rounds to 2048
  precis::gemm<precis::presets::fp16_mixed>(precis::cpu_context{1}, a, b, c);
  CHECK(c(0, 0) == 4096.0F);
}

TEST_CASE("gemm in double computes in double") {
  using P = precis::policy<double, double, double, double>;
  const auto a = random_tensor<double, 2>({9, 14});
  const auto b = random_tensor<double, 2>({14, 5});
  auto c = poisoned<double, 2>(std::array<std::size_t, 2>{9, 5});
  precis::gemm<P>(precis::cpu_context{2}, a, b, c);
  CHECK(rel_error(c, reference(a, b, nullptr, nullptr, {})) < 1e-12);
}

TEST_CASE_TEMPLATE("batched gemm matches float64 per batch item", Cfg, fp32_config, fp32_hw_config,
                   bf16_config, fp16_hw_config) {
  using T = typename Cfg::T;
  const std::size_t B = 3, M = 17, N = 26, K = 40;
  precis::gemm_options o;
  o.trans_b = true;  // Q K^T
  const auto a = random_tensor<T, 3>({B, M, K});
  const auto b = random_tensor<T, 3>({B, N, K});
  // alpha: attention's 1 / sqrt(d) (a power of two or not); on oneDNN an output scale.
  for (const float alpha : {1.0F, 0.125F, 0.3F}) {
    o.alpha = alpha;
    for (unsigned threads : {1U, 2U, 4U}) {
      auto c = poisoned<T, 3>(std::array<std::size_t, 3>{B, M, N});
      precis::gemm<typename Cfg::P>(precis::cpu_context{threads}, a, b, c, o);
      for (std::size_t i = 0; i < B; ++i) {
        host_tensor<double, 2> ai = xt::view(to_double(a), i);
        host_tensor<double, 2> bi = xt::view(to_double(b), i);
        host_tensor<T, 2> ci = xt::view(c, i);
        CHECK(rel_error(ci, reference(ai, bi, nullptr, nullptr, o)) < bound<T>());
      }
    }
  }
}

TEST_CASE_TEMPLATE("gemm_backward matches the float64 adjoint, itself checked by differences", Cfg,
                   fp32_config, fp32_hw_config, bf16_config, fp16_config, fp16_hw_config) {
  using T = typename Cfg::T;
  using P = typename Cfg::P;
  const std::size_t M = 11, N = 9, K = 13;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      INFO("trans_a=" << ta << " trans_b=" << tb);
      precis::gemm_options o;
      o.trans_a = ta;
      o.trans_b = tb;
      o.alpha = 1.25F;
      const auto a = random_tensor<T, 2>(stored(ta, M, K));
      const auto b = random_tensor<T, 2>(stored(tb, K, N));
      const auto dc = random_tensor<T, 2>({M, N});
      auto da = poisoned<T, 2>(a.shape());
      auto db = poisoned<T, 2>(b.shape());
      precis::gemm_backward<P>(precis::cpu_context{2}, a, b, dc, da, db, o);
      const auto ad = to_double(a), bd = to_double(b), dcd = to_double(dc);
      // Analytic adjoint in float64.
      auto da_ref = host_tensor<double, 2>::from_shape(a.shape());
      auto db_ref = host_tensor<double, 2>::from_shape(b.shape());
      da_ref.fill(0);
      db_ref.fill(0);
      for (std::size_t i = 0; i < M; ++i)
        for (std::size_t j = 0; j < N; ++j)
          for (std::size_t k = 0; k < K; ++k) {
            const double g = double(o.alpha) * dcd(i, j);
            (ta ? da_ref(k, i) : da_ref(i, k)) += g * at(bd, !tb, j, k);
            (tb ? db_ref(j, k) : db_ref(k, j)) += g * at(ad, ta, i, k);
          }
      CHECK(rel_error(da, da_ref) < bound<T>());
      CHECK(rel_error(db, db_ref) < bound<T>());
      // The adjoint is the gradient of sum(dc * forward): central differences.
      const auto fa = [&](const host_tensor<double, 2>& x) { return dot(dcd, reference(x, bd, nullptr, nullptr, o)); };
      const auto fb = [&](const host_tensor<double, 2>& x) { return dot(dcd, reference(ad, x, nullptr, nullptr, o)); };
      CHECK(rel_error(fd_gradient(fa, ad), da_ref) < fd_bound);
      CHECK(rel_error(fd_gradient(fb, bd), db_ref) < fd_bound);
    }
  }
}

TEST_CASE("gemm gives the same bits on 1, 2 and 3 threads") {
  const auto a = random_tensor<precis::bfloat16, 2>({150, 333});
  const auto b = random_tensor<precis::bfloat16, 2>({333, 201});
  const auto at_ = random_tensor<precis::bfloat16, 2>({301, 70});
  auto c1 = poisoned<float, 2>(std::array<std::size_t, 2>{150, 201});
  auto c2 = c1, c3 = c1;
  precis::gemm<precis::presets::bf16_exact>(precis::cpu_context{1}, a, b, c1);
  precis::gemm<precis::presets::bf16_exact>(precis::cpu_context{2}, a, b, c2);
  precis::gemm<precis::presets::bf16_exact>(precis::cpu_context{3}, a, b, c3);
  CHECK(same_bits(c1, c2));
  CHECK(same_bits(c1, c3));
  // Tall output: split over rows.
  const auto bt = random_tensor<precis::bfloat16, 2>({70, 9});
  auto d1 = poisoned<float, 2>(std::array<std::size_t, 2>{301, 9});
  auto d2 = d1;
  precis::gemm<precis::presets::bf16_exact>(precis::cpu_context{1}, at_, bt, d1);
  precis::gemm<precis::presets::bf16_exact>(precis::cpu_context{2}, at_, bt, d2);
  CHECK(same_bits(d1, d2));
}

TEST_CASE("gemm rejects mismatched shapes, naming both, and writes nothing") {
  const precis::cpu_context ctx{1};
  using P = precis::presets::bf16_mixed;
  const auto a = random_tensor<precis::bfloat16, 2>({4, 5});
  const auto b = random_tensor<precis::bfloat16, 2>({6, 3});
  auto c = poisoned<float, 2>(std::array<std::size_t, 2>{4, 3});
  check_error([&] { precis::gemm<P>(ctx, a, b, c); }, "precis::gemm", "[6, 3]", "[4, 5]");
  CHECK(std::isnan(c(0, 0)));
  const auto b2 = random_tensor<precis::bfloat16, 2>({5, 3});
  auto c_bad = poisoned<float, 2>(std::array<std::size_t, 2>{4, 4});
  check_error([&] { precis::gemm<P>(ctx, a, b2, c_bad); }, "c", "[4, 4]", "[4, 3]");
  CHECK(std::isnan(c_bad(0, 0)));
  const auto bias = random_tensor<precis::bfloat16, 1>({4});
  check_error([&] { precis::gemm<P>(ctx, a, b2, bias, c); }, "bias", "[4]", "[3]");
  auto da = poisoned<float, 2>(std::array<std::size_t, 2>{5, 4});
  auto db = poisoned<float, 2>(std::array<std::size_t, 2>{5, 3});
  const auto dc = random_tensor<precis::bfloat16, 2>({4, 3});
  check_error([&] { precis::gemm_backward<P>(ctx, a, b2, dc, da, db); }, "da", "[5, 4]", "[4, 5]");
  const auto a3 = random_tensor<precis::bfloat16, 3>({2, 4, 5});
  const auto b3 = random_tensor<precis::bfloat16, 3>({3, 5, 3});
  auto c3 = poisoned<float, 3>(std::array<std::size_t, 3>{2, 4, 3});
  check_error([&] { precis::gemm<P>(ctx, a3, b3, c3); }, "b", "[3, 5, 3]", "[2, 5, 3]");
}
