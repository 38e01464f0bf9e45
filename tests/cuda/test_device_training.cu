// nn::trainer on the device against nn::trainer on the host: a small classifier built from
// one blueprint with the same masters, trained for five steps on the same batches (the
// third holding an infinite input, so that both skip it), under bf16_mixed without a scaler
// and fp16_mixed with a dynamic scaler, with clipping. The records agree: the same skipped
// steps, scales and learning rates, losses and norms within bounds; the optimizer's step
// count is the host's. The same for a small ViT (the example's blueprint), and for steps of
// two micro-batches (also replayed as a graph). Then a step
// captured as a CUDA graph and replayed gives the bits of the same steps run eagerly (also
// when train_options::max_graphs drops graphs, and for an image model with a batch norm
// and its fused ReLU, and for the small ViT, whose attention runs fused where the build has the
// cuDNN frontend), a capture on a shape no step has run is refused and training goes on
// eagerly, a smaller batch allocates nothing, a
// device model's checkpoint goes through the host's file format and back with the same
// bits, and the device's memory pool keeps what a step frees across synchronisations.
// Exits 77 (skipped) where no GPU is present.
#include <precis/nn/cuda.hpp>  // first: the device kernels, then nn

#include "../../examples/vit/model.hpp"
#include "nn_compare.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using namespace precis_test;
using namespace precis;

constexpr std::size_t batch = 96, features = 24, classes = 10, steps = 5;

// n class targets on the device, every one class 0.
device_tensor<std::int32_t, 1> class_zero(std::size_t n) {
  auto t = host_tensor<std::int32_t, 1>::from_shape({n});
  t.fill(0);
  return to_device(t);
}

auto classifier() { return nn::seq(nn::linear<fc1>(features, 48), nn::gelu(), nn::linear<fc2>(48, classes)); }

template <class S, std::size_t R>
struct batch_data_r {
  host_tensor<S, R> x;
  host_tensor<std::int32_t, 1> t;
};

// `steps` batches of inputs of shape x_shape and class targets; the third holds an
// infinite input.
template <class S, std::size_t R = 2>
std::vector<batch_data_r<S, R>> batches(const std::array<std::size_t, R>& x_shape = {batch, features}) {
  std::vector<batch_data_r<S, R>> out;
  std::uniform_int_distribution<int> cls(0, int(classes) - 1);
  for (std::size_t i = 0; i < steps; ++i) {
    batch_data_r<S, R> b{random_tensor<S, R>(x_shape), host_tensor<std::int32_t, 1>::from_shape({x_shape[0]})};
    for (auto& v : b.t) v = cls(rng);
    if (i == 2) b.x.data()[5] = S(std::numeric_limits<float>::infinity());
    out.push_back(std::move(b));
  }
  return out;
}

// Every master of a model, host or device, in its parameters' order.
template <class Model>
std::vector<float> masters_of(Model& m) {
  std::vector<float> out;
  m.for_each_parameter([&](const std::string&, auto& p) {
    if constexpr (std::is_same_v<typename Model::context_type, cpu_context>) {
      out.insert(out.end(), p.master().begin(), p.master().end());
    } else {
      const auto h = to_host(p.master());
      out.insert(out.end(), h.begin(), h.end());
    }
  });
  return out;
}

// The optimizer wrote the working copies as it stepped (the refresh fused into its update):
// each is its master rounded to nearest-even, as parameter::refresh() rounds it.
template <class Model>
bool working_copies_follow_masters(Model& m) {
  bool ok = true;
  m.for_each_parameter([&](const std::string&, const auto& p) {
    using S = typename std::remove_cvref_t<decltype(p)>::storage_type;
    if constexpr (!std::is_same_v<S, float>) {
      const auto w = to_host(p.value());
      const auto mm = to_host(p.master());
      for (std::size_t i = 0; i < w.size(); ++i) {
        ok = ok && w.data()[i].bits() == convert<S, rounding::nearest_even, overflow::infinity>(mm.data()[i]).bits();
      }
    }
  });
  return ok;
}

