// The DBNet example on a GPU: the models, synthetic data, recipe and outputs of example_dbnet
// (train_dbnet.cpp, through run.hpp), with the whole training step on the device
// (nn::trainer on cuda_context, the device DB loss of loss_cuda.hpp).
//
//   example_dbnet_cuda [--epochs N] [--policy NAME[,NAME...]] [--batch N] [--train N]
//                      [--val N] [--size PX] [--width N] [--inner N] [--seed S] [--lr X]
//                      [--out DIR] [--check] [--time N] [--layout nchw|nhwc] [--graph]
//
// (example_dbnet --device cuda runs this program.) The images are normalised and the targets
// made on the host, then uploaded once; each epoch uploads its shuffled order
// (examples::epoch_order, the CPU run's), and each step gathers its batch on the device, cast
// to the model's input type, into buffers at fixed addresses. The maps: fp32 (exact float
// products), tf32 (tensor-core TF32 products, the GPU's counterpart of fp32_hardware),
// bf16_mixed, fp16_mixed and fp16_fp32_head (with a dynamic loss scaler), and
// fp16_seed_waived, the configuration whose float16 H-mean collapsed, built with its rules
// waived. AdamW with the CPU run's options and schedule (a learning-rate table on the device).
//
// The host reads the step records every 50 steps and at each epoch's end, and the loss's
// three terms at each epoch's end only (steps.csv has them on those steps; a step reads
// nothing on the host). Validation runs on the device in batches of the training size (the
// last one padded); each batch's probability logits are downloaded for the post-processing
// (OpenCV, on the host). Timing is synchronised: the device is waited for before and after
// each epoch's steps. --time N times N synchronised steps per map after 3 warm-up steps.
// --graph runs each training step as a CUDA graph (train_options::graph: the first step on a
// batch's buffers eager, the second captured, the rest replayed), timed steps included, and
// names the maps with "_graph" appended in the outputs.
//
// The synthetic set is made in memory (synthesize_set: the images and ground truth that
// example_dbnet writes as ICDAR files and reads back), so that the program links no image
// codec. Writes under --out what example_dbnet writes but the pictures, summary.csv's last
// column naming the GPU.
// --check: as example_dbnet's (every map but the waived one lowers its loss and skips at
// most a tenth of its steps; the waived one meets NaN gradients). Exits 77 without a GPU.
#include <precis/nn/cuda.hpp>  // first: the device kernels, then nn

#include "../device.hpp"
#include "loss_cuda.hpp"
#include "run.hpp"

#include <boost/hana.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include <unistd.h>

namespace hana = boost::hana;
using namespace precis;

