// gemm with bfloat16 and float16 inputs and float accumulation (precis::gemm) against
// OpenBLAS's cblas_sgemm on the same values in float, and against oneDNN's bfloat16 matmul
// called directly (float accumulation, bfloat16 output), square sizes 256..2048, on one and
// two threads. precis's bfloat16 runs twice: bf16_mixed (hardware products: oneDNN where
// precis::onednn is linked and the CPU has bfloat16 instructions) and bf16_exact (precis's
// exact kernel); precis fp32 is the float kernel. float16 runs fp16_mixed (precis's exact
// kernel) and fp16_hardware (oneDNN's float kernels on the inputs converted to float, where
// precis::onednn is linked). Ratios are taken within this run.
// precis's outputs are compared with sgemm's (the products are exact in both, only the
// order of the float sums differs).
//
//   bench_gemm [--csv path] [--max N]
#include <precis/kernels/gemm.hpp>

#include "common.hpp"

#include <cblas.h>
#include <dnnl.hpp>
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace {

double gflops(std::size_t n, double ms) { return 2.0 * double(n) * double(n) * double(n) / ms * 1e-6; }

template <class T>
precis::host_tensor<T, 2> random_matrix(std::size_t n, std::mt19937& g) {
  std::uniform_real_distribution<float> u(-1.0F, 1.0F);
  auto t = precis::host_tensor<T, 2>::from_shape({n, n});
  for (auto& v : t) v = T(u(g));
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t max_n = 2048;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--max") max_n = std::stoul(argv[i + 1]);
  }
  std::mt19937 g(42);
  precis_bench::table tab({"n", "threads", "sgemm GF/s", "precis fp32 GF/s", "oneDNN bf16 GF/s",
                           "precis bf16 GF/s", "precis bf16 exact GF/s", "precis fp16 GF/s",
                           "precis fp16 hardware GF/s", "bf16/oneDNN", "bf16/fp32", "exact/sgemm",
                           "fp16/sgemm", "fp16 hardware/sgemm", "max |bf16-sgemm|"});
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  for (int threads : {1, 2}) {
    openblas_set_num_threads(threads);
    omp_set_num_threads(threads);
    const precis::cpu_context ctx{unsigned(threads)};
    for (std::size_t n = 256; n <= max_n; n *= 2) {
      const int reps = n >= 1024 ? 5 : 30;  // best of many: the small products are short
      const auto a16 = random_matrix<precis::bfloat16>(n, g), b16 = random_matrix<precis::bfloat16>(n, g);
      const auto ah = random_matrix<precis::float16>(n, g), bh = random_matrix<precis::float16>(n, g);
      precis::host_tensor<float, 2> af = precis::host_tensor<float, 2>::from_shape({n, n});
      precis::host_tensor<float, 2> bf = af, cf = af, cp = af;
      for (std::size_t i = 0; i < n * n; ++i) {
        af.data()[i] = float(a16.data()[i]);
        bf.data()[i] = float(b16.data()[i]);
      }
      auto c16 = precis::host_tensor<precis::bfloat16, 2>::from_shape({n, n});
      auto ch = precis::host_tensor<precis::float16, 2>::from_shape({n, n});
      const int ni = int(n);
      // Let the other libraries' idle threads (OpenBLAS, OpenMP) stop spinning first.
      const auto settle = [] { std::this_thread::sleep_for(std::chrono::milliseconds(400)); };
      settle();
      const double t_sgemm = precis_bench::best_ms([&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ni, ni, ni, 1.0F, af.data(), ni,
                    bf.data(), ni, 0.0F, cf.data(), ni);
      }, reps);
      settle();
      const double t_fp32 = precis_bench::best_ms(
          [&] { precis::gemm<precis::presets::fp32>(ctx, af, bf, cp); }, reps);
      const double t_exact = precis_bench::best_ms(
          [&] { precis::gemm<precis::presets::bf16_exact>(ctx, a16, b16, c16); }, reps);
      const double t_bf16 = precis_bench::best_ms(
          [&] { precis::gemm<precis::presets::bf16_mixed>(ctx, a16, b16, c16); }, reps);
      const double t_fp16 = precis_bench::best_ms(
          [&] { precis::gemm<precis::presets::fp16_mixed>(ctx, ah, bh, ch); }, reps);
      const double t_fp16_hw = precis_bench::best_ms(
          [&] { precis::gemm<precis::presets::fp16_hardware>(ctx, ah, bh, ch); }, reps);
      // precis's bf16 output against sgemm's float output rounded to bf16: one bf16 ulp at most.
      double maxdiff = 0;
      for (std::size_t i = 0; i < n * n; ++i) {
        maxdiff = std::max(maxdiff, std::abs(double(float(c16.data()[i])) - double(cf.data()[i])));
      }
      // oneDNN bf16 matmul.
      using tag = dnnl::memory::format_tag;
      using dt = dnnl::memory::data_type;
      const dnnl::memory::dims dims{dnnl::memory::dim(n), dnnl::memory::dim(n)};
      dnnl::memory::desc md(dims, dt::bf16, tag::ab);
      dnnl::memory ma(md, eng, const_cast<precis::bfloat16*>(a16.data()));
      dnnl::memory mb(md, eng, const_cast<precis::bfloat16*>(b16.data()));
      auto cd = precis::host_tensor<precis::bfloat16, 2>::from_shape({n, n});
      dnnl::memory mc(md, eng, cd.data());
      // oneDNN 2.x has bf16 matmul only on AVX-512 CPUs; elsewhere its columns are n/a.
      std::optional<double> gd;
      try {
        dnnl::matmul mm(dnnl::matmul::primitive_desc(dnnl::matmul::desc(md, md, md), eng));
        settle();
        gd = gflops(n, precis_bench::best_ms([&] {
          mm.execute(strm, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}});
          strm.wait();
        }, reps));
      } catch (const dnnl::error& e) {
        if (e.status != dnnl_unimplemented) throw;
      }
      const double gs = gflops(n, t_sgemm), gb = gflops(n, t_bf16), gh = gflops(n, t_fp16);
      const double gf = gflops(n, t_fp32), ge = gflops(n, t_exact), ghw = gflops(n, t_fp16_hw);
      char diff[32];
      std::snprintf(diff, sizeof diff, "%.2g", maxdiff);
      tab.add({std::to_string(n), std::to_string(threads), precis_bench::fixed(gs, 1),
               precis_bench::fixed(gf, 1), precis_bench::fixed_or_na(gd, 1),
               precis_bench::fixed(gb, 1), precis_bench::fixed(ge, 1), precis_bench::fixed(gh, 1),
               precis_bench::fixed(ghw, 1),
               precis_bench::fixed_or_na(gd ? std::optional<double>(gb / *gd) : std::nullopt),
               precis_bench::fixed(gb / gf), precis_bench::fixed(ge / gs),
               precis_bench::fixed(gh / gs), precis_bench::fixed(ghw / gs), diff});
    }
  }
  precis_bench::print_machine();
  std::printf("precis micro-kernel: %s\nhardware products (bf16_mixed): %s\n",
              precis_bench::simd_name(), precis::cpu_products_engine().c_str());
  tab.print();
  if (const auto path = precis_bench::csv_path(argc, argv); !path.empty()) tab.write_csv(path);
}
