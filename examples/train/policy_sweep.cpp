// The policy sweep: one MLP classifier trained under several precision policies, all
// compiled into this binary from one Hana tuple of policies. For each it prints loss,
// accuracy, skipped steps, final loss scale, time per step and memory, writes the loss
// and scale curves as CSV and plots them with gnuplot.
//
//   precis_demo [--steps N] [--micro M] [--seed S] [--out DIR] [--check] [--threads N]
//
// --micro M accumulates M micro-batches of 1024 per step; --seed S changes the initial
// weights. About 30 s on two cores. --check (CI runs it) exits non-zero unless every safe policy
// ends within 1% accuracy of fp32 and the unsafe one more than 1% below it. Training is
// deterministic: the same bits on every run and for every thread count.
//
// The task: 10 classes; a sample is its class's prototype in 8 of its 64 features (plus
// noise) and pure noise in the other 56, so the first layer has to learn which features to
// read. The model is a deep sigmoid MLP (6 linear + sigmoid blocks): the loss gradient of a
// sample, (softmax - onehot) / 1024, shrinks at every block on its way back (a sigmoid's
// derivative is at most 1/4), so the gradients of the first layers are far below float16's
// smallest subnormal (6e-8). In float16 without loss scaling they are all zero and the
// network never learns; with the dynamic scaler (2^16) they are representable; bfloat16 has
// float's range and needs no scaler.
#include "../common.hpp"

#include <precis/precis.hpp>

#include <boost/hana.hpp>
#include <xtensor/xview.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <unistd.h>

namespace hana = boost::hana;
using namespace precis;