template <class P, class Scaler, std::size_t R = 2, class Blueprint = decltype(classifier())>
void check_training(cuda_context& ctx, const std::string& tag, const Blueprint& blueprint = classifier(),
                    const std::array<std::size_t, R>& x_shape = {batch, features}) {
  using S = typename P::storage_type;
  const cpu_context cpu{2};
  const auto data = batches<S, R>(x_shape);
  const adamw_options o{.lr = 3e-3, .weight_decay = 0.01};
  const nn::train_options to{.max_grad_norm = 0.5};

  auto host = nn::build<S, R>(P{}, blueprint, {.seed = 11});
  nn::softmax_cross_entropy<P> host_loss;
  adamw host_opt(host.masters(), o, host.decay_mask());
  Scaler host_scaler;
  nn::trainer host_train(host, host_loss, host_opt, host_scaler, to);

  auto dev = nn::build<S, R, cuda_context>(P{}, blueprint, {.seed = 11});
  nn::copy_masters(ctx, host, dev);
  nn::softmax_cross_entropy<P, std::int32_t, cuda_context> dev_loss;
  device_adamw dev_opt(ctx, dev.masters(), dev.gradients(), o, dev.decay_mask(), 16);
  Scaler dev_scaler;
  nn::trainer dev_train(ctx, dev, dev_loss, dev_opt, dev_scaler, to, 3);  // a ring of 3: one wait

  std::vector<nn::step_record> want;
  std::vector<device_tensor<S, R>> xs;
  std::vector<device_tensor<std::int32_t, 1>> ts;
  for (const auto& b : data) {
    want.push_back(host_train.step(cpu, b.x, b.t));
    xs.push_back(to_device(b.x));
    ts.push_back(to_device(b.t));
    dev_train.step(ctx, xs.back(), ts.back());
  }
  const auto got = dev_train.records(ctx);
  expect(got.size() == want.size(), tag + ": one record per step");
  for (std::size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    const std::string at = tag + " step " + std::to_string(i + 1);
    expect(got[i].step == want[i].step, at + ": index");
    expect(got[i].skipped == want[i].skipped, at + ": skipped as on the host");
    expect(got[i].skipped == (i == 2), at + ": only the step with an infinite input is skipped");
    expect(got[i].scale == want[i].scale && got[i].next_scale == want[i].next_scale, at + ": scales");
    expect(got[i].lr == want[i].lr, at + ": learning rate");
    if (!want[i].skipped) {
      expect(std::abs(got[i].loss - want[i].loss) <= 2 * bound<S>() * std::abs(want[i].loss), at + ": loss");
      expect(std::abs(got[i].grad_norm - want[i].grad_norm) <= 0.05 * want[i].grad_norm, at + ": gradient norm");
    }
  }
  expect(dev_opt.steps(ctx) == host_opt.steps(), tag + ": applied steps");
  // AdamW moves each weight by about lr per applied step whatever the gradient: the
  // masters stay within a few steps' worth of the host's.
  const auto a = masters_of(host), b = masters_of(dev);
  double err = 0;
  for (std::size_t i = 0; i < a.size(); ++i) err = std::max(err, std::abs(double(a[i]) - double(b[i])));
  expect(std::isfinite(err) && err <= 2 * o.lr * double(steps), tag + ": masters near the host's");
  dev_train.store_scaler(ctx);
  expect(dev_scaler.scale() == host_scaler.scale(), tag + ": the stored scale is the host's");
  expect(working_copies_follow_masters(dev), tag + ": the fused refresh wrote each working copy from its master");
}

// Two runs' step records have the same bits: losses and gradient norms compared as bits, not
// with == (a skipped step's norm is NaN), the skips, scales and learning rates equal.
bool same_record_bits(const std::vector<nn::step_record>& r1, const std::vector<nn::step_record>& r2) {
  bool same = r1.size() == r2.size();
  for (std::size_t i = 0; same && i < r1.size(); ++i) {
    same = std::memcmp(&r1[i].loss, &r2[i].loss, sizeof(double)) == 0 && r1[i].skipped == r2[i].skipped &&
           r1[i].scale == r2[i].scale && r1[i].lr == r2[i].lr &&
           std::memcmp(&r1[i].grad_norm, &r2[i].grad_norm, sizeof(double)) == 0;
  }
  return same;
}

// A host model and two device models of classifier() with its masters, each device model
// with its loss, AdamW (a table of `table` steps) and scaler: the graph tests run one eagerly
// and one through CUDA graphs, side by side, on every batch of batches() uploaded (xs, ts).
template <class P, class Scaler>
struct twins {
  using S = typename P::storage_type;
  using device_model = decltype(nn::build<S, 2, cuda_context>(P{}, classifier()));
  const std::vector<batch_data_r<S, 2>> data = batches<S>();
  decltype(nn::build<S, 2>(P{}, classifier())) host = nn::build<S, 2>(P{}, classifier(), {.seed = 5});
  device_model eager = nn::build<S, 2, cuda_context>(P{}, classifier(), {.seed = 5});
  device_model graph = nn::build<S, 2, cuda_context>(P{}, classifier(), {.seed = 5});
  nn::softmax_cross_entropy<P, std::int32_t, cuda_context> l1, l2;
  device_adamw o1, o2;
  Scaler s1, s2;
  std::vector<device_tensor<S, 2>> xs;
  std::vector<device_tensor<std::int32_t, 1>> ts;

  // `table`: the number of steps at the options' learning rate, or each step's rate.
  template <class Table>
  twins(cuda_context& ctx, const adamw_options& o, const Table& table)
      : o1(ctx, eager.masters(), eager.gradients(), o, eager.decay_mask(), table),
        o2(ctx, graph.masters(), graph.gradients(), o, graph.decay_mask(), table) {
    nn::copy_masters(ctx, host, eager);
    nn::copy_masters(ctx, host, graph);
    for (const auto& d : data) {
      xs.push_back(to_device(d.x));
      ts.push_back(to_device(d.t));
    }
  }
  // Batch i copied into the buffers (x, t) on ctx's stream, as a training loop gathers one.
  void gather(cuda_context& ctx, std::size_t i, device_tensor<S, 2>& x, device_tensor<std::int32_t, 1>& t) const {
    check(cudaMemcpyAsync(x.data(), xs[i].data(), x.size() * sizeof(S), cudaMemcpyDeviceToDevice, ctx.stream()),
          "cudaMemcpyAsync");
    check(cudaMemcpyAsync(t.data(), ts[i].data(), t.size() * sizeof(std::int32_t), cudaMemcpyDeviceToDevice,
                          ctx.stream()),
          "cudaMemcpyAsync");
  }
  // The eager and the graph runs' records (`count` each) and masters have the same bits.
  void expect_same_bits(const std::string& tag, cuda_context& ctx, const std::vector<nn::step_record>& r1,
                        const std::vector<nn::step_record>& r2, std::size_t count) {
    expect(r1.size() == count && r2.size() == count, tag + ": a record per step, replays included");
    expect(same_record_bits(r1, r2), tag + ": the records have the eager steps' bits");
    const auto a = masters_of(eager), b = masters_of(graph);
    expect(a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0,
           tag + ": the masters have the eager steps' bits");
  }
};

