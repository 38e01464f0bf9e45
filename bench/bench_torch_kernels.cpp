// precis's side of the comparison with PyTorch on the same CPU (bench/torch_kernels.py runs
// both and writes bench/results/cpu/torch_kernels.csv): gemm, conv2d on the ResNet-18
// layers, max pooling, softmax, layer norm, GELU and cross-entropy, in bfloat16 (bf16_mixed:
// hardware products where precis::onednn is linked) and float (fp32), timed best-of-N after a
// warm-up on a context with the given thread count. One CSV line per measurement on standard
// output:
//
//   kernel,shape,dtype,threads,ms
//
// Shapes: gemm "MxNxK" (A M x K, B K x N, C in the input type), conv2d
// "n<N>_c<C>_h<H>_co<Co>_k<K>_s<stride>_p<pad>" (square H x H images and K x K kernels,
// output in the input type; kernel conv2d with NCHW images, conv2d_nhwc with channels-last
// ones, image_layout::nhwc; conv2d_backward and conv2d_nhwc_backward both backward passes,
// dx in the input type and dw in float), max_pool2d, max_pool2d_indices (the same, also
// writing each maximum's index, as a training pass does) and max_pool2d_backward (from those
// indices, dx in the input type) "n<N>_c<C>_h<H>_k<K>_s<stride>_p<pad>" (NCHW), row kernels
// "RxC" over the last axis
// (output in the input type; layer norm with gamma and beta, statistics in float; cross-entropy the
// mean loss of R rows of C logits, row r's target r * 7 mod C), adamw "<T>x<N>" (one step of
// precis::adamw on T tensors of N float weights with float gradients, on the context's
// threads; float32 only).
//
//   bench_torch_kernels --threads N [--quick]
#include <precis/kernels/conv.hpp>
#include <precis/kernels/elementwise.hpp>
#include <precis/kernels/gemm.hpp>
#include <precis/kernels/loss.hpp>
#include <precis/kernels/norm.hpp>
#include <precis/kernels/pooling.hpp>
#include <precis/kernels/softmax.hpp>
#include <precis/optim/optimizers.hpp>

#include "common.hpp"
#include "resnet18.hpp"

#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace {

template <class T, std::size_t N>
precis::host_tensor<T, N> random_tensor(std::array<std::size_t, N> shape, std::mt19937& g) {
  std::uniform_real_distribution<float> u(-1.0F, 1.0F);
  auto t = precis::host_tensor<T, N>::from_shape(shape);
  for (auto& v : t) v = T(u(g));
  return t;
}

void report(const std::string& kernel, const std::string& shape, const char* dtype,
            unsigned threads, double ms) {
  std::printf("%s,%s,%s,%u,%.5f\n", kernel.c_str(), shape.c_str(), dtype, threads, ms);
  std::fflush(stdout);
}

