// The ViT example on a GPU: the model, data, recipe and outputs of example_vit (train_vit.cpp),
// with the whole training step on the device (nn::trainer on cuda_context).
//
//   example_vit_cuda [--epochs N] [--policy NAME[,NAME...]] [--batch N] [--train N] [--test N]
//                    [--seed S] [--lr X] [--data DIR] [--out DIR] [--graph] [--check]
//
// (example_vit --device cuda runs this program.) The images and labels are normalised on the
// host and uploaded once; each epoch uploads its shuffled order (examples::epoch_order, the
// CPU run's), and each step gathers its batch on the device, cast to the model's input type,
// into buffers at fixed addresses. The maps: fp32 (exact float products), tf32 (tensor-core
// TF32 products, the GPU's counterpart of fp32_hardware), bf16_mixed, fp16_mixed (with a
// dynamic loss scaler) and fp8_hybrid (vit::fp8_map: float8 linear products with device
// delayed scaling, a dynamic loss scaler). AdamW with the CPU run's options and schedule (a learning-rate table on
// the device), gradients clipped to norm 1. The host reads the step records at each epoch's
// end (and prints progress every 100 steps); evaluation runs on the device in batches of the
// training size (the last one padded, its extra rows not counted), the correct predictions
// counted there (nn::count_correct on device tensors). Timing is synchronised: the device
// is waited for before and after each epoch's steps. --graph runs each training step as a
// CUDA graph (train_options::graph: the first step eager, the second captured, the rest
// replayed), and names the maps with "_graph" appended in the outputs.
//
// Writes under --out summary.csv (the CPU run's columns, the last naming the GPU) and
// curves.csv (per epoch). --check trains each map for one short epoch (32 steps on 4,096
// images) and exits non-zero unless each reaches 40% test accuracy on 1,000 test images and
// ends within 3 points of fp32, bf16_mixed skipped no step and every test loss is finite.
#include <precis/nn/cuda.hpp>  // first: the device kernels, then nn

#include "../common.hpp"
#include "../device.hpp"
#include "../report.hpp"
#include "fashion_mnist.hpp"
#include "model.hpp"
#include "options.hpp"
#include "tables.hpp"

#include <boost/hana.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace hana = boost::hana;
using namespace precis;