namespace {

using namespace dbnet::run;

const auto sweep = hana::make_tuple(
    entry<decltype(make_policy_map(presets::fp32{})), no_scaling>{"fp32", "reference"},
    entry<decltype(make_policy_map(presets::tf32{})), no_scaling>{"tf32", "float, TF32 tensor-core products"},
    entry<decltype(make_policy_map(presets::bf16_mixed{})), no_scaling>{"bf16_mixed", "bfloat16, no scaler"},
    entry<decltype(make_policy_map(presets::fp16_mixed{})), dynamic_scaler>{"fp16_mixed", "float16 + dynamic scaler"},
    entry<dbnet::fp16_fp32_head_map, dynamic_scaler>{"fp16_fp32_head", "float16 body, float heads, dynamic scaler"},
    entry<dbnet::seed_waived_map, no_scaling>{"fp16_seed_waived", "float16 loss and exp, no scaler: rules WAIVED"});

// A dataset in device memory, uploaded once; its images [3, side, side] each, or [side,
// side, 3] for a channels-last model.
struct device_set {
  std::size_t count, side;
  device_tensor<float, 1> x, shrink, shrink_mask, thresh, thresh_mask;
  device_set(const dataset& d, image_layout layout)
      : count(d.count),
        side(d.side),
        x(upload(layout == image_layout::nhwc ? channels_last(d) : d.x)),
        shrink(upload(d.shrink)),
        shrink_mask(upload(d.shrink_mask)),
        thresh(upload(d.thresh)),
        thresh_mask(upload(d.thresh_mask)) {}
  static std::vector<float> channels_last(const dataset& d) {
    const std::size_t px = d.side * d.side;
    std::vector<float> out(d.x.size());
    for (std::size_t i = 0; i < d.count; ++i) {
      for (std::size_t q = 0; q < px; ++q) {
        for (std::size_t c = 0; c < 3; ++c) out[(i * px + q) * 3 + c] = d.x[(i * 3 + c) * px + q];
      }
    }
    return out;
  }
  static device_tensor<float, 1> upload(const std::vector<float>& v) {
    auto t = host_tensor<float, 1>::from_shape({v.size()});
    std::copy(v.begin(), v.end(), t.begin());
    return to_device(t);
  }
};

// Sample b of the batch is item order[(first + b) % count]: its image (3 * pixels values in
// the set's layout), cast to S, and its four target maps (the padding of a last validation
// batch wraps to the order's start).
template <class S>
__global__ void gather_batch(const float* images, const float* s, const float* sm, const float* t, const float* tm,
                             const std::int32_t* order, std::size_t count, std::size_t first, std::size_t n,
                             std::size_t pixels, S* x, float* ys, float* ysm, float* yt, float* ytm) {
  const std::size_t total = n * 3 * pixels;
  for (std::size_t e = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; e < total;
       e += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t b = e / (3 * pixels), q = e % (3 * pixels);
    const std::size_t item = std::size_t(order[(first + b) % count]);
    x[e] = S(images[item * 3 * pixels + q]);
    if (q < pixels) {
      const std::size_t from = item * pixels + q, to = b * pixels + q;
      ys[to] = s[from];
      ysm[to] = sm[from];
      yt[to] = t[from];
      ytm[to] = tm[from];
    }
  }
}

// The batch buffers a run steps on: images [n, 3, side, side] and one-channel maps [n, 1,
// side, side], or channels-last [n, side, side, 3] and [n, side, side, 1].
template <class S>
struct batch {
  device_tensor<S, 4> x;
  dbnet::device_targets y;
  batch(std::size_t n, std::size_t side, image_layout layout)
      : x(shape(layout, n, 3, side)),
        y{device_tensor<float, 4>(shape(layout, n, 1, side)), device_tensor<float, 4>(shape(layout, n, 1, side)),
          device_tensor<float, 4>(shape(layout, n, 1, side)), device_tensor<float, 4>(shape(layout, n, 1, side))} {}
  static std::array<std::size_t, 4> shape(image_layout layout, std::size_t n, std::size_t c, std::size_t side) {
    return image_shape(layout, n, c, side, side);
  }
  void gather(cuda_context& ctx, const device_set& d, const device_tensor<std::int32_t, 1>& order, std::size_t first) {
    const std::size_t n = x.shape()[0], pixels = d.side * d.side;
    gather_batch<S><<<precis::detail::cuda::grid_for(n * 3 * pixels), 256, 0, ctx.stream()>>>(
        d.x.data(), d.shrink.data(), d.shrink_mask.data(), d.thresh.data(), d.thresh_mask.data(), order.data(),
        d.count, first, n, pixels, x.data(), y.shrink.data(), y.shrink_mask.data(), y.thresh.data(),
        y.thresh_mask.data());
    check(cudaGetLastError(), "example_dbnet_cuda: gather");
  }
};

// Probability maps for the whole validation set on the device, scored on the host.
template <class Model, class S>
dbnet::detection_scores evaluate(cuda_context& ctx, Model& model, const dataset& val, const device_set& dval,
                                 const device_tensor<std::int32_t, 1>& identity, batch<S>& b,
                                 std::vector<std::vector<std::array<dbnet::point, 4>>>& found) {
  const std::size_t chunk = b.x.shape()[0];
  dbnet::match_counts total;
  found.assign(val.count, {});
  for (std::size_t first = 0; first < val.count; first += chunk) {
    const std::size_t n = std::min(chunk, val.count - first);
    b.gather(ctx, dval, identity, first);
    const auto out = model.forward(ctx, b.x, nn::mode::eval);
    const auto logits = to_host(*std::get<0>(out), ctx.stream());  // waits
    score_images(val, first, n, logits.data(), found, total);
  }
  return dbnet::scores_of(total);
}

template <class Entry>
result train_one(const Entry& e, const options& o, const dbnet::config& dc, cuda_context& ctx, const dataset& val,
                 const device_set& train, const device_set& dval) {
  using Map = typename Entry::map;
  using S = nn::activation_type_t<typename Map::default_policy>;
  examples::reset_peak_rss();
  auto model = nn::build<S, 4, cuda_context>(Map{}, dbnet::blueprint(dc), {.seed = o.seed, .layout = o.layout});
  model.refresh(ctx);
  dbnet::loss_t<Map, decltype(model)> loss;
  const std::size_t per_epoch = train.count / o.batch, total = per_epoch * o.epochs;
  warmup_cosine schedule(o.lr, std::max<std::size_t>(total / 10, 1), total, o.lr * 0.01);
  device_adamw opt(ctx, model.masters(), model.gradients(), {.lr = o.lr, .weight_decay = o.weight_decay},
                   model.decay_mask(), schedule.lr_table(total));
  typename Entry::scaler scaler;
  nn::trainer tr(ctx, model, loss, opt, scaler, {.graph = o.graph}, 128);
  batch<S> b(o.batch, train.side, o.layout);
  std::vector<std::size_t> all(val.count);
  std::iota(all.begin(), all.end(), std::size_t{0});
  const auto identity = examples::upload_order(ctx, all);

  result r;
  r.policy = std::string(e.name);
  r.name = r.policy + (o.graph ? "_graph" : "");
  r.note = std::string(e.note);
  const bool tty = isatty(STDOUT_FILENO) != 0;
  std::vector<std::vector<std::array<dbnet::point, 4>>> found;
  double train_seconds = 0;
  float scale = scaler.scale();
  std::size_t skipped = 0;
  for (std::size_t ep = 0; ep < o.epochs && r.stopped.empty(); ++ep) {
    const auto order = examples::upload_order(ctx, examples::epoch_order(train.count, o.seed, ep));
    ctx.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    double loss_sum = 0;
    std::size_t counted = 0, applied = 0;
    for (std::size_t s = 0; s < per_epoch; ++s) {
      b.gather(ctx, train, order, s * o.batch);
      tr.step(ctx, b.x, b.y);
      if (s % 50 == 49 || s + 1 == per_epoch) {  // reading the records waits for the device
        const auto recs = tr.records(ctx);
        for (std::size_t i = 0; i < recs.size(); ++i) {
          note_step(r, recs[i], applied, loss_sum, counted);
          skipped += recs[i].skipped ? 1 : 0;
          scale = recs[i].next_scale;
          // The terms are read at the epoch's end only (the last step's); NaN elsewhere.
          const bool last = s + 1 == per_epoch && i + 1 == recs.size();
          r.terms.push_back(last ? loss.terms(ctx) : dbnet::loss_terms{NAN, NAN, NAN, 0, 0});
        }
        if (tty) {
          std::printf("\r  %-17s epoch %zu/%zu  step %zu/%zu  loss %.4f  scale %g   ", r.name.c_str(), ep + 1,
                      o.epochs, s + 1, per_epoch, r.records.back().loss, double(scale));
          std::fflush(stdout);
        }
      }
    }
    ctx.synchronize();
    const auto t1 = std::chrono::steady_clock::now();
    train_seconds += std::chrono::duration<double>(t1 - t0).count();
    const auto sc = evaluate<decltype(model), S>(ctx, model, val, dval, identity, b, found);
    epoch_record er;
    er.train_loss = counted ? loss_sum / double(counted) : std::nan("");
    er.precision = sc.precision;
    er.recall = sc.recall;
    er.hmean = sc.hmean;
    er.scale = double(scale);
    er.skipped = skipped;
    er.seconds = std::chrono::duration<double>(t1 - t0).count();
    end_epoch(r, er, ep, o.epochs, applied, tty);
  }
  tr.store_scaler(ctx);
  r.skipped = skipped;
  r.final_scale = double(scale);
  r.param_bytes = model.parameter_bytes();
  r.optim_bytes = opt.state_bytes();
  r.activation_bytes = model.activation_bytes() + loss.own_bytes();
  r.peak_rss_mib = examples::peak_rss_mib();
  finish_run(r, o, val, found, train_seconds);
  if (std::string_view(e.name) == "fp16_seed_waived") std::printf("%s", nn::describe(model).c_str());
  return r;
}

// --time: the best and the median of o.time_steps synchronised steps on the first batch,
// after 3 warm-up steps.
template <class Entry>
void time_one(const Entry& e, const options& o, const dbnet::config& dc, cuda_context& ctx, const device_set& train) {
  using Map = typename Entry::map;
  using S = nn::activation_type_t<typename Map::default_policy>;
  auto model = nn::build<S, 4, cuda_context>(Map{}, dbnet::blueprint(dc), {.seed = o.seed, .layout = o.layout});
  model.refresh(ctx);
  dbnet::loss_t<Map, decltype(model)> loss;
  device_adamw opt(ctx, model.masters(), model.gradients(), {.lr = o.lr, .weight_decay = o.weight_decay},
                   model.decay_mask(), 3 + o.time_steps);
  typename Entry::scaler scaler;
  nn::trainer tr(ctx, model, loss, opt, scaler, {.graph = o.graph});
  batch<S> b(o.batch, train.side, o.layout);
  std::vector<std::size_t> all(train.count);
  std::iota(all.begin(), all.end(), std::size_t{0});
  const auto order = examples::upload_order(ctx, all);
  b.gather(ctx, train, order, 0);
  std::vector<double> ms;
  for (std::size_t s = 0; s < 3 + o.time_steps; ++s) {
    ctx.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    tr.step(ctx, b.x, b.y);
    ctx.synchronize();
    if (s >= 3) ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  (void)tr.records(ctx);
  std::sort(ms.begin(), ms.end());
  std::printf("precis %s%s: width %zu inner %zu size %zu batch %zu%s on the GPU: best %.2f ms/step, median %.2f ms/step\n",
              std::string(e.name).c_str(), o.graph ? "_graph" : "", dc.width, dc.inner, o.size, o.batch,
              o.layout == image_layout::nhwc ? " nhwc" : "", ms.front(), ms[ms.size() / 2]);
  std::fflush(stdout);
}

int usage(const char* self) {
  std::fprintf(stderr,
               "usage: %s [--epochs N] [--policy NAME[,NAME...]] [--batch N] [--train N] [--val N]\n"
               "          [--size PX] [--width N] [--inner N] [--seed S] [--lr X] [--out DIR] [--check] [--time N]\n"
               "          [--layout nchw|nhwc] [--graph]\n"
               "policies: fp32 tf32 bf16_mixed fp16_mixed fp16_fp32_head fp16_seed_waived\n",
               self);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  if (!parse(argc, argv, o, names_of(sweep))) return usage(argv[0]);
  if (o.monitor_every != 0 || !o.advise.empty() || o.threads != 0) {
    std::fprintf(stderr, "example_dbnet_cuda: --monitor, --advise and --threads are the CPU run's (example_dbnet)\n");
    return 2;
  }
  int devices = 0;
  if (const cudaError_t status = cudaGetDeviceCount(&devices); status != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "example_dbnet_cuda: no CUDA device (%s)\n",
                 status != cudaSuccess ? cudaGetErrorString(status) : "none found");
    return 77;  // what CTest reports as skipped
  }
  try {
    const dbnet::config dc{.width = o.width, .inner = o.inner};
    dc.validate();
    if (o.train < o.batch) throw error("example_dbnet_cuda: fewer training images than one batch");
    // The synthetic set made in memory: the images and ground truth example_dbnet writes and
    // reads back (this program reads and writes no image file).
    const dataset train = synthesize_set(o.seed, 0, o.train, o.size);
    const dataset val = synthesize_set(o.seed, 1'000'000, o.val, o.size);
    const std::string gpu = examples::gpu_name();
    std::printf("GPU: %s; CPU: %s\n", gpu.c_str(), examples::cpu_line().c_str());
    std::printf("precis %d.%d DBNet on the synthetic set (seed %zu) on the GPU: %zu training and %zu validation images "
                "of %zu x %zu in %s; width %zu, inner %zu; batch %zu, %zu epochs, AdamW lr %g (warmup 1/10, cosine)\n",
                PRECIS_VERSION_MAJOR, PRECIS_VERSION_MINOR, o.seed, train.count, val.count, o.size, o.size,
                (o.out / "data").string().c_str(), o.width, o.inner, o.batch, o.epochs, o.lr);
    cuda_context ctx;
    const device_set dtrain(train, o.layout), dval(val, o.layout);
    if (o.time_steps > 0) {
      hana::for_each(sweep, [&](const auto& e) {
        if (o.policies.empty() || o.policies.contains(std::string(e.name))) time_one(e, o, dc, ctx, dtrain);
      });
      return 0;
    }
    std::size_t failed = 0;
    const auto results = train_each("example_dbnet_cuda", sweep, o, "gpu", gpu, failed,
                                    [&](const auto& e) { return train_one(e, o, dc, ctx, val, dtrain, dval); });
    print_results(results);
    if (failed != 0) {
      std::fprintf(stderr, "example_dbnet_cuda: %zu map(s) failed\n", failed);
      return 1;
    }
    return o.check ? check(results) : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "example_dbnet_cuda: %s\n", e.what());
    return 1;
  }
}
