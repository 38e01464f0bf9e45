/// @file
/// Loss scalers (no_scaling, static_scaler, dynamic_scaler), the step they guard, and the scaler a
/// policy calls for.
#pragma once

#include <precis/config.hpp>
#include <precis/policy/checks.hpp>
#include <precis/policy/definition.hpp>
#include <precis/scaling/gradients.hpp>
#include <precis/scaling/reducer.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace precis {

/// What a scaler's step did. Learning-rate schedules advance only when `applied`.
struct step_result {
  bool applied = false;           ///< the optimizer stepped (the gradients were finite)
  bool found_inf = false;         ///< some gradient was infinite or NaN (in any process)
  float scale_before = 1.0f;      ///< the loss scale the gradients were computed with
  float scale_after = 1.0f;       ///< the loss scale for the next step
  bool at_minimum_scale = false;  ///< skipped while the scale could not back off further
};

/// An optimizer a scaler can step: `opt.step(grads)` updates the parameters from the
/// (unscaled) gradients.
template <class O, class G>
concept optimizer_for = requires(O& o, G& g) { o.step(g); };

/// Something that receives every step's result, for logging.
template <class S>
concept scaler_sink = requires(S& s, const step_result& r) { s.on_step(r); };

/// A change of the loss scale: at which step (counting from 0) and to what.
struct scale_change {
  std::uint64_t step;  ///< The step whose scale update made the change.
  float scale;         ///< The scale from the next step on.
};

namespace detail {

template <class Archive, class Scaler>
void visit_common_state(Archive& a, Scaler& s);

// Shared by the scalers: counting, the guarded step, the scaled-gradient entry point.
template <class Derived, reducer Reducer>
class scaler_base {
 public:
  explicit scaler_base(Reducer r = {}) : reducer_(std::move(r)) {}

  /// The loss multiplied by the current scale; backpropagate this.
  float scale_loss(float loss) const { return loss * self().scale(); }

  /// Marks gradients computed from `scale_loss(...)` as scaled by the current scale.
  template <gradients G>
  scaled<G> scaled_gradients(G grads) const {
    return scaled<G>(std::move(grads), self().scale());
  }

  /// Steps `opt` with the gradients unless some gradient (in any process, through the
  /// reducer) is infinite or NaN, then updates the scale. Consumes the gradients: a
  /// second step needs a new backward pass.
  template <gradients G, optimizer_for<G> O>
  step_result step(O& opt, unscaled<G>&& grads) {
    return step_impl<void>(opt, std::move(grads), nullptr);
  }
  /// The same, reporting the result to `sink`.
  template <gradients G, optimizer_for<G> O, scaler_sink S>
  step_result step(O& opt, unscaled<G>&& grads, S& sink) {
    return step_impl<S>(opt, std::move(grads), &sink);
  }
  /// Unscales (one fused pass) and steps, for loops that do not clip.
  template <gradients G, optimizer_for<G> O>
  step_result step(O& opt, scaled<G>&& grads) {
    return step(opt, unscale(std::move(grads)));
  }

  template <gradients G, class O>
  void step(O&, unscaled<G>&) {
    static_assert(dependent_false_v<G>,
                  "precis: step() consumes the unscaled gradients; pass std::move(grads). A "
                  "second step with the same gradients would apply them twice");
  }
  template <gradients G, class O>
  void step(O&, scaled<G>&) {
    static_assert(dependent_false_v<G>,
                  "precis: step() consumes the gradients; pass std::move(grads), after "
                  "unscale() if you clip them");
  }

  /// Steps taken, skipped, and skipped while the scale was at its minimum.
  std::uint64_t steps() const { return steps_; }
  std::uint64_t skipped_steps() const { return skipped_; }
  std::uint64_t steps_at_minimum() const { return at_minimum_; }
  /// Every change of the scale, in order (not one entry per step).
  const std::vector<scale_change>& scale_history() const { return history_; }
  /// The reducer that combines found-inf flags across processes.
  Reducer& reducer_object() { return reducer_; }

  // What a scaler that never changes its scale does; dynamic_scaler hides these.
  bool at_minimum() const { return false; }
  void update(bool) {}
  void after_step(const step_result&) {}
  std::string validate() const { return {}; }

 protected:
  const Derived& self() const { return static_cast<const Derived&>(*this); }
  Derived& self() { return static_cast<Derived&>(*this); }

