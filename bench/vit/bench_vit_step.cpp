// Time per training step (forward, cross-entropy, backward, AdamW) of the ViT example's
// model, for the side-by-side comparison with PyTorch (bench/vit/compare.py runs both).
//
//   bench_vit_step [--config small|ti] [--precision fp32|bf16|both] [--threads N]
//                  [--batch N] [--patch N] [--steps N]
//
// small: width 64, 4 heads, depth 4 (the example's model); ti: width 192, 3 heads, depth 6
// (ViT-Ti's width). Patch 4 and batch 128 unless given; 28 x 28 one-channel inputs, 10
// classes, random data (the time does not depend on the values). Prints one line per
// precision with the best and the median of `steps` timed steps after 5 warm-up steps.
#include "../../examples/vit/model.hpp"
#include "../common.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <string_view>
#include <vector>

using namespace precis;

namespace {

struct options {
  std::string config = "small";
  std::string precision = "both";
  unsigned threads = 2;
  std::size_t batch = 128, patch = 4, steps = 20;
};

template <std::size_t Depth, class Map>
void time_steps(const options& o, const vit::config& c, const char* name) {
  using S = nn::activation_type_t<typename Map::default_policy>;
  const cpu_context ctx{o.threads};
  auto model = nn::build<S, 4>(Map{}, vit::blueprint<Depth>(c), {.seed = 1});
  nn::softmax_cross_entropy<policy_for_t<vit::head, Map>> loss;
  adamw opt(model.masters(), {.lr = 1e-3, .weight_decay = 0.05}, model.decay_mask());
  no_scaling scaler;
  nn::trainer tr(model, loss, opt, scaler);
  host_tensor<S, 4> x(std::array<std::size_t, 4>{o.batch, c.channels, c.image, c.image});
  host_tensor<std::int32_t, 1> y(std::array<std::size_t, 1>{o.batch});
  std::mt19937 g(3);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (auto& v : x) v = S(n(g));
  for (std::size_t i = 0; i < o.batch; ++i) y(i) = std::int32_t(i % c.classes);
  for (int w = 0; w < 5; ++w) tr.step(ctx, x, y);
  std::vector<double> ms;
  for (std::size_t s = 0; s < o.steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    tr.step(ctx, x, y);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  std::printf("precis %s: width %zu heads %zu depth %zu patch %zu batch %zu threads %u: best %.1f ms/step, median %.1f "
              "ms/step\n",
              name, c.width, c.heads, Depth, c.patch, o.batch, ctx.thread_count(), ms.front(), ms[ms.size() / 2]);
  std::fflush(stdout);
}

template <std::size_t Depth>
void run(const options& o, const vit::config& c) {
  if (o.precision != "bf16") time_steps<Depth, decltype(make_policy_map(presets::fp32{}))>(o, c, "fp32");
  if (o.precision != "fp32") time_steps<Depth, decltype(make_policy_map(presets::bf16_mixed{}))>(o, c, "bf16");
}

int usage(const char* self) {
  std::fprintf(stderr,
               "usage: %s [--config small|ti] [--precision fp32|bf16|both] [--threads N] [--batch N] [--patch N] "
               "[--steps N]\n",
               self);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (i + 1 >= argc) return usage(argv[0]);
    const std::string v = argv[++i];
    auto number = [&](auto& out) {
      char* end = nullptr;
      const long long n = std::strtoll(v.c_str(), &end, 10);
      if (*end != '\0' || n < 1) return false;
      out = static_cast<std::remove_reference_t<decltype(out)>>(n);
      return true;
    };
    bool ok = true;
    if (a == "--config") {
      o.config = v;
      ok = v == "small" || v == "ti";
    } else if (a == "--precision") {
      o.precision = v;
      ok = v == "fp32" || v == "bf16" || v == "both";
    } else if (a == "--threads") {
      ok = number(o.threads);
    } else if (a == "--batch") {
      ok = number(o.batch);
    } else if (a == "--patch") {
      ok = number(o.patch);
    } else if (a == "--steps") {
      ok = number(o.steps);
    } else {
      ok = false;
    }
    if (!ok) return usage(argv[0]);
  }
  try {
    precis_bench::print_machine();
    std::printf("hardware products run on: %s\n", cpu_products_engine().c_str());
    vit::config c;
    c.patch = o.patch;
    if (o.config == "ti") {
      c.width = 192;
      c.heads = 3;
    }
    c.validate();
    if (o.config == "ti") {
      run<6>(o, c);
    } else {
      run<4>(o, c);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_vit_step: %s\n", e.what());
    return 1;
  }
}
