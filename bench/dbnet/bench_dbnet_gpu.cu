// The DBNet training step on a GPU under each map: the median time of a whole device step
// (nn::trainer on cuda_context: forward, the DB loss, backward, unscale, AdamW, scale
// update) and the device memory it holds, for the two configurations of dbnet_gpu.csv:
//
//   dbnet-r18-640-b16   ResNet-18's widths (64), inner 256, 640 x 640 images, batch 16 (the
//                       DB reference's training crop and batch)
//   dbnet-w16-256-b8    the example's: width 16, inner 64, 256 x 256 images, batch 8
//
//   bench_dbnet_gpu [--steps N] [--warmup N] [--config NAME] [--policy NAME,...] [--csv FILE]
//
// The maps: fp32, tf32, bf16_mixed, fp16_mixed and fp16_fp32_head (the example's, less the
// waived one). Inputs: random images and targets, a tenth of the pixels text (the step's time
// does not depend on the values). Each step is timed on the host around a synchronised step,
// after `warmup` untimed steps (with the host's queueing time and the device's time beside:
// bench/cuda/step_bench.hpp); each map eagerly and as a CUDA graph (train_options::graph,
// the policy named with `_graph` appended), each with NCHW images and channels-last
// (build_options::layout = image_layout::nhwc, the policy named with `_nhwc` before any
// `_graph`). Memory: as bench_vit_gpu
// (bench/cuda/step_bench.hpp). Prints a table and, with --csv, writes
// config,policy,precis_ms,precis_peak_mib,precis_enqueue_ms,precis_gpu_ms,precis_workspace_mib,gpu. Exits 77
// without a GPU.
#include <precis/nn/cuda.hpp>  // first: the device kernels, then nn

#include "../../examples/dbnet/loss_cuda.hpp"
#include "../../examples/dbnet/maps.hpp"
#include "../../examples/dbnet/model.hpp"
#include "../cuda/step_bench.hpp"

#include <boost/hana.hpp>

#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace hana = boost::hana;
using namespace precis;

namespace {

template <class Map, class Scaler>
struct entry {
  using map = Map;
  using scaler = Scaler;
  std::string_view name;
};

const auto maps = hana::make_tuple(entry<decltype(make_policy_map(presets::fp32{})), no_scaling>{"fp32"},
                                   entry<decltype(make_policy_map(presets::tf32{})), no_scaling>{"tf32"},
                                   entry<decltype(make_policy_map(presets::bf16_mixed{})), no_scaling>{"bf16_mixed"},
                                   entry<decltype(make_policy_map(presets::fp16_mixed{})), dynamic_scaler>{"fp16_mixed"},
                                   entry<dbnet::fp16_fp32_head_map, dynamic_scaler>{"fp16_fp32_head"});

/// Random values in [lo, hi), or 0 / 1 with probability `p` of 1 when p >= 0.
device_tensor<float, 4> random_map(std::mt19937& rng, const std::array<std::size_t, 4>& shape, double p,
                                   float lo = 0, float hi = 1) {
  auto h = host_tensor<float, 4>::from_shape(shape);
  std::uniform_real_distribution<float> u(0.0F, 1.0F);
  for (auto& v : h) v = p >= 0 ? (u(rng) < p ? 1.0F : 0.0F) : lo + (hi - lo) * u(rng);
  return to_device(h);
}

// The policy column of a map's row: its name, with `_nhwc` for channels-last images and
// `_graph` for the captured step.
template <class Entry>
std::string row_name(const Entry& e, bool graph, image_layout layout) {
  return std::string(e.name) + (layout == image_layout::nhwc ? "_nhwc" : "") + (graph ? "_graph" : "");
}

template <class Entry>
bench::row time_map(const std::string& config, const dbnet::config& c, std::size_t size, std::size_t batch,
                    const Entry& e, std::size_t warmup, std::size_t steps, bool graph, image_layout layout) {
  const bool last = layout == image_layout::nhwc;
  cuda_context ctx;  // its own, so that its workspace is counted in its figure
  using Map = typename Entry::map;
  using S = nn::activation_type_t<typename Map::default_policy>;
  ctx.synchronize();
  bench::trim_pool();
  const double before = bench::used_mib();
  bench::step_times st;
  double mib = 0, workspace = 0;
  {
    auto model = nn::build<S, 4, cuda_context>(Map{}, dbnet::blueprint(c), {.seed = 1, .layout = layout});
    model.refresh(ctx);
    dbnet::loss_t<Map, decltype(model)> loss;
    device_adamw opt(ctx, model.masters(), model.gradients(), {.lr = 1e-3, .weight_decay = 1e-4},
                     model.decay_mask(), warmup + steps);
    typename Entry::scaler scaler;
    nn::trainer tr(ctx, model, loss, opt, scaler, {.graph = graph});
    std::mt19937 rng(1);
    std::normal_distribution<float> nd;
    auto xh = host_tensor<S, 4>::from_shape(last ? std::array<std::size_t, 4>{batch, size, size, 3}
                                                 : std::array<std::size_t, 4>{batch, 3, size, size});
    for (auto& v : xh) v = S(nd(rng));
    const auto x = to_device(xh);
    // One channel: [N, 1, H, W] and [N, H, W, 1] are the same values.
    const std::array<std::size_t, 4> m = last ? std::array<std::size_t, 4>{batch, size, size, 1}
                                              : std::array<std::size_t, 4>{batch, 1, size, size};
    const dbnet::device_targets t{random_map(rng, m, 0.1), random_map(rng, m, 0.95), random_map(rng, m, -1, 0.3F, 0.7F),
                                  random_map(rng, m, 0.3)};
    st = bench::median_step(ctx, [&] { tr.step(ctx, x, t); }, warmup, steps);
    mib = bench::used_mib() - before;
    workspace = double(ctx.workspace_size()) / double(1 << 20);
    (void)tr.records(ctx);
  }
  ctx.synchronize();
  return {config, row_name(e, graph, layout), st, mib, workspace};
}

}  // namespace

int main(int argc, char** argv) {
  return bench::run(argc, argv, "bench_dbnet_gpu", [](auto& rows, const bench::selection& want,
                                                       std::size_t warmup, std::size_t steps) {
    const auto config = [&](const std::string& name, const dbnet::config& c, std::size_t size, std::size_t batch) {
      if (!want.config(name)) return;
      for (const auto layout : {image_layout::nchw, image_layout::nhwc}) {
        for (const bool graph : {false, true}) {
          hana::for_each(maps, [&](const auto& e) {
            const std::string policy = row_name(e, graph, layout);
            if (!want.policy(policy)) return;
            rows.add(name, policy, [&] { return time_map(name, c, size, batch, e, warmup, steps, graph, layout); });
          });
        }
      }
    };
    config("dbnet-r18-640-b16", {.width = 64, .inner = 256}, 640, 16);
    config("dbnet-w16-256-b8", {.width = 16, .inner = 64}, 256, 8);
  });
}