  template <class S, class G, class O>
  step_result step_impl(O& opt, unscaled<G>&& grads, S* sink) {
    if (grads.consumed()) {
      throw error("precis: step() was given gradients that were already stepped with or moved "
                  "from");
    }
    step_result r;
    r.found_inf = reducer_.any(grads.found_inf());
    r.scale_before = self().scale();
    if (!r.found_inf) opt.step(grads.values());
    G spent = std::move(grads).release();
    (void)spent;
    r.applied = !r.found_inf;
    r.at_minimum_scale = r.found_inf && self().at_minimum();
    ++steps_;
    skipped_ += r.found_inf;
    at_minimum_ += r.at_minimum_scale;
    self().update(r.found_inf);
    r.scale_after = self().scale();
    if (r.scale_after != r.scale_before) history_.push_back({steps_ - 1, r.scale_after});
    if constexpr (!std::is_same_v<S, void>) {
      if (sink) sink->on_step(r);
    }
    self().after_step(r);
    return r;
  }

  Reducer reducer_;
  std::uint64_t steps_ = 0;
  std::uint64_t skipped_ = 0;
  std::uint64_t at_minimum_ = 0;
  std::vector<scale_change> history_;

  template <class D, reducer R>
  friend class scaler_base;
  template <class Archive, class Scaler>
  friend void visit_common_state(Archive&, Scaler&);
};

}  // namespace detail

/// No loss scaling: for float and bfloat16 gradients, whose range needs none. Steps are
/// still skipped when a gradient is infinite or NaN.
template <reducer Reducer = single_process>
class basic_no_scaling : public detail::scaler_base<basic_no_scaling<Reducer>, Reducer> {
 public:
  /// False: the loss is not multiplied, so precis::check_scaler rejects it for gradients
  /// that need loss scaling.
  static constexpr bool scales = false;
  /// The kind a checkpoint records (precis::save_state).
  static constexpr std::string_view kind = "no_scaling";
  using detail::scaler_base<basic_no_scaling, Reducer>::scaler_base;
  /// Always 1.
  float scale() const { return 1.0f; }
  /// Visits the state for precis::save_state and precis::load_state: the step counters
  /// and the scale history.
  template <class Archive>
  void visit_state(Archive& a) {
    detail::visit_common_state(a, *this);
  }
};
/// precis::basic_no_scaling for one process.
using no_scaling = basic_no_scaling<>;

/// A fixed loss scale. Skips steps whose gradients are not finite, never changes.
template <reducer Reducer = single_process>
class basic_static_scaler : public detail::scaler_base<basic_static_scaler<Reducer>, Reducer> {
 public:
  /// True: the loss is multiplied by scale().
  static constexpr bool scales = true;
  /// The kind a checkpoint records (precis::save_state).
  static constexpr std::string_view kind = "static_scaler";
  /// A scaler with the fixed loss scale `scale`; `r` agrees found-inf flags across
  /// processes. Throws precis::error unless `scale` is finite and positive.
  explicit basic_static_scaler(float scale = 65536.0f, Reducer r = {})
      : detail::scaler_base<basic_static_scaler, Reducer>(std::move(r)), scale_(scale) {
    if (auto e = validate(); !e.empty()) throw error("precis::static_scaler: " + e);
  }
  /// The fixed loss scale.
  float scale() const { return scale_; }
  /// Visits the state for precis::save_state and precis::load_state: the step counters,
  /// the scale history and the scale.
  template <class Archive>
  void visit_state(Archive& a) {
    detail::visit_common_state(a, *this);
    a.field("scale", scale_);
  }
  /// Empty when the scale is finite and positive; otherwise what is wrong.
  std::string validate() const {
    if (!(scale_ > 0.0f) || !std::isfinite(scale_)) {
      return "the scale must be finite and positive, got " + std::to_string(scale_);
    }
    return {};
  }

 private:
  float scale_;
};
/// precis::basic_static_scaler for one process.
using static_scaler = basic_static_scaler<>;

/// What a dynamic scaler does when it backs off to its minimum scale and keeps finding
/// non-finite gradients.
enum class at_minimum_scale {
  skip_and_report,  ///< keep skipping steps; step_result::at_minimum_scale and
                    ///< steps_at_minimum() say so (the default)
  throw_error,      ///< throw precis::error after `max_skips_at_minimum` consecutive skips
};

