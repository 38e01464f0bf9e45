// A Vision Transformer trained on Fashion-MNIST under several policy maps, all compiled into
// this binary from one blueprint (model.hpp) and one Hana tuple of maps.
//
//   example_vit [--epochs N] [--policy NAME[,NAME...]] [--threads N] [--batch N]
//               [--train N] [--seed S] [--lr X] [--augment] [--data DIR] [--out DIR]
//               [--init FILE] [--check] [--distributed] [--monitor N] [--advise FILE]
//               [--device cpu|cuda]
//
// The model: patch 4 (7 x 7 = 49 patch tokens and a class token), width 64, 4 heads, 4
// pre-norm blocks, 10 classes. AdamW (weight decay 0.05 on the linear weights only, not on
// biases, norms or embeddings), linear warmup over the first tenth of the steps, then cosine decay,
// gradients clipped to norm 1. For each policy it prints a line per epoch (training loss,
// test accuracy, skipped steps, loss scale, time), then a summary table, and writes under
// --out: summary.csv, curves.csv (per epoch), steps.csv (per step) and curves.png (gnuplot),
// and each policy's trained weights as weights_<policy>.safetensors (float32, named as
// PyTorch's module in bench/vit/torch_reference.py names them; the sizes and the
// normalisation in the metadata: `torch_reference.py evaluate` runs them in PyTorch).
// --init FILE starts every policy from the weights in a safetensors file of those names
// (PyTorch's, or one this program wrote) instead of the seed's.
//
// --check (CI runs it) trains every policy for one short epoch (32 steps on 4,096 images)
// and exits non-zero unless each reaches 40% test accuracy on 1,000 test images (chance is
// 10%; the full run reaches 88%) and ends within 3 points of fp32, bf16_mixed had no
// skipped step and every test loss is finite.
//
// --distributed (a build with precis::mpi), under `mpirun -np R`: data-parallel training,
// each process taking batch / R images of every step and the gradients averaged over the
// processes (precis::mpi_reducer); rank 0 prints and writes the outputs.
//
// --monitor N observes every N-th step with precis::diagnostics::monitor: per layer, the
// ranges of activations and gradients against float16, bfloat16 and float8, and where the
// first non-finite value appeared. For each policy it prints the table and writes
// ranges_<policy>.csv, series_<policy>.csv and ranges_<policy>.png (amax per layer over
// training against each format's limits). --advise FILE (with one --policy; implies
// --monitor 10 unless given) writes the policy map precis::diagnostics::advise draws from
// those measurements, as a C++ header.
//
// --device cuda runs example_vit_cuda (train_vit_cuda.cu; built with the CUDA backend) with
// the other arguments: the same model and recipe, the whole step on a GPU.
//
// Training is deterministic: the same bits for a given seed, thread count, process count
// and build.
#include "../common.hpp"
#include "../monitor.hpp"
#include "fashion_mnist.hpp"
#include "model.hpp"
#include "options.hpp"
#include "tables.hpp"
// After the tags (model.hpp): the map the advisor wrote from a float run, and the ranges it
// measured, which rule d checks for every map below.
#include "advised_map.hpp"

#include <precis/nn/safetensors.hpp>
#if PRECIS_EXAMPLE_MPI
#include <precis/distributed/mpi.hpp>
#endif

#include "../report.hpp"

#include <boost/hana.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <optional>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

#include <unistd.h>

namespace hana = boost::hana;
using namespace precis;

