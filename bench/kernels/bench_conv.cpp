// conv2d forward (bfloat16 and float16 inputs, float accumulation, output in the input's
// type) against oneDNN's convolution called directly, bfloat16 and float, on the ResNet-18
// layer shapes, one and two threads. oneDNN gets its preferred weight layout (reordered
// once, outside the timing) and NCHW activations, as precis keeps them ("nchw"), or its
// preferred activation layout too, the input reordered outside the timing ("own layouts":
// the primitive bf16_mixed's hardware products run, minus precis's per-call reorders), and
// the latter again with its weights reordered in every call, as a training step must
// ("own layouts, weights per call").
// precis's evaluation passes keep the weights moved to oneDNN's layout between calls
// (conv2d_params::weights_version, which nn's layers set in mode::eval): "kept" is that,
// against oneDNN with its weights reordered once.
// precis runs bf16_mixed (hardware products: oneDNN where precis::onednn is linked and the
// CPU has bfloat16 instructions) on NCHW images and on channels-last ones
// (image_layout::nhwc, the layout oneDNN's own choice is on CPUs with AMX or AVX512-BF16),
// bf16_exact and fp16_mixed (precis's exact kernel), fp16_hardware (oneDNN's float kernels
// on the inputs converted to float) and fp32. Ratios are taken within this run.
//
//   bench_conv [--csv path] [--batch N]
#include <precis/kernels/conv.hpp>

#include "common.hpp"
#include "resnet18.hpp"

#include <dnnl.hpp>
#include <omp.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using layer = precis_bench::conv_layer;

template <class T>
precis::host_tensor<T, 4> random4(std::array<std::size_t, 4> s, std::mt19937& g) {
  std::uniform_real_distribution<float> u(-1.0F, 1.0F);
  auto t = precis::host_tensor<T, 4>::from_shape(s);
  for (auto& v : t) v = T(u(g));
  return t;
}

