// Data-parallel training with precis::mpi_reducer, run by CTest under
// `mpirun -np 2` (every check runs on both ranks; a failure on either fails the run):
// agreement of found-inf flags and amaxes, the gradient average on float and bfloat16
// wires, two ranks training on halves of each batch against one process on the whole
// batch, an infinity on one rank skipping the step on both, and MPI's errors as
// precis::error.
#define DOCTEST_CONFIG_IMPLEMENT
#include <precis/distributed/mpi.hpp>
#include <precis/precis.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

using namespace precis;

namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

}  // namespace

TEST_CASE("two processes: flags agree by OR, amaxes by max") {
  mpi_reducer<> r;
  REQUIRE(r.size() == 2);
  CHECK(r.any(r.rank() == 1));
  CHECK_FALSE(r.any(false));
  std::vector<float> amax{r.rank() == 0 ? 3.0F : 1.0F, r.rank() == 0 ? 0.5F : INFINITY};
  r.max(amax);
  CHECK(amax[0] == 3.0F);
  CHECK(amax[1] == INFINITY);
}

TEST_CASE("the gradient average over processes, in buckets, float and bfloat16 on the wire") {
  // Values exact in bfloat16 whose sums and halves are exact too: both wires give the mean.
  const auto value = [](int rank, std::size_t t, std::size_t i) {
    return float(int((i * 7 + t * 3) % 11) - 5) * (rank == 0 ? 0.25F : 1.5F);
  };
  const auto fill = [&](int rank) {
    std::vector<std::vector<float>> g{std::vector<float>(5), std::vector<float>(1),
                                      std::vector<float>(13)};
    for (std::size_t t = 0; t < g.size(); ++t) {
      for (std::size_t i = 0; i < g[t].size(); ++i) g[t][i] = value(rank, t, i);
    }
    return g;
  };
  for (const std::size_t bucket : {std::size_t(4), std::size_t(1) << 20}) {
    mpi_reducer<> f(MPI_COMM_WORLD, bucket);
    mpi_reducer<bfloat16> b(MPI_COMM_WORLD, bucket);
    auto gf = fill(f.rank()), gb = fill(b.rank());
    f.average(gf);
    b.average(gb);
    for (std::size_t t = 0; t < gf.size(); ++t) {
      for (std::size_t i = 0; i < gf[t].size(); ++i) {
        const float mean = (value(0, t, i) + value(1, t, i)) / 2.0F;
        CHECK(gf[t][i] == mean);
        CHECK(gb[t][i] == mean);
      }
    }
    CHECK(f.gradient_bytes() == 19 * sizeof(float));
    CHECK(b.gradient_bytes() == 19 * sizeof(bfloat16));
  }
  // bfloat16 tensors are averaged in float and rounded once.
  mpi_reducer<> r;
  std::vector<bfloat16> g{bfloat16(r.rank() == 0 ? 1.0F : 1.0078125F)};
  r.average(g);
  CHECK(float(g[0]) == float(bfloat16(1.00390625F)));
}

