// DBNet trained on the synthetic text-detection set under several policy maps, all compiled
// into this binary from one blueprint (model.hpp), one loss (loss.hpp) and one Hana tuple
// of maps, and scored with the ICDAR 2015 protocol (evaluate.hpp).
//
//   example_dbnet [--epochs N] [--policy NAME[,NAME...]] [--threads N] [--batch N]
//                 [--train N] [--val N] [--size PX] [--width N] [--inner N] [--seed S]
//                 [--lr X] [--out DIR] [--check] [--time N] [--monitor N] [--advise FILE]
//                 [--device cpu|cuda]
//
// --device cuda runs example_dbnet_cuda (train_dbnet_cuda.cu; built with the CUDA backend)
// with the other options: the same models, data, recipe and outputs, trained on a GPU.
//
// The policies: fp32, fp32_hardware (fp32 with oneDNN's float products, as PyTorch's
// float32 runs its convolutions), bf16_mixed, fp16_mixed (dynamic scaler), fp16_fp32_head (float16
// backbone and neck, the heads in float; dynamic scaler), advised (the map
// precis::diagnostics::advise wrote from a monitored float run, advised_map.hpp; dynamic
// scaler) and fp16_seed_waived: the
// configuration whose float16 H-mean collapsed (float16 everywhere, the loss terms and the
// binarization's exp in float16, no loss scaler). That configuration does not compile
// (tests/compile_fail/dbnet_seed_*.cpp); here it is built with its three rules waived by
// unsafe<...>, which describe shows, and trained to show what happens.
//
// Under --out DIR (its data/ is written afresh):
//   data/train/, data/val/   the generated set in the ICDAR 2015 layout (img_N.png,
//                            gt_img_N.txt), read back through the ICDAR loader
//   <policy>/res_img_N.txt   each policy's validation detections (ICDAR submission format)
//   <policy>/detections.png  the first validation images, ground truth green (### grey),
//                            detections red
//   summary.csv              policy,epochs,precision,recall,hmean,skipped_steps,final_scale,
//                            ms_per_step,peak_rss_mib,cpu
//   curves.csv, steps.csv    per epoch (training loss, H-mean, scale) and per step (loss,
//                            scale, skipped, and the BCE, dice and L1 terms)
//   curves.png               training loss per step, H-mean per epoch, loss scale (gnuplot)
//
// Training: AdamW (weight decay on the convolution weights only), linear warmup over the
// first tenth of the steps, then cosine decay; batches in a seeded order, the same bits
// for a given seed, thread count and build. --check (CI) trains a small model briefly and
// exits non-zero unless every policy but the waived one trains to the end with finite
// losses, lowers its training loss and skips at most a tenth of its steps (bf16_mixed
// none), and the waived one meets NaN gradients. --time N times N training steps per policy
// (after 3 warm-up steps, on the first batch) and prints the best and the median, for
// bench/dbnet/compare.py's comparison with PyTorch.
//
// --monitor N observes every N-th step with precis::diagnostics::monitor (per layer, the
// ranges of activations and gradients against float16, bfloat16 and float8, and where the
// first non-finite value appeared): for each policy it prints the table and writes
// ranges_<policy>.csv, series_<policy>.csv and ranges_<policy>.png under --out.
// --advise FILE (with one --policy; implies --monitor 10 unless given) writes the policy
// map precis::diagnostics::advise draws from those measurements, as a C++ header.
#include "../monitor.hpp"
#include "run.hpp"
// After the tags (model.hpp, through run.hpp): the map the advisor wrote from a float run,
// and the ranges it measured, which rule d checks for every map below.
#include "advised_map.hpp"

#include <boost/hana.hpp>
#include <opencv2/imgcodecs.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <optional>
#include <set>
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

using namespace dbnet::run;

// ---- the maps: entries of one compile-time tuple ----

const auto sweep = hana::make_tuple(
    entry<decltype(make_policy_map(presets::fp32{})), no_scaling>{"fp32", "reference"},
    entry<decltype(make_policy_map(presets::fp32_hardware{})), no_scaling>{
        "fp32_hardware", "float, oneDNN's products"},
    entry<decltype(make_policy_map(presets::bf16_mixed{})), no_scaling>{"bf16_mixed",
                                                                        "bfloat16, no scaler"},
    entry<decltype(make_policy_map(presets::fp16_mixed{})), dynamic_scaler>{
        "fp16_mixed", "float16 + dynamic scaler"},
    entry<dbnet::fp16_fp32_head_map, dynamic_scaler>{"fp16_fp32_head",
                                              "float16 body, float heads, dynamic scaler"},
    entry<dbnet::seed_waived_map, no_scaling>{"fp16_seed_waived",
                                       "float16 loss and exp, no scaler: rules WAIVED"},
    entry<std::remove_cvref_t<decltype(advised_map)>, dynamic_scaler>{
        "advised", "advise()'s map from a float run"});