namespace {

inline constexpr std::size_t depth = 4;  // the CPU example's

struct options : vit::run_options {
  options() { out = "vit_gpu_output"; }
  bool graph = false;
};

// Images normalised as the CPU run does ((p / 255 - mean) / sd, the training set's).
struct dataset {
  std::size_t count = 0, pixels = 0;
  std::vector<float> x;
  std::vector<std::int32_t> y;
};

dataset normalise(const vit::image_set& s, std::size_t limit, double mean, double sd) {
  dataset d;
  d.count = limit == 0 ? s.count : std::min(limit, s.count);
  d.pixels = s.rows * s.cols;
  d.x.resize(d.count * d.pixels);
  d.y.resize(d.count);
  for (std::size_t i = 0; i < d.x.size(); ++i) d.x[i] = float((double(s.pixels[i]) / 255.0 - mean) / sd);
  for (std::size_t i = 0; i < d.count; ++i) d.y[i] = std::int32_t(s.labels[i]);
  return d;
}

// A dataset in device memory, uploaded once.
struct device_set {
  std::size_t count, pixels;
  device_tensor<float, 1> x;
  device_tensor<std::int32_t, 1> y;
  explicit device_set(const dataset& d)
      : count(d.count), pixels(d.pixels), x(to_device(host_tensor_of(d.x))), y(to_device(host_tensor_of(d.y))) {}
  template <class T>
  static host_tensor<T, 1> host_tensor_of(const std::vector<T>& v) {
    auto t = host_tensor<T, 1>::from_shape({v.size()});
    std::copy(v.begin(), v.end(), t.begin());
    return t;
  }
};

// x[b] = images[order[first + b]] as S, y[b] = labels[...], for b < n; rows past the end of
// the order wrap to its start (the padding of a last evaluation batch).
template <class S>
__global__ void gather_batch(const float* images, const std::int32_t* labels, const std::int32_t* order,
                             std::size_t count, std::size_t first, std::size_t n, std::size_t pixels, S* x,
                             std::int32_t* y) {
  const std::size_t total = n * pixels;
  for (std::size_t e = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; e < total;
       e += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t b = e / pixels, p = e % pixels;
    const std::size_t item = std::size_t(order[(first + b) % count]);
    x[e] = S(images[item * pixels + p]);
    if (p == 0) y[b] = labels[item];
  }
}

template <class S>
void gather(cuda_context& ctx, const device_set& d, const device_tensor<std::int32_t, 1>& order, std::size_t first,
            device_tensor<S, 4>& x, device_tensor<std::int32_t, 1>& y) {
  const std::size_t n = x.shape()[0];
  gather_batch<S><<<detail::cuda::grid_for(n * d.pixels), 256, 0, ctx.stream()>>>(
      d.x.data(), d.y.data(), order.data(), d.count, first, n, d.pixels, x.data(), y.data());
  check(cudaGetLastError(), "example_vit_cuda: gather");
}

template <class Map, class Scaler>
struct entry {
  using map = Map;
  using scaler = Scaler;
  std::string_view name;
};

const auto sweep = hana::make_tuple(entry<decltype(make_policy_map(presets::fp32{})), no_scaling>{"fp32"},
                                    entry<decltype(make_policy_map(presets::tf32{})), no_scaling>{"tf32"},
                                    entry<decltype(make_policy_map(presets::bf16_mixed{})), no_scaling>{"bf16_mixed"},
                                    entry<decltype(make_policy_map(presets::fp16_mixed{})), dynamic_scaler>{"fp16_mixed"},
                                    entry<vit::fp8_map, dynamic_scaler>{"fp8_hybrid"});

struct epoch_record {
  double train_loss = 0, test_loss = 0, test_accuracy = 0, scale = 1, seconds = 0;
  std::size_t skipped = 0;
};

struct result {
  std::string name;    // in the outputs: the map's, with "_graph" under --graph
  std::string policy;  // the map's
  double accuracy = 0, test_loss = 0, ms_per_step = 0, final_scale = 1, peak_rss_mib = 0;
  std::size_t skipped = 0;
  std::vector<epoch_record> epochs;
};

// Loss and accuracy over the test set, in batches of the training size (the model's buffers
// keep their size: no allocation), the last padded.
template <class Model, class Loss, class S>
std::pair<double, double> evaluate_all(cuda_context& ctx, Model& model, Loss& loss, const device_set& test,
                                       const device_tensor<std::int32_t, 1>& identity, device_tensor<S, 4>& x,
                                       device_tensor<std::int32_t, 1>& y) {
  const std::size_t chunk = x.shape()[0];
  device_tensor<unsigned long long, 1> correct({1});
  check(cudaMemsetAsync(correct.data(), 0, sizeof(unsigned long long), ctx.stream()), "cudaMemsetAsync");
  double loss_sum = 0;
  for (std::size_t first = 0; first < test.count; first += chunk) {
    const std::size_t n = std::min(chunk, test.count - first);
    gather(ctx, test, identity, first, x, y);
    const auto& logits = model.forward(ctx, x, nn::mode::eval);
    nn::count_correct(ctx, logits, y, n, correct);  // on the device, the first n rows
    if (n == chunk) {
      loss_sum += double(to_host(loss.forward(ctx, logits, y), ctx.stream())(0)) * double(n);  // waits
    } else {  // the padded batch: the loss of its first n rows, from the logits on the host
      const auto h = to_host(logits, ctx.stream());
      const auto t = to_host(y, ctx.stream());
      for (std::size_t r = 0; r < n; ++r) {
        double m = -INFINITY, s = 0;
        for (std::size_t c = 0; c < h.shape()[1]; ++c) m = std::max(m, double(h(r, c)));
        for (std::size_t c = 0; c < h.shape()[1]; ++c) s += std::exp(double(h(r, c)) - m);
        loss_sum += m + std::log(s) - double(h(r, std::size_t(t(r))));
      }
    }
  }
  const double right = double(to_host(correct, ctx.stream())(0));
  return {loss_sum / double(test.count), right / double(test.count)};
}

template <class Entry>
result train_one(const Entry& e, const options& o, cuda_context& ctx, const device_set& train,
                 const device_set& test) {
  using Map = typename Entry::map;
  using S = nn::activation_type_t<typename Map::default_policy>;
  using LossPolicy = policy_for_t<vit::head, Map>;
  examples::reset_peak_rss();
  const vit::config vc;
  auto model = nn::build<S, 4, cuda_context>(Map{}, vit::blueprint<depth>(vc), {.seed = o.seed});
  model.refresh(ctx);
  nn::softmax_cross_entropy<LossPolicy, std::int32_t, cuda_context> loss;
  const std::size_t per_epoch = train.count / o.batch, total = per_epoch * o.epochs;
  warmup_cosine schedule(o.lr, std::max<std::size_t>(total / 10, 1), total, o.lr * 0.01);
  device_adamw opt(ctx, model.masters(), model.gradients(), {.lr = o.lr, .weight_decay = o.weight_decay},
                   model.decay_mask(), schedule.lr_table(total));
  typename Entry::scaler scaler;
  nn::trainer tr(ctx, model, loss, opt, scaler, {.max_grad_norm = 1.0, .graph = o.graph}, 128);
  device_tensor<S, 4> x({o.batch, 1, vc.image, vc.image});
  device_tensor<std::int32_t, 1> y({o.batch});
  std::vector<std::size_t> all(test.count);
  std::iota(all.begin(), all.end(), std::size_t{0});
  const auto identity = examples::upload_order(ctx, all);

  result r;
  r.policy = std::string(e.name);
  r.name = r.policy + (o.graph ? "_graph" : "");
  double train_seconds = 0;
  std::size_t skipped = 0;
  float scale = scaler.scale();
  for (std::size_t ep = 0; ep < o.epochs; ++ep) {
    const auto order = examples::upload_order(ctx, examples::epoch_order(train.count, o.seed, ep));
    ctx.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    double loss_sum = 0;
    std::size_t counted = 0;
    for (std::size_t b = 0; b < per_epoch; ++b) {
      gather(ctx, train, order, b * o.batch, x, y);
      tr.step(ctx, x, y);
      if (b % 100 == 99 || b + 1 == per_epoch) {  // reading the records waits for the device
        for (const auto& rec : tr.records(ctx)) {
          if (!rec.skipped) loss_sum += rec.loss, ++counted;
          skipped += rec.skipped ? 1 : 0;
          scale = rec.next_scale;
        }
        std::printf("\r  %-17s epoch %zu/%zu  step %zu/%zu  scale %g   ", r.name.c_str(), ep + 1, o.epochs, b + 1,
                    per_epoch, double(scale));
        std::fflush(stdout);
      }
    }
    ctx.synchronize();
    const auto t1 = std::chrono::steady_clock::now();
    train_seconds += std::chrono::duration<double>(t1 - t0).count();
    const auto [test_loss, accuracy] = evaluate_all(ctx, model, loss, test, identity, x, y);
    epoch_record er;
    er.train_loss = counted ? loss_sum / double(counted) : std::nan("");
    er.test_loss = test_loss;
    er.test_accuracy = accuracy;
    er.scale = double(scale);
    er.skipped = skipped;
    er.seconds = std::chrono::duration<double>(t1 - t0).count();
    r.epochs.push_back(er);
    std::printf("\r  %-17s epoch %2zu/%zu  train loss %.4f  test loss %.4f  test accuracy %6.2f%%  skipped %zu  "
                "scale %g  %.2f s\n",
                r.name.c_str(), ep + 1, o.epochs, er.train_loss, er.test_loss, 100 * er.test_accuracy, er.skipped,
                er.scale, er.seconds);
    std::fflush(stdout);
  }
  r.ms_per_step = 1000.0 * train_seconds / double(std::max<std::size_t>(total, 1));
  r.accuracy = r.epochs.back().test_accuracy;
  r.test_loss = r.epochs.back().test_loss;
  r.skipped = skipped;
  r.final_scale = double(scale);
  r.peak_rss_mib = examples::peak_rss_mib();
  return r;
}

void usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--epochs N] [--policy NAME[,NAME...]] [--batch N] [--train N] [--test N] [--seed S]\n"
               "          [--lr X] [--data DIR] [--out DIR] [--graph] [--check]\n"
               "policies: fp32 tf32 bf16_mixed fp16_mixed fp8_hybrid\n",
               argv0);
}