namespace {

struct config {
  std::size_t steps = 1000;
  std::size_t batch = 1024;      // rows of a micro-batch
  std::size_t micro = 1;         // micro-batches per optimizer step
  std::size_t train_size = 32768;
  std::size_t test_size = 8192;
  std::size_t features = 64;     // inputs: `informative` carry the class, the rest are noise
  std::size_t informative = 8;
  std::size_t hidden = 64;
  std::size_t classes = 10;
  double noise = 0.6;            // spread of a class around its prototype
  float lr = 5e-3f;
  std::size_t seed = 0;
  unsigned threads = 0;
  bool check = false;
  std::filesystem::path out = "precis_demo_output";
};

// ---- the dataset, the same on every platform (no standard-library distributions) ----

double uniform(std::uint64_t stream, std::uint64_t i) {
  return (double(examples::mix64(examples::mix64(stream) ^ i) >> 11) + 0.5) * 0x1.0p-53;
}
double gaussian(std::uint64_t stream, std::uint64_t i) {  // Box-Muller
  return std::sqrt(-2.0 * std::log(uniform(stream, 2 * i))) * std::cos(6.283185307179586 * uniform(stream, 2 * i + 1));
}

struct dataset {
  host_tensor<float, 2> x;
  host_tensor<std::int32_t, 1> y;
};

// Class c has a prototype p_c ~ N(0, I) in the first `informative` features; a sample of
// class c is p_c + noise * N(0, I) there and N(0, 1) in every other feature.
dataset make_dataset(const config& c, std::size_t n, std::uint64_t stream) {
  dataset d{host_tensor<float, 2>(std::array<std::size_t, 2>{n, c.features}),
            host_tensor<std::int32_t, 1>(std::array<std::size_t, 1>{n})};
  for (std::size_t r = 0; r < n; ++r) {
    const std::size_t label = examples::mix64(examples::mix64(stream) + r) % c.classes;
    d.y(r) = std::int32_t(label);
    for (std::size_t k = 0; k < c.features; ++k) {
      const double z = gaussian(stream, r * c.features + k);
      d.x(r, k) = float(k < c.informative ? gaussian(1, label * c.features + k) + c.noise * z : z);
    }
  }
  return d;
}

// ---- the policies: four entries of one compile-time tuple ----

using fp16_unsafe = unsafe<presets::fp16_mixed, rule::unscaled_gradients>;
// The loss of the unsafe configuration also sums in float16 (rule::fp32_operation waived).
using fp16_unsafe_loss = unsafe<policy<float16, float16, float16, float>, rule::unscaled_gradients, rule::fp32_operation>;

template <class Map, class Loss, class Scaler>
struct entry {
  using map = Map;
  using loss = Loss;
  using scaler = Scaler;
  std::string_view name;
  std::string_view note;
};

const auto sweep = hana::make_tuple(
    entry<decltype(make_policy_map(presets::fp32{})), presets::fp32, no_scaling>{"fp32", "reference"},
    entry<decltype(make_policy_map(presets::bf16_mixed{})), presets::bf16_mixed, no_scaling>{
        "bf16_mixed", "bfloat16, no scaler needed"},
    entry<decltype(make_policy_map(presets::fp16_mixed{})), presets::fp16_mixed, dynamic_scaler>{
        "fp16_mixed", "float16 + dynamic scaler"},
    entry<decltype(make_policy_map(fp16_unsafe{})), fp16_unsafe_loss, no_scaling>{"fp16_unsafe",
                                                                                  "float16, no scaler, fp16 loss"});

// `depth` hidden blocks of linear + sigmoid, then the classifier, with PyTorch's default
// initialisation (uniform in +-1/sqrt(fan_in)). A sigmoid's derivative is at most 1/4, so
// each block scales the gradient down on its way back (the vanishing gradient of deep
// sigmoid networks); Adam's per-parameter normalisation still trains the first layers in
// float, bfloat16, or float16 with a loss scale. Without one, their float16 gradients are 0.
inline constexpr std::size_t depth = 6;

// The classifier, tagged so that a map could give it a policy of its own.
struct classifier : layer<op::matmul> {
  static constexpr std::string_view name = "classifier";
};

// One hidden block: a linear layer and a sigmoid.
auto block(std::size_t in, std::size_t out) { return nn::seq(nn::linear(in, out), nn::sigmoid()); }

// The blueprint, written once; each entry builds it from its own map.
auto blueprint(const config& c) {
  return nn::seq(nn::named("input", block(c.features, c.hidden)),
                 nn::named("hidden", nn::repeat<depth - 1>(block(c.hidden, c.hidden))),
                 nn::linear<classifier>(c.hidden, c.classes));
}

struct result {
  std::string name, note;
  double loss = 0, accuracy = 0, ms_per_step = 0, final_scale = 1;
  double zero_grads = 0;  // share of the first layer's weight gradients that are exactly 0, mean over steps
  std::size_t skipped = 0, param_bytes = 0, optim_bytes = 0, activation_bytes = 0;
  std::vector<nn::step_record> records;
};

template <class T>
host_tensor<T, 2> rows_as(const host_tensor<float, 2>& x, std::size_t begin, std::size_t count) {
  host_tensor<T, 2> out(std::array<std::size_t, 2>{count, std::size_t(x.shape()[1])});
  const cpu_context one{1};
  host_tensor<float, 2> part = xt::view(x, xt::range(begin, begin + count), xt::all());
  precis::cast(one, part, out);
  return out;
}

template <class Entry>
result train_one(const Entry& e, const config& c, const dataset& train, const dataset& test) {
  using Map = typename Entry::map;
  using S = typename Map::default_policy::storage_type;
  const cpu_context ctx{c.threads};
  auto model = nn::build<S, 2>(Map{}, blueprint(c), {.seed = c.seed});
  nn::softmax_cross_entropy<typename Entry::loss> loss;
  adamw opt(model.masters(), {.lr = c.lr, .weight_decay = 0.0f}, {}, ctx);
  warmup_cosine schedule(c.lr, c.steps / 20, c.steps, 1e-4f);
  typename Entry::scaler scaler;
  nn::trainer tr(model, loss, opt, scaler, schedule);

  result r;
  r.name = std::string(e.name);
  r.note = std::string(e.note);
  const bool tty = isatty(STDOUT_FILENO) != 0;
  const std::size_t batches = train.x.shape()[0] / c.batch;
  std::vector<host_tensor<S, 2>> xs;
  std::vector<host_tensor<std::int32_t, 1>> ys;
  for (std::size_t b = 0; b < batches; ++b) {
    xs.push_back(rows_as<S>(train.x, b * c.batch, c.batch));
    ys.push_back(xt::view(train.y, xt::range(b * c.batch, (b + 1) * c.batch)));
  }
  // The first layer's weight gradient, where float16 without a scaler loses the most.
  const host_tensor<float, 2>* first_grad = nullptr;
  model.for_each_parameter([&](const std::string& path, auto& p) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(p.grad())>, host_tensor<float, 2>>) {
      if (path == "input.0.weight") first_grad = &p.grad();
    }
  });
  if (first_grad == nullptr) throw error("policy_sweep: the model has no parameter input.0.weight");
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t s = 0; s < c.steps; ++s) {
    std::vector<typename decltype(tr)::batch_type> parts;
    for (std::size_t m = 0; m < c.micro; ++m) {
      const std::size_t b = (s * c.micro + m) % batches;
      parts.push_back({xs[b], ys[b]});
    }
    r.records.push_back(tr.step(ctx, parts));
    const auto& g = *first_grad;
    r.zero_grads += double(std::count(g.begin(), g.end(), 0.0f)) / double(g.size()) / double(c.steps);
    if (tty || (s + 1) % (c.steps / 4) == 0 || s + 1 == c.steps) {
      std::printf("%s  %-12s step %4zu/%zu  loss %8.4f  scale %8g%s", tty ? "\r" : "", r.name.c_str(), s + 1,
                  c.steps, r.records.back().loss, double(r.records.back().scale), tty ? "" : "\n");
      std::fflush(stdout);
    }
  }
  const auto stop = std::chrono::steady_clock::now();
  if (tty) std::printf("\n");
  r.activation_bytes = model.activation_bytes() + loss.own_bytes();  // of a training step
  r.ms_per_step = std::chrono::duration<double, std::milli>(stop - start).count() / double(c.steps);
  const auto tx = rows_as<S>(test.x, 0, test.x.shape()[0]);
  // Evaluated with the layers' policy's loss (float sums), the same measure for every entry.
  nn::softmax_cross_entropy<typename Map::default_policy> eval_loss;
  const auto ev = nn::evaluate(ctx, model, eval_loss, tx, test.y);
  r.loss = ev.loss;
  r.accuracy = ev.accuracy;
  r.skipped = scaler.skipped_steps();
  r.final_scale = scaler.scale();
  r.param_bytes = model.parameter_bytes();
  r.optim_bytes = opt.state_bytes();
  if (r.name == "fp16_unsafe") {
    std::printf("\n%s\n", nn::describe(model).c_str());
  }
  return r;
}

