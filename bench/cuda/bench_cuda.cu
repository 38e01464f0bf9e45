// Device benchmarks, ratios within one run on one GPU:
//   1. precis::gemm on device tensors (bf16, 8192^3 by default, and 1024^3 where the host
//      side of a call weighs more) against the same cuBLASLt product called directly, its
//      descriptors and algorithm chosen once outside the timing: what precis's per-call
//      work (shape checks, the plan lookup in the context, setting the call's pointers)
//      costs;
//   2. the same product in bf16, fp16, float with TF32 and exact float through precis::gemm:
//      the low-precision speedups;
//   3. the fused multi-tensor unscale + non-finite check (64 tensors) against a
//      device-to-device copy of the same bytes (both read and write every byte once);
//   4. the forward convolutions of ResNet-18 (one of each distinct shape, batch 32) through
//      precis::conv2d in bf16, fp16, float with TF32 and exact float;
//   5. precis's own memory-bound kernels (relu, softmax, layer norm, sum, cast, the float8
//      scaled cast) on bf16 tensors of 8192 x 4096: bytes read and written per second as a
//      fraction of a device-to-device copy's.
// Times are medians of CUDA-event-timed repetitions after a warm-up; in 1. the two products
// alternate, so that a drifting clock weighs on both. Exits 77 where no GPU
// is present.
//
//   bench_cuda [--csv path] [--n N]
#include <precis/kernels/cuda/cast.hpp>
#include <precis/kernels/cuda/conv.hpp>
#include <precis/kernels/cuda/elementwise.hpp>
#include <precis/kernels/cuda/gemm.hpp>
#include <precis/kernels/cuda/loss.hpp>
#include <precis/kernels/cuda/norm.hpp>
#include <precis/kernels/cuda/reduce.hpp>
#include <precis/kernels/cuda/scaling_kernels.hpp>
#include <precis/kernels/cuda/softmax.hpp>

#include "../../examples/device.hpp"
#include "../common.hpp"
#include "../resnet18.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace {

