/// @file
/// One optimizer step of a model under loss scaling, done in the only order that is right: scaled
/// loss -> backward per micro-batch, gradients summed in float -> averaged over processes when the
/// scaler's reducer averages (data-parallel training, precis/distributed/mpi.hpp) -> one unscale ->
/// norm and clipping on the unscaled gradients -> the scaler steps the optimizer or skips the step
/// -> working copies refreshed -> schedule advanced only when the step was applied.
#pragma once

#include <precis/nn/loss.hpp>
#include <precis/nn/build.hpp>
#include <precis/scaling/gradients.hpp>
#include <precis/scaling/scalers.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace precis::nn {

/// Options of trainer.
struct train_options {
  /// Clip the unscaled gradients' joint L2 norm to this (precis::clip_grad_norm); 0: no
  /// clipping.
  double max_grad_norm = 0.0;
  /// The device trainer only: run each step as a CUDA graph. The first step on given input
  /// and target objects runs eagerly (it makes the buffers and plans), the second is captured
  /// and every later one replays that graph; once per such pair, cached, and captured again
  /// when a device buffer was reallocated since. The host trainer refuses it.
  bool graph = false;
  /// The device trainer under `graph`: the most (inputs, targets) sequences it keeps a graph
  /// (or a warm-up mark) for. Past it, the least recently stepped one is dropped, its graph
  /// destroyed, and trainer::graph_evictions() counts it: a loop that gives new batch tensors
  /// every step shows there, instead of growing without bound. At least 1.
  std::size_t max_graphs = 8;
};

/// What one step did.
struct step_record {
  std::uint64_t step = 0;   ///< index of the step (applied or skipped), counted by the scaler
  double loss = 0.0;        ///< mean loss over the micro-batches (not scaled)
  float scale = 1.0f;       ///< the loss scale the gradients were computed with
  float next_scale = 1.0f;  ///< the loss scale for the next step
  bool skipped = false;     ///< some gradient was infinite or NaN: the optimizer did not step
  double grad_norm = 0.0;   ///< joint L2 norm of the unscaled gradients, before clipping
  double lr = 0.0;          ///< the optimizer's learning rate for this step
};

/// One micro-batch: the model's inputs and the loss's targets (tensors the caller owns; the
/// batch refers to them). Made as `{inputs, targets}` from tensors of exactly these types.
template <class X, class T>
struct micro_batch {
  /// Refers to x and t, which must outlive the batch.
  micro_batch(const X& x, const T& t) : inputs(x), targets(t) {}
  /// Anything but lvalues of exactly these types does not compile: a temporary, or a tensor
  /// of another type (a multi-input model's tuple of pointers included) converted into one,
  /// would be gone before the batch is used.
  template <class A, class B>
    requires(!(std::is_lvalue_reference_v<A> && std::is_lvalue_reference_v<B> &&
               std::is_same_v<std::remove_cvref_t<A>, X> && std::is_same_v<std::remove_cvref_t<B>, T>))
  micro_batch(A&&, B&&) : inputs(unbound<X>()), targets(unbound<T>()) {
    static_assert(precis::detail::dependent_false_v<A>,
                  "precis: nn::micro_batch refers to its inputs and targets: give it tensors of exactly its "
                  "types (the trainer's input_tensor and target_tensor) that outlive it, not temporaries or "
                  "tensors of other types, which would be gone before the batch is used");
  }
  const X& inputs;   ///< what the model's forward() reads
  const T& targets;  ///< what the loss's forward() compares the output with

 private:
  // Declared, never defined: what the refused constructor's references name (it does not
  // compile, so nothing calls this).
  template <class U>
  static const U& unbound();
};

/// The schedule of a trainer without one: the optimizer's learning rate is left alone.
struct no_schedule {};

/// What nn::trainer::step(ctx, batches, monitor) calls on a monitor
/// (precis::diagnostics::monitor): whether a step is observed, reading the model's buffers
/// after each backward pass and its parameter gradients after the last, and explaining a
/// skipped step.
template <class M, class Model>
concept step_monitor = requires(M& m, const Model& model, std::uint64_t step, float scale) {
  { m.due(step) } -> std::convertible_to<bool>;
  m.observe(model, step, scale);
  m.observe_parameters(model, step, scale);
  m.explain_skip(model, step);
};

/// True when Scaler's reducer averages gradients over processes (precis::mpi_reducer):
/// the trainer then averages the summed gradients once per step, before unscaling. False
/// for precis::single_process, and the step has no such call.
template <class Scaler>
concept averaging_scaler = requires(Scaler& s, std::vector<std::span<float>>& g) {
  s.reducer_object().average(g);
};