/// oneDNN forward convolution in data type `dt`, timed; weights reordered once first, or
/// in every call too where `weights_per_call`. Empty when oneDNN has no implementation on
/// this CPU (bf16 needs AVX-512 in oneDNN 2.x).
std::optional<double> time_dnnl(const layer& l, std::size_t n, std::size_t ho,
                                dnnl::memory::data_type dt, void* x, void* w, void* y, int reps,
                                bool own_layouts = false, bool weights_per_call = false) {
  using tag = dnnl::memory::format_tag;
  using dim = dnnl::memory::dim;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  const dnnl::memory::dims xd{dim(n), dim(l.c), dim(l.h), dim(l.h)}, wd{dim(l.co), dim(l.c), dim(l.k), dim(l.k)},
      yd{dim(n), dim(l.co), dim(ho), dim(ho)};
  const tag act = own_layouts ? tag::any : tag::nchw;
  dnnl::memory::desc xm(xd, dt, act), wm_any(wd, dt, tag::any), ym(yd, dt, act);
  dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                                    xm, wm_any, ym, {dim(l.s), dim(l.s)}, {dim(l.p), dim(l.p)},
                                    {dim(l.p), dim(l.p)});
  std::optional<dnnl::convolution_forward::primitive_desc> maybe;
  try {
    maybe.emplace(d, eng);
  } catch (const dnnl::error& e) {
    if (e.status != dnnl_unimplemented) throw;
    return std::nullopt;
  }
  const auto& pd = *maybe;
  dnnl::memory xuser({xd, dt, tag::nchw}, eng, x), wuser({wd, dt, tag::oihw}, eng, w);
  dnnl::memory xmem = xuser, ymem({yd, dt, tag::nchw}, eng, y);
  if (own_layouts) {
    xmem = dnnl::memory(pd.src_desc(), eng);
    dnnl::reorder(xuser, xmem).execute(strm, xuser, xmem);
    ymem = dnnl::memory(pd.dst_desc(), eng);
  }
  dnnl::memory wmem(pd.weights_desc(), eng);
  dnnl::reorder wreorder(wuser, wmem);
  wreorder.execute(strm, wuser, wmem);
  strm.wait();
  dnnl::convolution_forward conv(pd);
  return precis_bench::best_ms(
      [&] {
        if (weights_per_call) wreorder.execute(strm, wuser, wmem);
        conv.execute(strm, {{DNNL_ARG_SRC, xmem}, {DNNL_ARG_WEIGHTS, wmem}, {DNNL_ARG_DST, ymem}});
        strm.wait();
      },
      reps);
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t batch = 2;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--batch") batch = std::stoul(argv[i + 1]);
  }
  std::mt19937 g(7);
  precis_bench::table tab({"layer",
                           "threads",
                           "GFLOP",
                           "oneDNN f32 GF/s",
                           "oneDNN bf16 GF/s",
                           "oneDNN bf16 own layouts GF/s",
                           "own layouts, weights per call GF/s",
                           "precis fp32 GF/s",
                           "precis bf16 GF/s",
                           "precis bf16 exact GF/s",
                           "precis fp16 GF/s",
                           "precis bf16 NHWC GF/s",
                           "bf16/oneDNN bf16",
                           "bf16/oneDNN own layouts",
                           "bf16 NHWC/oneDNN own layouts",
                           "bf16 NHWC/weights per call",
                           "bf16/fp32",
                           "exact/oneDNN f32",
                           "precis bf16 kept GF/s",
                           "precis bf16 NHWC kept GF/s",
                           "bf16 kept/oneDNN bf16",
                           "bf16 NHWC kept/oneDNN own layouts",
                           "precis fp16 hardware GF/s",
                           "fp16 hardware/fp16",
                           "fp16 hardware/oneDNN f32"});
  std::uint64_t version = 0;  // a new one for each layer's weights
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    const precis::cpu_context ctx{unsigned(threads)};
    for (const layer& l : precis_bench::resnet18_layers) {
      const std::size_t ho = l.out();
      const double flop = 2.0 * double(batch * l.co * ho * ho) * double(l.c * l.k * l.k);
      const int reps = 15;  // best of many: this machine is shared and noisy
      precis::conv2d_params p;
      p.stride = {l.s, l.s};
      p.padding = {l.p, l.p};
      const auto xb = random4<precis::bfloat16>({batch, l.c, l.h, l.h}, g);
      const auto wb = random4<precis::bfloat16>({l.co, l.c, l.k, l.k}, g);
      const auto xh = random4<precis::float16>({batch, l.c, l.h, l.h}, g);
      const auto wh = random4<precis::float16>({l.co, l.c, l.k, l.k}, g);
      auto yb = precis::host_tensor<precis::bfloat16, 4>::from_shape({batch, l.co, ho, ho});
      auto yh = precis::host_tensor<precis::float16, 4>::from_shape({batch, l.co, ho, ho});
      auto xf = precis::host_tensor<float, 4>::from_shape(xb.shape());
      auto wf = precis::host_tensor<float, 4>::from_shape(wb.shape());
      auto yf = precis::host_tensor<float, 4>::from_shape(yb.shape());
      for (std::size_t i = 0; i < xf.size(); ++i) xf.data()[i] = float(xb.data()[i]);
      for (std::size_t i = 0; i < wf.size(); ++i) wf.data()[i] = float(wb.data()[i]);
      auto yd = yb;
      // Let the other library's idle threads stop spinning before each measurement.
      const auto settle = [] { std::this_thread::sleep_for(std::chrono::milliseconds(400)); };
      settle();
      const auto t_df = time_dnnl(l, batch, ho, dnnl::memory::data_type::f32, xf.data(), wf.data(), yf.data(), reps);
      const auto t_db = time_dnnl(l, batch, ho, dnnl::memory::data_type::bf16,
                                    const_cast<precis::bfloat16*>(xb.data()),
                                    const_cast<precis::bfloat16*>(wb.data()), yd.data(), reps);
      const auto t_do = time_dnnl(l, batch, ho, dnnl::memory::data_type::bf16,
                                    const_cast<precis::bfloat16*>(xb.data()),
                                    const_cast<precis::bfloat16*>(wb.data()), yd.data(), reps, true);
      const auto t_dw = time_dnnl(
          l, batch, ho, dnnl::memory::data_type::bf16, const_cast<precis::bfloat16*>(xb.data()),
          const_cast<precis::bfloat16*>(wb.data()), yd.data(), reps, true, true);
      settle();
      // The same values as channels-last images.
      precis::conv2d_params pl = p;
      pl.layout = precis::image_layout::nhwc;
      auto xl = precis::host_tensor<precis::bfloat16, 4>::from_shape({batch, l.h, l.h, l.c});
      for (std::size_t i = 0; i < batch; ++i)
        for (std::size_t c = 0; c < l.c; ++c)
          for (std::size_t y = 0; y < l.h; ++y)
            for (std::size_t x = 0; x < l.h; ++x) xl(i, y, x, c) = xb(i, c, y, x);
      auto yl = precis::host_tensor<precis::bfloat16, 4>::from_shape({batch, ho, ho, l.co});
      const double t_l = precis_bench::best_ms(
          [&] { precis::conv2d<precis::presets::bf16_mixed>(ctx, xl, wb, yl, pl); }, reps);
      const double t_b = precis_bench::best_ms([&] { precis::conv2d<precis::presets::bf16_mixed>(ctx, xb, wb, yb, p); }, reps);
      // The weights kept in oneDNN's layout (moved by the first call, outside the best).
      ++version;
      precis::conv2d_params pk = p, plk = pl;
      pk.weights_version = plk.weights_version = version;
      const double t_bk = precis_bench::best_ms(
          [&] { precis::conv2d<precis::presets::bf16_mixed>(ctx, xb, wb, yb, pk); }, reps);
      const double t_lk = precis_bench::best_ms(
          [&] { precis::conv2d<precis::presets::bf16_mixed>(ctx, xl, wb, yl, plk); }, reps);
      const double t_e = precis_bench::best_ms([&] { precis::conv2d<precis::presets::bf16_exact>(ctx, xb, wb, yb, p); }, reps);
      const double t_f = precis_bench::best_ms([&] { precis::conv2d<precis::presets::fp32>(ctx, xf, wf, yf, p); }, reps);
      const double t_h = precis_bench::best_ms([&] { precis::conv2d<precis::presets::fp16_mixed>(ctx, xh, wh, yh, p); }, reps);
      const double t_hw = precis_bench::best_ms(
          [&] { precis::conv2d<precis::presets::fp16_hardware>(ctx, xh, wh, yh, p); }, reps);
      const auto gf = [&](double ms) { return flop / ms * 1e-6; };
      const auto gf_or = [&](const std::optional<double>& ms) {
        return ms ? std::optional<double>(gf(*ms)) : std::nullopt;
      };
      const auto ratio = [&](const std::optional<double>& ms, double t) {
        return ms ? std::optional<double>(*ms / t) : std::nullopt;
      };
      tab.add({l.name,
               std::to_string(threads),
               precis_bench::fixed(flop * 1e-9, 2),
               precis_bench::fixed_or_na(gf_or(t_df), 1),
               precis_bench::fixed_or_na(gf_or(t_db), 1),
               precis_bench::fixed_or_na(gf_or(t_do), 1),
               precis_bench::fixed_or_na(gf_or(t_dw), 1),
               precis_bench::fixed(gf(t_f), 1),
               precis_bench::fixed(gf(t_b), 1),
               precis_bench::fixed(gf(t_e), 1),
               precis_bench::fixed(gf(t_h), 1),
               precis_bench::fixed(gf(t_l), 1),
               precis_bench::fixed_or_na(ratio(t_db, t_b)),
               precis_bench::fixed_or_na(ratio(t_do, t_b)),
               precis_bench::fixed_or_na(ratio(t_do, t_l)),
               precis_bench::fixed_or_na(ratio(t_dw, t_l)),
               precis_bench::fixed(t_f / t_b),
               precis_bench::fixed_or_na(ratio(t_df, t_e)),
               precis_bench::fixed(gf(t_bk), 1),
               precis_bench::fixed(gf(t_lk), 1),
               precis_bench::fixed_or_na(ratio(t_db, t_bk)),
               precis_bench::fixed_or_na(ratio(t_do, t_lk)),
               precis_bench::fixed(gf(t_hw), 1),
               precis_bench::fixed(t_h / t_hw),
               precis_bench::fixed_or_na(ratio(t_df, t_hw))});
    }
  }
  precis_bench::print_machine();
  std::printf(
      "batch %zu, NCHW (and NHWC where named); precis micro-kernel: %s; hardware products "
      "(bf16_mixed): %s\n",
      batch, precis_bench::simd_name(), precis::cpu_products_engine().c_str());
  tab.print();
  if (const auto path = precis_bench::csv_path(argc, argv); !path.empty()) tab.write_csv(path);
}