void write_outputs(const config& c, const std::vector<result>& results) {
  std::filesystem::create_directories(c.out);
  const auto curves = c.out / "loss_curves.csv";
  {
    std::ofstream f(curves);
    f << "step";
    for (const auto& r : results) f << "," << r.name << "_loss," << r.name << "_scale," << r.name << "_skipped";
    f << "\n";
    for (std::size_t s = 0; s < c.steps; ++s) {
      f << s;
      for (const auto& r : results) {
        const auto& rec = r.records[s];
        f << "," << rec.loss << "," << rec.scale << "," << (rec.skipped ? 1 : 0);
      }
      f << "\n";
    }
  }
  const auto summary = c.out / "summary.csv";
  {
    std::ofstream f(summary);
    f << "policy,test_loss,test_accuracy,skipped_steps,final_scale,ms_per_step,param_bytes,optimizer_bytes,"
         "activation_bytes\n";
    for (const auto& r : results) {
      f << r.name << "," << r.loss << "," << r.accuracy << "," << r.skipped << "," << r.final_scale << ","
        << r.ms_per_step << "," << r.param_bytes << "," << r.optim_bytes << "," << r.activation_bytes << "\n";
    }
  }
  std::printf("\nwrote %s and %s\n", curves.string().c_str(), summary.string().c_str());

  const auto script = c.out / "plot.gp";
  const auto png = c.out / "loss_curves.png";
  std::ostringstream g;
  {
    g << "set terminal pngcairo size 1200,500 noenhanced\n"
      << "set output '" << png.string() << "'\n"
      << "set datafile separator ','\n"
      << "set key autotitle columnhead\n"
      << "set multiplot layout 1,2\n"
      << "set title 'training loss'\nset xlabel 'step'\nset ylabel 'loss'\nset logscale y\n"
      << "plot";
    for (std::size_t i = 0; i < results.size(); ++i) {
      g << (i ? ", " : " ") << "'" << curves.string() << "' using 1:" << 2 + 3 * i << " with lines lw 2";
    }
    g << "\nset title 'loss scale'\nset ylabel 'scale'\n"
      << "plot";
    for (std::size_t i = 0; i < results.size(); ++i) {
      g << (i ? ", " : " ") << "'" << curves.string() << "' using 1:" << 3 + 3 * i << " with lines lw 2";
    }
    g << "\nunset multiplot\n";
  }
  examples::draw_with_gnuplot(script, g.str(), png);
}