namespace {

/// The blocks of the example's model (compile time: they are one array of one type).
inline constexpr std::size_t depth = 4;

struct options : vit::run_options {
  options() { out = "vit_output"; }
  unsigned threads = 0;
  bool augment = false;
  std::optional<safetensors::file> init;  // --init: the starting weights
  bool distributed = false;               // --distributed: data-parallel over MPI's processes
  int rank = 0, processes = 1;
  double mean = 0, sd = 1;                 // the normalisation (for the weights' metadata)
  std::uint64_t monitor_every = 0;         // --monitor N: observe every N-th step (0: off)
  std::filesystem::path advise;            // --advise FILE: write the advised policy map
  std::string command;                     // the command line (the advised map names it)
};

// ---- the data: normalised once, batches gathered per step ----


/// Images as normalised floats ((p / 255 - mean) / std, the training set's mean and
/// standard deviation) and their labels.
struct dataset {
  std::size_t count = 0, side = 0;
  float background = 0;  // a zero pixel, normalised: what a shifted image is padded with
  std::vector<float> x;
  std::vector<std::int32_t> y;
};

dataset normalise(const vit::image_set& s, std::size_t limit, double mean, double sd) {
  if (s.rows != s.cols) throw error("example_vit: the images are not square");
  dataset d;
  d.count = limit == 0 ? s.count : std::min(limit, s.count);
  d.side = s.rows;
  d.background = float((0.0 - mean) / sd);
  const std::size_t px = d.side * d.side;
  d.x.resize(d.count * px);
  d.y.resize(d.count);
  for (std::size_t i = 0; i < d.count * px; ++i) d.x[i] = float((double(s.pixels[i]) / 255.0 - mean) / sd);
  for (std::size_t i = 0; i < d.count; ++i) d.y[i] = std::int32_t(s.labels[i]);
  return d;
}


/// Items order[first, first + n) as an [n, 1, side, side] float batch. With `augment`, each
/// image is shifted by up to 2 pixels in each direction (a random crop of the image padded
/// with background) and mirrored left-right with probability 1/2, from (seed, epoch, item).
void gather(const dataset& d, const std::vector<std::size_t>& order, std::size_t first, std::size_t n, bool augment,
            std::uint64_t seed, std::size_t epoch, host_tensor<float, 4>& x, host_tensor<std::int32_t, 1>& y) {
  const std::size_t side = d.side, px = side * side;
  x.resize({n, 1, side, side});
  y.resize({n});
  for (std::size_t b = 0; b < n; ++b) {
    const std::size_t item = order[first + b];
    const float* src = d.x.data() + item * px;
    float* dst = x.data() + b * px;
    y(b) = d.y[item];
    if (!augment) {
      std::copy(src, src + px, dst);
      continue;
    }
    const std::uint64_t r = examples::mix64(examples::mix64(seed ^ 0xA5A5A5A5ULL) + epoch * 1000003 + item);
    const long dx = long(r % 5) - 2, dy = long((r / 5) % 5) - 2;
    const bool flip = ((r >> 32) & 1) != 0;
    for (std::size_t i = 0; i < side; ++i) {
      for (std::size_t j = 0; j < side; ++j) {
        const long si = long(i) + dy, sj = long(flip ? side - 1 - j : j) + dx;
        const bool inside = si >= 0 && sj >= 0 && si < long(side) && sj < long(side);
        dst[i * side + j] = inside ? src[std::size_t(si) * side + std::size_t(sj)] : d.background;
      }
    }
  }
}

// ---- the reducer: this process alone, or every process of an MPI run ----

#if PRECIS_EXAMPLE_MPI
mpi_reducer<>* world = nullptr;  // set by --distributed
#endif

/// The scalers' reducer, chosen at run time so that each map is compiled once: one
/// process, or (with --distributed) the MPI run's processes, whose gradients it averages.
struct run_reducer {
  bool any(bool local_found_inf) const {
#if PRECIS_EXAMPLE_MPI
    if (world != nullptr) return world->any(local_found_inf);
#endif
    return local_found_inf;
  }
  void max(std::span<float> values) const {
#if PRECIS_EXAMPLE_MPI
    if (world != nullptr) world->max(values);
#else
    (void)values;
#endif
  }
  template <gradients G>
  void average(G& grads) const {
#if PRECIS_EXAMPLE_MPI
    if (world != nullptr) world->average(grads);
#else
    (void)grads;
#endif
  }
};
using run_no_scaling = basic_no_scaling<run_reducer>;
using run_dynamic_scaler = basic_dynamic_scaler<run_reducer>;

// ---- the maps: entries of one compile-time tuple ----

template <class Map, class Scaler>
struct entry {
  using map = Map;
  using scaler = Scaler;
  std::string_view name;
  std::string_view note;
};

// bf16 everywhere, the attention products (scores and context, whose values are small) in
// float16, the head in float: a map with overrides on a real model. Its float16 layers'
// gradients need a loss scaler (rule b).
using per_layer_map = decltype(make_policy_map(presets::bf16_mixed{}, for_layer<vit::scores>(presets::fp16_mixed{}),
                                               for_layer<vit::context>(presets::fp16_mixed{}),
                                               for_layer<vit::head>(presets::fp32{})));

const auto sweep = hana::make_tuple(
    entry<decltype(make_policy_map(presets::fp32{})), run_no_scaling>{"fp32", "reference"},
    entry<decltype(make_policy_map(presets::bf16_mixed{})), run_no_scaling>{"bf16_mixed",
                                                                            "bfloat16, no scaler"},
    entry<decltype(make_policy_map(presets::fp16_mixed{})), run_dynamic_scaler>{
        "fp16_mixed", "float16 + dynamic scaler"},
    entry<vit::fp8_map, run_dynamic_scaler>{"fp8_hybrid", "float8 linear products, bf16 between layers"},
    entry<per_layer_map, run_dynamic_scaler>{"bf16_attn_fp16",
                                             "bf16, attention products fp16, head fp32"},
    entry<std::remove_cvref_t<decltype(advised_map)>, run_dynamic_scaler>{
        "advised", "advise()'s map from a float run"});

struct epoch_record {
  double train_loss = 0, test_loss = 0, test_accuracy = 0, scale = 1, seconds = 0;
  std::size_t skipped = 0;
};

struct result {
  std::string name, note;
  double accuracy = 0, test_loss = 0, ms_per_step = 0, final_scale = 1, peak_rss_mib = 0;
  std::size_t skipped = 0, steps = 0, param_bytes = 0, optim_bytes = 0, activation_bytes = 0;
  std::vector<epoch_record> epochs;
  std::vector<nn::step_record> records;
};

/// Loss and accuracy over the whole test set, in batches of `chunk` (the training batch, so
/// the layers' buffers keep their training size).
template <class Model, class Loss, class S>
nn::evaluation evaluate_all(const cpu_context& ctx, Model& model, Loss& loss, const dataset& test, std::size_t chunk) {
  std::vector<std::size_t> order(test.count);
  std::iota(order.begin(), order.end(), std::size_t{0});
  host_tensor<float, 4> xf;
  host_tensor<S, 4> x;
  host_tensor<std::int32_t, 1> y;
  double loss_sum = 0, correct = 0;
  for (std::size_t first = 0; first < test.count; first += chunk) {
    const std::size_t n = std::min(chunk, test.count - first);
    gather(test, order, first, n, false, 0, 0, xf, y);
    x.resize(xf.shape());
    precis::cast(ctx, xf, x);
    const auto e = nn::evaluate(ctx, model, loss, x, y);
    loss_sum += e.loss * double(n);
    correct += e.accuracy * double(n);
  }
  return {loss_sum / double(test.count), correct / double(test.count)};
}

template <class Entry>
result train_one(const Entry& e, const options& o, const vit::config& vc, const dataset& train, const dataset& test) {
  using Map = typename Entry::map;
  // The images enter in the activation type of the map's default (bfloat16 for fp8_hybrid).
  using S = nn::activation_type_t<typename Map::default_policy>;
  // The loss reads the head's output: its policy is the head's.
  using LossPolicy = policy_for_t<vit::head, Map>;
  examples::reset_peak_rss();
  const cpu_context ctx{o.threads};
  auto model = nn::build<S, 4>(Map{}, vit::blueprint<depth>(vc), {.seed = o.seed});
  if (o.init) nn::load_safetensors(model, *o.init, vit::torch_name);
  nn::softmax_cross_entropy<LossPolicy> loss;
  const std::size_t per_epoch = train.count / o.batch, total = per_epoch * o.epochs;
  adamw opt(model.masters(), {.lr = o.lr, .weight_decay = o.weight_decay}, model.decay_mask(), ctx);
  warmup_cosine schedule(o.lr, std::max<std::size_t>(total / 10, 1), total, o.lr * 0.01);
  typename Entry::scaler scaler;
#if PRECIS_EXAMPLE_MPI
  if (world != nullptr) {
    broadcast_parameters(model, *world, ctx);  // rank 0's weights, whatever the others loaded
    model.set_amax_reducer(scaler.reducer_object());
  }
#endif
  nn::trainer tr(model, loss, opt, scaler, schedule, {.max_grad_norm = 1.0});
  // This process's rows of every batch.
  const std::size_t first = o.batch * std::size_t(o.rank) / std::size_t(o.processes);
  const std::size_t rows = o.batch * std::size_t(o.rank + 1) / std::size_t(o.processes) - first;

  result r;
  r.name = std::string(e.name);
  r.note = std::string(e.note);
  const bool tty = isatty(STDOUT_FILENO) != 0 && o.rank == 0;
  std::optional<diagnostics::monitor> monitor;
  if (o.monitor_every != 0) monitor.emplace(diagnostics::monitor_options{.every = o.monitor_every});
  host_tensor<float, 4> xf;
  host_tensor<S, 4> x;
  host_tensor<std::int32_t, 1> y;
  double train_seconds = 0;
  for (std::size_t ep = 0; ep < o.epochs; ++ep) {
    const auto order = examples::epoch_order(train.count, o.seed, ep);
    const auto t0 = std::chrono::steady_clock::now();
    double loss_sum = 0;
    std::size_t counted = 0;
    for (std::size_t b = 0; b < per_epoch; ++b) {
      gather(train, order, b * o.batch + first, rows, o.augment, o.seed, ep, xf, y);
      x.resize(xf.shape());
      precis::cast(ctx, xf, x);
      r.records.push_back(monitor ? tr.step(ctx, x, y, *monitor) : tr.step(ctx, x, y));
      const auto& rec = r.records.back();
      if (!rec.skipped) {
        loss_sum += rec.loss;
        ++counted;
      }
      if (tty && (b % 10 == 9 || b + 1 == per_epoch)) {
        std::printf("\r  %-15s epoch %zu/%zu  step %zu/%zu  loss %.4f  scale %g   ", r.name.c_str(), ep + 1, o.epochs,
                    b + 1, per_epoch, rec.loss, double(rec.next_scale));
        std::fflush(stdout);
      }
    }
    const auto t1 = std::chrono::steady_clock::now();
    train_seconds += std::chrono::duration<double>(t1 - t0).count();
    const auto ev = evaluate_all<decltype(model), decltype(loss), S>(ctx, model, loss, test, o.batch);
    epoch_record er;
    er.train_loss = counted ? loss_sum / double(counted) : std::nan("");
    er.test_loss = ev.loss;
    er.test_accuracy = ev.accuracy;
    er.scale = double(scaler.scale());
    er.skipped = scaler.skipped_steps();
    er.seconds = std::chrono::duration<double>(t1 - t0).count();
    r.epochs.push_back(er);
    std::printf("%s  %-15s epoch %2zu/%zu  train loss %.4f  test loss %.4f  test accuracy %6.2f%%  skipped %zu  "
                "scale %g  %.1f s\n",
                tty ? "\r" : "", r.name.c_str(), ep + 1, o.epochs, er.train_loss, er.test_loss, 100 * er.test_accuracy,
                er.skipped, er.scale, er.seconds);
    std::fflush(stdout);
  }
  r.steps = total;
  r.ms_per_step = 1000.0 * train_seconds / double(std::max<std::size_t>(total, 1));
  r.accuracy = r.epochs.back().test_accuracy;
  r.test_loss = r.epochs.back().test_loss;
  r.skipped = scaler.skipped_steps();
  r.final_scale = double(scaler.scale());
  r.param_bytes = model.parameter_bytes();
  r.optim_bytes = opt.state_bytes();
  r.activation_bytes = model.activation_bytes() + loss.own_bytes();
  r.peak_rss_mib = examples::peak_rss_mib();

  if (o.rank != 0) return r;  // the weights are the same on every process: rank 0 writes them
  if (monitor) examples::write_monitor(*monitor, o.out, r.name, o.advise, o.command);
  auto text = [](double v) { return examples::format("%.17g", v); };
  const auto weights = o.out / ("weights_" + r.name + ".safetensors");
  nn::save_safetensors(model, weights, vit::torch_name, safetensors::dtype::f32,
                       {{"image", std::to_string(vc.image)}, {"patch", std::to_string(vc.patch)},
                        {"channels", std::to_string(vc.channels)}, {"width", std::to_string(vc.width)},
                        {"heads", std::to_string(vc.heads)}, {"depth", std::to_string(depth)},
                        {"classes", std::to_string(vc.classes)}, {"mean", text(o.mean)}, {"std", text(o.sd)},
                        {"seed", std::to_string(o.seed)}, {"policy", r.name}, {"epochs", std::to_string(o.epochs)},
                        {"test_accuracy", text(r.accuracy)}, {"test_images", std::to_string(test.count)}});
  std::printf("  wrote %s\n", weights.string().c_str());
  return r;
}

void write_outputs(const options& o, const std::vector<result>& results) {
  std::filesystem::create_directories(o.out);
  std::ostringstream steps;
  steps << "step";
  for (const auto& r : results) steps << "," << r.name << "_loss," << r.name << "_scale," << r.name << "_skipped";
  steps << "\n";
  const std::size_t n = results.empty() ? 0 : results.front().records.size();
  for (std::size_t s = 0; s < n; ++s) {
    steps << s;
    for (const auto& r : results) {
      const auto& rec = r.records[s];
      steps << "," << rec.loss << "," << rec.scale << "," << (rec.skipped ? 1 : 0);
    }
    steps << "\n";
  }
  examples::write_file(o.out / "summary.csv", vit::summary_csv(results, o.epochs, "cpu", examples::cpu_line()));
  examples::write_file(o.out / "curves.csv", vit::curves_csv(results, o.epochs));
  examples::write_file(o.out / "steps.csv", steps.str());
  std::printf("wrote %s, curves.csv and steps.csv\n", (o.out / "summary.csv").string().c_str());

  // The plot: training loss per step, test accuracy per epoch, loss scale per step.
  const auto png = o.out / "curves.png";
  std::ostringstream g;
  g << "set terminal pngcairo size 1500,450 noenhanced\nset output '" << png.string() << "'\n"
    << "set datafile separator ','\nset key autotitle columnhead\nset multiplot layout 1,3\n"
    << "set title 'training loss'\nset xlabel 'step'\nset logscale y\nplot";
  for (std::size_t i = 0; i < results.size(); ++i) {
    g << (i ? ", " : " ") << "'" << (o.out / "steps.csv").string() << "' using 1:" << 2 + 3 * i << " with lines";
  }
  g << "\nunset logscale y\nset title 'test accuracy'\nset xlabel 'epoch'\nset xrange [0.5:" << double(o.epochs) + 0.5
    << "]\nplot";
  for (std::size_t i = 0; i < results.size(); ++i) {
    g << (i ? ", " : " ") << "'" << (o.out / "curves.csv").string() << "' using 1:" << 3 + 3 * i
      << " with linespoints lw 2";
  }
  g << "\nset title 'loss scale'\nset xlabel 'step'\nset autoscale x\nset logscale y\nplot";
  for (std::size_t i = 0; i < results.size(); ++i) {
    g << (i ? ", " : " ") << "'" << (o.out / "steps.csv").string() << "' using 1:" << 3 + 3 * i << " with lines lw 2";
  }
  g << "\nunset multiplot\n";
  examples::draw_with_gnuplot(o.out / "curves.gp", g.str(), png);
}

int check(const std::vector<result>& results) {
  int failures = 0;
  const auto fp32 = std::find_if(results.begin(), results.end(), [](const result& r) { return r.name == "fp32"; });
  for (const auto& r : results) {
    const bool bf16_only = r.name == "bf16_mixed";
    const bool near_fp32 = fp32 == results.end() || std::abs(r.accuracy - fp32->accuracy) <= 0.03;
    const bool ok = std::isfinite(r.test_loss) && r.accuracy >= 0.4 && near_fp32 && (!bf16_only || r.skipped == 0);
    std::printf("check %-15s accuracy %.4f, test loss %.4f, skipped %zu: %s\n", r.name.c_str(), r.accuracy,
                r.test_loss, r.skipped, ok ? "ok" : "FAILED");
    failures += ok ? 0 : 1;
  }
  return failures == 0 ? 0 : 1;
}

int usage(const char* self) {
  std::fprintf(stderr,
               "usage: %s [--epochs N] [--policy NAME[,NAME...]] [--threads N] [--batch N] "
               "[--train N] [--test N]\n"
               "          [--seed S] [--lr X] [--augment] [--data DIR] [--out DIR] [--init FILE] "
               "[--check] [--distributed]\n"
               "          [--monitor N] [--advise FILE] [--device cpu|cuda]\n"
               "policies: fp32 bf16_mixed fp16_mixed fp8_hybrid bf16_attn_fp16 advised\n",
               self);
  return 2;
}

std::set<std::string> policy_names() {
  std::set<std::string> names;
  hana::for_each(sweep, [&](const auto& e) { names.insert(std::string(e.name)); });
  return names;
}

}  // namespace