// The same steps eagerly and through a captured graph: the same bits. The learning rate
// rises step by step (a warm-up's table), so that a replay that kept the captured step's
// rate would move the masters otherwise.
template <class P, class Scaler>
void check_graph(cuda_context& ctx, const std::string& tag) {
  using S = typename P::storage_type;
  std::vector<double> warmup(16);
  for (std::size_t i = 0; i < warmup.size(); ++i) warmup[i] = 3e-3 * double(i + 1) / double(warmup.size());
  twins<P, Scaler> w(ctx, {.lr = 3e-3}, warmup);
  nn::trainer t1(ctx, w.eager, w.l1, w.o1, w.s1, {.max_grad_norm = 0.5});
  nn::trainer t2(ctx, w.graph, w.l2, w.o2, w.s2, {.max_grad_norm = 0.5});
  auto xb = to_device(w.data[0].x);
  auto tb = to_device(w.data[0].t);
  for (std::size_t i = 0; i < steps; ++i) t1.step(ctx, w.xs[i], w.ts[i]);
  t2.step(ctx, w.xs[0], w.ts[0]);
  t2.capture(ctx, xb, tb);
  for (std::size_t i = 1; i < steps; ++i) {
    w.gather(ctx, i, xb, tb);
    t2.replay(ctx);
  }
  const auto r2 = t2.records(ctx);
  w.expect_same_bits(tag + " graph", ctx, t1.records(ctx), r2, steps);
  expect(r2.size() == steps && r2[2].skipped, tag + " graph: the replayed infinite batch is skipped");
  expect(r2.size() == steps && r2[1].lr != r2[3].lr, tag + " graph: replayed steps take the table's rates");
  // The captured inputs fitted to another shape in place (the same buffer): refused, never
  // replayed on the old sizes; fitted back, the graph replays again.
  xb.fit({batch / 2, features});
  expect_error(tag + " graph: replay on inputs of another shape", [&] { t2.replay(ctx); }, "another buffer or shape");
  xb.fit({batch, features});
  // A pass on a batch of another size gives the model's buffers another shape: the graph is stale.
  (void)w.graph.forward(ctx, to_device(random_tensor<S, 2>({batch / 2, features})), nn::mode::eval);
  expect_error(tag + " graph: replay after a reallocation", [&] { t2.replay(ctx); }, "capture the step again");
  // A capture on a batch larger than any step so far would allocate the model's buffers
  // inside the capture: refused, naming the remedy. The trainer then runs an eager step on
  // it (the failed capture's CUDA error does not reach that step's launch checks).
  const auto xl = to_device(random_tensor<S, 2>({2 * batch, features}));
  const auto tl = class_zero(2 * batch);
  const auto places = w.o2.steps_left();
  expect_error(tag + " graph: a capture before an eager step of its shape", [&] { t2.capture(ctx, xl, tl); },
               "run one step() on tensors of these shapes first");
  expect(w.o2.steps_left() == places, tag + " graph: a failed capture keeps the optimizer's table places");
  t2.step(ctx, xl, tl);
  const auto r3 = t2.records(ctx);
  expect(r3.size() == 1 && std::isfinite(r3[0].loss), tag + " graph: an eager step after a failed capture");
}

// train_options::graph: step() runs the first step on a pair of batch buffers eagerly,
// captures the second and replays the rest, with the eager steps' bits; a table exactly as
// long as the steps suffices (the capture takes no place in it).
template <class P, class Scaler>
void check_graph_option(cuda_context& ctx, const std::string& tag) {
  twins<P, Scaler> w(ctx, {.lr = 3e-3}, steps);
  nn::trainer t1(ctx, w.eager, w.l1, w.o1, w.s1, {.max_grad_norm = 0.5});
  nn::trainer t2(ctx, w.graph, w.l2, w.o2, w.s2, {.max_grad_norm = 0.5, .graph = true});
  auto xb = to_device(w.data[0].x);
  auto tb = to_device(w.data[0].t);
  for (std::size_t i = 0; i < steps; ++i) {
    w.gather(ctx, i, xb, tb);
    t1.step(ctx, xb, tb);
    t2.step(ctx, xb, tb);
  }
  expect(t2.graphs() == 1, tag + " graph option: one graph for the one pair of buffers");
  w.expect_same_bits(tag + " graph option", ctx, t1.records(ctx), t2.records(ctx), steps);
  expect(w.o2.steps_left() == 0, tag + " graph option: the table holds exactly the steps run");
}