// ---- the data: written as ICDAR 2015 files, read back through the loader ----

/// The images and ground truth of an ICDAR 2015 folder (img_N.png, gt_img_N.txt).
dataset load_set(const std::filesystem::path& dir, std::size_t side) {
  dataset d;
  d.side = side;
  for (auto& s : dbnet::load_icdar_dir(dir)) {
    const std::string path = s.image.string();
    add_sample(d, cv::imread(path, cv::IMREAD_COLOR), std::move(s), path);
  }
  return d;
}

/// The synthetic set written afresh under o.out / "data" and read back: (train, val).
std::pair<dataset, dataset> make_sets(const options& o) {
  if (o.train < o.batch) throw error("example_dbnet: fewer training images than one batch");
  const auto train_dir = o.out / "data" / "train", val_dir = o.out / "data" / "val";
  std::filesystem::remove_all(train_dir);
  std::filesystem::remove_all(val_dir);
  const dbnet::synth_options so{.width = int(o.size), .height = int(o.size)};
  dbnet::write_synth_set(train_dir, o.seed, 0, o.train, so);
  dbnet::write_synth_set(val_dir, o.seed, 1'000'000, o.val, so);
  return {load_set(train_dir, o.size), load_set(val_dir, o.size)};
}

/// The first validation images with their ground truth (green, ### grey) and detections (red).
void draw_detections(const std::filesystem::path& png, const dataset& val,
                     const std::vector<std::vector<std::array<dbnet::point, 4>>>& found) {
  const std::size_t shown = std::min<std::size_t>(4, val.count);
  const int s = int(val.side);
  cv::Mat sheet(s, s * int(shown), CV_8UC3, cv::Scalar(0, 0, 0));
  auto poly = [](const std::array<dbnet::point, 4>& q) {
    std::vector<cv::Point> p;
    for (const auto& c : q) p.emplace_back(int(std::lround(c.x)), int(std::lround(c.y)));
    return std::vector<std::vector<cv::Point>>{p};
  };
  for (std::size_t i = 0; i < shown; ++i) {
    cv::Mat img = val.images[i].clone();
    for (const auto& r : val.samples[i].regions) {
      cv::polylines(img, poly(r.corners), true, dbnet::dont_care(r) ? cv::Scalar(150, 150, 150) : cv::Scalar(0, 200, 0), 1,
                    cv::LINE_AA);
    }
    for (const auto& q : found[i]) cv::polylines(img, poly(q), true, cv::Scalar(0, 0, 255), 1, cv::LINE_AA);
    img.copyTo(sheet(cv::Rect(int(i) * s, 0, s, s)));
  }
  if (!cv::imwrite(png.string(), sheet)) throw error("example_dbnet: cannot write " + png.string());
}

/// Probability maps for the whole validation set, scored; the detections kept per image.
template <class Model, class S>
dbnet::detection_scores evaluate(const cpu_context& ctx, Model& model, const dataset& val, std::size_t chunk,
                                 std::vector<std::vector<std::array<dbnet::point, 4>>>& found) {
  std::vector<std::size_t> order(val.count);
  std::iota(order.begin(), order.end(), std::size_t{0});
  host_tensor<float, 4> xf;
  host_tensor<S, 4> x;
  dbnet::match_counts total;
  found.assign(val.count, {});
  for (std::size_t first = 0; first < val.count; first += chunk) {
    const std::size_t n = std::min(chunk, val.count - first);
    gather(val, order, first, n, xf, nullptr, model.layout());
    x.resize(xf.shape());
    precis::cast(ctx, xf, x);
    const auto out = model.forward(ctx, x, nn::mode::eval);
    score_images(val, first, n, std::get<0>(out)->data(), found, total);
  }
  return dbnet::scores_of(total);
}