#ifdef PRECIS_EXAMPLE_VIT_CUDA
constexpr const char* device_program = PRECIS_EXAMPLE_VIT_CUDA;  // example_vit_cuda (train_vit_cuda.cu)
#else
constexpr const char* device_program = nullptr;
#endif

int main(int argc, char** argv) {
  // --device cuda: the same model and recipe trained on a GPU, by example_vit_cuda.
  if (const int rc = examples::run_on_device("example_vit", device_program, argc, argv); rc >= 0) return rc;
  options o;
  o.command = examples::command_line(argc, argv);
  std::filesystem::path init_path;
  const auto known = policy_names();
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto number = [&](long long min, auto& out) { return examples::next_count(argc, argv, i, min, out); };
    bool ok = true;
    if (const auto shared = vit::read_shared_option(argc, argv, i, o, known, "example_vit")) {
      ok = *shared;
    } else if (a == "--threads") {
      ok = number(0, o.threads);
    } else if (a == "--augment") {
      o.augment = true;
    } else if (a == "--init" && i + 1 < argc) {
      init_path = argv[++i];
    } else if (a == "--device" && i + 1 < argc) {
      ++i;  // cpu (cuda went to run_on_device)
    } else if (a == "--distributed") {
      o.distributed = true;
    } else if (a == "--monitor") {
      ok = number(1, o.monitor_every);
    } else if (a == "--advise" && i + 1 < argc) {
      o.advise = argv[++i];
    } else {
      ok = false;
    }
    if (!ok) return usage(argv[0]);
  }