// `blueprint` stepped eagerly and under train_options::graph (two device models of one seed),
// on the batches `data` gathered into one pair of buffers: one graph; the records and the
// masters with the eager steps' bits; and an evaluation pass after them (reading batch norm's
// running statistics, where the model has one) with the eager model's. `w` names the checks;
// with `all_applied`, every step must be applied with a finite loss.
// With `toggle_keep`, the captured model's blocks keep their buffers for the first two steps
// (on a pair of tensors A: eager, then captured) and lend them from the third on, stepping a
// pair B and A in turn: B's eager step frees the buffers A's graph was captured with, so A's
// next step must run eagerly, not replay into freed memory; the fifth step (B) is captured,
// so one graph is left there too.
template <class P, class Scaler, class Blueprint, class S = typename P::storage_type>
void check_graph_replay(cuda_context& ctx, const std::string& w, const Blueprint& blueprint,
                        const std::vector<batch_data_r<S, 4>>& data, bool all_applied, bool toggle_keep = false) {
  std::vector<device_tensor<S, 4>> xs;
  std::vector<device_tensor<std::int32_t, 1>> ts;
  for (const auto& d : data) {
    xs.push_back(to_device(d.x));
    ts.push_back(to_device(d.t));
  }
  auto eager = nn::build<S, 4, cuda_context>(P{}, blueprint, {.seed = 5});
  auto graph = nn::build<S, 4, cuda_context>(P{}, blueprint, {.seed = 5});
  // The eager model's blocks keep their own backward buffers; the captured one's nn::repeat
  // lends them (where it has three or more blocks after the first).
  eager.keep_gradient_buffers(true);
  nn::softmax_cross_entropy<P, std::int32_t, cuda_context> l1, l2;
  device_adamw o1(ctx, eager.masters(), eager.gradients(), {.lr = 3e-3}, eager.decay_mask(), steps);
  device_adamw o2(ctx, graph.masters(), graph.gradients(), {.lr = 3e-3}, graph.decay_mask(), steps);
  Scaler s1, s2;
  nn::trainer t1(ctx, eager, l1, o1, s1, {.max_grad_norm = 0.5});
  nn::trainer t2(ctx, graph, l2, o2, s2, {.max_grad_norm = 0.5, .graph = true});
  auto xa = to_device(data[0].x), xb2 = to_device(data[0].x);
  auto ta = to_device(data[0].t), tb2 = to_device(data[0].t);
  if (toggle_keep) graph.keep_gradient_buffers(true);
  for (std::size_t i = 0; i < steps; ++i) {
    if (toggle_keep && i == 2) graph.keep_gradient_buffers(false);
    const bool second = toggle_keep && i >= 2 && i % 2 == 0;
    auto& xb = second ? xb2 : xa;
    auto& tb = second ? tb2 : ta;
    check(cudaMemcpyAsync(xb.data(), xs[i].data(), xb.size() * sizeof(S), cudaMemcpyDeviceToDevice, ctx.stream()),
          "cudaMemcpyAsync");
    check(cudaMemcpyAsync(tb.data(), ts[i].data(), tb.size() * sizeof(std::int32_t), cudaMemcpyDeviceToDevice,
                          ctx.stream()),
          "cudaMemcpyAsync");
    t1.step(ctx, xb, tb);
    t2.step(ctx, xb, tb);
  }
  expect(t2.graphs() == 1, w + ": one graph");
  const auto r1 = t1.records(ctx), r2 = t2.records(ctx);
  expect(r1.size() == steps && same_record_bits(r1, r2), w + ": the records have the eager steps' bits");
  if (all_applied) {
    const auto applied = [](const nn::step_record& r) { return !r.skipped && std::isfinite(r.loss); };
    expect(std::all_of(r1.begin(), r1.end(), applied), w + ": every step applied, with a finite loss");
  }
  const auto a = masters_of(eager), b = masters_of(graph);
  expect(a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0,
         w + ": the masters have the eager steps' bits");
  expect(same_bits(ctx, graph.forward(ctx, xs[0], nn::mode::eval),
                   to_host(eager.forward(ctx, xs[0], nn::mode::eval), ctx.stream())),
         w + ": an evaluation pass after the steps has the eager model's bits");
}

// An image model, a convolution, a batch norm and its ReLU (one fused pass on the device),
// pooling and a linear head, stepped eagerly and under train_options::graph: cuDNN's
// convolutions, the batch statistics and running statistics, and the fused pair, captured and
// replayed with the eager steps' bits (the records, the masters, and an evaluation pass that
// reads the running statistics). Every batch is finite: an infinite input would leave NaN
// running statistics on both sides, and the evaluation pass would compare NaN with NaN.
template <class P, class Scaler>
void check_graph_images(cuda_context& ctx, const std::string& tag) {
  using S = typename P::storage_type;
  const auto blueprint =
      nn::seq(nn::conv2d(2, 8, 3, {.padding = {1, 1}}, nn::no_bias), nn::batch_norm(8), nn::relu(),
              nn::max_pool2d({.kernel = {2, 2}}), nn::flatten(), nn::linear<fc2>(8 * 4 * 4, classes));
  auto data = batches<S, 4>({16, 2, 8, 8});
  data[2].x.data()[5] = S(0.5F);
  check_graph_replay<P, Scaler>(ctx, tag + " image model under the graph option", blueprint, data, true);
}

// A smaller last batch, and the full batches after it, keep the layers' memory (a shape
// change is still counted, so that a captured graph is refused after it).
template <class P>
void check_smaller_batch(cuda_context& ctx, const std::string& tag) {
  using S = typename P::storage_type;
  auto m = nn::build<S, 2, cuda_context>(P{}, classifier(), {.seed = 5});
  const auto full = to_device(random_tensor<S, 2>({batch, features}));
  const auto half = to_device(random_tensor<S, 2>({batch / 2, features}));
  const void* first = m.forward(ctx, full, nn::mode::train).data();
  const auto before = nn::detail::device_reallocations.load();
  const void* smaller = m.forward(ctx, half, nn::mode::train).data();
  const auto after_smaller = nn::detail::device_reallocations.load();
  const void* again = m.forward(ctx, full, nn::mode::train).data();
  ctx.synchronize();
  expect(first == smaller && first == again, tag + ": a smaller batch and the full one after it keep the memory");
  expect(after_smaller > before && nn::detail::device_reallocations.load() > after_smaller,
         tag + ": each shape change is counted");
}

