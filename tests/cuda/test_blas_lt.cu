// cuBLASLt products through precis against a float64 reference on the host: bfloat16 and
// float16 inputs (all transposes, bias and ReLU epilogues), float with TF32 and exact,
// and float8 e4m3 x e4m3 -> bfloat16 with per-tensor scales. Exits 77 (skipped) where no
// GPU is present.
#include <precis/kernels/cuda/blas_lt.hpp>
#include <precis/tensor/device_tensor.hpp>

#include "../gpu.hpp"

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace {

int failures = 0;

template <class T>
precis::host_tensor<T, 2> random_matrix(std::size_t r, std::size_t c, std::mt19937& g, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  auto m = precis::host_tensor<T, 2>::from_shape({r, c});
  for (auto& v : m) v = T(d(g));
  return m;
}

// Relative error of the output against a float64 reference, as a fraction of its norm.
template <class TA, class TB, class TC, class Compute>
void check(precis::cuda_context& ctx, std::mt19937& g, std::int64_t m, std::int64_t n, std::int64_t k,
           bool ta, bool tb, precis::lt_epilogue epi, double bound, float a_scale = 1.0f, float b_scale = 1.0f) {
  const auto A = random_matrix<TA>(std::size_t(ta ? k : m), std::size_t(ta ? m : k), g, 1.0f / a_scale);
  const auto B = random_matrix<TB>(std::size_t(tb ? n : k), std::size_t(tb ? k : n), g, 1.0f / b_scale);
  const auto bias = random_matrix<TC>(1, std::size_t(n), g);
  auto dA = precis::to_device(A), dB = precis::to_device(B);
  auto dbias = precis::to_device(bias);
  precis::device_tensor<TC, 2> dC({std::size_t(m), std::size_t(n)});
  // Two 16-byte slots: cuBLASLt needs each float8 scale pointer 16-byte aligned.
  precis::device_tensor<float, 1> scales({8});
  const float inv[8] = {1.0f / a_scale, 0, 0, 0, 1.0f / b_scale, 0, 0, 0};
  precis::check(cudaMemcpyAsync(scales.data(), inv, sizeof inv, cudaMemcpyHostToDevice, ctx.stream()), "cudaMemcpyAsync");
  precis::lt_product<TA, TB, TC> p;
  p.m = m, p.n = n, p.k = k, p.a = dA.data(), p.b = dB.data(), p.c = dC.data();
  p.trans_a = ta, p.trans_b = tb, p.epilogue = epi, p.bias = dbias.data();
  if constexpr (precis::is_float8_v<TA>) p.a_scale = scales.data(), p.b_scale = scales.data() + 4;
  try {
    precis::lt_matmul<Compute>(ctx, p);
  } catch (const precis::error& e) {  // cuda_error too: report the case, go on with the next
    std::printf("FAILED: m=%lld n=%lld k=%lld ta=%d tb=%d: %s\n", (long long)m, (long long)n,
                (long long)k, ta, tb, e.what());
    ++failures;
    return;
  }
  const auto C = precis::to_host(dC, ctx.stream());
  double err = 0, norm = 0;
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (std::int64_t q = 0; q < k; ++q) {
        const double a = float(ta ? A(std::size_t(q), std::size_t(i)) : A(std::size_t(i), std::size_t(q)));
        const double b = float(tb ? B(std::size_t(j), std::size_t(q)) : B(std::size_t(q), std::size_t(j)));
        s += a * b;
      }
      s /= double(a_scale) * double(b_scale);
      if (epi != precis::lt_epilogue::none) s += float(bias(0, std::size_t(j)));
      if (epi == precis::lt_epilogue::relu_bias) s = s > 0 ? s : 0;
      const double got = float(C(std::size_t(i), std::size_t(j)));
      err += (got - s) * (got - s);
      norm += s * s;
    }
  }
  const double rel = std::sqrt(err / norm);
  if (!(rel < bound)) {
    std::printf("FAILED: m=%lld n=%lld k=%lld ta=%d tb=%d: relative error %g >= %g\n", (long long)m,
                (long long)n, (long long)k, ta, tb, rel, bound);
    ++failures;
  }
}

}  // namespace

int main() {
  if (!precis_test::have_gpu()) return precis_test::skipped;
  precis::cuda_context ctx;
  std::mt19937 g(precis_test::test_seed());
  using precis::bfloat16;
  using precis::float16;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      check<bfloat16, bfloat16, bfloat16, bfloat16>(ctx, g, 128, 96, 200, ta, tb, precis::lt_epilogue::none, 1e-2);
      check<float16, float16, float16, float16>(ctx, g, 64, 72, 136, ta, tb, precis::lt_epilogue::relu_bias, 2e-3);
      check<float, float, float, float>(ctx, g, 33, 65, 97, ta, tb, precis::lt_epilogue::bias, 1e-5);
      check<float, float, float, precis::tfloat32>(ctx, g, 64, 64, 64, ta, tb, precis::lt_epilogue::none, 2e-3);
    }
  }
  check<precis::float8_e4m3, precis::float8_e4m3, bfloat16, bfloat16>(ctx, g, 64, 128, 256, false, true,
                                                                      precis::lt_epilogue::none, 8e-2, 64.0f, 32.0f);
  // A scale pointer off a 16-byte boundary is refused by precis, naming the rule, before
  // cuBLASLt's bare "not supported".
  {
    precis::device_tensor<precis::float8_e4m3, 2> a({16, 16}), b({16, 16});
    precis::device_tensor<bfloat16, 2> c({16, 16});
    precis::device_tensor<float, 1> s({8});
    precis::lt_product<precis::float8_e4m3, precis::float8_e4m3, bfloat16> p;
    p.m = p.n = p.k = 16, p.a = a.data(), p.b = b.data(), p.c = c.data(), p.trans_b = true;
    p.a_scale = s.data(), p.b_scale = s.data() + 1;
    bool refused = false;
    try {
      precis::lt_matmul<bfloat16>(ctx, p);
    } catch (const precis::cuda_error&) {
    } catch (const precis::error& e) {
      refused = std::string(e.what()).find("aligned to 16 bytes") != std::string::npos;
    }
    if (!refused) {
      std::printf(
          "FAILED: a float8 scale pointer 4 bytes past a 16-byte boundary is not refused by "
          "precis\n");
      ++failures;
    }
  }
  std::printf("%d failures\n", failures);
  return failures == 0 ? 0 : 1;
}