/// Median time in ms of `reps` runs of f on ctx's stream, after `warm` unmeasured runs.
template <class F>
double median_ms(precis::cuda_context& ctx, F&& f, int reps = 20, int warm = 5) {
  for (int i = 0; i < warm; ++i) f();
  examples::stream_timer timer;
  std::vector<float> ms(std::size_t(reps), 0.0F);
  for (int i = 0; i < reps; ++i) {
    timer.start(ctx.stream());
    f();
    timer.stop(ctx.stream());
    ms[std::size_t(i)] = timer.elapsed_ms();
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

/// Median times in ms of f and of g, measured alternately (f g, then g f, ...) after `warm`
/// unmeasured runs of each: a clock or power state that drifts during the run falls on
/// both alike, which timing all of f before all of g does not give.
template <class F, class G>
std::pair<double, double> median_pair_ms(precis::cuda_context& ctx, F&& f, G&& g, int reps = 20,
                                         int warm = 5) {
  for (int i = 0; i < warm; ++i) f(), g();
  std::vector<float> tf, tg;
  for (int i = 0; i < reps; ++i) {
    const bool f_first = i % 2 == 0;
    double a = 0, b = 0;  // the first and the second timed
    if (f_first) {
      a = median_ms(ctx, f, 1, 0);
      b = median_ms(ctx, g, 1, 0);
    } else {
      a = median_ms(ctx, g, 1, 0);
      b = median_ms(ctx, f, 1, 0);
    }
    tf.push_back(float(f_first ? a : b));
    tg.push_back(float(f_first ? b : a));
  }
  std::sort(tf.begin(), tf.end());
  std::sort(tg.begin(), tg.end());
  return {tf[tf.size() / 2], tg[tg.size() / 2]};
}

/// A device tensor of normally distributed values (never zeros: they can run faster).
template <class T, std::size_t N>
precis::device_tensor<T, N> random_device(const std::array<std::size_t, N>& shape, std::mt19937& g) {
  auto h = precis::host_tensor<T, N>::from_shape(shape);
  std::normal_distribution<float> d(0.0F, 1.0F);
  for (auto& v : h) v = T(d(g));
  return precis::to_device(h);
}

/// The product C = A B (row-major, n x n) through cuBLASLt directly: descriptors, layouts
/// and the algorithm made once; each call is one cublasLtMatmul.
struct direct_lt {
  precis::detail::cuda::matmul_desc desc;
  precis::detail::cuda::matrix_layout layout;
  cublasLtMatmulHeuristicResult_t heuristic{};
  void* workspace = nullptr;
  std::size_t workspace_bytes = std::size_t(32) << 20;

  direct_lt(precis::cuda_context& ctx, std::size_t n) {
    using namespace precis::detail::cuda;
    cublasLtMatmulDesc_t raw = nullptr;
    precis::check(cublasLtMatmulDescCreate(&raw, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    desc.reset(raw);
    layout = precis::detail::cuda::layout(CUDA_R_16BF, n, n, std::int64_t(n));
    cublasLtMatmulPreference_t rawp = nullptr;
    precis::check(cublasLtMatmulPreferenceCreate(&rawp), "cublasLtMatmulPreferenceCreate");
    matmul_preference pref(rawp);
    const std::uint64_t ws = workspace_bytes;
    precis::check(cublasLtMatmulPreferenceSetAttribute(pref.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                       &ws, sizeof ws),
                  "cublasLtMatmulPreferenceSetAttribute");
    int found = 0;
    precis::check(cublasLtMatmulAlgoGetHeuristic(ctx.blas_lt(), desc.get(), layout.get(), layout.get(),
                                                 layout.get(), layout.get(), pref.get(), 1, &heuristic, &found),
                  "cublasLtMatmulAlgoGetHeuristic");
    if (found == 0) throw precis::error("bench_cuda: no cuBLASLt algorithm for the direct product");
    workspace = ctx.workspace(workspace_bytes);
  }

  void run(precis::cuda_context& ctx, const precis::bfloat16* a, const precis::bfloat16* b,
           precis::bfloat16* c) const {
    const float alpha = 1.0F, beta = 0.0F;
    // Column-major view of row-major C = A B: C^T = B^T A^T.
    precis::check(cublasLtMatmul(ctx.blas_lt(), desc.get(), &alpha, b, layout.get(), a, layout.get(), &beta, c,
                                 layout.get(), c, layout.get(), &heuristic.algo, workspace, workspace_bytes,
                                 ctx.stream()),
                  "cublasLtMatmul");
  }
};

template <class P, class T>
double gemm_ms(precis::cuda_context& ctx, std::size_t n, std::mt19937& g) {
  const auto a = random_device<T, 2>({n, n}, g), b = random_device<T, 2>({n, n}, g);
  precis::device_tensor<T, 2> c({n, n});
  return median_ms(ctx, [&] { precis::gemm<P>(ctx, a, b, c); });
}

template <class T>
void unscale_row(precis::cuda_context& ctx, precis_bench::table& tab, const char* name, std::mt19937& g) {
  const std::size_t tensors = 64, each = std::size_t(1) << 20;
  std::vector<precis::device_tensor<T, 1>> grads;
  for (std::size_t i = 0; i < tensors; ++i) grads.push_back(random_device<T, 1>({each}, g));
  std::vector<std::span<T>> spans;
  for (auto& t : grads) spans.push_back(t.span());
  precis::device_tensor<float, 1> scale({1});
  precis::device_tensor<int, 1> found({1});
  const float one = 1.0F;  // scale 1 keeps the values as they are across repetitions
  precis::check(cudaMemcpyAsync(scale.data(), &one, sizeof one, cudaMemcpyHostToDevice, ctx.stream()), "cudaMemcpyAsync");
  precis::check(cudaMemsetAsync(found.data(), 0, sizeof(int), ctx.stream()), "cudaMemsetAsync");
  const std::size_t bytes = tensors * each * sizeof(T);
  precis::device_tensor<unsigned char, 1> src({bytes}), dst({bytes});
  const double t_unscale = median_ms(ctx, [&] {
    precis::unscale_and_check_async(ctx, std::span<const std::span<T>>(spans), scale.data(), found.data());
  });
  const double t_copy = median_ms(ctx, [&] {
    precis::check(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, ctx.stream()),
                  "cudaMemcpyAsync");
  });
  const double gbs = 2.0 * double(bytes) / t_unscale * 1e-6, copy_gbs = 2.0 * double(bytes) / t_copy * 1e-6;
  tab.add({name, std::to_string(bytes >> 20), precis_bench::fixed(t_unscale, 3), precis_bench::fixed(t_copy, 3),
           precis_bench::fixed(gbs, 0), precis_bench::fixed(copy_gbs, 0), precis_bench::fixed(gbs / copy_gbs)});
}

/// Time of one forward pass over ResNet-18's convolutions, each layer timed alone.
template <class P, class T>
double conv_stack_ms(precis::cuda_context& ctx, std::size_t batch, std::mt19937& g) {
  double total = 0;
  for (const precis_bench::conv_layer& l : precis_bench::resnet18_layers) {
    const std::size_t ho = l.out();
    const auto x = random_device<T, 4>({batch, l.c, l.h, l.h}, g);
    const auto w = random_device<T, 4>({l.co, l.c, l.k, l.k}, g);
    precis::device_tensor<T, 4> y({batch, l.co, ho, ho});
    precis::conv2d_params p;
    p.stride = {l.s, l.s};
    p.padding = {l.p, l.p};
    total += median_ms(ctx, [&] { precis::conv2d<P>(ctx, x, w, y, p); });
  }
  return total;
}

/// Own kernels against a device-to-device copy: GB/s of the bytes a kernel must move (each
/// tensor it reads or writes counted once; a kernel that reads a tensor twice, as batch
/// norm's statistics and normalisation do, shows it as a lower fraction). Every kernel of
/// the memory-bound set, forward and backward, on 8192 x 4096 bfloat16 elements (64 MiB),
/// batch norm on [32, 64, 128, 128] (the same count).
void bandwidth_rows(precis::cuda_context& ctx, precis_bench::table& tab, std::mt19937& g) {
  using bf16 = precis::bfloat16;
  using P = precis::presets::bf16_mixed;
  const std::size_t rows = 8192, cols = 4096, n = rows * cols;
  const auto x = random_device<bf16, 2>({rows, cols}, g);
  const auto dy = random_device<bf16, 2>({rows, cols}, g);
  precis::device_tensor<bf16, 2> y({rows, cols}), dx({rows, cols});
  const auto gamma = random_device<bf16, 1>({cols}, g), beta = random_device<bf16, 1>({cols}, g);
  precis::device_tensor<bf16, 1> dgamma({cols}), dbeta({cols}), col_sums({cols});
  precis::device_tensor<float, 1> mean({rows}), rstd({rows}), out({1}), scale({1}), amax({1}), row_sums({rows});
  const float one = 1.0F;
  precis::check(cudaMemcpyAsync(scale.data(), &one, sizeof one, cudaMemcpyHostToDevice, ctx.stream()),
                "cudaMemcpyAsync");
  precis::check(cudaMemsetAsync(amax.data(), 0, sizeof(float), ctx.stream()), "cudaMemsetAsync");
  precis::device_tensor<float, 2> xf({rows, cols});
  precis::device_tensor<precis::float8_e4m3, 2> x8({rows, cols});
  precis::device_tensor<unsigned char, 1> src({n * 2}), dst({n * 2});
  auto classes = precis::host_tensor<std::int32_t, 1>::from_shape({rows});
  for (std::size_t i = 0; i < rows; ++i) classes(i) = std::int32_t((i * 2654435761U) % cols);
  const auto targets = precis::to_device(classes);
  precis::device_tensor<float, 1> loss({1});
  const double t_copy = median_ms(ctx, [&] {
    precis::check(cudaMemcpyAsync(dst.data(), src.data(), n * 2, cudaMemcpyDeviceToDevice, ctx.stream()),
                  "cudaMemcpyAsync");
  });
  const double copy_gbs = 2.0 * double(n * 2) / t_copy * 1e-6;
  const auto row = [&](const char* name, double bytes, double ms) {
    const double gbs = bytes / ms * 1e-6;
    tab.add({name, precis_bench::fixed(ms, 3), precis_bench::fixed(gbs, 0), precis_bench::fixed(copy_gbs, 0),
             precis_bench::fixed(gbs / copy_gbs)});
  };
  const double bf = double(n) * 2;  // bytes of one bf16 tensor
  const auto time = [&](auto&& f) { return median_ms(ctx, f); };
  row("relu bf16 -> bf16", 2 * bf, time([&] { precis::relu<P>(ctx, x, y); }));
  row("relu_backward bf16", 3 * bf, time([&] { precis::relu_backward<P>(ctx, dy, x, dx); }));
  row("gelu bf16", 2 * bf, time([&] { precis::gelu<P>(ctx, x, y); }));
  row("gelu_backward bf16", 3 * bf, time([&] { precis::gelu_backward<P>(ctx, dy, x, dx); }));
  row("add bf16 (same shape)", 3 * bf, time([&] { precis::add<P>(ctx, x, dy, y); }));
  row("add bf16 (a row broadcast)", 2 * bf, time([&] { precis::add<P>(ctx, x, gamma, y); }));
  row("mul bf16", 3 * bf, time([&] { precis::mul<P>(ctx, x, dy, y); }));
  row("cast bf16 -> float", 3 * bf, time([&] { precis::cast(ctx, x, xf); }));
  row("cast float -> bf16", 3 * bf, time([&] { precis::cast(ctx, xf, y); }));
  row("scaled_cast bf16 -> e4m3 + amax", 1.5 * bf,
      time([&] { precis::scaled_cast_async(ctx, x, x8, scale.data(), amax.data()); }));
  row("softmax rows of 4096, bf16", 2 * bf, time([&] { precis::softmax<P>(ctx, x, y); }));
  row("softmax_backward rows of 4096, bf16", 3 * bf, time([&] { precis::softmax_backward<P>(ctx, dy, y, dx); }));
  row("log_softmax rows of 4096, bf16", 2 * bf, time([&] { precis::log_softmax<P>(ctx, x, y); }));
  row("log_softmax_backward rows of 4096, bf16", 3 * bf,
      time([&] { precis::log_softmax_backward<P>(ctx, dy, y, dx); }));
  row("layer_norm rows of 4096, bf16", 2 * bf,
      time([&] { precis::layer_norm<P>(ctx, x, gamma, beta, y, mean, rstd); }));
  row("layer_norm_backward rows of 4096, bf16 (+ dgamma, dbeta)", 3 * bf,
      time([&] { precis::layer_norm_backward<P>(ctx, dy, x, gamma, mean, rstd, dx, dgamma, dbeta); }));
  {
    // Rows of 1024 (a warp each, as ViT-B's layer norms and attention rows get): the same bytes.
    const std::size_t short_rows = n / 1024;
    const auto xs = random_device<bf16, 2>({short_rows, 1024}, g), dys = random_device<bf16, 2>({short_rows, 1024}, g);
    precis::device_tensor<bf16, 2> ys({short_rows, 1024}), dxs({short_rows, 1024});
    const auto gs = random_device<bf16, 1>({1024}, g), bs = random_device<bf16, 1>({1024}, g);
    precis::device_tensor<bf16, 1> dgs({1024}), dbs({1024});
    precis::device_tensor<float, 1> ms({short_rows}), rs({short_rows});
    row("softmax rows of 1024, bf16", 2 * bf, time([&] { precis::softmax<P>(ctx, xs, ys); }));
    row("softmax_backward rows of 1024, bf16", 3 * bf, time([&] { precis::softmax_backward<P>(ctx, dys, ys, dxs); }));
    row("layer_norm rows of 1024, bf16", 2 * bf, time([&] { precis::layer_norm<P>(ctx, xs, gs, bs, ys, ms, rs); }));
    row("layer_norm_backward rows of 1024, bf16 (+ dgamma, dbeta)", 3 * bf,
        time([&] { precis::layer_norm_backward<P>(ctx, dys, xs, gs, ms, rs, dxs, dgs, dbs); }));
  }
  {
    // Rows of 768 (ViT-B's width; its layer norms' backward takes 8 warps a block, 6 at 1024).
    const std::size_t vit_rows = n / 768;
    const double vit_bytes = double(vit_rows * 768) * 2;
    const auto xv = random_device<bf16, 2>({vit_rows, 768}, g), dyv = random_device<bf16, 2>({vit_rows, 768}, g);
    precis::device_tensor<bf16, 2> yv({vit_rows, 768}), dxv({vit_rows, 768});
    const auto gv = random_device<bf16, 1>({768}, g), bv = random_device<bf16, 1>({768}, g);
    precis::device_tensor<bf16, 1> dgv({768}), dbv({768});
    precis::device_tensor<float, 1> mv({vit_rows}), rv({vit_rows});
    row("layer_norm rows of 768, bf16", 2 * vit_bytes,
        time([&] { precis::layer_norm<P>(ctx, xv, gv, bv, yv, mv, rv); }));
    row("layer_norm_backward rows of 768, bf16 (+ dgamma, dbeta)", 3 * vit_bytes,
        time([&] { precis::layer_norm_backward<P>(ctx, dyv, xv, gv, mv, rv, dxv, dgv, dbv); }));
  }
  {
    // Rows of 197 (ViT-B's attention scores, unfused): a warp each, read an element at a time
    // (197 is no multiple of a 16-byte pack).
    const std::size_t odd_rows = n / 197;
    const double odd_bytes = double(odd_rows * 197) * 2;
    const auto xo = random_device<bf16, 2>({odd_rows, 197}, g), dyo = random_device<bf16, 2>({odd_rows, 197}, g);
    precis::device_tensor<bf16, 2> yo({odd_rows, 197}), dxo({odd_rows, 197});
    row("softmax rows of 197, bf16", 2 * odd_bytes, time([&] { precis::softmax<P>(ctx, xo, yo); }));
    row("softmax_backward rows of 197, bf16", 3 * odd_bytes,
        time([&] { precis::softmax_backward<P>(ctx, dyo, yo, dxo); }));
  }
  row("sum bf16 (whole tensor)", bf, time([&] { precis::sum<P>(ctx, x, out); }));
  row("sum bf16 along rows (axis 1)", bf, time([&] { precis::sum<P>(ctx, x, 1, row_sums); }));
  row("sum bf16 along columns (axis 0)", bf, time([&] { precis::sum<P>(ctx, x, 0, col_sums); }));
  row("cross_entropy rows of 4096, bf16", bf, time([&] { precis::cross_entropy<P>(ctx, x, targets, loss); }));
  row("cross_entropy_backward rows of 4096, bf16", 2 * bf,
      time([&] { precis::cross_entropy_backward<P>(ctx, x, targets, dx); }));
  // Batch norm: [32, 64, 128, 128], NCHW and channels-last.
  const std::array<std::size_t, 4> image{32, 64, 128, 128}, image_nhwc{32, 128, 128, 64};
  const auto bgamma = random_device<bf16, 1>({64}, g), bbeta = random_device<bf16, 1>({64}, g);
  precis::device_tensor<bf16, 1> bdgamma({64}), bdbeta({64});
  precis::device_tensor<float, 1> run_mean({64}), run_var({64}), save_mean({64}), save_rstd({64});
  precis::check(cudaMemsetAsync(run_mean.data(), 0, 64 * sizeof(float), ctx.stream()), "cudaMemsetAsync");
  precis::check(cudaMemsetAsync(run_var.data(), 0, 64 * sizeof(float), ctx.stream()), "cudaMemsetAsync");
  for (const auto layout : {precis::image_layout::nchw, precis::image_layout::nhwc}) {
    const bool last = layout == precis::image_layout::nhwc;
    // x's and dy's bytes read as [N, C, H, W] or, channels-last, [N, H, W, C].
    const auto shape = last ? image_nhwc : image;
    precis::device_tensor<bf16, 4> bx(shape), by(shape), bdy(shape), bdx(shape);
    precis::check(cudaMemcpyAsync(bx.data(), x.data(), n * 2, cudaMemcpyDeviceToDevice, ctx.stream()),
                  "cudaMemcpyAsync");
    precis::check(cudaMemcpyAsync(bdy.data(), dy.data(), n * 2, cudaMemcpyDeviceToDevice, ctx.stream()),
                  "cudaMemcpyAsync");
    const std::string tag = last ? " nhwc" : " nchw";
    row(("batch_norm_train bf16" + tag).c_str(), 2 * bf, time([&] {
          precis::batch_norm_train<P>(ctx, bx, bgamma, bbeta, run_mean, run_var, by, save_mean, save_rstd, 0.1, 1e-5,
                                      layout);
        }));
    row(("batch_norm_infer bf16" + tag).c_str(), 2 * bf,
        time([&] { precis::batch_norm_infer<P>(ctx, bx, bgamma, bbeta, run_mean, run_var, by, 1e-5, layout); }));
    row(("batch_norm_backward bf16" + tag).c_str(), 3 * bf, time([&] {
          precis::batch_norm_backward<P>(ctx, bdy, bx, bgamma, save_mean, save_rstd, bdx, bdgamma, bdbeta, layout);
        }));
  }
}

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("skipped: no CUDA device\n");
    return 77;
  }
  std::size_t n = 8192;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--n") n = std::stoul(argv[i + 1]);
  }
  cudaDeviceProp prop{};
  precis::check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  precis::cuda_context ctx;
  std::mt19937 g(42);
  const double flop = 2.0 * double(n) * double(n) * double(n);
  const auto tflops = [&](double ms) { return flop / ms * 1e-9; };

  // 1. precis::gemm vs the direct cuBLASLt call, bf16.
  const auto a = random_device<precis::bfloat16, 2>({n, n}, g), b = random_device<precis::bfloat16, 2>({n, n}, g);
  precis::device_tensor<precis::bfloat16, 2> c({n, n});
  const direct_lt direct(ctx, n);
  const auto [t_direct, t_precis] = median_pair_ms(
      ctx, [&] { direct.run(ctx, a.data(), b.data(), c.data()); },
      [&] { precis::gemm<precis::presets::bf16_mixed>(ctx, a, b, c); });

  // 2. Low precision against float.
  const double t_fp16 = gemm_ms<precis::presets::fp16_mixed, precis::float16>(ctx, n, g);
  const double t_tf32 = gemm_ms<precis::presets::tf32, float>(ctx, n, g);
  const double t_fp32 = gemm_ms<precis::presets::fp32, float>(ctx, n, g);
  precis_bench::table gemm_tab({"product", "ms", "TFLOP/s", "vs direct cuBLASLt", "vs fp32", "vs tf32"});
  const auto row = [&](const char* name, double ms, std::string vs_direct) {
    gemm_tab.add({name, precis_bench::fixed(ms, 3), precis_bench::fixed(tflops(ms), 1), std::move(vs_direct),
                  precis_bench::fixed(t_fp32 / ms), precis_bench::fixed(t_tf32 / ms)});
  };
  row("direct cuBLASLt bf16", t_direct, "1.00");
  row("precis::gemm bf16", t_precis, precis_bench::fixed(t_direct / t_precis, 3));
  // The same comparison on a small product, where host-side work is a larger share.
  const std::size_t small = 1024;
  const auto as = random_device<precis::bfloat16, 2>({small, small}, g);
  const auto bs = random_device<precis::bfloat16, 2>({small, small}, g);
  precis::device_tensor<precis::bfloat16, 2> cs({small, small});
  const direct_lt direct_small(ctx, small);
  const auto [t_direct_small, t_precis_small] = median_pair_ms(
      ctx, [&] { direct_small.run(ctx, as.data(), bs.data(), cs.data()); },
      [&] { precis::gemm<precis::presets::bf16_mixed>(ctx, as, bs, cs); }, 200);
  row("precis::gemm fp16", t_fp16, "-");
  row("precis::gemm tf32", t_tf32, "-");
  row("precis::gemm fp32", t_fp32, "-");

  // 3. Fused unscale vs a device-to-device copy of the same bytes.
  precis_bench::table unscale_tab({"gradients", "MiB", "unscale ms", "copy ms", "unscale GB/s", "copy GB/s",
                                   "fraction of copy bandwidth"});
  unscale_row<float>(ctx, unscale_tab, "float", g);
  unscale_row<precis::bfloat16>(ctx, unscale_tab, "bfloat16", g);
  unscale_row<precis::float16>(ctx, unscale_tab, "float16", g);

  // 4. The ResNet-18 convolution stack.
  const std::size_t batch = 32;
  const double c_bf16 = conv_stack_ms<precis::presets::bf16_mixed, precis::bfloat16>(ctx, batch, g);
  const double c_fp16 = conv_stack_ms<precis::presets::fp16_mixed, precis::float16>(ctx, batch, g);
  const double c_tf32 = conv_stack_ms<precis::presets::tf32, float>(ctx, batch, g);
  const double c_fp32 = conv_stack_ms<precis::presets::fp32, float>(ctx, batch, g);
  precis_bench::table conv_tab({"ResNet-18 conv stack (batch 32)", "ms", "vs fp32", "vs tf32"});
  const auto conv_row = [&](const char* name, double ms) {
    conv_tab.add({name, precis_bench::fixed(ms, 3), precis_bench::fixed(c_fp32 / ms),
                  precis_bench::fixed(c_tf32 / ms)});
  };
  conv_row("bf16", c_bf16);
  conv_row("fp16", c_fp16);
  conv_row("tf32", c_tf32);
  conv_row("fp32", c_fp32);

  // 5. Own memory-bound kernels against a copy.
  precis_bench::table bw_tab({"kernel (8192 x 4096)", "ms", "GB/s", "copy GB/s", "fraction of copy bandwidth"});
  bandwidth_rows(ctx, bw_tab, g);

  std::printf("device: %s; products %zu^3\n", prop.name, n);
  gemm_tab.print();
  std::printf("bf16 %zu^3: direct cuBLASLt %.4f ms, precis::gemm %.4f ms, ratio %.3f\n", small, t_direct_small,
              t_precis_small, t_direct_small / t_precis_small);
  unscale_tab.print();
  conv_tab.print();
  bw_tab.print();
  if (const auto path = precis_bench::csv_path(argc, argv); !path.empty()) {
    gemm_tab.write_csv(path);
    unscale_tab.write_csv(path + ".unscale.csv");
    conv_tab.write_csv(path + ".conv.csv");
    bw_tab.write_csv(path + ".bandwidth.csv");
  }
}