// train_options::max_graphs: with room for two, three pairs of batch buffers (a, b, c) stepped
// a a b b a c b b: c drops b (the least recently stepped, with its graph), then b drops a;
// every step still has the eager steps' bits.
template <class P, class Scaler>
void check_graph_eviction(cuda_context& ctx, const std::string& tag) {
  using S = typename P::storage_type;
  const std::vector<std::size_t> pair = {0, 0, 1, 1, 0, 2, 1, 1};
  const std::vector<std::size_t> want_graphs = {0, 1, 1, 2, 2, 1, 0, 1};
  const std::vector<std::uint64_t> want_evictions = {0, 0, 0, 0, 0, 1, 2, 2};
  twins<P, Scaler> w(ctx, {.lr = 3e-3}, pair.size());
  nn::trainer t1(ctx, w.eager, w.l1, w.o1, w.s1, {.max_grad_norm = 0.5});
  nn::trainer t2(ctx, w.graph, w.l2, w.o2, w.s2, {.max_grad_norm = 0.5, .graph = true, .max_graphs = 2});
  std::vector<device_tensor<S, 2>> xb;
  std::vector<device_tensor<std::int32_t, 1>> tb;
  for (std::size_t m = 0; m < 3; ++m) {
    xb.push_back(to_device(w.data[0].x));
    tb.push_back(to_device(w.data[0].t));
  }
  bool counts = true;
  for (std::size_t i = 0; i < pair.size(); ++i) {
    const std::size_t m = pair[i];
    w.gather(ctx, i % w.data.size(), xb[m], tb[m]);
    t1.step(ctx, xb[m], tb[m]);
    t2.step(ctx, xb[m], tb[m]);
    counts = counts && t2.graphs() == want_graphs[i] && t2.graph_evictions() == want_evictions[i];
  }
  expect(counts, tag + " max_graphs: the graphs held and dropped after each step");
  w.expect_same_bits(tag + " max_graphs", ctx, t1.records(ctx), t2.records(ctx), pair.size());
  expect_error(tag + " max_graphs 0", [&] { nn::trainer(ctx, w.graph, w.l2, w.o2, w.s2, {.graph = true, .max_graphs = 0}); },
               "max_graphs");
}

// Gradient accumulation: steps of two and of three micro-batches, on the host, on the device,
// and on the device under train_options::graph (three fixed pairs of batch buffers: the steps
// of two read the first two, those of three all three, so each sequence has its graph: its
// first step eager, its second captured and run, the rest replayed). The device records agree
// with the host's (the same skipped step, scales, learning rates; losses, the micro-batches'
// mean, and norms within bounds); the graph steps have the eager device steps' bits.
// Micro-batches of two shapes are refused under the option.
template <class P, class Scaler>
void check_micro_batches(cuda_context& ctx, const std::string& tag) {
  using S = typename P::storage_type;
  using dev_batch = nn::micro_batch<device_tensor<S, 2>, device_tensor<std::int32_t, 1>>;
  using host_batch = nn::micro_batch<host_tensor<S, 2>, host_tensor<std::int32_t, 1>>;
  const cpu_context cpu{2};
  // Batch indices of each step's micro-batches; batch 2 holds an infinite input.
  const std::vector<std::vector<std::size_t>> groups = {{0, 1}, {2, 3}, {4, 0, 1}, {1, 3, 4}, {3, 4, 0}};
  const adamw_options o{.lr = 3e-3, .weight_decay = 0.01};
  const nn::train_options to{.max_grad_norm = 0.5};
  twins<P, Scaler> w(ctx, o, groups.size());
  adamw host_opt(w.host.masters(), o, w.host.decay_mask());
  nn::softmax_cross_entropy<P> host_loss;
  Scaler host_scaler;
  nn::trainer host_train(w.host, host_loss, host_opt, host_scaler, to);
  nn::trainer t1(ctx, w.eager, w.l1, w.o1, w.s1, to);
  nn::trainer t2(ctx, w.graph, w.l2, w.o2, w.s2, {.max_grad_norm = 0.5, .graph = true});

  std::vector<device_tensor<S, 2>> xf;
  std::vector<device_tensor<std::int32_t, 1>> tf;
  for (std::size_t m = 0; m < 3; ++m) {
    xf.push_back(to_device(w.data[0].x));
    tf.push_back(to_device(w.data[0].t));
  }
  const dev_batch fixed[3] = {{xf[0], tf[0]}, {xf[1], tf[1]}, {xf[2], tf[2]}};
  std::vector<nn::step_record> want;
  for (const auto& g : groups) {
    std::vector<host_batch> hb;
    for (std::size_t m = 0; m < g.size(); ++m) {
      hb.push_back({w.data[g[m]].x, w.data[g[m]].t});
      w.gather(ctx, g[m], xf[m], tf[m]);
    }
    want.push_back(host_train.step(cpu, std::span<const host_batch>(hb)));
    t1.step(ctx, std::span<const dev_batch>(fixed, g.size()));
    t2.step(ctx, std::span<const dev_batch>(fixed, g.size()));
  }
  const auto got = t1.records(ctx);
  expect(got.size() == groups.size(), tag + " micro-batches: one record per step");
  for (std::size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    const std::string at = tag + " micro-batches step " + std::to_string(i + 1);
    expect(got[i].skipped == want[i].skipped && got[i].skipped == (i == 1), at + ": skipped as on the host");
    expect(got[i].scale == want[i].scale && got[i].next_scale == want[i].next_scale, at + ": scales");
    expect(got[i].lr == want[i].lr, at + ": learning rate");
    if (!want[i].skipped) {
      expect(std::abs(got[i].loss - want[i].loss) <= 2 * bound<S>() * std::abs(want[i].loss),
             at + ": loss, the micro-batches' mean");
      expect(std::abs(got[i].grad_norm - want[i].grad_norm) <= 0.05 * want[i].grad_norm, at + ": gradient norm");
    }
  }
  const auto a = masters_of(w.host), b = masters_of(w.eager);
  double err = 0;
  for (std::size_t i = 0; i < a.size(); ++i) err = std::max(err, std::abs(double(a[i]) - double(b[i])));
  expect(std::isfinite(err) && err <= 2 * o.lr * double(groups.size()), tag + " micro-batches: masters near the host's");
  expect(t2.graphs() == 2, tag + " micro-batches: a graph for two and one for three micro-batches");
  w.expect_same_bits(tag + " micro-batches graph", ctx, got, t2.records(ctx), groups.size());
  expect_error(tag + " micro-batches: none", [&] { t1.step(ctx, std::span<const dev_batch>()); },
               "no micro-batches");
  const auto half = to_device(random_tensor<S, 2>({batch / 2, features}));
  const auto half_t = class_zero(batch / 2);
  const dev_batch mixed[2] = {{xf[0], tf[0]}, {half, half_t}};
  expect_error(tag + " micro-batches: two shapes under the graph option",
               [&] { t2.step(ctx, std::span<const dev_batch>(mixed)); }, "one shape");
}

