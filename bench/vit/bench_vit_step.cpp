// Time per training step (forward, cross-entropy, backward, AdamW) of the ViT example's
// model, for the side-by-side comparison with PyTorch (bench/vit/compare.py runs both).
//
//   bench_vit_step [--config small|ti|b16] [--precision fp32|fp32_hardware|bf16|both|all]
//                  [--threads N] [--batch N] [--patch N] [--steps N] [--monitor-cost ROUNDS]
//
// small: width 64, 4 heads, depth 4 (the example's model); ti: width 192, 3 heads, depth 6
// (ViT-Ti's width); both on 28 x 28 one-channel inputs, 10 classes, patch 4 unless given.
// b16: ViT-B/16 (width 768, 12 heads, depth 12, patch 16 unless given, 224 x 224 x 3
// inputs, 1000 classes). Batch 128 unless given; random data (the time does not depend on
// the values). Prints one line per precision with the best and the median of `steps` timed
// steps after 5 warm-up steps, and one with the bytes of the layers' buffers after a step:
// as built (nn::repeat's blocks lending their backward buffers) and with every layer's kept
// (nn::model::keep_gradient_buffers, one more step).
// --precision: fp32 (exact products), fp32_hardware (oneDNN's float products), bf16
// (bf16_mixed); both = fp32 and bf16 (the default), all = the three.
//
// --monitor-cost ROUNDS measures what precis::diagnostics::monitor costs per step instead:
// in alternating rounds on one model (the same trainer and data), 100 steps without a
// monitor, 100 with one observing every 100th step (exactly one of them observed: any 100
// consecutive step indices hold one multiple of 100) and 20 with one observing every step.
// Prints the mean ms/step of each over all rounds, the overhead against no monitor, and the
// cost of one observation (every-step minus none) spread over 100 steps.
#include "../../examples/vit/model.hpp"
#include "../common.hpp"

#include <precis/diagnostics/diagnostics.hpp>

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
  std::size_t monitor_rounds = 0;  // --monitor-cost N: the monitor's cost over N rounds instead
};

/// The model, loss, optimizer and trainer of one timed map, with a fixed random batch.
template <std::size_t Depth, class Map>
struct step_setup {
  using S = nn::activation_type_t<typename Map::default_policy>;
  step_setup(const options& o, const vit::config& c)
      : ctx{o.threads},
        model(nn::build<S, 4>(Map{}, vit::blueprint<Depth>(c), {.seed = 1})),
        opt(model.masters(), {.lr = 1e-4, .weight_decay = 0.05}, model.decay_mask(), ctx),
        tr(model, loss, opt, scaler),
        x(std::array<std::size_t, 4>{o.batch, c.channels, c.image, c.image}),
        y(std::array<std::size_t, 1>{o.batch}) {
    std::mt19937 g(3);
    std::normal_distribution<float> n(0.0f, 1.0f);
    for (auto& v : x) v = S(n(g));
    for (std::size_t i = 0; i < o.batch; ++i) y(i) = std::int32_t(i % c.classes);
    for (int w = 0; w < 5; ++w) tr.step(ctx, x, y);  // warm-up
  }
  cpu_context ctx;
  nn::model_t<S, 4, Map, decltype(vit::blueprint<Depth>(vit::config{}))> model;
  nn::softmax_cross_entropy<policy_for_t<vit::head, Map>> loss;
  adamw opt;
  no_scaling scaler;
  nn::trainer<decltype(model), decltype(loss), adamw, no_scaling> tr;
  host_tensor<S, 4> x;
  host_tensor<std::int32_t, 1> y;
};