namespace detail {

/// The compile-time checks every trainer (host or device) makes of its parts: the loss
/// reads the model's output type and rank and gives its gradient type, and the scaler fits
/// the loss's policy (rule b). True when they pass; a static_assert's message otherwise.
template <class Model, class Loss, class Scaler>
constexpr bool trainer_parts_fit() {
  static_assert(std::is_same_v<typename Model::output_type, typename Loss::input_type> &&
                    std::is_same_v<typename Model::output_grad_type, typename Loss::input_grad_type>,
                "precis: the loss must read the model's output type and give its gradient type; "
                "give the loss's tag the policy of the model's last layer in the map");
  static_assert(Model::output_rank == Loss::input_rank,
                "precis: the loss reads tensors of another rank than the model gives");
  return check_scaler<typename Loss::policy_type, Scaler>();
}

/// Whether T is a std::tuple.
template <class T>
struct is_std_tuple : std::false_type {};
template <class... U>
struct is_std_tuple<std::tuple<U...>> : std::true_type {};

/// Whether a CUDA graph's key can see every buffer that value v of type T reads
/// (graph_key_append): a tensor; a tuple of pointers to tensors (a model of several
/// inputs); a struct that names its tensors with tensors() (a tuple of references, as
/// std::tie gives).
template <class T>
constexpr bool graph_key_visible() {
  if constexpr (requires(const T& v) {
                  v.data();
                  v.shape();
                }) {
    return true;
  } else if constexpr (requires(const T& v) { v.tensors(); }) {
    return []<class... U>(std::type_identity<std::tuple<U...>>) {
      return (graph_key_visible<std::remove_cvref_t<U>>() && ...);
    }(std::type_identity<decltype(std::declval<const T&>().tensors())>{});
  } else if constexpr (is_std_tuple<T>::value) {
    return []<class... U>(std::type_identity<std::tuple<U...>>) {
      return ((std::is_pointer_v<U> && graph_key_visible<std::remove_cvref_t<std::remove_pointer_t<U>>>()) && ...);
    }(std::type_identity<T>{});
  } else {
    return false;
  }
}

/// Appends to `key` what a CUDA graph captured with value v reads through it: for each
/// tensor it holds (itself; each pointee of a tuple of pointers; each of a struct's
/// tensors()), the tensor's address, its buffer and its extents, as words. A tensor made
/// again at an old one's address holds another buffer, and one fitted to another shape in
/// place other extents: either gives another key. Only for graph_key_visible types.
template <class T>
void graph_key_append(std::vector<const void*>& key, const T& v) {
  static_assert(graph_key_visible<T>(), "precis: graph_key_append reads tensors, tuples of pointers to them, and "
                                        "structs whose tensors() names theirs");
  if constexpr (requires {
                  v.data();
                  v.shape();
                }) {
    key.push_back(&v);
    key.push_back(v.data());
    for (const auto e : v.shape()) key.push_back(reinterpret_cast<const void*>(static_cast<std::uintptr_t>(e)));
  } else if constexpr (requires { v.tensors(); }) {
    std::apply([&](const auto&... t) { (graph_key_append(key, t), ...); }, v.tensors());
  } else {
    std::apply([&](const auto*... p) { (graph_key_append(key, *p), ...); }, v);
  }
}

/// What every trainer (host or device) checks of each micro-batch before a step changes
/// anything: the model's shapes under training's rules (nn::model::output_shape(in,
/// mode::train)), then the targets, by the loss's check_targets(out, targets) where it has
/// one (a loss of several outputs), else a first axis as long as the output's. Throws
/// precis::error naming what it refuses.
template <class Model, class Loss, class X, class T>
void check_micro_batch(const Model& model, const Loss& loss, const X& inputs, const T& targets) {
  const auto out = model.output_shape(edge_shape_of<Model::input_rank>(inputs), mode::train);
  if constexpr (requires { loss.check_targets(out, targets); }) {
    loss.check_targets(out, targets);
  } else if constexpr (requires {
                         targets.shape()[0];
                         out[0];
                       }) {
    if (std::size_t(targets.shape()[0]) != out[0]) {
      throw error("precis::nn::trainer::step: " + std::to_string(targets.shape()[0]) +
                  " targets for a batch of " + std::to_string(out[0]));
    }
  }
}

}  // namespace detail