/// --time: the best and the median of o.time_steps training steps on the first batch,
/// after 3 warm-up steps (bench/dbnet/compare.py reads the line).
template <class Entry>
void time_one(const Entry& e, const options& o, const dbnet::config& dc, const dataset& train) {
  using Map = typename Entry::map;
  using S = nn::activation_type_t<typename Map::default_policy>;
  const cpu_context ctx{o.threads};
  auto model = nn::build<S, 4>(Map{}, dbnet::blueprint(dc), {.seed = o.seed, .layout = o.layout});
  dbnet::loss_t<Map, decltype(model)> loss;
  adamw opt(model.masters(), {.lr = o.lr, .weight_decay = o.weight_decay}, model.decay_mask(), ctx);
  typename Entry::scaler scaler;
  nn::trainer tr(model, loss, opt, scaler);
  std::vector<std::size_t> order(train.count);
  std::iota(order.begin(), order.end(), std::size_t{0});
  host_tensor<float, 4> xf;
  host_tensor<S, 4> x;
  dbnet::targets t;
  gather(train, order, 0, o.batch, xf, &t, o.layout);
  x.resize(xf.shape());
  precis::cast(ctx, xf, x);
  std::vector<double> ms;
  for (std::size_t s = 0; s < 3 + o.time_steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    (void)tr.step(ctx, x, t);
    if (s >= 3) ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  const std::string label = e.name == "bf16_mixed" ? "bf16" : std::string(e.name);
  std::printf("precis %s: width %zu inner %zu size %zu batch %zu threads %u%s: best %.1f ms/step, median %.1f "
              "ms/step\n",
              label.c_str(), dc.width, dc.inner, o.size, o.batch, ctx.thread_count(),
              o.layout == image_layout::nhwc ? " nhwc" : "", ms.front(), ms[ms.size() / 2]);
  std::fflush(stdout);
}

template <class Entry>
result train_one(const Entry& e, const options& o, const dbnet::config& dc, const dataset& train, const dataset& val) {
  using Map = typename Entry::map;
  using S = nn::activation_type_t<typename Map::default_policy>;
  examples::reset_peak_rss();
  const cpu_context ctx{o.threads};
  auto model = nn::build<S, 4>(Map{}, dbnet::blueprint(dc), {.seed = o.seed, .layout = o.layout});
  dbnet::loss_t<Map, decltype(model)> loss;
  const std::size_t per_epoch = train.count / o.batch, total = per_epoch * o.epochs;
  adamw opt(model.masters(), {.lr = o.lr, .weight_decay = o.weight_decay}, model.decay_mask(), ctx);
  warmup_cosine schedule(o.lr, std::max<std::size_t>(total / 10, 1), total, o.lr * 0.01);
  typename Entry::scaler scaler;
  nn::trainer tr(model, loss, opt, scaler, schedule);

  result r;
  r.name = std::string(e.name);
  r.policy = r.name;
  r.note = std::string(e.note);
  const bool tty = isatty(STDOUT_FILENO) != 0;
  std::optional<diagnostics::monitor> monitor;
  if (o.monitor_every != 0) monitor.emplace(diagnostics::monitor_options{.every = o.monitor_every});
  host_tensor<float, 4> xf;
  host_tensor<S, 4> x;
  dbnet::targets t;
  std::vector<std::vector<std::array<dbnet::point, 4>>> found;
  double train_seconds = 0;
  for (std::size_t ep = 0; ep < o.epochs && r.stopped.empty(); ++ep) {
    const auto order = examples::epoch_order(train.count, o.seed, ep);
    const auto t0 = std::chrono::steady_clock::now();
    double loss_sum = 0;
    std::size_t counted = 0;
    std::size_t applied = 0;
    for (std::size_t b = 0; b < per_epoch; ++b) {
      gather(train, order, b * o.batch, o.batch, xf, &t, o.layout);
      x.resize(xf.shape());
      precis::cast(ctx, xf, x);
      note_step(r, monitor ? tr.step(ctx, x, t, *monitor) : tr.step(ctx, x, t), applied, loss_sum, counted);
      r.terms.push_back(loss.terms());
      const auto& rec = r.records.back();
      if (tty && (b % 5 == 4 || b + 1 == per_epoch)) {
        std::printf("\r  %-17s epoch %zu/%zu  step %zu/%zu  loss %.4f  scale %g   ", r.name.c_str(), ep + 1, o.epochs,
                    b + 1, per_epoch, rec.loss, double(rec.next_scale));
        std::fflush(stdout);
      }
    }
    const auto t1 = std::chrono::steady_clock::now();
    train_seconds += std::chrono::duration<double>(t1 - t0).count();
    const auto sc = evaluate<decltype(model), S>(ctx, model, val, o.batch, found);
    epoch_record er;
    er.train_loss = counted ? loss_sum / double(counted) : std::nan("");
    er.precision = sc.precision;
    er.recall = sc.recall;
    er.hmean = sc.hmean;
    er.scale = double(scaler.scale());
    er.skipped = scaler.skipped_steps();
    er.seconds = std::chrono::duration<double>(t1 - t0).count();
    end_epoch(r, er, ep, o.epochs, applied, tty);
  }
  r.skipped = scaler.skipped_steps();
  r.final_scale = double(scaler.scale());
  r.param_bytes = model.parameter_bytes();
  r.optim_bytes = opt.state_bytes();
  r.activation_bytes = model.activation_bytes() + loss.own_bytes();
  r.peak_rss_mib = examples::peak_rss_mib();
  finish_run(r, o, val, found, train_seconds);
  draw_detections(o.out / r.name / "detections.png", val, found);
  if (monitor) examples::write_monitor(*monitor, o.out, r.name, o.advise, o.command);
  if (r.policy == "fp16_seed_waived") std::printf("%s", nn::describe(model).c_str());
  return r;
}

int usage(const char* self) {
  std::fprintf(stderr,
               "usage: %s [--epochs N] [--policy NAME[,NAME...]] [--threads N] [--batch N] "
               "[--train N] [--val N]\n"
               "          [--size PX] [--width N] [--inner N] [--seed S] [--lr X] [--out DIR] "
               "[--check] [--time N]\n"
               "          [--monitor N] [--advise FILE] [--layout nchw|nhwc] [--device cpu|cuda [--graph]]\n"
               "policies: fp32 fp32_hardware bf16_mixed fp16_mixed fp16_fp32_head fp16_seed_waived "
               "advised\n",
               self);
  return 2;
}

}  // namespace

