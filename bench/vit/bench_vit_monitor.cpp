// What precis::diagnostics::monitor costs per training step of the ViT example's model:
// steps without a monitor, with one observing every 100th step, and with one observing
// every step, in alternating rounds on one model (the same trainer and data), under fp32
// and bf16_mixed.
//
//   bench_vit_monitor [--threads N] [--batch N] [--rounds N] [--precision fp32|bf16|both]
//
// A round is 100 steps without a monitor, 100 steps with the every-100 monitor (exactly one
// of them observed: any 100 consecutive step indices hold one multiple of 100) and 20 steps
// with the every-step monitor. Prints the mean ms/step of each over all rounds, the
// overhead against no monitor, and the cost of one observation (every-step minus none)
// spread over 100 steps.
#include "../../examples/vit/model.hpp"
#include "../common.hpp"

#include <precis/diagnostics/diagnostics.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <string_view>

using namespace precis;

namespace {

struct options {
  unsigned threads = 2;
  std::size_t batch = 128, rounds = 2;
  std::string precision = "both";
};

template <class Map>
void measure(const options& o, const char* name) {
  using S = nn::activation_type_t<typename Map::default_policy>;
  const vit::config c;
  const cpu_context ctx{o.threads};
  auto model = nn::build<S, 4>(Map{}, vit::blueprint<4>(c), {.seed = 1});
  nn::softmax_cross_entropy<policy_for_t<vit::head, Map>> loss;
  adamw opt(model.masters(), {.lr = 1e-4, .weight_decay = 0.05}, model.decay_mask());
  no_scaling scaler;
  nn::trainer tr(model, loss, opt, scaler);
  host_tensor<S, 4> x(std::array<std::size_t, 4>{o.batch, c.channels, c.image, c.image});
  host_tensor<std::int32_t, 1> y(std::array<std::size_t, 1>{o.batch});
  std::mt19937 g(3);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (auto& v : x) v = S(n(g));
  for (std::size_t i = 0; i < o.batch; ++i) y(i) = std::int32_t(i % c.classes);
  diagnostics::monitor every100({.every = 100}), every1({.every = 1});
  for (int w = 0; w < 5; ++w) tr.step(ctx, x, y);
  double t_none = 0, t_100 = 0, t_1 = 0;
  std::size_t n_none = 0, n_100 = 0, n_1 = 0;
  const auto timed = [&](auto&& step, std::size_t count, double& total, std::size_t& steps) {
    const auto t0 = std::chrono::steady_clock::now();
    for (std::size_t s = 0; s < count; ++s) step();
    total +=
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    steps += count;
  };
  for (std::size_t r = 0; r < o.rounds; ++r) {
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
      name, o.batch, ctx.thread_count(), o.rounds, none, e1, 100.0 * (e1 / none - 1.0), observation,
      100.0 * observation / 100.0 / none, e100, 100.0 * (e100 / none - 1.0),
      every100.series().size());
  std::fflush(stdout);
}

int usage(const char* self) {
  std::fprintf(stderr,
               "usage: %s [--threads N] [--batch N] [--rounds N] [--precision fp32|bf16|both]\n",
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
    char* end = nullptr;
    const long long n = std::strtoll(v.c_str(), &end, 10);
    const bool number = *end == '\0' && n >= 1;
    if (a == "--threads" && number) {
      o.threads = unsigned(n);
    } else if (a == "--batch" && number) {
      o.batch = std::size_t(n);
    } else if (a == "--rounds" && number) {
      o.rounds = std::size_t(n);
    } else if (a == "--precision" && (v == "fp32" || v == "bf16" || v == "both")) {
      o.precision = v;
    } else {
      return usage(argv[0]);
    }
  }
  try {
    precis_bench::print_machine();
    std::printf(
        "ViT of examples/vit (patch 4, width 64, 4 heads, depth 4), Fashion-MNIST-sized random "
        "data\n");
    if (o.precision != "bf16") measure<decltype(make_policy_map(presets::fp32{}))>(o, "fp32");
    if (o.precision != "fp32")
      measure<decltype(make_policy_map(presets::bf16_mixed{}))>(o, "bf16_mixed");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_vit_monitor: %s\n", e.what());
    return 1;
  }
}