template <std::size_t Depth, class Map>
void time_steps(const options& o, const vit::config& c, const char* name) {
  step_setup<Depth, Map> b(o, c);
  std::vector<double> ms;
  for (std::size_t s = 0; s < o.steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    b.tr.step(b.ctx, b.x, b.y);
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  std::printf(
      "precis %s: width %zu heads %zu depth %zu patch %zu batch %zu threads %u: best %.1f ms/step, "
      "median %.1f ms/step\n",
      name, c.width, c.heads, Depth, c.patch, o.batch, b.ctx.thread_count(), ms.front(),
      ms[ms.size() / 2]);
  const double lent = double(b.model.activation_bytes());
  b.model.keep_gradient_buffers(true);
  b.tr.step(b.ctx, b.x, b.y);
  const double kept = double(b.model.activation_bytes());
  std::printf("precis %s: the layers' buffers after a step: %.1f MiB (%.1f MiB an image); %.1f MiB (%.1f) with "
              "every block's backward buffers kept\n",
              name, lent / 1048576.0, lent / 1048576.0 / double(o.batch), kept / 1048576.0,
              kept / 1048576.0 / double(o.batch));
  std::fflush(stdout);
}

template <std::size_t Depth, class Map>
void measure_monitor(const options& o, const vit::config& c, const char* name) {
  step_setup<Depth, Map> b(o, c);
  auto& ctx = b.ctx;
  auto& tr = b.tr;
  const auto& x = b.x;
  const auto& y = b.y;
  diagnostics::monitor every100({.every = 100}), every1({.every = 1});
  double t_none = 0, t_100 = 0, t_1 = 0;
  std::size_t n_none = 0, n_100 = 0, n_1 = 0;
  const auto timed = [&](auto&& step, std::size_t count, double& total, std::size_t& steps) {
    const auto t0 = std::chrono::steady_clock::now();
    for (std::size_t s = 0; s < count; ++s) step();
    total +=
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    steps += count;
  };
  for (std::size_t r = 0; r < o.monitor_rounds; ++r) {
    timed([&] { tr.step(ctx, x, y); }, 100, t_none, n_none);
    timed([&] { tr.step(ctx, x, y, every100); }, 100, t_100, n_100);
    timed([&] { tr.step(ctx, x, y, every1); }, 20, t_1, n_1);
  }
  const double none = t_none / double(n_none), e100 = t_100 / double(n_100), e1 = t_1 / double(n_1);
  // One observation costs what an every-step step adds; at every 100 steps it is spread
  // over 100 steps (the direct every-100 rounds measure the same, within the rounds' noise).
  const double observation = e1 - none;
  std::printf(
      "%s, batch %zu, %u threads, %zu rounds: no monitor %.2f ms/step; every step %.2f ms/step "
      "(%+.1f%%); "
      "one observation %.1f ms, at every 100 steps %+.2f%% per step; measured every-100 rounds "
      "%.2f ms/step "
      "(%+.2f%%, %zu observed)\n",
      name, o.batch, ctx.thread_count(), o.monitor_rounds, none, e1, 100.0 * (e1 / none - 1.0),
      observation, 100.0 * observation / 100.0 / none, e100, 100.0 * (e100 / none - 1.0),
      every100.series().size());
  std::fflush(stdout);
}

template <std::size_t Depth>
void run(const options& o, const vit::config& c) {
  using fp32_map = decltype(make_policy_map(presets::fp32{}));
  using fp32_hw_map = decltype(make_policy_map(presets::fp32_hardware{}));
  using bf16_map = decltype(make_policy_map(presets::bf16_mixed{}));
  const bool all = o.precision == "all", both = all || o.precision == "both";
  const bool fp32 = both || o.precision == "fp32", bf16 = both || o.precision == "bf16";
  const bool fp32_hw = all || o.precision == "fp32_hardware";
  if (o.monitor_rounds != 0) {
    if (fp32) measure_monitor<Depth, fp32_map>(o, c, "fp32");
    if (fp32_hw) measure_monitor<Depth, fp32_hw_map>(o, c, "fp32_hardware");
    if (bf16) measure_monitor<Depth, bf16_map>(o, c, "bf16_mixed");
    return;
  }
  if (fp32) time_steps<Depth, fp32_map>(o, c, "fp32");
  if (fp32_hw) time_steps<Depth, fp32_hw_map>(o, c, "fp32_hardware");
  if (bf16) time_steps<Depth, bf16_map>(o, c, "bf16");
}

int usage(const char* self) {
  std::fprintf(stderr,
               "usage: %s [--config small|ti|b16] [--precision fp32|fp32_hardware|bf16|both|all]\n"
               "       [--threads N] [--batch N] [--patch N] [--steps N] [--monitor-cost ROUNDS]\n",
               self);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  bool patch_given = false;
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
      ok = v == "small" || v == "ti" || v == "b16";
    } else if (a == "--precision") {
      o.precision = v;
      ok = v == "fp32" || v == "fp32_hardware" || v == "bf16" || v == "both" || v == "all";
    } else if (a == "--threads") {
      ok = number(o.threads);
    } else if (a == "--batch") {
      ok = number(o.batch);
    } else if (a == "--patch") {
      ok = number(o.patch);
      patch_given = true;
    } else if (a == "--steps") {
      ok = number(o.steps);
    } else if (a == "--monitor-cost") {
      ok = number(o.monitor_rounds);
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
    } else if (o.config == "b16") {
      c.image = 224;
      c.channels = 3;
      c.classes = 1000;
      c.width = 768;
      c.heads = 12;
      c.patch = patch_given ? o.patch : 16;
    }
    c.validate();
    if (o.config == "ti") {
      run<6>(o, c);
    } else if (o.config == "b16") {
      run<12>(o, c);
    } else {
      run<4>(o, c);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_vit_step: %s\n", e.what());
    return 1;
  }
}