namespace {

// An MLP and a batch every rank builds identically (rank 1's seed differs: the broadcast
// of rank 0's weights must fix it).
template <class P>
auto mlp(std::uint64_t seed) {
  using T = typename P::storage_type;
  return nn::build<T, 2>(P{}, nn::seq(nn::linear(6, 24), nn::gelu(), nn::linear(24, 4)),
                         {.seed = seed});
}

template <class T>
host_tensor<T, 2> batch_rows(const host_tensor<float, 2>& x, std::size_t first, std::size_t last) {
  host_tensor<T, 2> out(std::array<std::size_t, 2>{last - first, x.shape()[1]});
  for (std::size_t r = first; r < last; ++r) {
    for (std::size_t c = 0; c < x.shape()[1]; ++c) out(r - first, c) = T(x(r, c));
  }
  return out;
}

// Trains the MLP under P: once on this rank alone over the whole batch, once data-parallel
// over its half; returns the largest weight difference relative to the largest weight.
template <class P, class Scaler, class DpScaler>
double two_ranks_against_one(Scaler one_scaler, DpScaler dp_scaler, int steps) {
  using T = typename P::storage_type;
  const cpu_context ctx{1};
  const std::size_t rows = 16;
  host_tensor<float, 2> x(std::array<std::size_t, 2>{rows, 6});
  std::mt19937 gen(3);
  std::normal_distribution<float> d(0.0F, 1.0F);
  for (auto& v : x) v = d(gen);
  host_tensor<std::int32_t, 1> t(std::array<std::size_t, 1>{rows});
  for (std::size_t r = 0; r < rows; ++r) t(r) = std::int32_t((r * 5) % 4);

  auto one = mlp<P>(1);
  nn::softmax_cross_entropy<P> loss_one;
  adamw opt_one(one.masters(), {.lr = 1e-2});
  nn::trainer tr_one(one, loss_one, opt_one, one_scaler);
  const auto all = batch_rows<T>(x, 0, rows);

  auto& reducer = dp_scaler.reducer_object();
  auto dp = mlp<P>(1 + std::uint64_t(reducer.rank()));
  broadcast_parameters(dp, reducer, ctx);
  nn::softmax_cross_entropy<P> loss_dp;
  adamw opt_dp(dp.masters(), {.lr = 1e-2});
  nn::trainer tr_dp(dp, loss_dp, opt_dp, dp_scaler);
  const auto [first, last] = shard(rows, reducer.rank(), reducer.size());
  const auto mine = batch_rows<T>(x, first, last);
  host_tensor<std::int32_t, 1> tm(std::array<std::size_t, 1>{last - first});
  for (std::size_t r = first; r < last; ++r) tm(r - first) = t(r);

  for (int s = 0; s < steps; ++s) {
    const auto a = tr_one.step(ctx, all, t);
    const auto b = tr_dp.step(ctx, mine, tm);
    CHECK(a.skipped == b.skipped);
    CHECK(a.next_scale == b.next_scale);
  }
  double diff = 0.0, scale = 0.0;
  const auto wa = one.masters(), wb = dp.masters();
  for (std::size_t i = 0; i < wa.size(); ++i) {
    for (std::size_t k = 0; k < wa[i].size(); ++k) {
      diff = std::max(diff, std::fabs(double(wa[i][k]) - double(wb[i][k])));
      scale = std::max(scale, std::fabs(double(wa[i][k])));
    }
  }
  // Every rank holds the same weights: rank 0's, compared bit for bit.
  for (const auto& w : wb) {
    std::vector<float> mine_w(w.begin(), w.end()), root = mine_w;
    reducer.broadcast(root, 0);
    CHECK(std::memcmp(root.data(), mine_w.data(), root.size() * sizeof(float)) == 0);
  }
  return diff / scale;
}

}  // namespace

TEST_CASE("two ranks on halves of each batch train as one process on the whole batch") {
  // Not bit for bit: one process sums each gradient over the 16 rows in one pass, two
  // ranks over 8 rows each and then add the two sums, so sums round differently (an ulp or
  // so of the gradients; float16's working copies and gradients round more). Measured
  // after 20 AdamW steps at lr 1e-2: 3.6e-7 (float) and 3.1e-4 (float16) of the largest
  // weight; the bounds leave a margin of about 30x and 3x, far below one step (1e-2).
  const double fp32 = two_ranks_against_one<presets::fp32>(
      no_scaling{}, basic_no_scaling<mpi_reducer<>>(mpi_reducer<>()), 20);
  MESSAGE("fp32: max weight difference " << fp32 << " of the largest weight");
  CHECK(fp32 < 1e-5);
  const dynamic_scaler_options o{.init_scale = 1024.0F, .growth_interval = 5};
  const double fp16 = two_ranks_against_one<presets::fp16_mixed>(
      dynamic_scaler(o), basic_dynamic_scaler<mpi_reducer<>>(o, mpi_reducer<>()), 20);
  MESSAGE("fp16_mixed: max weight difference " << fp16 << " of the largest weight");
  CHECK(fp16 < 1e-3);
}

