/// @file
/// Training on the device: the softmax cross-entropy loss and nn::trainer on cuda_context.
/// Included by <precis/nn/cuda.hpp>; CUDA code only.
///
///     nn::softmax_cross_entropy<presets::bf16_mixed, std::int32_t, cuda_context> loss;
///     precis::device_adamw opt(ctx, model.masters(), model.gradients(), {.lr = 1e-3},
///                              model.decay_mask(), schedule.lr_table(total_steps));
///     precis::dynamic_scaler scaler;
///     nn::trainer train(ctx, model, loss, opt, scaler, {.max_grad_norm = 1.0});
///     train.step(ctx, x, targets);              // queued; nothing waits
///     for (const auto& r : train.records(ctx))  // waits, reads the steps since the last call
///       std::printf("%g %g\n", r.loss, r.scale);
///
/// A step is queued on the context's stream in the host trainer's order: gradients zeroed,
/// forward, loss, scaled backward (dloss read from the device scale), one multi-tensor
/// unscale with found-inf, the joint norm and clipping, a step record, the optimizer (which
/// skips on the device when found-inf is set, and takes its learning rate from a table
/// indexed by its applied-step count, and which writes the working copies as it updates the
/// masters where it can: fuse_refresh), the scale update, and otherwise the working copies
/// refreshed; with several micro-batches, forward, loss and scaled backward per micro-batch
/// before the unscale, as the host trainer. The host reads nothing: what a step did goes to a
/// ring of records in device memory, read back by records() (and, when the ring is full, by
/// the next step, which then waits). After the first step a step allocates no buffer, only
/// stream-ordered scratch (the reductions' and the loss's), which a CUDA graph records as
/// memory nodes: a step can be captured (capture()) and replayed (replay()), unless the model
/// holds a dropout (its mask would repeat). A replay refuses to run once a device buffer or
/// the context's workspace was reallocated after the capture. train_options::graph makes step() capture
/// and replay by itself (a graph per sequence of input and target objects, of one shape).
#pragma once

#include <precis/config.hpp>

#if defined(__CUDACC__)