/// Options of dynamic_scaler. The first four are PyTorch's GradScaler defaults; the
/// factors are doubles, as PyTorch's are, and the scale is multiplied by them in double
/// and rounded to float once, as PyTorch does, so any factors give PyTorch's trajectory.
struct dynamic_scaler_options {
  float init_scale = 65536.0f;          ///< 2^16
  double growth_factor = 2.0;           ///< after growth_interval finite steps
  double backoff_factor = 0.5;          ///< on a backoff
  std::uint32_t growth_interval = 2000; ///< consecutive finite steps before growing
  /// Back off only after this many consecutive non-finite steps (1: at every one, as
  /// PyTorch does; Apex and DeepSpeed offer more). Every non-finite step is skipped.
  std::uint32_t hysteresis = 1;
  float min_scale = 1.0f;  ///< the scale never backs off below this
  float max_scale = std::numeric_limits<float>::infinity();  ///< nor grows above this
  /// What to do while steps keep being skipped at min_scale.
  at_minimum_scale at_minimum = at_minimum_scale::skip_and_report;
  std::uint64_t max_skips_at_minimum = 1000;  ///< for at_minimum_scale::throw_error
};

/// Dynamic loss scaling: grows the scale by growth_factor after growth_interval
/// consecutive finite steps (when the result is finite and within max_scale), backs it
/// off by backoff_factor after `hysteresis` consecutive non-finite steps (not below
/// min_scale), and skips every non-finite step.
template <reducer Reducer = single_process>
class basic_dynamic_scaler : public detail::scaler_base<basic_dynamic_scaler<Reducer>, Reducer> {
 public:
  /// True: the loss is multiplied by scale().
  static constexpr bool scales = true;
  /// The kind a checkpoint records (precis::save_state).
  static constexpr std::string_view kind = "dynamic_scaler";

  /// A scaler starting at `o.init_scale`; `r` agrees found-inf flags across processes.
  /// Throws precis::error when the options are inconsistent (see validate()).
  explicit basic_dynamic_scaler(dynamic_scaler_options o = {}, Reducer r = {})
      : detail::scaler_base<basic_dynamic_scaler, Reducer>(std::move(r)),
        options_(o),
        scale_(o.init_scale),
        hysteresis_left_(o.hysteresis) {
    if (auto e = validate(); !e.empty()) throw error("precis::dynamic_scaler: " + e);
  }

  /// The current loss scale.
  float scale() const { return scale_; }
  /// The options in force (those given, or those a loaded checkpoint holds).
  const dynamic_scaler_options& options() const { return options_; }
  /// Consecutive finite steps since the last growth or backoff.
  std::uint32_t growth_tracker() const { return growth_tracker_; }
  /// Non-finite steps still tolerated before the next backoff.
  std::uint32_t hysteresis_left() const { return hysteresis_left_; }
  /// True when the scale is at min_scale and cannot back off further.
  bool at_minimum() const { return scale_ <= options_.min_scale; }

  /// The scale update after a step: PyTorch's rule (float scale times double factor,
  /// rounded to float), with hysteresis and bounds.
  void update(bool found_inf) {
    if (found_inf) {
      growth_tracker_ = 0;
      if (--hysteresis_left_ == 0) {
        const float backed_off = static_cast<float>(double(scale_) * options_.backoff_factor);
        scale_ = backed_off < options_.min_scale ? options_.min_scale : backed_off;
        hysteresis_left_ = options_.hysteresis;
      }
    } else {
      hysteresis_left_ = options_.hysteresis;
      if (++growth_tracker_ == options_.growth_interval) {
        const float grown = static_cast<float>(double(scale_) * options_.growth_factor);
        if (std::isfinite(grown)) scale_ = grown > options_.max_scale ? options_.max_scale : grown;
        growth_tracker_ = 0;
      }
    }
  }

  /// Called by step() after each step: counts consecutive skipped steps at the minimum
  /// scale and, under at_minimum_scale::throw_error, throws precis::error when they reach
  /// max_skips_at_minimum.
  void after_step(const step_result& r) {
    consecutive_at_minimum_ = r.at_minimum_scale ? consecutive_at_minimum_ + 1 : 0;
    if (options_.at_minimum == at_minimum_scale::throw_error &&
        consecutive_at_minimum_ >= options_.max_skips_at_minimum) {
      throw error("precis::dynamic_scaler: " + std::to_string(consecutive_at_minimum_) +
                  " consecutive steps had non-finite gradients at the minimum loss scale " +
                  std::to_string(options_.min_scale) +
                  "; the model diverged or its gradients overflow even unscaled");
    }
  }