namespace {

// A two-rank fp16 run with a dynamic scaler and a schedule (state a checkpoint must carry).
struct dp_run {
  using P = presets::fp16_mixed;
  decltype(mlp<P>(0)) model;
  nn::softmax_cross_entropy<P> loss;
  adamw opt;
  basic_dynamic_scaler<mpi_reducer<>> scaler;
  warmup_cosine schedule;
  explicit dp_run(std::uint64_t seed)
      : model(mlp<P>(seed)),
        opt(model.masters(), {.lr = 1e-2}),
        scaler({.init_scale = 1e6F, .growth_interval = 2}),  // backs off, then grows
        schedule(1e-2, 3, 12) {
    broadcast_parameters(model, scaler.reducer_object(), cpu_context{1});
  }
  // Steps [from, to): each step's batch made from its index, this rank's half of it.
  void train(std::size_t from, std::size_t to) {
    nn::trainer tr(model, loss, opt, scaler, schedule);
    const auto [first, last] =
        shard(8, scaler.reducer_object().rank(), scaler.reducer_object().size());
    for (std::size_t s = from; s < to; ++s) {
      host_tensor<float16, 2> x(std::array<std::size_t, 2>{last - first, 6});
      host_tensor<std::int32_t, 1> t(std::array<std::size_t, 1>{last - first});
      for (std::size_t r = first; r < last; ++r) {
        for (std::size_t c = 0; c < 6; ++c)
          x(r - first, c) = float16(float(int((r * 7 + c * 3 + s * 5) % 9) - 4) / 4.0F);
        t(r - first) = std::int32_t((r + s) % 4);
      }
      tr.step(cpu_context{1}, x, t);
    }
  }
};

}  // namespace

TEST_CASE("a checkpoint written by rank 0 during a two-rank run resumes it bit for bit") {
  mpi_reducer<> r;
  int tag = r.rank() == 0 ? int(std::random_device{}() % 1000000) : 0;
  MPI_Bcast(&tag, 1, MPI_INT, 0, MPI_COMM_WORLD);
  const auto file =
      std::filesystem::temp_directory_path() / ("precis_mpi_ckpt_" + std::to_string(tag) + ".bin");

  dp_run straight(7);
  straight.train(0, 10);

  dp_run first(7);
  first.train(0, 5);
  if (r.rank() == 0) save_checkpoint(file, first.model, first.opt, first.scaler, first.schedule);
  MPI_Barrier(MPI_COMM_WORLD);  // written before anyone reads

  dp_run resumed(99);  // other weights: the checkpoint and the broadcast must restore them
  load_checkpoint(file, resumed.model, resumed.opt, resumed.scaler, resumed.schedule);
  resumed.model.refresh(cpu_context{1});
  resumed.train(5, 10);
  MPI_Barrier(MPI_COMM_WORLD);
  if (r.rank() == 0) std::filesystem::remove(file);

  CHECK(resumed.scaler.scale() == straight.scaler.scale());
  CHECK(resumed.scaler.steps() == straight.scaler.steps());
  CHECK(resumed.scaler.skipped_steps() == straight.scaler.skipped_steps());
  CHECK(straight.scaler.skipped_steps() > 0);
  const auto a = straight.model.masters(), b = resumed.model.masters();
  for (std::size_t i = 0; i < a.size(); ++i) {
    CHECK(std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) == 0);
  }
}