// summary.csv (its last column the GPU) and curves.csv under o.out, for the maps in `results`.
void write_outputs(const options& o, const std::vector<result>& results, const std::string& gpu) {
  examples::write_file(o.out / "summary.csv", vit::summary_csv(results, o.epochs, "gpu", gpu));
  examples::write_file(o.out / "curves.csv", vit::curves_csv(results, o.epochs));
  std::printf("wrote %s and curves.csv\n", (o.out / "summary.csv").string().c_str());
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  std::set<std::string> known;
  hana::for_each(sweep, [&](const auto& e) { known.insert(std::string(e.name)); });
  const std::set<std::string_view> cpu_only{"--threads", "--augment", "--init", "--distributed", "--monitor",
                                            "--advise"};
  for (int i = 1; i < argc; ++i) {
    bool ok = false;
    if (const auto shared = vit::read_shared_option(argc, argv, i, o, known, "example_vit_cuda")) {
      ok = *shared;
    } else if (std::string_view(argv[i]) == "--graph") {
      o.graph = ok = true;
    } else if (cpu_only.contains(argv[i])) {
      std::fprintf(stderr, "example_vit_cuda: %s is an option of the CPU run only (example_vit without --device cuda)\n",
                   argv[i]);
      return 2;
    }
    if (!ok) {
      usage(argv[0]);
      return 2;
    }
  }
  o.apply_check();
  int devices = 0;
  if (const cudaError_t status = cudaGetDeviceCount(&devices); status != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "example_vit_cuda: no CUDA device (%s)\n",
                 status != cudaSuccess ? cudaGetErrorString(status) : "none found");
    return 77;  // what CTest reports as skipped
  }
  try {
    const auto train_set = vit::load_fashion_mnist(o.data, vit::split::train);
    const auto test_set = vit::load_fashion_mnist(o.data, vit::split::test);
    const auto [mean, sd] = vit::statistics_of(train_set);  // the training set's, for both splits
    const auto train_h = normalise(train_set, o.train_size, mean, sd);
    const auto test_h = normalise(test_set, o.test_size, mean, sd);
    const vit::config vc;
    if (train_h.pixels != vc.image * vc.image) throw error("example_vit_cuda: the images are not 28 x 28");
    if (train_h.count < o.batch) throw error("example_vit_cuda: fewer training images than one batch");
    const std::string gpu = examples::gpu_name();
    cuda_context ctx;
    const device_set train(train_h), test(test_h);
    std::printf("GPU: %s\n", gpu.c_str());
    std::printf("precis %d.%d ViT on Fashion-MNIST on the GPU: patch %zu, width %zu, %zu heads, depth %zu; %zu "
                "training and %zu test images; batch %zu, %zu epochs, AdamW lr %g (warmup 1/10, cosine), "
                "no augmentation\n",
                PRECIS_VERSION_MAJOR, PRECIS_VERSION_MINOR, vc.patch, vc.width, vc.heads, depth, train.count,
                test.count, o.batch, o.epochs, o.lr);
    std::filesystem::create_directories(o.out);
    // Each map's outputs are written as it ends, so that a run stopped by a time limit keeps
    // the maps that finished; a map that throws is reported and the next one runs.
    std::vector<result> results;
    std::size_t failed = 0;
    hana::for_each(sweep, [&](const auto& e) {
      if (!o.policies.empty() && !o.policies.count(std::string(e.name))) return;
      try {
        results.push_back(train_one(e, o, ctx, train, test));
      } catch (const std::exception& ex) {
        std::fprintf(stderr, "example_vit_cuda: %s: %s\n", std::string(e.name).c_str(), ex.what());
        ++failed;
        return;
      }
      write_outputs(o, results, gpu);
    });
    std::printf("\n%-17s %9s %8s %8s %12s\n", "policy", "accuracy", "skipped", "scale", "ms/step");
    for (const auto& r : results) {
      std::printf("%-17s %8.2f%% %8zu %8g %12.3f\n", r.name.c_str(), 100 * r.accuracy, r.skipped, r.final_scale,
                  r.ms_per_step);
    }
    if (failed != 0) {
      std::fprintf(stderr, "example_vit_cuda: %zu map(s) failed\n", failed);
      return 1;
    }
    if (o.check) {
      bool ok = true;
      double fp32 = -1;
      for (const auto& r : results) {
        if (r.policy == "fp32") fp32 = r.accuracy;
      }
      for (const auto& r : results) {
        const bool good = r.accuracy >= 0.4 && std::isfinite(r.test_loss) && (fp32 < 0 || r.accuracy >= fp32 - 0.03) &&
                          (r.policy != "bf16_mixed" || r.skipped == 0);
        if (!good) std::printf("check failed: %s\n", r.name.c_str());
        ok = ok && good;
      }
      return ok ? 0 : 1;
    }
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "example_vit_cuda: %s\n", ex.what());
    return 1;
  }
  return 0;
}
