// Data-parallel training steps of the ViT example's model under MPI: run it under
// `mpirun -np R`; each process takes batch / R images of every step (precis::shard) and
// the trainer averages the gradients through precis::mpi_reducer.
//
//   mpirun -np 2 bench_vit_mpi [--threads N] [--batch N] [--steps N]
//
// Model: the example's (width 64, 4 heads, depth 4, patch 4; 28 x 28 one-channel inputs,
// 10 classes, random data). For fp32 and bf16_mixed, each with float and with bfloat16 on
// the wire, prints rank 0's median ms per step (forward, backward, all-reduce, AdamW) after
// 5 warm-up steps, the median ms of the gradient all-reduce alone (timed by averaging the
// same gradients once more after each step) and the gradient bytes each process hands to
// the all-reduce per step. Compare `mpirun -np 2 ... --threads 1` with `-np 1 --threads 2`.
#include "../../examples/vit/model.hpp"
#include "../common.hpp"

#include <precis/distributed/mpi.hpp>

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
  unsigned threads = 1;
  std::size_t batch = 128, steps = 20;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class Map, class Wire>
void time_steps(const options& o, const vit::config& c, const char* name, const char* wire) {
  using S = nn::activation_type_t<typename Map::default_policy>;
  const cpu_context ctx{o.threads};
  basic_no_scaling<mpi_reducer<Wire>> scaler;
  auto& reducer = scaler.reducer_object();
  auto model = nn::build<S, 4>(Map{}, vit::blueprint<4>(c), {.seed = 1});
  broadcast_parameters(model, reducer, ctx);
  nn::softmax_cross_entropy<policy_for_t<vit::head, Map>> loss;
  adamw opt(model.masters(), {.lr = 1e-3, .weight_decay = 0.05}, model.decay_mask(), ctx);
  nn::trainer tr(model, loss, opt, scaler);
  const auto [first, last] = shard(o.batch, reducer.rank(), reducer.size());
  const std::size_t n = last - first;
  host_tensor<S, 4> x(std::array<std::size_t, 4>{n, c.channels, c.image, c.image});
  host_tensor<std::int32_t, 1> y(std::array<std::size_t, 1>{n});
  std::mt19937 g(3 + unsigned(reducer.rank()));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& v : x) v = S(nd(g));
  for (std::size_t i = 0; i < n; ++i) y(i) = std::int32_t((first + i) % c.classes);
  for (int w = 0; w < 5; ++w) tr.step(ctx, x, y);
  std::vector<double> step_ms, reduce_ms;
  std::uint64_t bytes = 0;
  for (std::size_t s = 0; s < o.steps; ++s) {
    MPI_Barrier(reducer.communicator());
    const std::uint64_t before = reducer.gradient_bytes();
    const auto t0 = std::chrono::steady_clock::now();
    tr.step(ctx, x, y);
    const auto t1 = std::chrono::steady_clock::now();
    bytes = reducer.gradient_bytes() - before;
    auto grads = model.gradients();
    MPI_Barrier(reducer.communicator());
    const auto t2 = std::chrono::steady_clock::now();
    reducer.average(grads);
    const auto t3 = std::chrono::steady_clock::now();
    step_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    reduce_ms.push_back(std::chrono::duration<double, std::milli>(t3 - t2).count());
  }
  if (reducer.rank() == 0) {
    std::printf(
        "precis %s, %s on the wire: %d processes x %u threads, batch %zu (%zu per process): median "
        "%.1f "
        "ms/step, all-reduce %.2f ms/step, %llu gradient bytes per process per step\n",
        name, wire, reducer.size(), ctx.thread_count(), o.batch, n, median(step_ms),
        median(reduce_ms), static_cast<unsigned long long>(bytes));
    std::fflush(stdout);
  }
}

int usage(const char* self) {
  std::fprintf(stderr, "usage: mpirun -np R %s [--threads N] [--batch N] [--steps N]\n", self);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (i + 1 >= argc) return usage(argv[0]);
    const std::string v = argv[++i];
    char* end = nullptr;
    const long long n = std::strtoll(v.c_str(), &end, 10);
    if (*end != '\0' || n < 1) return usage(argv[0]);
    if (a == "--threads") {
      o.threads = unsigned(n);
    } else if (a == "--batch") {
      o.batch = std::size_t(n);
    } else if (a == "--steps") {
      o.steps = std::size_t(n);
    } else {
      return usage(argv[0]);
    }
  }
  int rc = 0;
  try {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) precis_bench::print_machine();
    vit::config c;
    c.validate();
    using fp32_map = decltype(make_policy_map(presets::fp32{}));
    using bf16_map = decltype(make_policy_map(presets::bf16_mixed{}));
    time_steps<fp32_map, float>(o, c, "fp32", "float");
    time_steps<fp32_map, bfloat16>(o, c, "fp32", "bfloat16");
    time_steps<bf16_map, float>(o, c, "bf16_mixed", "float");
    time_steps<bf16_map, bfloat16>(o, c, "bf16_mixed", "bfloat16");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_vit_mpi: %s\n", e.what());
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