/// The products (gemm, conv2d) under P, then, unless `products_only`, the row kernels.
template <class T, class P>
void run_all(const precis::cpu_context& ctx, const char* dtype, bool quick, std::mt19937& g,
             bool products_only = false) {
  const unsigned threads = ctx.thread_count();
  const int reps = quick ? 3 : 10;
  for (std::size_t n : {256, 512, 1024, 2048}) {
    if (quick && n > 512) break;
    const auto a = random_tensor<T, 2>({n, n}, g), b = random_tensor<T, 2>({n, n}, g);
    auto c = precis::host_tensor<T, 2>::from_shape({n, n});
    const double ms = precis_bench::best_ms([&] { precis::gemm<P>(ctx, a, b, c); }, reps);
    report("gemm", std::to_string(n) + "x" + std::to_string(n) + "x" + std::to_string(n), dtype,
           threads, ms);
  }
  for (const auto& l : precis_bench::resnet18_layers) {
    const std::size_t batch = 2, ho = l.out();
    precis::conv2d_params p;
    p.stride = {l.s, l.s};
    p.padding = {l.p, l.p};
    const auto w = random_tensor<T, 4>({l.co, l.c, l.k, l.k}, g);
    const std::string shape = "n" + std::to_string(batch) + "_c" + std::to_string(l.c) + "_h" +
                              std::to_string(l.h) + "_co" + std::to_string(l.co) + "_k" +
                              std::to_string(l.k) + "_s" + std::to_string(l.s) + "_p" +
                              std::to_string(l.p);
    for (const auto layout : {precis::image_layout::nchw, precis::image_layout::nhwc}) {
      p.layout = layout;
      const auto x = random_tensor<T, 4>(precis::image_shape(layout, batch, l.c, l.h, l.h), g);
      auto y =
          precis::host_tensor<T, 4>::from_shape(precis::image_shape(layout, batch, l.co, ho, ho));
      const double ms = precis_bench::best_ms([&] { precis::conv2d<P>(ctx, x, w, y, p); }, reps);
      const bool nchw = layout == precis::image_layout::nchw;
      report(nchw ? "conv2d" : "conv2d_nhwc", shape, dtype, threads, ms);
      // Both backward passes (dx in T, dw in float), as a training step runs them.
      const auto dy = random_tensor<T, 4>(precis::image_shape(layout, batch, l.co, ho, ho), g);
      auto dx = precis::host_tensor<T, 4>::from_shape(x.shape());
      auto dw = precis::host_tensor<float, 4>::from_shape(w.shape());
      report(nchw ? "conv2d_backward" : "conv2d_nhwc_backward", shape, dtype, threads,
             precis_bench::best_ms([&] { precis::conv2d_backward<P>(ctx, x, dy, w, dx, dw, p); },
                                   reps));
    }
    if (quick) break;
  }
  if (products_only) return;
  // ResNet-18's stem pooling, and DBNet's at a 512-pixel input (width 64, batch 4).
  struct pool_shape {
    std::size_t n, c, h;
  };
  for (const pool_shape s : {pool_shape{2, 64, 112}, pool_shape{4, 64, 128}}) {
    const precis::pool2d_params p{.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}};
    const std::size_t ho = (s.h + 2 - 3) / 2 + 1;
    const auto x = random_tensor<T, 4>({s.n, s.c, s.h, s.h}, g);
    const auto dy = random_tensor<T, 4>({s.n, s.c, ho, ho}, g);
    auto y = precis::host_tensor<T, 4>::from_shape({s.n, s.c, ho, ho});
    auto dx = precis::host_tensor<T, 4>::from_shape({s.n, s.c, s.h, s.h});
    const std::string shape = "n" + std::to_string(s.n) + "_c" + std::to_string(s.c) + "_h" +
                              std::to_string(s.h) + "_k3_s2_p1";
    report("max_pool2d", shape, dtype, threads,
           precis_bench::best_ms([&] { precis::max_pool2d<P>(ctx, x, y, p); }, reps));
    // A training step's passes: the forward pass keeping the indices, the backward from them.
    auto indices = precis::host_tensor<std::uint32_t, 4>::from_shape({s.n, s.c, ho, ho});
    report("max_pool2d_indices", shape, dtype, threads,
           precis_bench::best_ms([&] { precis::max_pool2d<P>(ctx, x, y, indices, p); }, reps));
    report("max_pool2d_backward", shape, dtype, threads,
           precis_bench::best_ms([&] { precis::max_pool2d_backward<P>(ctx, indices, dy, dx, p); },
                                 reps));
    if (quick) break;
  }
  const std::size_t rows = quick ? 64 : 1024, cols = 4096;
  const std::string rc = std::to_string(rows) + "x" + std::to_string(cols);
  const auto x = random_tensor<T, 2>({rows, cols}, g);
  auto y = precis::host_tensor<T, 2>::from_shape({rows, cols});
  report("softmax", rc, dtype, threads,
         precis_bench::best_ms([&] { precis::softmax<P>(ctx, x, y); }, reps));
  const auto gamma = random_tensor<T, 1>({cols}, g), beta = random_tensor<T, 1>({cols}, g);
  auto mean = precis::host_tensor<float, 1>::from_shape({rows});
  auto rstd = precis::host_tensor<float, 1>::from_shape({rows});
  report("layer_norm", rc, dtype, threads,
         precis_bench::best_ms([&] { precis::layer_norm<P>(ctx, x, gamma, beta, y, mean, rstd); },
                               reps));
  report("gelu", rc, dtype, threads,
         precis_bench::best_ms([&] { precis::gelu<P>(ctx, x, y); }, reps));
  auto targets = precis::host_tensor<std::int64_t, 1>::from_shape({rows});
  for (std::size_t r = 0; r < rows; ++r) targets(r) = std::int64_t(r * 7 % cols);
  volatile float loss = 0;
  report("cross_entropy", rc, dtype, threads,
         precis_bench::best_ms([&] { loss = float(precis::cross_entropy<P>(ctx, x, targets)); },
                               reps));
  if constexpr (std::is_same_v<T, float>) {
    // About the weights of the DBNet example at width 64 (11M), in 8 tensors.
    const std::size_t tensors = 8, n = quick ? 4096 : std::size_t{1} << 20;
    std::vector<std::vector<float>> w, grads;
    std::uniform_real_distribution<float> u(-1.0F, 1.0F);
    for (std::size_t i = 0; i < tensors; ++i) {
      w.emplace_back(n);
      grads.emplace_back(n);
      for (auto& v : w.back()) v = u(g);
      for (auto& v : grads.back()) v = u(g) * 1e-2F;
    }
    precis::adamw opt({w.begin(), w.end()}, {.lr = 1e-3, .weight_decay = 0.01}, {}, ctx);
    report("adamw", std::to_string(tensors) + "x" + std::to_string(n), dtype, threads,
           precis_bench::best_ms([&] { opt.step(grads); }, reps));
  }
}

}  // namespace

int main(int argc, char** argv) {
  unsigned threads = 1;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--threads" && i + 1 < argc) {
      threads = unsigned(std::stoul(argv[++i]));
    } else if (arg == "--quick") {
      quick = true;
    } else {
      std::fprintf(stderr, "usage: bench_torch_kernels --threads N [--quick]\n");
      return 2;
    }
  }
  // The machine on standard error: standard output is the CSV.
  std::fprintf(stderr, "CPU: %s; precis kernels compiled for %s; hardware products: %s\n",
               precis_bench::cpu_model().c_str(), precis_bench::simd_name(),
               precis::cpu_products_engine().c_str());
  const precis::cpu_context ctx{threads};
  std::mt19937 g(11);
  run_all<precis::bfloat16, precis::presets::bf16_mixed>(ctx, "bfloat16", quick, g);
  run_all<float, precis::presets::fp32>(ctx, "float32", quick, g);
  // fp32 with oneDNN's float products (the kernels torch's float32 runs); the row kernels
  // are fp32's.
  run_all<float, precis::presets::fp32_hardware>(ctx, "float32_hardware", quick, g, true);
}