// A device model's checkpoint in the host's format: trained two steps on the device, its
// state copied into a host model (nn::copy_state), its optimizer stored into a host AdamW and its scaler
// written back, then save_checkpoint; loaded into fresh host objects, the same bits; and
// back onto a fresh device model and optimizer, which continue with the first one's bits.
template <class P>
void check_checkpoint(cuda_context& ctx) {
  using S = typename P::storage_type;
  const auto data = batches<S>();
  const adamw_options o{.lr = 3e-3, .weight_decay = 0.01};
  std::vector<device_tensor<S, 2>> xs;
  std::vector<device_tensor<std::int32_t, 1>> ts;
  for (const auto& b : data) {
    xs.push_back(to_device(b.x));
    ts.push_back(to_device(b.t));
  }
  auto dev = nn::build<S, 2, cuda_context>(P{}, classifier(), {.seed = 3});
  dev.refresh(ctx);
  nn::softmax_cross_entropy<P, std::int32_t, cuda_context> loss;
  device_adamw opt(ctx, dev.masters(), dev.gradients(), o, dev.decay_mask(), 16);
  dynamic_scaler scaler;
  nn::trainer train(ctx, dev, loss, opt, scaler, {.max_grad_norm = 0.5});
  train.step(ctx, xs[0], ts[0]);
  train.step(ctx, xs[1], ts[1]);

  auto host = nn::build<S, 2>(P{}, classifier(), {.seed = 99});  // other weights, overwritten
  adamw host_opt(host.masters(), o, host.decay_mask());
  nn::copy_state(ctx, dev, host);
  opt.store(ctx, host_opt);
  train.store_scaler(ctx);
  const auto file = std::filesystem::temp_directory_path() / "precis_test_device_checkpoint.bin";
  save_checkpoint(file, host, host_opt, scaler);
  auto host2 = nn::build<S, 2>(P{}, classifier(), {.seed = 123});
  adamw host_opt2(host2.masters(), o, host2.decay_mask());
  dynamic_scaler scaler2;
  load_checkpoint(file, host2, host_opt2, scaler2);
  std::filesystem::remove(file);
  const auto on_device = masters_of(dev), loaded = masters_of(host2);
  expect(on_device.size() == loaded.size() &&
             std::memcmp(on_device.data(), loaded.data(), loaded.size() * sizeof(float)) == 0,
         "checkpoint: the host model loads the device model's bits");
  expect(save_state(host_opt2) == save_state(host_opt), "checkpoint: the optimizer's state round-trips");
  expect(scaler2.scale() == scaler.scale(), "checkpoint: the scale round-trips");

  auto dev2 = nn::build<S, 2, cuda_context>(P{}, classifier(), {.seed = 7});
  nn::copy_state(ctx, host2, dev2);
  nn::softmax_cross_entropy<P, std::int32_t, cuda_context> loss2;
  device_adamw opt2(ctx, dev2.masters(), dev2.gradients(), o, dev2.decay_mask(), 16);
  opt2.load(ctx, host_opt2);
  nn::trainer train2(ctx, dev2, loss2, opt2, scaler2, {.max_grad_norm = 0.5});
  train.step(ctx, xs[3], ts[3]);
  train2.step(ctx, xs[3], ts[3]);
  const auto a = masters_of(dev), b = masters_of(dev2);
  expect(a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0,
         "checkpoint: the restored device model steps with the original's bits");
  const auto r1 = train.records(ctx), r2 = train2.records(ctx);
  expect(!r1.empty() && !r2.empty() && r1.back().loss == r2.back().loss && r1.back().scale == r2.back().scale,
         "checkpoint: the restored step's record is the original's");
}