#if PRECIS_EXAMPLE_MPI
  // MPI is finalised after the reducer is gone, on every way out of main.
  struct mpi_session {
    bool on = false;
    ~mpi_session() {
      if (on) MPI_Finalize();
    }
  } session;
  std::optional<mpi_reducer<>> reducer;
  if (o.distributed) {
    MPI_Init(&argc, &argv);
    session.on = true;
    reducer.emplace();
    world = &*reducer;
    o.rank = reducer->rank();
    o.processes = reducer->size();
    if (o.rank != 0 && std::freopen("/dev/null", "w", stdout) == nullptr)
      return 1;  // rank 0 reports
  }
#else
  if (o.distributed) {
    std::fprintf(
        stderr,
        "example_vit: --distributed needs a build with MPI (libopenmpi-dev: precis::mpi)\n");
    return 2;
  }
#endif
  if (!o.advise.empty()) {
    if (o.policies.size() != 1) {
      std::fprintf(stderr,
                   "example_vit: --advise takes the measurements of one run: name one --policy\n");
      return 2;
    }
    if (o.monitor_every == 0) o.monitor_every = 10;
  }
  o.apply_check();
  try {
    const vit::config vc;
    vc.validate();
    const auto train_set = vit::load_fashion_mnist(o.data, vit::split::train);
    const auto test_set = vit::load_fashion_mnist(o.data, vit::split::test);
    // The training images' mean and standard deviation normalise both splits.
    const auto [mean, sd] = vit::statistics_of(train_set);
    o.mean = mean;
    o.sd = sd;
    const auto train = normalise(train_set, o.train_size, mean, sd);
    const auto test = normalise(test_set, o.test_size, mean, sd);
    if (train.side != vc.image || test.side != vc.image) throw error("example_vit: the images are not 28 x 28");
    if (train.count < o.batch) throw error("example_vit: fewer training images than one batch");
    if (o.batch < std::size_t(o.processes))
      throw error("example_vit: fewer images in a batch than processes");

    std::printf("CPU: %s, %u hardware threads; products: %s\n", examples::cpu_line().c_str(), std::thread::hardware_concurrency(),
                cpu_products_engine().c_str());
    std::printf("precis %d.%d ViT on Fashion-MNIST: patch %zu, width %zu, %zu heads, depth %zu; %zu training and %zu "
                "test images; batch %zu, %zu epochs, AdamW lr %g (warmup 1/10, cosine), %s; %u threads\n",
                PRECIS_VERSION_MAJOR, PRECIS_VERSION_MINOR, vc.patch, vc.width, vc.heads, depth, train.count,
                test.count, o.batch, o.epochs, o.lr, o.augment ? "shift + flip augmentation" : "no augmentation",
                cpu_context{o.threads}.thread_count());
    if (!init_path.empty()) {
      o.init = safetensors::file::read(init_path);
      std::printf("starting from the weights in %s\n", init_path.string().c_str());
    }
    if (o.distributed) {
      std::printf("data-parallel over %d processes: %zu images of each batch per process\n",
                  o.processes, o.batch / std::size_t(o.processes));
    }
    if (o.rank == 0) std::filesystem::create_directories(o.out);
    std::vector<result> results;
    hana::for_each(sweep, [&](const auto& e) {
      if (!o.policies.empty() && !o.policies.contains(std::string(e.name))) return;
      results.push_back(train_one(e, o, vc, train, test));
    });

    std::vector<std::vector<std::string>> rows{{"policy", "test acc", "test loss", "skipped", "final scale",
                                                "ms/step", "params", "optimizer", "activations", "peak RSS", ""}};
    const auto num = examples::format;
    auto kib = [&](std::size_t b) { return num("%.0f KiB", double(b) / 1024.0); };
    for (const auto& r : results) {
      rows.push_back({r.name, num("%.2f%%", 100 * r.accuracy), num("%.4f", r.test_loss), std::to_string(r.skipped),
                      num("%g", r.final_scale), num("%.1f", r.ms_per_step), kib(r.param_bytes), kib(r.optim_bytes),
                      kib(r.activation_bytes), num("%.0f MiB", r.peak_rss_mib), r.note});
    }
    std::printf("\n%s", precis::detail::format_table(rows).c_str());
    if (o.rank == 0) write_outputs(o, results);
    return o.check ? check(results) : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "example_vit: %s\n", e.what());
    return 1;
  }
}