  /// Visits the state for precis::save_state and precis::load_state: the step counters,
  /// the scale history, the scale, the growth and hysteresis trackers, the count of
  /// consecutive skips at the minimum and every option.
  template <class Archive>
  void visit_state(Archive& a) {
    detail::visit_common_state(a, *this);
    a.field("scale", scale_);
    a.field("growth_tracker", growth_tracker_);
    a.field("hysteresis_left", hysteresis_left_);
    a.field("consecutive_at_minimum", consecutive_at_minimum_);
    a.field("init_scale", options_.init_scale);
    a.field("growth_factor", options_.growth_factor);
    a.field("backoff_factor", options_.backoff_factor);
    a.field("growth_interval", options_.growth_interval);
    a.field("hysteresis", options_.hysteresis);
    a.field("min_scale", options_.min_scale);
    a.field("max_scale", options_.max_scale);
    auto mode = static_cast<std::uint32_t>(options_.at_minimum);
    a.field("at_minimum", mode);
    options_.at_minimum = static_cast<at_minimum_scale>(mode);
    a.field("max_skips_at_minimum", options_.max_skips_at_minimum);
  }

  /// Empty when the state is consistent; otherwise what is wrong.
  std::string validate() const {
    const auto& o = options_;
    if (!(o.init_scale > 0.0f) || !std::isfinite(o.init_scale)) return "init_scale must be finite and positive";
    if (!(o.growth_factor > 1.0) || !std::isfinite(o.growth_factor)) return "growth_factor must be finite and above 1";
    if (!(o.backoff_factor > 0.0 && o.backoff_factor < 1.0)) return "backoff_factor must be in (0, 1)";
    if (o.growth_interval == 0) return "growth_interval must be at least 1";
    if (o.hysteresis == 0) return "hysteresis must be at least 1";
    if (!(o.min_scale > 0.0f) || !std::isfinite(o.min_scale)) return "min_scale must be finite and positive";
    if (!(o.max_scale >= o.min_scale)) return "max_scale must be at least min_scale";
    if (static_cast<std::uint32_t>(o.at_minimum) > 1) return "at_minimum is not a known mode";
    if (!(scale_ > 0.0f) || !std::isfinite(scale_)) return "the scale must be finite and positive";
    if (scale_ < o.min_scale || scale_ > o.max_scale) return "the scale lies outside [min_scale, max_scale]";
    if (growth_tracker_ >= o.growth_interval) return "growth_tracker must be below growth_interval";
    if (hysteresis_left_ == 0 || hysteresis_left_ > o.hysteresis) return "hysteresis_left must be in [1, hysteresis]";
    return {};
  }

 private:
  dynamic_scaler_options options_;
  float scale_;
  std::uint32_t growth_tracker_ = 0;
  std::uint32_t hysteresis_left_;
  std::uint64_t consecutive_at_minimum_ = 0;
};
/// precis::basic_dynamic_scaler for one process.
using dynamic_scaler = basic_dynamic_scaler<>;

namespace detail {
template <class Archive, class Scaler>
void visit_common_state(Archive& a, Scaler& s) {
  a.field("steps", s.steps_);
  a.field("skipped_steps", s.skipped_);
  a.field("steps_at_minimum", s.at_minimum_);
  a.history("scale_history", s.history_);
}
}  // namespace detail

/// The scaler a policy calls for: dynamic_scaler when its gradients need loss scaling
/// (float16, float8), no_scaling otherwise (float, bfloat16).
template <Policy P>
using scaler_for = std::conditional_t<needs_loss_scaling_v<P>, dynamic_scaler, no_scaling>;

/// Checks rule b where policy `P` meets scaler `Scaler`: float16 or float8 gradients with
/// a scaler that does not scale do not compile, unless `P` waives rule::unscaled_gradients.
template <Policy P, class Scaler>
constexpr bool check_scaler() {
  return check_gradient_scaling<P, Scaler::scales>();
}

}  // namespace precis