namespace {

// Trains an fp8_hybrid MLP three steps on rank-dependent data (rank 1's inputs 8 times
// larger, so the processes' amaxes differ); returns every float8 recipe's scale and the
// master weights, with the recipes' amaxes agreed through the run's reducer or not.
std::pair<std::vector<float>, std::vector<float>> fp8_run(bool shared) {
  using P = presets::fp8_hybrid;
  using S = nn::activation_type_t<P>;
  using Scaler = std::conditional_t<needs_loss_scaling_v<P>, basic_dynamic_scaler<mpi_reducer<>>,
                                    basic_no_scaling<mpi_reducer<>>>;
  const cpu_context ctx{1};
  Scaler scaler;
  auto& r = scaler.reducer_object();
  auto model =
      nn::build<S, 2>(P{}, nn::seq(nn::linear(6, 24), nn::gelu(), nn::linear(24, 4)), {.seed = 1});
  broadcast_parameters(model, r, ctx);
  if (shared) model.set_amax_reducer(r);
  nn::softmax_cross_entropy<P> loss;
  adamw opt(model.masters(), {.lr = 1e-2});
  nn::trainer tr(model, loss, opt, scaler);
  host_tensor<S, 2> x(std::array<std::size_t, 2>{8, 6});
  host_tensor<std::int32_t, 1> t(std::array<std::size_t, 1>{8});
  for (int step = 0; step < 3; ++step) {
    for (std::size_t i = 0; i < 8; ++i) {
      for (std::size_t c = 0; c < 6; ++c) {
        x(i, c) = S(float(int((i * 5 + c * 3 + std::size_t(step)) % 7) - 3) *
                    (r.rank() == 1 ? 8.0F : 1.0F));
      }
      t(i) = std::int32_t(i % 4);
    }
    tr.step(ctx, x, t);
  }
  std::vector<float> scales;
  model.for_each_layer([&](const std::string&, auto& l) {
    if constexpr (requires { l.float8_products().input.scale(); }) {
      const auto& f = l.float8_products();
      scales.insert(scales.end(), {f.input.scale(), f.weight.scale(), f.grad_output.scale()});
    }
  });
  std::vector<float> weights;
  for (auto w : model.masters()) weights.insert(weights.end(), w.begin(), w.end());
  return {scales, weights};
}

// True when every process holds the same bits as rank 0.
bool same_on_all_ranks(const std::vector<float>& v) {
  std::vector<float> root = v;
  MPI_Bcast(root.data(), int(root.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
  int same = std::memcmp(root.data(), v.data(), v.size() * sizeof(float)) == 0 ? 1 : 0, all = 0;
  MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  return all != 0;
}

}  // namespace

TEST_CASE("float8 recipes agree on their amaxes across ranks once the model's reducer is set") {
  const auto [scales, weights] = fp8_run(true);
  REQUIRE(scales.size() == 6);
  CHECK(same_on_all_ranks(scales));
  CHECK(same_on_all_ranks(weights));
  // Without it each process scales by its own amaxes (the test tells the two apart).
  const auto [local_scales, local_weights] = fp8_run(false);
  CHECK_FALSE(same_on_all_ranks(local_scales));
  (void)local_weights;
}

TEST_CASE("an infinity on one rank makes both skip the step and back off the same way") {
  basic_dynamic_scaler<mpi_reducer<>> scaler({.init_scale = 4096.0F});
  std::vector<float> w{1.0F, 2.0F};
  sgd opt({std::span<float>(w)}, {.lr = 0.5});
  std::vector<float> g{1.0F, world_rank() == 1 ? INFINITY : 1.0F};
  const auto r = scaler.step(opt, unscale(scaler.scaled_gradients(std::move(g))));
  CHECK(r.found_inf);
  CHECK_FALSE(r.applied);
  CHECK(r.scale_after == 2048.0F);
  CHECK(w[0] == 1.0F);  // untouched on both ranks
}

TEST_CASE("MPI's failures are precis errors naming the call; bad arguments are refused") {
  mpi_reducer<> r;
  std::vector<float> v{1.0F};
  try {
    r.broadcast(v, 5);  // no rank 5
    FAIL("an invalid root was accepted");
  } catch (const error& e) {
    CHECK(std::string(e.what()).find("MPI_Bcast failed") != std::string::npos);
  }
  CHECK_THROWS_AS(mpi_reducer<>(MPI_COMM_NULL), error);
  CHECK_THROWS_AS(mpi_reducer<>(MPI_COMM_WORLD, 0), error);
  CHECK(shard(10, 0, 3) == std::pair<std::size_t, std::size_t>{0, 4});
  CHECK(shard(10, 2, 3) == std::pair<std::size_t, std::size_t>{7, 10});
  CHECK_THROWS_AS(shard(10, 3, 3), error);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  doctest::Context context(argc, argv);
  const int failed = context.run();
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any_failed != 0 ? 1 : 0;
}