#ifdef PRECIS_EXAMPLE_DBNET_CUDA
constexpr const char* device_program = PRECIS_EXAMPLE_DBNET_CUDA;  // example_dbnet_cuda (train_dbnet_cuda.cu)
#else
constexpr const char* device_program = nullptr;
#endif

int main(int argc, char** argv) {
  // --device cuda: the same models, data and recipe trained on a GPU, by example_dbnet_cuda.
  if (const int rc = examples::run_on_device("example_dbnet", device_program, argc, argv); rc >= 0) return rc;
  options o;
  o.command = examples::command_line(argc, argv);
  if (!parse(argc, argv, o, names_of(sweep))) return usage(argv[0]);
  if (o.graph) {
    std::fprintf(stderr, "example_dbnet: --graph captures device steps as CUDA graphs: the GPU run's (--device cuda)\n");
    return 2;
  }
  if (!o.advise.empty()) {
    if (o.policies.size() != 1) {
      std::fprintf(
          stderr, "example_dbnet: --advise takes the measurements of one run: name one --policy\n");
      return 2;
    }
    if (o.monitor_every == 0) o.monitor_every = 10;
  }
  try {
    const dbnet::config dc{.width = o.width, .inner = o.inner};
    dc.validate();
    // The data, written afresh and read back through the ICDAR 2015 loader.
    const auto [train, val] = make_sets(o);

    std::printf("CPU: %s, %u hardware threads; products: %s\n", examples::cpu_line().c_str(),
                std::thread::hardware_concurrency(), cpu_products_engine().c_str());
    std::printf("precis %d.%d DBNet on the synthetic set (seed %zu): %zu training and %zu validation images of %zu x %zu "
                "in %s; width %zu, inner %zu; batch %zu, %zu epochs, AdamW lr %g (warmup 1/10, cosine); %u threads\n",
                PRECIS_VERSION_MAJOR, PRECIS_VERSION_MINOR, o.seed, train.count, val.count, o.size, o.size,
                (o.out / "data").string().c_str(), o.width, o.inner, o.batch, o.epochs, o.lr,
                cpu_context{o.threads}.thread_count());
    if (o.time_steps > 0) {
      hana::for_each(sweep, [&](const auto& e) {
        if (o.policies.empty() || o.policies.contains(std::string(e.name))) time_one(e, o, dc, train);
      });
      return 0;
    }
    std::size_t failed = 0;
    const auto results = train_each("example_dbnet", sweep, o, "cpu", examples::cpu_line(), failed,
                                    [&](const auto& e) { return train_one(e, o, dc, train, val); });
    print_results(results);
    if (failed != 0) {
      std::fprintf(stderr, "example_dbnet: %zu map(s) failed\n", failed);
      return 1;
    }
    return o.check ? check(results) : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "example_dbnet: %s\n", e.what());
    return 1;
  }
}