#include <precis/kernels/cuda/loss.hpp>
#include <precis/kernels/cuda/scaling_kernels.hpp>
#include <precis/kernels/cuda_context.hpp>
#include <precis/nn/loss.hpp>
#include <precis/nn/state.hpp>
#include <precis/nn/train.hpp>
#include <precis/optim/device_optimizers.hpp>
#include <precis/scaling/scalers.hpp>
#include <precis/tensor/device_tensor.hpp>

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace precis::nn {

/// The softmax cross-entropy loss on the device (see the host basic_softmax_cross_entropy):
/// the same rules and formulas, the targets a device tensor, the loss value written to a
/// one-element device tensor so that nothing waits for it. A target outside [0, classes)
/// makes the loss NaN (the device cannot refuse it without waiting), so a scaler skips the
/// step.
template <Policy P, std::integral Target>
class basic_softmax_cross_entropy<P, Target, cuda_context>
    : public softmax_cross_entropy_types<P, Target, cuda_context> {
  using S = typename P::storage_type;
  using G = typename P::gradient_type;
  using types = softmax_cross_entropy_types<P, Target, cuda_context>;

 public:
  /// The targets' tensor, in device memory.
  using target_tensor = typename types::target_tensor;
  /// The type the loss value is computed and kept in.
  using value_type = typename types::value_type;

  /// Writes the loss of `logits` against `targets` to value() and returns it; keeps both
  /// addresses for backward(). Throws precis::error for targets of another length or an
  /// empty batch, before any launch.
  const device_tensor<value_type, 1>& forward(cuda_context& ctx, const device_tensor<S, 2>& logits,
                                              const target_tensor& targets) {
    precis::cross_entropy<P>(ctx, logits, targets, loss_);
    logits_.set(logits);
    targets_ = &targets;
    return loss_;
  }
  /// dloss * (softmax - onehot) / batch for the last forward pass, in P's gradient type;
  /// `dloss` a host value or a device float (a loss scale kept on the device). Throws
  /// precis::error without a forward pass.
  const device_tensor<G, 2>& backward(cuda_context& ctx, device_dloss dloss = 1.0) {
    const auto& logits = logits_.get(types::name);
    ensure(dx_, shape_of<2>(logits));
    precis::cross_entropy_backward<P>(ctx, logits, *targets_, dx_, dloss);
    return dx_;
  }
  /// The loss of the last forward pass (device memory).
  const device_tensor<value_type, 1>& value() const { return loss_; }
  /// "-": the loss has no parameters.
  std::string shape() const { return "-"; }
  /// Bytes of its gradient buffer and value.
  std::size_t own_bytes() const { return bytes_of(dx_) + bytes_of(loss_); }

 private:
  saved<device_tensor<S, 2>> logits_;
  const target_tensor* targets_ = nullptr;
  device_tensor<G, 2> dx_;
  device_tensor<value_type, 1> loss_{{1}};
};

namespace detail::cuda {

/// count[0] += the rows r < rows of logits [.., cols] whose largest value (the first on
/// ties; NaN never larger) is at targets[r]: nn::count_correct's rule, one thread per row.
template <class T, class I>
__global__ void count_correct_rows(const T* logits, const I* targets, std::size_t rows, std::size_t cols,
                                   unsigned long long* count) {
  for (std::size_t r = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; r < rows;
       r += std::size_t(gridDim.x) * blockDim.x) {
    const T* row = logits + r * cols;
    std::size_t best = 0;
    for (std::size_t c = 1; c < cols; ++c) {
      using precis::detail::cuda::device_load;
      if (device_load<float>(row[c]) > device_load<float>(row[best])) best = c;
    }
    if (static_cast<I>(best) == targets[r]) atomicAdd(count, 1ULL);
  }
}

}  // namespace detail::cuda

/// Adds to `count` (a device counter, {1}) how many of the first `rows` rows of `logits`
/// have their largest value (the first on ties) at the target, as nn::count_correct does
/// on the host; queued on ctx's stream. Throws precis::error when rows exceeds the logits'
/// rows or the targets' length.
template <class T, std::integral I>
void count_correct(cuda_context& ctx, const device_tensor<T, 2>& logits, const device_tensor<I, 1>& targets,
                   std::size_t rows, device_tensor<unsigned long long, 1>& count) {
  if (rows > logits.shape()[0] || rows > targets.shape()[0]) {
    throw error("precis::nn::count_correct: " + std::to_string(rows) + " rows of logits " +
                shape_string(logits.shape()) + " and " + std::to_string(targets.shape()[0]) + " targets");
  }
  check_shape("precis::nn::count_correct: count", count, std::array<std::size_t, 1>{1});
  if (rows == 0) return;
  detail::cuda::count_correct_rows<<<precis::detail::cuda::grid_for(rows), 256, 0, ctx.stream()>>>(
      logits.data(), targets.data(), rows, logits.shape()[1], count.data());
  check(cudaGetLastError(), "precis::nn::count_correct");
}

/// One step as the device writes it into a trainer's ring (step_record without the host's
/// step index).
struct device_step_record {
  double loss;       ///< the loss (not scaled)
  double grad_norm;  ///< joint L2 norm of the unscaled gradients, before clipping
  double lr;         ///< the learning rate of the step (the optimizer's table)
  float scale;       ///< the loss scale the gradients were computed with
  float next_scale;  ///< the loss scale for the next step
  int skipped;       ///< 1 when a gradient was infinite or NaN and the optimizer did not step
  int pad;           ///< unused
};

namespace detail::cuda {

/// What a trainer's step keeps in device memory besides the scaler's state.
struct step_scratch {
  double loss_sum;          ///< the micro-batches' losses so far, but the last (several of them)
  double norm;              ///< the gradients' joint norm
  float factor;             ///< the clipping factor (1: none)
  int found_inf;            ///< set by the unscale
  std::uint64_t position;   ///< steps written into the ring so far
};

// Templates, so that every translation unit may define them.
// The host trainer's sum of micro-batch losses, in its order: 0 + l0 + l1 + ... (micro-batch
// `index` of a step of several; the last is added by write_record).
template <class L>
__global__ void add_loss(step_scratch* s, const L* loss, std::size_t index) {
  s->loss_sum = (index == 0 ? 0.0 : s->loss_sum) + double(*loss);
}
// `loss`: the last micro-batch's; the record's loss is the mean over `count` of them.
template <class L = float>
__global__ void write_record(device_step_record* ring, std::uint64_t capacity, const step_scratch* s,
                             const L* loss, std::size_t count, const device_scaler_state* scaler,
                             const double* lrs, std::uint64_t lr_count, const std::uint64_t* applied) {
  device_step_record& r = ring[s->position % capacity];
  r.loss = count == 1 ? double(*loss) : (s->loss_sum + double(*loss)) / double(count);
  r.grad_norm = s->norm;
  const std::uint64_t t = *applied;
  r.lr = t < lr_count ? lrs[t] : ::nan("");
  r.scale = scaler->scale;
  r.skipped = s->found_inf != 0 ? 1 : 0;
  r.pad = 0;
}
template <class T = float>
__global__ void finish_record(device_step_record* ring, std::uint64_t capacity, step_scratch* s,
                              const device_scaler_state* scaler) {
  ring[s->position % capacity].next_scale = scaler->scale;
  ++s->position;
}

}  // namespace detail::cuda

/// What a device trainer needs of its optimizer (precis::device_adamw, device_sgd).
template <class O>
concept device_optimizer = requires(O& o, cuda_context& ctx, const int* found_inf) {
  o.step_async(ctx, found_inf);
  o.reserve_replay();
  o.release_capture();
  { o.steps_left() } -> std::convertible_to<std::uint64_t>;
  { o.learning_rates() } -> std::convertible_to<const double*>;
  { o.learning_rate_count() } -> std::convertible_to<std::size_t>;
  { o.applied_steps() } -> std::convertible_to<const std::uint64_t*>;
};

/// The trainer on cuda_context (see the file comment): one batch or several micro-batches per
/// step, the whole step queued on the context's stream with no host synchronisation (except
/// when the ring of records is full), step records read back by records(). The scaler is the
/// host object whose state the device mirrors: a dynamic_scaler's scale and counters are loaded when
/// the trainer is made and written back by store_scaler(); static_scaler and no_scaling
/// keep their fixed scale. The learning-rate schedule is the optimizer's table.
template <class Model, class Loss, class Optimizer, class Scaler, class Schedule>
class trainer<Model, Loss, Optimizer, Scaler, Schedule, cuda_context> {
  static_assert(detail::trainer_parts_fit<Model, Loss, Scaler>());
  static_assert(std::is_same_v<Schedule, no_schedule>,
                "precis: on the device the learning-rate schedule is the optimizer's table "
                "(device_adamw(..., schedule.lr_table(steps))); make the trainer without one");
  static_assert(device_optimizer<Optimizer>,
                "precis: a device model steps with precis::device_adamw or precis::device_sgd");
  static_assert(std::is_same_v<Scaler, dynamic_scaler> || std::is_same_v<Scaler, static_scaler> ||
                    std::is_same_v<Scaler, no_scaling>,
                "precis: the device trainer takes dynamic_scaler, static_scaler or no_scaling "
                "(one process)");
  static constexpr bool dynamic = std::is_same_v<Scaler, dynamic_scaler>;

 public:
  /// What the model's forward() reads.
  using input_tensor = typename Model::input_tensor;
  /// What the loss reads as targets.
  using target_tensor = typename Loss::target_tensor;
  /// One micro-batch of step() (device tensors).
  using batch_type = micro_batch<input_tensor, target_tensor>;

  /// A trainer whose ring holds `ring` records between two reads. Loads the scaler's state
  /// into device memory (waits for that copy). Throws precis::error when `o.max_grad_norm`
  /// is negative or NaN, `o.max_graphs` is 0 under `o.graph`, or `ring` is 0.
  trainer(cuda_context& ctx, Model& model, Loss& loss, Optimizer& opt, Scaler& scaler,
          train_options o = {}, std::size_t ring = 1024)
      : model_(&model),
        loss_(&loss),
        opt_(&opt),
        scaler_(&scaler),
        options_(o),
        grads_(ctx, model.gradients()),
        state_({1}),
        scratch_({1}),
        ring_({ring}),
        first_step_(scaler.steps()) {
    (void)model_->template check_scaler<Scaler>();
    if (!(options_.max_grad_norm >= 0.0)) throw error("precis::nn::trainer: max_grad_norm must be >= 0");
    if (options_.graph && options_.max_graphs == 0) {
      throw error("precis::nn::trainer: train_options::max_graphs must be at least 1 under train_options::graph");
    }
    if (ring == 0) throw error("precis::nn::trainer: the ring of step records needs at least one slot");
    if constexpr (dynamic) {
      load_device_state(ctx, scaler, state_.data());
    } else {
      const device_scaler_state fixed{scaler.scale(), 0, 0};
      check(cudaMemcpyAsync(state_.data(), &fixed, sizeof fixed, cudaMemcpyHostToDevice, ctx.stream()),
            "cudaMemcpyAsync");
    }
    check(cudaMemsetAsync(scratch_.data(), 0, sizeof(detail::cuda::step_scratch), ctx.stream()),
          "cudaMemsetAsync");
    fuse_refresh(ctx);
    ctx.synchronize();
  }
  trainer(const trainer&) = delete;
  trainer& operator=(const trainer&) = delete;
  ~trainer() {
    if (graph_ != nullptr) (void)cudaGraphExecDestroy(graph_);
    for (auto& g : graphs_) {
      if (g.exec != nullptr) (void)cudaGraphExecDestroy(g.exec);
    }
  }

  /// Queues one optimizer step on `inputs` and `targets` (device tensors that must stay
  /// unchanged until the step has run). Throws precis::error, before any launch, for inputs
  /// or targets of a shape the model or the loss refuses, or when the optimizer's
  /// learning-rate table is used up.
  ///
  /// With train_options::graph the step runs as a CUDA graph: eagerly the first time these
  /// input and target objects are given, captured the second time, replayed after (a graph
  /// per pair, captured again when a device buffer was reallocated since). A replay reads
  /// the objects' buffers at the addresses they had when it was captured: give the same
  /// objects for the same batch buffers (a batch gathered into fixed buffers). A tensor
  /// holding another buffer than at the capture (moved into, or made again at the same
  /// address) starts a graph of its own; past train_options::max_graphs the least recently
  /// used is dropped (graph_evictions()), and forget_graphs() frees them all. Throws
  /// precis::error as capture() does for a model with a dropout layer.
  void step(cuda_context& ctx, const input_tensor& inputs, const target_tensor& targets) {
    const batch_type b{inputs, targets};
    step(ctx, std::span<const batch_type>(&b, 1));
  }
  /// One optimizer step over `batches`, as the host trainer's (gradient accumulation: each
  /// micro-batch's scaled loss is divided by their count, the record's loss is their mean):
  /// the same launches per micro-batch, one unscale, norm and update. Throws precis::error,
  /// before any launch, for no micro-batches or one that the model or the loss refuses.
  /// Under train_options::graph a graph belongs to the sequence of (inputs, targets) objects,
  /// and the micro-batches of a step must have one shape (precis::error otherwise).
  void step(cuda_context& ctx, std::span<const batch_type> batches) {
    if (batches.empty()) throw error("precis::nn::trainer::step: no micro-batches were given");
    if (!options_.graph) {
      make_room(ctx);
      queue(ctx, batches);
      ++queued_;
      return;
    }
    // A captured step's buffers have one shape: micro-batches of several shapes would
    // reallocate them inside the capture (the targets' shapes follow the inputs', checked by
    // queue()).
    const auto shape = detail::edge_shape_of<Model::input_rank>(batches[0].inputs);
    for (const auto& b : batches) {
      if (detail::edge_shape_of<Model::input_rank>(b.inputs) != shape) {
        throw error("precis::nn::trainer::step: under train_options::graph the micro-batches of a step have one "
                    "shape; got " + detail::edge_shape_string(shape) + " and " +
                    detail::edge_shape_string(detail::edge_shape_of<Model::input_rank>(b.inputs)));
      }
    }
    // The objects, their buffers and extents: a tensor made again at an old object's address
    // holds another buffer, and one fitted to another shape other sizes, which the graph
    // would not read.
    std::vector<const void*> key;
    key.reserve(8 * batches.size());
    for (const auto& b : batches) append_key(key, b);
    graph_entry* g = nullptr;
    for (auto& e : graphs_) {
      if (e.key == key) g = &e;
    }
    if (g == nullptr && graphs_.size() >= options_.max_graphs) {
      // Room for a new sequence: the least recently stepped one goes.
      auto oldest = graphs_.begin();
      for (auto it = graphs_.begin(); it != graphs_.end(); ++it) {
        if (it->last_step < oldest->last_step) oldest = it;
      }
      if (oldest->exec != nullptr) (void)cudaGraphExecDestroy(oldest->exec);
      graphs_.erase(oldest);
      ++graph_evictions_;
    }
    if (g != nullptr && g->exec != nullptr && !still_valid(ctx, g->reallocations, g->workspace)) {
      (void)cudaGraphExecDestroy(g->exec);
      g->exec = nullptr;  // the next step on these objects is captured again
    }
    if (g == nullptr || g->exec == nullptr) {
      const bool warm = g != nullptr;
      if (!warm) {
        graphs_.push_back({std::move(key), nullptr, 0, nullptr});
        g = &graphs_.back();
      }
      g->last_step = ++graph_steps_;
      if (!warm || g->warmed_reallocations != detail::device_reallocations.load(std::memory_order_relaxed)) {
        // First on these objects, or buffers moved since: an eager step (it makes them).
        make_room(ctx);
        queue(ctx, batches);
        ++queued_;
        g->warmed_reallocations = detail::device_reallocations.load(std::memory_order_relaxed);
        return;
      }
      g->exec = capture_graph(ctx, batches);
      g->reallocations = detail::device_reallocations.load(std::memory_order_relaxed);
      g->workspace = ctx.workspace_address();
    }
    g->last_step = ++graph_steps_;
    launch(ctx, g->exec);
  }
  /// Forgets the graphs step() captured under train_options::graph (each pair then starts
  /// again with an eager step).
  void forget_graphs() {
    for (auto& g : graphs_) {
      if (g.exec != nullptr) (void)cudaGraphExecDestroy(g.exec);
    }
    graphs_.clear();
  }
  /// Graphs step() holds (train_options::graph).
  std::size_t graphs() const {
    std::size_t n = 0;
    for (const auto& g : graphs_) n += g.exec != nullptr ? 1U : 0U;
    return n;
  }
  /// (inputs, targets) sequences step() dropped to stay within train_options::max_graphs,
  /// each with its graph if it had one. More than a few means the loop gives new tensors
  /// each step: gather the batches into the same ones.
  std::uint64_t graph_evictions() const { return graph_evictions_; }

  /// Records the step on `inputs` and `targets` as a CUDA graph instead of running it
  /// (replacing one captured before); replay() runs it on whatever those tensors hold then,
  /// so both objects must outlive the replays (replay() reads them to check their buffers).
  /// Needs an eager step() on tensors of the same shapes first (the buffers and cuBLASLt's
  /// plans are made there); throws precis::error otherwise, for a model with a dropout
  /// layer, or when capture fails. Each replay, not the capture, takes one step of the
  /// optimizer's learning-rate table.
  void capture(cuda_context& ctx, const input_tensor& inputs, const target_tensor& targets) {
    if (queued_ == 0) {
      throw error("precis::nn::trainer::capture: run one step() on tensors of these shapes first");
    }
    const batch_type b{inputs, targets};
    std::vector<const void*> key;
    append_key(key, b);  // before the capture: it may refuse the targets
    cudaGraphExec_t exec = capture_graph(ctx, std::span<const batch_type>(&b, 1));
    if (graph_ != nullptr) (void)cudaGraphExecDestroy(graph_);
    graph_ = exec;
    graph_reallocations_ = detail::device_reallocations.load(std::memory_order_relaxed);
    graph_workspace_ = ctx.workspace_address();
    graph_key_ = std::move(key);
  }
  /// Runs the captured step once more, on ctx's stream. Throws precis::error without a
  /// capture, when a device buffer of any model took another shape or ctx's workspace was
  /// reallocated since, or when the captured inputs or targets hold another buffer or shape
  /// (capture again then).
  void replay(cuda_context& ctx) {
    if (graph_ == nullptr) throw error("precis::nn::trainer::replay: no step was captured");
    // The graph holds the addresses and sizes of the layers' buffers, the batch's and the
    // context's workspace.
    if (!still_valid(ctx, graph_reallocations_, graph_workspace_)) {
      throw error("precis::nn::trainer::replay: device buffers took another shape since the capture (a pass on "
                  "a batch of another shape, or a larger workspace); capture the step again");
    }
    const auto* inputs = static_cast<const input_tensor*>(graph_key_[0]);
    const auto* targets = static_cast<const target_tensor*>(graph_key_[1]);
    std::vector<const void*> now;
    append_key(now, batch_type{*inputs, *targets});
    if (now != graph_key_) {
      throw error("precis::nn::trainer::replay: the captured inputs or targets hold another buffer or shape "
                  "than at the capture; capture the step again");
    }
    launch(ctx, graph_);
  }

  /// The records of the steps queued since the last call, in order (waits for them).
  std::vector<step_record> records(cuda_context& ctx) {
    drain(ctx);
    std::vector<step_record> out;
    out.swap(pending_);
    return out;
  }
  /// Steps queued (eager and replayed) since the trainer was made.
  std::uint64_t queued() const { return queued_; }
  /// Writes the device scaler state back into the host scaler (a dynamic_scaler's scale
  /// and counters; nothing for the fixed scalers), e.g. before save_checkpoint; waits.
  void store_scaler(cuda_context& ctx) {
    if constexpr (dynamic) store_device_state(ctx, state_.data(), *scaler_);
  }

 private:
  // The step's launches, in the host trainer's order (nn/train.hpp).
  void queue(cuda_context& ctx, std::span<const batch_type> batches) {
    // Shapes first, so that a bad batch queues nothing.
    for (const auto& b : batches) check_batch(b.inputs, b.targets);
    if (opt_->steps_left() == 0) {
      throw error("precis::nn::trainer::step: the optimizer's learning-rate table is used up; make it with a "
                  "longer table (lr_table(steps) or max_steps)");
    }
    auto* s = scratch_.data();
    const float* scale = &state_.data()->scale;
    check(cudaMemsetAsync(&s->found_inf, 0, sizeof(int), ctx.stream()), "cudaMemsetAsync");
    model_->zero_grad(ctx);
    const std::size_t n = batches.size();
    // Forward, loss and scaled backward of one micro-batch; its loss value.
    auto pass = [&](const batch_type& b) -> const auto& {
      const auto& y = model_->forward(ctx, b.inputs, mode::train);
      const auto& l = loss_->forward(ctx, y, b.targets);
      model_->backward_parameters(ctx, loss_->backward(ctx, device_dloss(scale, double(n))));
      return l;
    };
    for (std::size_t i = 0; i + 1 < n; ++i) {
      detail::cuda::add_loss<<<1, 1, 0, ctx.stream()>>>(s, pass(batches[i]).data(), i);
      check(cudaGetLastError(), "precis::nn::trainer::step (loss)");
    }
    const auto& loss = pass(batches[n - 1]);
    grads_.unscale_async(ctx, scale, &s->found_inf);
    grads_.norm_async(ctx, options_.max_grad_norm, &s->norm, &s->factor);
    if (options_.max_grad_norm > 0.0) grads_.clip_async(ctx, &s->factor);
    detail::cuda::write_record<<<1, 1, 0, ctx.stream()>>>(ring_.data(), ring_.size(), s, loss.data(), n,
                                                          state_.data(), opt_->learning_rates(),
                                                          opt_->learning_rate_count(), opt_->applied_steps());
    check(cudaGetLastError(), "precis::nn::trainer::step (record)");
    opt_->step_async(ctx, &s->found_inf);
    if constexpr (dynamic) update_scale_async(ctx, state_.data(), &s->found_inf, scaler_->options());
    detail::cuda::finish_record<<<1, 1, 0, ctx.stream()>>>(ring_.data(), ring_.size(), s, state_.data());
    check(cudaGetLastError(), "precis::nn::trainer::step (record)");
    // Masters a skipped step left alone give the working copies they already have.
    if (fused_) {
      model_->for_each_parameter([](const std::string&, auto& p) { p.mark_refreshed(); });
    } else {
      model_->refresh(ctx);
    }
  }
  // Appends what a graph of micro-batch b depends on to `key`: the inputs' and targets'
  // objects (what replay() reads them back from), then each tensor they hold, its address,
  // buffer and extents (detail::graph_key_append: a tuple of pointers, several inputs, gives
  // each pointee's; a struct of targets its tensors()'). Throws precis::error for targets
  // whose tensors the key cannot see (a struct without tensors()): a graph keyed on the
  // struct's address alone would replay on the tensors it held at the capture.
  static void append_key(std::vector<const void*>& key, const batch_type& b) {
    key.insert(key.end(), {&b.inputs, &b.targets});
    if constexpr (detail::graph_key_visible<input_tensor>() && detail::graph_key_visible<target_tensor>()) {
      detail::graph_key_append(key, b.inputs);
      detail::graph_key_append(key, b.targets);
    } else {
      throw error("precis::nn::trainer: a step captured as a CUDA graph is keyed on the tensors its inputs and "
                  "targets hold; give the targets' type a tensors() member returning std::tie of its tensors");
    }
  }
  // Throws precis::error for inputs the model refuses in training or targets the loss refuses.
  void check_batch(const input_tensor& inputs, const target_tensor& targets) const {
    detail::check_micro_batch(*model_, *loss_, inputs, targets);
  }
  // Where the optimizer can write the working copies in its update (fuse_refresh) and every
  // working copy is of a type it writes, it does: the step needs no refresh launches.
  void fuse_refresh(cuda_context& ctx) {
    if constexpr (requires { opt_->fuse_refresh(ctx, {}); }) {
      std::vector<std::pair<void*, precis::detail::cuda::working_kind>> working;
      bool all = true;
      model_->for_each_parameter([&](const std::string&, auto& p) {
        using P = std::remove_cvref_t<decltype(p)>;
        using S = typename P::storage_type;
        if constexpr (std::is_same_v<S, typename P::master_type>) {
          working.emplace_back(nullptr, precis::detail::cuda::working_kind::none);
        } else {
          constexpr auto kind = precis::detail::cuda::working_kind_of<S>();
          all = all && kind != precis::detail::cuda::working_kind::none;
          working.emplace_back(const_cast<S*>(p.value().data()), kind);
        }
      });
      if (all) {
        opt_->fuse_refresh(ctx, working);
        fused_ = true;
      }
    }
  }
  // Records a step as a CUDA graph (it does not run): the launches step() would queue.
  cudaGraphExec_t capture_graph(cuda_context& ctx, std::span<const batch_type> batches) {
    // A replay runs the captured launches with the arguments they had: dropout's (seed,
    // call) would repeat one mask.
    model_->for_each_layer([](const std::string& path, const auto& layer) {
      if constexpr (requires { std::remove_cvref_t<decltype(layer)>::kind; }) {
        if (std::remove_cvref_t<decltype(layer)>::kind == std::string_view("dropout")) {
          throw error("precis::nn::trainer::capture: layer " + path_or_root(path) +
                      " is a dropout, whose mask a replayed graph would repeat; train it with step()");
        }
      }
    });
    make_room(ctx);
    const std::uint64_t before = detail::device_reallocations.load(std::memory_order_relaxed);
    const std::uint64_t places = opt_->steps_left();
    cudaGraph_t g = nullptr;
    check(cudaStreamBeginCapture(ctx.stream(), cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    try {
      queue(ctx, batches);
    } catch (const std::exception& e) {
      (void)cudaStreamEndCapture(ctx.stream(), &g);
      capture_failed(g, before, places, e.what());
    } catch (...) {
      (void)cudaStreamEndCapture(ctx.stream(), &g);
      abandon_capture(g, places);
      throw;
    }
    if (const cudaError_t e = cudaStreamEndCapture(ctx.stream(), &g); e != cudaSuccess) {
      capture_failed(g, before, places,
                     std::string("cudaStreamEndCapture: ") + cudaGetErrorString(e) +
                         " (a step queued something that cannot be captured)");
    }
    opt_->release_capture();  // the captured step ran nothing: each replay takes its place
    cudaGraphExec_t exec = nullptr;
    const cudaError_t e = cudaGraphInstantiate(&exec, g, 0);
    (void)cudaGraphDestroy(g);
    if (e != cudaSuccess) {
      // The captured update's place was given back above.
      capture_failed(nullptr, before, opt_->steps_left(),
                     std::string("cudaGraphInstantiate: ") + cudaGetErrorString(e));
    }
    return exec;
  }
  // Undoes what a failed capture left: destroys what it recorded (`partial`), clears its error
  // (a failed capture leaves it as the thread's last CUDA error, which the next launch's check
  // would report as its own), and gives back the place in the optimizer's table that the
  // captured update took, if it took one (`places`: the places left when the capture began).
  void abandon_capture(cudaGraph_t partial, std::uint64_t places) {
    if (partial != nullptr) (void)cudaGraphDestroy(partial);
    (void)cudaGetLastError();
    if (opt_->steps_left() < places) opt_->release_capture();
  }
  // Throws for a capture that failed (`what`), after abandon_capture. Where the step made or
  // resized device buffers while captured (`before`: the count when the capture began), the
  // message says so: the step was not run eagerly on these shapes first.
  [[noreturn]] void capture_failed(cudaGraph_t partial, std::uint64_t before, std::uint64_t places,
                                   const std::string& what) {
    abandon_capture(partial, places);
    if (detail::device_reallocations.load(std::memory_order_relaxed) != before) {
      throw error("precis::nn::trainer::capture: the step made or resized device buffers while it was captured (" +
                  what + "); run one step() on tensors of these shapes first");
    }
    throw error("precis::nn::trainer::capture: " + what);
  }
  // Whether a graph captured when the reallocation count and workspace were these may run.
  static bool still_valid(cuda_context& ctx, std::uint64_t reallocations, const void* workspace) {
    return detail::device_reallocations.load(std::memory_order_relaxed) == reallocations &&
           ctx.workspace_address() == workspace;
  }
  // Runs a captured step on ctx's stream. The step's place in the optimizer's table is taken
  // just before the launch and given back when the launch fails (nothing ran).
  void launch(cuda_context& ctx, cudaGraphExec_t exec) {
    make_room(ctx);
    opt_->reserve_replay();
    const cudaError_t e = cudaGraphLaunch(exec, ctx.stream());
    if (e != cudaSuccess) {
      opt_->release_capture();
      check(e, "cudaGraphLaunch");
    }
    ++queued_;
  }
  // Reads the ring when the next step would overwrite a record not yet read.
  void make_room(cuda_context& ctx) {
    if (queued_ - drained_ >= ring_.size()) drain(ctx);
  }
  void drain(cuda_context& ctx) {
    const std::uint64_t n = queued_ - drained_;
    if (n == 0) return;
    std::vector<device_step_record> all(ring_.size());
    check(cudaMemcpyAsync(all.data(), ring_.data(), all.size() * sizeof(all[0]), cudaMemcpyDeviceToHost,
                          ctx.stream()),
          "cudaMemcpyAsync");
    ctx.synchronize();
    for (std::uint64_t i = drained_; i < queued_; ++i) {
      const device_step_record& d = all[i % ring_.size()];
      step_record r;
      r.step = first_step_ + i;
      r.loss = d.loss;
      r.scale = d.scale;
      r.next_scale = d.next_scale;
      r.skipped = d.skipped != 0;
      r.grad_norm = d.grad_norm;
      r.lr = d.lr;
      pending_.push_back(r);
    }
    drained_ = queued_;
  }

  Model* model_;
  Loss* loss_;
  Optimizer* opt_;
  Scaler* scaler_;
  train_options options_;
  device_gradient_set grads_;
  device_tensor<device_scaler_state, 1> state_;
  device_tensor<detail::cuda::step_scratch, 1> scratch_;
  device_tensor<device_step_record, 1> ring_;
  std::uint64_t first_step_;
  std::uint64_t queued_ = 0, drained_ = 0;
  std::vector<step_record> pending_;
  bool fused_ = false;  // the optimizer writes the working copies (fuse_refresh)
  cudaGraphExec_t graph_ = nullptr;
  std::uint64_t graph_reallocations_ = 0;
  const void* graph_workspace_ = nullptr;
  std::vector<const void*> graph_key_;  // capture()'s batch: its objects, buffers and extents
  // train_options::graph: a graph per sequence of (inputs, targets) objects, null until captured.
  struct graph_entry {
    std::vector<const void*> key;  // per micro-batch: inputs, targets, their buffers and extents
    cudaGraphExec_t exec;
    std::uint64_t reallocations;  // at the capture
    const void* workspace;        // at the capture
    std::uint64_t warmed_reallocations = 0;  // after the eager step that warmed the pair
    std::uint64_t last_step = 0;             // graph_steps_ when last stepped on
  };
  std::vector<graph_entry> graphs_;
  std::uint64_t graph_steps_ = 0;      // a clock for graph_entry::last_step (ticks per use)
  std::uint64_t graph_evictions_ = 0;  // entries dropped past train_options::max_graphs
};

/// nn::trainer train(ctx, model, loss, optimizer, scaler[, options]): the device trainer.
template <class Model, class Loss, class Optimizer, class Scaler>
trainer(cuda_context&, Model&, Loss&, Optimizer&, Scaler&, train_options = {}, std::size_t = 1024)
    -> trainer<Model, Loss, Optimizer, Scaler, no_schedule, cuda_context>;

}  // namespace precis::nn

#endif  // __CUDACC__