/// Trains `Model` (an nn::model from nn::build) on `Loss` (nn::softmax_cross_entropy, or any
/// loss with input_type / input_grad_type / input_rank / target_tensor, forward(ctx, y,
/// targets) returning the loss and backward(ctx, dloss) the gradient of y) with `Optimizer`
/// (precis::sgd, precis::adamw) under `Scaler` (precis::no_scaling, static_scaler,
/// dynamic_scaler, or their basic_ forms with a reducer: with precis::mpi_reducer each
/// process trains on its share of the batch and the gradients are averaged), advancing `Schedule`
/// (e.g. precis::warmup_cosine) on applied steps. Holds references: the objects are the caller's,
/// so they can be checkpointed together with precis::save_checkpoint(file, model, optimizer,
/// scaler, schedule). The backward pass skips the gradient with respect to the model's
/// input, which nothing reads (nn::model::backward_parameters).
///
/// Compile-time checks: the loss reads the model's output type and gives its gradient
/// type, and every layer's gradients fit the scaler (rule b: float16 gradients need a
/// scaler that scales, unless the layer's policy waives rule::unscaled_gradients).
///
/// `Ctx`, the model's context, picks the implementation: this one for cpu_context; the
/// device trainer for cuda_context is a partial specialisation in <precis/nn/cuda.hpp>
/// (the whole step queued on the context's stream, records read back when asked).
template <class Model, class Loss, class Optimizer, class Scaler, class Schedule = no_schedule,
          class Ctx = typename Model::context_type>
class trainer {
  static_assert(std::is_same_v<Ctx, cpu_context>,
                "precis: the device nn::trainer is declared in <precis/nn/cuda.hpp>; include it "
                "first, from CUDA code");
  static_assert(detail::trainer_parts_fit<Model, Loss, Scaler>());

 public:
  /// What the model's forward() reads.
  using input_tensor = typename Model::input_tensor;
  /// What the loss reads as targets.
  using target_tensor = typename Loss::target_tensor;
  /// One micro-batch of step().
  using batch_type = micro_batch<input_tensor, target_tensor>;

  /// A trainer without a schedule (the optimizer's learning rate is left alone); throws
  /// precis::error when `o.max_grad_norm` is negative or NaN.
  trainer(Model& model, Loss& loss, Optimizer& opt, Scaler& scaler, train_options o = {})
    requires std::is_same_v<Schedule, no_schedule>
      : model_(&model), loss_(&loss), opt_(&opt), scaler_(&scaler), options_(o) {
    check_options();
  }
  /// A trainer that sets the optimizer's learning rate from `schedule` before each step and
  /// advances it after each applied one; throws precis::error as the other constructor does.
  trainer(Model& model, Loss& loss, Optimizer& opt, Scaler& scaler, Schedule& schedule, train_options o = {})
      : model_(&model), loss_(&loss), opt_(&opt), scaler_(&scaler), schedule_(&schedule), options_(o) {
    check_options();
  }

  /// One optimizer step over `batches` (gradient accumulation: each micro-batch's loss is
  /// divided by their count, so the step sees the mean of their gradients).
  step_record step(const cpu_context& ctx, std::span<const batch_type> batches) {
    no_monitor none;
    return run(ctx, batches, none);
  }
  /// The same step, observed by `monitor` (precis::diagnostics::monitor) when it is due, and
  /// explained by it when the step is skipped.
  template <step_monitor<Model> Monitor>
  step_record step(const cpu_context& ctx, std::span<const batch_type> batches, Monitor& monitor) {
    return run(ctx, batches, monitor);
  }
  /// One optimizer step on one batch.
  step_record step(const cpu_context& ctx, const input_tensor& inputs,
                   const target_tensor& targets) {
    const batch_type b{inputs, targets};
    return step(ctx, std::span<const batch_type>(&b, 1));
  }
  /// The same, observed by `monitor`.
  template <step_monitor<Model> Monitor>
  step_record step(const cpu_context& ctx, const input_tensor& inputs, const target_tensor& targets,
                   Monitor& monitor) {
    const batch_type b{inputs, targets};
    return step(ctx, std::span<const batch_type>(&b, 1), monitor);
  }
  /// Any other inputs or targets do not compile (see nn::binds_edge_v): they would be
  /// converted into temporary copies, or fail at run time (swapped arguments).
  template <class X, class Y, class... Monitor>
    requires(sizeof...(Monitor) <= 1 && !std::is_convertible_v<const X&, std::span<const batch_type>> &&
             !(binds_edge_v<X, input_tensor> && binds_edge_v<Y, target_tensor>))
  step_record step(const cpu_context&, const X&, const Y&, Monitor&...) {
    static_assert(precis::detail::dependent_false_v<X>,
                  "precis: nn::trainer::step(ctx, inputs, targets) takes the model's input_tensor and the "
                  "loss's target_tensor (the trainer's input_tensor and target_tensor types), inputs first; another "
                  "element type, rank or an xtensor expression would be copied into a temporary");
    return {};
  }

 private:
  struct no_monitor {};