// nn::copy_state of an image model with a batch norm and a dropout layer: two training
// passes on the device move the running statistics and the dropout's call count; the state
// copied into a host model, through a checkpoint file into another host model, and onto a
// device model of other weights and seed gives the first one's bits in evaluation (the
// running statistics) and in training (the masks). A model whose layers hold other state
// fields (no dropout) is refused, naming them.
template <class P>
void check_state_copy(cuda_context& ctx) {
  using S = typename P::storage_type;
  const auto blueprint = nn::seq(nn::conv2d(2, 8, 3, {.padding = {1, 1}}, nn::no_bias), nn::batch_norm(8),
                                 nn::relu(), nn::dropout(0.25), nn::max_pool2d({.kernel = {2, 2}}), nn::flatten(),
                                 nn::linear<fc2>(8 * 4 * 4, classes));
  const auto data = batches<S, 4>({16, 2, 8, 8});
  auto dev = nn::build<S, 4, cuda_context>(P{}, blueprint, {.seed = 3});
  for (std::size_t i = 0; i < 2; ++i) (void)dev.forward(ctx, to_device(data[i].x));
  auto host = nn::build<S, 4>(P{}, blueprint, {.seed = 99});
  nn::copy_state(ctx, dev, host);
  const auto file = std::filesystem::temp_directory_path() / "precis_test_device_state.bin";
  save_checkpoint(file, host);
  auto host2 = nn::build<S, 4>(P{}, blueprint, {.seed = 123});
  load_checkpoint(file, host2);
  std::filesystem::remove(file);
  auto dev2 = nn::build<S, 4, cuda_context>(P{}, blueprint, {.seed = 7});
  nn::copy_state(ctx, host2, dev2);
  const auto x = to_device(data[2].x);
  const auto want_eval = to_host(dev.forward(ctx, x, nn::mode::eval), ctx.stream());
  expect(same_bits(ctx, dev2.forward(ctx, x, nn::mode::eval), want_eval),
         "copy_state: an evaluation pass (the running statistics) has the first model's bits");
  expect(same_bits(ctx, dev2.forward(ctx, x), to_host(dev.forward(ctx, x), ctx.stream())),
         "copy_state: a training pass (the dropout's masks) has the first model's bits");
  auto other = nn::build<S, 4, cuda_context>(
      P{}, nn::seq(nn::conv2d(2, 8, 3, {.padding = {1, 1}}, nn::no_bias), nn::batch_norm(8), nn::relu(),
                   nn::max_pool2d({.kernel = {2, 2}}), nn::flatten(), nn::linear<fc2>(8 * 4 * 4, classes)));
  expect_error("copy_state: a model without the dropout", [&] { nn::copy_state(ctx, dev, other); },
               "other state fields");
}

}  // namespace

