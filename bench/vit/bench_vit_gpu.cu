// The ViT training step on a GPU under each map: the median time of a whole device step
// (nn::trainer on cuda_context: forward, loss, backward, unscale, clipping, AdamW, scale
// update) and the device memory it holds, for the two configurations of vit_gpu.csv:
//
//   vit-w192-d6-p4-b128   28 x 28 x 1 images, patch 4, width 192, 3 heads, depth 6, 10 classes,
//                         batch 128
//   vit-b16-224-b64       ViT-B/16: 224 x 224 x 3 images, patch 16, width 768, 12 heads,
//                         depth 12, 1000 classes, batch 64
//
//   bench_vit_gpu [--steps N] [--warmup N] [--config NAME] [--policy NAME,...] [--csv FILE]
//
// Each step is timed on the host around a synchronised step (as torch_reference.py times
// PyTorch's), after `warmup` untimed steps, with the host's time to queue it and the
// device's time between events before and after it beside (bench/cuda/step_bench.hpp);
// random inputs and targets, gradients clipped to norm 1, AdamW. Memory: the device memory
// in use (cudaMemGetInfo) after the timed steps less what was in use before the map's
// context and model were made, with the stream-ordered pool keeping what it reserves (every
// cuda_context has it keep its freed memory, so its high-water mark stays counted) and
// trimmed before each map: comparable to PyTorch's torch.cuda.max_memory_reserved(). Each map is
// timed twice: eagerly, and as a CUDA graph (train_options::graph: the policy named with
// `_graph` appended; the warm-up steps include the eager step and the capture). Prints a
// table and, with --csv, writes
// config,policy,precis_ms,precis_peak_mib,precis_enqueue_ms,precis_gpu_ms,precis_workspace_mib,gpu. Built with
// precis::cudnn_frontend, bf16_mixed's attention is fused (docs/cuda.md, "Fused attention");
// bf16_mixed_pieces is the same map with the attention products exact, unfused. Exits 77
// without a GPU.
#include <precis/nn/cuda.hpp>  // first: the device kernels, then nn

#include "../../examples/vit/model.hpp"
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

// bf16_mixed with the attention products exact: its five pieces on precis's kernels, where
// bf16_mixed itself runs them fused in a build with precis::cudnn_frontend (the row
// bf16_mixed_pieces measures what fusion gives).
using bf16_pieces = decltype(make_policy_map(presets::bf16_mixed{}, for_layer<vit::scores>(presets::bf16_exact{}),
                                             for_layer<vit::context>(presets::bf16_exact{})));

const auto maps = hana::make_tuple(entry<decltype(make_policy_map(presets::fp32{})), no_scaling>{"fp32"},
                                   entry<decltype(make_policy_map(presets::tf32{})), no_scaling>{"tf32"},
                                   entry<decltype(make_policy_map(presets::bf16_mixed{})), no_scaling>{"bf16_mixed"},
                                   entry<bf16_pieces, no_scaling>{"bf16_mixed_pieces"},
                                   entry<decltype(make_policy_map(presets::fp16_mixed{})), dynamic_scaler>{"fp16_mixed"},
                                   entry<vit::fp8_map, dynamic_scaler>{"fp8_hybrid"});

// The policy column of a map's row: its name, with `_graph` for the captured step.
template <class Entry>
std::string row_name(const Entry& e, bool graph) {
  return std::string(e.name) + (graph ? "_graph" : "");
}

template <std::size_t Depth, class Entry>
bench::row time_map(const std::string& config, const vit::config& c, std::size_t batch, const Entry& e,
                    std::size_t warmup, std::size_t steps, bool graph) {
  cuda_context ctx;  // its own, so that its workspace is counted in its figure
  using Map = typename Entry::map;
  using S = nn::activation_type_t<typename Map::default_policy>;
  using LossPolicy = policy_for_t<vit::head, Map>;
  ctx.synchronize();
  bench::trim_pool();  // what earlier maps left: this map's figure counts its own high-water mark
  const double before = bench::used_mib();
  bench::step_times st;
  double mib = 0, workspace = 0;
  {
    auto model = nn::build<S, 4, cuda_context>(Map{}, vit::blueprint<Depth>(c), {.seed = 1});
    model.refresh(ctx);
    nn::softmax_cross_entropy<LossPolicy, std::int32_t, cuda_context> loss;
    device_adamw opt(ctx, model.masters(), model.gradients(), {.lr = 1e-3, .weight_decay = 0.05},
                     model.decay_mask(), warmup + steps);
    typename Entry::scaler scaler;
    nn::trainer tr(ctx, model, loss, opt, scaler, {.max_grad_norm = 1.0, .graph = graph});
    std::mt19937 rng(1);
    std::normal_distribution<float> nd;
    auto xh = host_tensor<S, 4>::from_shape({batch, c.channels, c.image, c.image});
    for (auto& v : xh) v = S(nd(rng));
    auto th = host_tensor<std::int32_t, 1>::from_shape({batch});
    for (auto& v : th) v = std::int32_t(rng() % c.classes);
    const auto x = to_device(xh);
    const auto t = to_device(th);
    st = bench::median_step(ctx, [&] { tr.step(ctx, x, t); }, warmup, steps);
    mib = bench::used_mib() - before;
    workspace = double(ctx.workspace_size()) / double(1 << 20);
    (void)tr.records(ctx);
  }
  ctx.synchronize();
  return {config, row_name(e, graph), st, mib, workspace};
}

}  // namespace

int main(int argc, char** argv) {
  // Said first, so that a run's log shows which attention its bf16_mixed rows timed.
  std::printf("fused attention: %s\n", has_fused_attention
                                            ? "on (precis::cudnn_frontend: bf16_mixed runs cuDNN's flash attention)"
                                            : "OFF (built without precis::cudnn_frontend: bf16_mixed runs the five "
                                              "pieces unfused, as bf16_mixed_pieces)");
  return bench::run(argc, argv, "bench_vit_gpu", [](auto& rows, const bench::selection& want, std::size_t warmup,
                                                     std::size_t steps) {
    if (want.config("vit-w192-d6-p4-b128")) {
      const vit::config c{.image = 28, .patch = 4, .channels = 1, .width = 192, .heads = 3, .classes = 10};
      for (const bool graph : {false, true}) {
        hana::for_each(maps, [&](const auto& e) {
          const std::string policy = row_name(e, graph);
          if (!want.policy(policy)) return;
          rows.add("vit-w192-d6-p4-b128", policy, [&] { return time_map<6>("vit-w192-d6-p4-b128", c, 128, e, warmup, steps, graph); });
        });
      }
    }
    if (want.config("vit-b16-224-b64")) {
      const vit::config c{.image = 224, .patch = 16, .channels = 3, .width = 768, .heads = 12, .classes = 1000};
      for (const bool graph : {false, true}) {
        hana::for_each(maps, [&](const auto& e) {
          const std::string policy = row_name(e, graph);
          if (!want.policy(policy)) return;
          rows.add("vit-b16-224-b64", policy, [&] { return time_map<12>("vit-b16-224-b64", c, 64, e, warmup, steps, graph); });
        });
      }
    }
  });
}