  template <class Monitor>
  step_record run(const cpu_context& ctx, std::span<const batch_type> batches, Monitor& monitor) {
    constexpr bool monitored = !std::is_same_v<Monitor, no_monitor>;
    if (batches.empty()) throw error("precis::nn::trainer::step: no micro-batches were given");
    // Every micro-batch's shapes and targets first, so that a bad one changes nothing (the
    // gradients are not zeroed, no layer runs).
    for (const auto& b : batches) detail::check_micro_batch(*model_, *loss_, b.inputs, b.targets);
    step_record r;
    r.step = scaler_->steps();
    if constexpr (!std::is_same_v<Schedule, no_schedule>) opt_->set_lr(schedule_->lr());
    r.lr = opt_->lr();
    // Under a monitor every layer keeps its gradient buffers: the monitor reads them on the
    // steps it observes, and on any step that is skipped, to find the first non-finite value.
    // The model's own setting comes back when the step ends, by any way out.
    struct keeping {
      Model* model;  // null: nothing to put back
      bool before;
      keeping(Model* m, bool b) : model(m), before(b) {}
      keeping(const keeping&) = delete;
      keeping& operator=(const keeping&) = delete;
      ~keeping() {
        if (model != nullptr) model->keep_gradient_buffers(before);
      }
    };
    const keeping keep{monitored ? model_ : nullptr, model_->keeps_gradient_buffers()};
    if constexpr (monitored) model_->keep_gradient_buffers(true);
    model_->zero_grad();
    const float scale = scaler_->scale();
    const double dloss = double(scale) / double(batches.size());
    double loss_sum = 0.0;
    for (const auto& b : batches) {
      const auto& y = model_->forward(ctx, b.inputs, mode::train);
      loss_sum += double(loss_->forward(ctx, y, b.targets));
      model_->backward_parameters(ctx, loss_->backward(ctx, dloss));
      if constexpr (monitored) {
        if (monitor.due(r.step)) monitor.observe(std::as_const(*model_), r.step, scale);
      }
    }
    if constexpr (monitored) {
      if (monitor.due(r.step)) monitor.observe_parameters(std::as_const(*model_), r.step, scale);
    }
    r.loss = loss_sum / double(batches.size());  // this process's
    if constexpr (averaging_scaler<Scaler>) {
      auto local = model_->gradients();
      scaler_->reducer_object().average(local);
    }
    auto grads = unscale(scaler_->scaled_gradients(model_->gradients()));
    r.grad_norm = options_.max_grad_norm > 0.0 ? clip_grad_norm(grads, options_.max_grad_norm) : grad_norm(grads);
    const step_result s = scaler_->step(*opt_, std::move(grads));
    r.scale = s.scale_before;
    r.next_scale = s.scale_after;
    r.skipped = !s.applied;
    if constexpr (monitored) {
      if (!s.applied) monitor.explain_skip(std::as_const(*model_), r.step);
    }
    if (s.applied) model_->refresh(ctx);
    if constexpr (!std::is_same_v<Schedule, no_schedule>) schedule_->advance(s.applied);
    return r;
  }

  void check_options() const {
    // Rule b for every layer: instantiating the check is what makes it a compile error.
    (void)model_->template check_scaler<Scaler>();
    if (!(options_.max_grad_norm >= 0.0)) throw error("precis::nn::trainer: max_grad_norm must be >= 0");
    if (options_.graph) {
      throw error("precis::nn::trainer: train_options::graph captures device steps as CUDA graphs; a host "
                  "trainer has none");
    }
  }

  Model* model_;
  Loss* loss_;
  Optimizer* opt_;
  Scaler* scaler_;
  Schedule* schedule_ = nullptr;
  train_options options_;
};

/// Loss and accuracy of a model in evaluation mode on one batch.
struct evaluation {
  double loss = 0.0;      ///< the loss's value on the batch (nn::softmax_cross_entropy: the mean)
  double accuracy = 0.0;  ///< fraction of rows whose largest logit (first on ties) is the target
};

/// Runs `model` on `x` in evaluation mode (mode::eval) and scores its output against
/// `targets` with `loss` and nn::count_correct; no gradient is computed. The output must be
/// logits [batch, classes].
template <class Model, class Loss>
evaluation evaluate(const cpu_context& ctx, Model& model, Loss& loss, const typename Model::input_tensor& x,
                    const typename Loss::target_tensor& targets) {
  const auto& y = model.forward(ctx, x, mode::eval);
  evaluation e;
  e.loss = double(loss.forward(ctx, y, targets));
  e.accuracy = double(count_correct(y, targets)) / double(x.shape()[0]);
  return e;
}

/// Any other inputs or targets do not compile, as for nn::trainer::step.
template <class Model, class Loss, class X, class Y>
  requires(!(binds_edge_v<X, typename Model::input_tensor> && binds_edge_v<Y, typename Loss::target_tensor>))
evaluation evaluate(const cpu_context&, Model&, Loss&, const X&, const Y&) {
  static_assert(precis::detail::dependent_false_v<X>,
                "precis: nn::evaluate(ctx, model, loss, x, targets) takes the model's input_tensor and the "
                "loss's target_tensor, x first; another element type, rank or an xtensor expression would be "
                "copied into a temporary");
  return {};
}

}  // namespace precis::nn