int check_ordering(const std::vector<result>& results) {
  const double reference = results[0].accuracy;
  int failures = 0;
  for (const auto& r : results) {
    const bool unsafe_policy = r.name == "fp16_unsafe";
    const double gap = reference - r.accuracy;
    const bool ok = unsafe_policy ? gap > 0.01 : gap <= 0.01;
    std::printf("check %-12s accuracy %.4f vs fp32 %.4f: %s\n", r.name.c_str(), r.accuracy, reference,
                ok ? (unsafe_policy ? "measurably worse, as expected" : "within 1%") : "UNEXPECTED");
    failures += ok ? 0 : 1;
  }
  return failures == 0 ? 0 : 1;
}

int usage(const char* self) {
  std::fprintf(stderr, "usage: %s [--steps N] [--micro M] [--seed S] [--out DIR] [--check] [--threads N]\n", self);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  config c;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto number = [&](long long min, auto& out) { return examples::next_count(argc, argv, i, min, out); };
    bool ok = true;
    if (a == "--steps") {
      ok = number(8, c.steps);
    } else if (a == "--micro") {
      ok = number(1, c.micro);
    } else if (a == "--seed") {
      ok = number(0, c.seed);
    } else if (a == "--threads") {
      ok = number(0, c.threads);
    } else if (a == "--out" && i + 1 < argc) {
      c.out = argv[++i];
    } else if (a == "--check") {
      c.check = true;
    } else {
      ok = false;
    }
    if (!ok) return usage(argv[0]);
  }
  try {
    std::printf("precis %d.%d policy sweep: MLP %zu-%zu-%zu-%zu-%zu, %zu steps of batch %zu, AdamW + warmup/cosine\n",
                PRECIS_VERSION_MAJOR, PRECIS_VERSION_MINOR, c.features, c.hidden, c.hidden, c.hidden, c.classes, c.steps, c.batch);
    const auto train = make_dataset(c, c.train_size, 11);
    const auto test = make_dataset(c, c.test_size, 12);
    std::vector<result> results;
    hana::for_each(sweep, [&](const auto& e) { results.push_back(train_one(e, c, train, test)); });

    std::vector<std::vector<std::string>> rows{{"policy", "test loss", "accuracy", "skipped", "final scale",
                                                "ms/step", "params", "optimizer", "activations", "layer-0 grads = 0", ""}};
    const auto num = examples::format;
    auto kib = [&](std::size_t b) { return num("%.0f KiB", double(b) / 1024.0); };
    for (const auto& r : results) {
      rows.push_back({r.name, num("%.4f", r.loss), num("%.2f%%", 100 * r.accuracy), std::to_string(r.skipped),
                      num("%g", r.final_scale), num("%.2f", r.ms_per_step), kib(r.param_bytes), kib(r.optim_bytes),
                      kib(r.activation_bytes), num("%.1f%%", 100 * r.zero_grads), r.note});
    }
    std::printf("\n%s", precis::detail::format_table(rows).c_str());
    write_outputs(c, results);
    return c.check ? check_ordering(results) : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "precis_demo: %s\n", e.what());
    return 1;
  }
}