int main() {
  if (!have_gpu()) return skipped;
  cuda_context ctx;
  check_training<presets::bf16_mixed, no_scaling>(ctx, "bf16_mixed");
  check_training<presets::fp16_mixed, dynamic_scaler>(ctx, "fp16_mixed");
  check_graph<presets::fp16_mixed, dynamic_scaler>(ctx, "fp16_mixed");
  check_graph_option<presets::fp16_mixed, dynamic_scaler>(ctx, "fp16_mixed");
  check_graph_option<presets::bf16_mixed, no_scaling>(ctx, "bf16_mixed");
  check_graph_eviction<presets::fp16_mixed, dynamic_scaler>(ctx, "fp16_mixed");
  check_graph_images<presets::bf16_mixed, no_scaling>(ctx, "bf16_mixed");
  check_graph_images<presets::fp16_mixed, dynamic_scaler>(ctx, "fp16_mixed");
  check_smaller_batch<presets::bf16_mixed>(ctx, "bf16_mixed");
  check_micro_batches<presets::fp16_mixed, dynamic_scaler>(ctx, "fp16_mixed");
  check_checkpoint<presets::fp16_mixed>(ctx);
  check_state_copy<presets::bf16_mixed>(ctx);
  // Accuracy counted on the device as nn::count_correct counts on the host: ties to the
  // first largest value, only the first `rows` rows.
  {
    const std::size_t rows = 40;
    auto logits = random_tensor<bfloat16, 2>({50, 7});
    for (std::size_t c = 0; c < 7; ++c) logits(3, c) = bfloat16(0.5F);  // a tie: class 0
    auto targets = host_tensor<std::int32_t, 1>::from_shape({50});
    std::uniform_int_distribution<int> cls(0, 6);
    for (auto& v : targets) v = cls(rng);
    targets(3) = 0;
    auto first = host_tensor<bfloat16, 2>::from_shape({rows, 7});
    auto first_targets = host_tensor<std::int32_t, 1>::from_shape({rows});
    std::copy(logits.begin(), logits.begin() + std::ptrdiff_t(rows * 7), first.begin());
    std::copy(targets.begin(), targets.begin() + std::ptrdiff_t(rows), first_targets.begin());
    const std::size_t want = nn::count_correct(first, first_targets);
    device_tensor<unsigned long long, 1> count({1});
    check(cudaMemsetAsync(count.data(), 0, sizeof(unsigned long long), ctx.stream()), "cudaMemsetAsync");
    const auto dl = to_device(logits);
    const auto dt = to_device(targets);
    nn::count_correct(ctx, dl, dt, rows, count);
    expect(std::size_t(to_host(count, ctx.stream())(0)) == want, "count_correct on the device counts as the host");
  }
  // A small ViT (the example's blueprint), three layers of every kind it has.
  const vit::config c{.image = 16, .patch = 4, .channels = 1, .width = 32, .heads = 2, .classes = classes};
  check_training<presets::bf16_mixed, no_scaling, 4>(ctx, "vit bf16_mixed", vit::blueprint<2>(c), {32, 1, 16, 16});
  check_training<presets::fp16_mixed, dynamic_scaler, 4>(ctx, "vit fp16_mixed", vit::blueprint<2>(c),
                                                         {32, 1, 16, 16});
  // The small ViT under the graph option: under bf16_mixed, where the build has the cuDNN
  // frontend, its attention runs fused on 17 tokens (not a multiple of 128, where an older
  // cuDNN's backward pass needs its padding masked), forward and backward captured and replayed.
  // Four blocks, so that the three after the first lend their backward buffers in the
  // captured steps (against an eager model whose blocks keep theirs).
  check_graph_replay<presets::bf16_mixed, no_scaling>(ctx, "vit bf16_mixed under the graph option",
                                                      vit::blueprint<4>(c), batches<bfloat16, 4>({32, 1, 16, 16}),
                                                      false);
  // The same with the captured model's blocks keeping their buffers for a first graph, then
  // lending them on two pairs of tensors.
  check_graph_replay<presets::bf16_mixed, no_scaling>(ctx, "vit bf16_mixed, graphs across keep and lend",
                                                      vit::blueprint<4>(c), batches<bfloat16, 4>({32, 1, 16, 16}),
                                                      false, true);
  // A model with a dropout cannot be captured: a replay would repeat its mask.
  {
    using P = presets::bf16_mixed;
    auto dev = nn::build<bfloat16, 2, cuda_context>(P{}, nn::seq(classifier(), nn::dropout(0.1)));
    dev.refresh(ctx);
    nn::softmax_cross_entropy<P, std::int32_t, cuda_context> loss;
    device_adamw opt(ctx, dev.masters(), dev.gradients(), {}, dev.decay_mask(), 4);
    no_scaling scaler;
    nn::trainer train(ctx, dev, loss, opt, scaler);
    const auto x = to_device(random_tensor<bfloat16, 2>({8, features}));
    const auto t = class_zero(8);
    train.step(ctx, x, t);
    expect_error("trainer: capture with a dropout", [&] { train.capture(ctx, x, t); }, "dropout");
  }
  // The context has the device's pool keep what is freed into it: memory freed before a
  // synchronisation is still reserved after it, and a step after a synchronisation reserves
  // nothing more (its scratch comes from what the step before it freed).
  {
    cudaMemPool_t pool = nullptr;
    check(cudaDeviceGetMemPool(&pool, ctx.device()), "cudaDeviceGetMemPool");
    const auto reserved = [&] {
      std::uint64_t bytes = 0;
      check(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &bytes), "cudaMemPoolGetAttribute");
      return bytes;
    };
    { device_tensor<float, 1> scratch({std::size_t(16) << 20}, ctx.stream()); }
    ctx.synchronize();
    expect(reserved() >= (std::uint64_t(64) << 20), "the pool keeps 64 MiB freed before a synchronisation");
    using P = presets::fp16_mixed;
    using S = typename P::storage_type;
    auto dev = nn::build<S, 2, cuda_context>(P{}, classifier());
    dev.refresh(ctx);
    nn::softmax_cross_entropy<P, std::int32_t, cuda_context> loss;
    device_adamw opt(ctx, dev.masters(), dev.gradients(), {}, dev.decay_mask(), 4);
    dynamic_scaler scaler;
    nn::trainer train(ctx, dev, loss, opt, scaler);
    const auto x = to_device(random_tensor<S, 2>({batch, features}));
    const auto t = class_zero(batch);
    train.step(ctx, x, t);
    ctx.synchronize();
    const std::uint64_t before = reserved();
    train.step(ctx, x, t);
    ctx.synchronize();
    expect(reserved() == before, "a step after a synchronisation reserves no more of the pool");
  }
  // A batch of another width is refused before any launch, naming the layer.
  {
    using P = presets::bf16_mixed;
    auto dev = nn::build<bfloat16, 2, cuda_context>(P{}, classifier());
    nn::softmax_cross_entropy<P, std::int32_t, cuda_context> loss;
    device_adamw opt(ctx, dev.masters(), dev.gradients(), {}, dev.decay_mask(), 4);
    no_scaling scaler;
    nn::trainer train(ctx, dev, loss, opt, scaler);
    const auto x = to_device(random_tensor<bfloat16, 2>({4, features + 1}));
    const auto t = class_zero(4);
    expect_error("trainer: wrong width", [&] { train.step(ctx, x, t); }, "fc1");
  }
  // A batch that leaves a batch norm deep in the model one value per channel is refused by the
  // shape check, under training's rules, before any launch, naming the layer.
  {
    using P = presets::bf16_mixed;
    auto dev = nn::build<bfloat16, 4, cuda_context>(
        P{}, nn::seq(nn::conv2d(2, 4, 3, {.padding = {1, 1}}), nn::avg_pool2d({.kernel = {4, 4}}),
                     nn::named("norm", nn::batch_norm(4)), nn::flatten(), nn::linear(4, 3)));
    nn::softmax_cross_entropy<P, std::int32_t, cuda_context> loss;
    device_adamw opt(ctx, dev.masters(), dev.gradients(), {}, dev.decay_mask(), 4);
    no_scaling scaler;
    nn::trainer train(ctx, dev, loss, opt, scaler);
    const auto x = to_device(random_tensor<bfloat16, 4>({1, 2, 4, 4}));
    const auto t = class_zero(1);
    expect_error("trainer: one value per channel", [&] { train.step(ctx, x, t); }, "layer norm (batch_norm)");
    expect(train.queued() == 0, "trainer: the refused batch queued no step");
  }
  return finish();
}
