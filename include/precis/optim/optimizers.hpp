/// @file
/// Optimizers that update float master weights from gradients of any gradient type, with float
/// state: SGD with momentum and AdamW. They work with the scalers: a scaler calls `step(grads)`
/// only for finite gradients, so a skipped step changes neither the weights nor the optimizer's
/// state or step count.
///
/// An update is elementwise, so it runs on SIMD vectors (vmath: fma, sqrt and division are
/// correctly rounded instructions, the scalar operations' bits) and on the threads of the
/// context the optimizer was given, each tensor split into contiguous parts: the same bits
/// on every target and thread count.
#pragma once

#include <precis/config.hpp>
#include <precis/kernels/context.hpp>
#include <precis/kernels/cpu/support.hpp>
#include <precis/kernels/cpu/vec_math.hpp>
#include <precis/numeric/detail/unfused.hpp>
#include <precis/optim/update.hpp>
#include <precis/scaling/gradients.hpp>
#include <precis/tensor/device_span.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace precis {

namespace detail {

// Pairs each gradient tensor of `grads` (in gradient_access order) with the master tensor
// at the same position, checking counts and sizes before anything is updated.
template <gradients G, class F>
void for_each_master(std::span<const std::span<float>> masters, G& grads, std::string_view who, F&& f) {
  std::size_t count = 0;
  gradient_access<G>::for_each(grads, [&](auto g) {
    if (count >= masters.size() || masters[count].size() != g.size()) {
      throw error(std::string(who) + ": gradient tensor " + std::to_string(count) + " has " +
                  std::to_string(g.size()) + " elements, the parameter has " +
                  (count < masters.size() ? std::to_string(masters[count].size()) : std::string("none")));
    }
    ++count;
  });
  if (count != masters.size()) {
    throw error(std::string(who) + ": " + std::to_string(count) + " gradient tensors for " +
                std::to_string(masters.size()) + " parameters");
  }
  std::size_t i = 0;
  gradient_access<G>::for_each(grads, [&](auto g) {
    f(i, masters[i], g);
    ++i;
  });
}

/// Calls f(k, n, gf) over blocks of one tensor's gradients `g` on ctx's threads: k the
/// block's first element, n its length, gf its gradients as floats (g's own memory where it
/// holds floats, else converted into a buffer).
template <class T, class F>
void for_gradient_blocks(const cpu_context& ctx, std::span<T> g, F&& f) {
  constexpr std::size_t block = 2048;
  parallel_for(ctx, g.size(), std::size_t{1} << 15, [&](std::size_t b, std::size_t e) {
    std::array<float, block> buffer;
    for (std::size_t k = b; k < e; k += block) {
      const std::size_t n = std::min(block, e - k);
      f(k, n, float_view(g.data() + k, buffer.data(), n));
    }
  });
}

/// Calls f(i, c) for each vector of a block of n floats: i its first element, c how many of
/// its lanes are in the block (vmath::lanes but in the last).
template <class F>
void for_vectors(std::size_t n, F&& f) {
  for (std::size_t i = 0; i < n; i += vmath::lanes) f(i, std::min(vmath::lanes, n - i));
}

/// The c floats at p as a vector (the lanes past c zero), and back.
inline vmath::vf load_lanes(const float* p, std::size_t c) {
  return c == vmath::lanes ? vmath::load(p) : vmath::load_partial(p, c);
}
inline void store_lanes(float* p, vmath::vf v, std::size_t c) {
  if (c == vmath::lanes) {
    vmath::store(p, v);
  } else {
    vmath::store_partial(p, v, c);
  }
}

/// The operations of the shared updates (optim/update.hpp) on the host's SIMD vectors: the
/// same IEEE operations as precis::scalar_update_math, lane by lane.
struct vector_update_math {
  static vmath::vf fma(vmath::vf a, vmath::vf b, vmath::vf c) { return vmath::fma(a, b, c); }
  static vmath::vf mul(vmath::vf a, vmath::vf b) { return vmath::product(a, b); }
  static vmath::vf sqrt(vmath::vf a) { return vmath::sqrt(a); }
};

inline std::vector<std::vector<float>> zeros_like(std::span<const std::span<float>> masters) {
  std::vector<std::vector<float>> s;
  for (auto m : masters) s.emplace_back(m.size(), 0.0f);
  return s;
}

template <class Archive>
void visit_buffers(Archive& a, std::string_view name, std::vector<std::vector<float>>& buffers) {
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    a.floats(std::string(name) + "." + std::to_string(i), buffers[i]);
  }
}

inline std::string check_buffers(const std::vector<std::vector<float>>& buffers,
                                 std::span<const std::span<float>> masters, std::string_view name) {
  if (buffers.size() != masters.size()) return std::string(name) + ": wrong number of tensors";
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    if (buffers[i].size() != masters[i].size()) return std::string(name) + ": a tensor has the wrong size";
  }
  return {};
}

/// Which tensors take weight decay: all when `decay` is empty, else as it says (one flag
/// per master tensor, e.g. nn::model::decay_mask(): no decay on biases, norms, embeddings).
inline std::vector<bool> decay_flags(std::vector<bool> decay, std::size_t tensors, std::string_view who) {
  if (decay.empty()) return std::vector<bool>(tensors, true);
  if (decay.size() != tensors) {
    throw error(std::string(who) + ": " + std::to_string(decay.size()) + " weight-decay flags for " +
                std::to_string(tensors) + " parameter tensors");
  }
  return decay;
}

inline std::size_t buffer_bytes(const std::vector<std::vector<float>>& buffers) {
  std::size_t n = 0;
  for (const auto& b : buffers) n += b.size() * sizeof(float);
  return n;
}

}  // namespace detail

/// Stochastic gradient descent with momentum on float master weights: the same bits as
/// torch.optim.SGD (foreach or for-loop) for float32 weights and gradients, every step.
/// Each element is updated by precis::sgd_update (optim/update.hpp: PyTorch's order, each
/// multiplier rounded to float from the double hyperparameter, every fused operation an
/// explicit fma and no product fused into an addition), so the bits do not depend on -march
/// or -ffp-contract (docs/reproducibility.md), nor on the thread count, and a device
/// optimizer calling the same function gives them too.
class sgd {
 public:
  /// The kind a checkpoint records (precis::save_state).
  static constexpr std::string_view kind = "sgd";

  /// `masters`: the float master weights, in the order the gradients come in; `decay`: for
  /// each of them, whether weight decay applies (empty: all); `ctx`: the threads the updates
  /// run on (give the model's context, whose threads are idle during the update; the
  /// default is one thread).
  sgd(std::vector<std::span<float>> masters, sgd_options o = {}, std::vector<bool> decay = {},
      cpu_context ctx = cpu_context{1})
      : masters_(std::move(masters)),
        options_(o),
        decay_(detail::decay_flags(std::move(decay), masters_.size(), "precis::sgd")),
        velocity_(detail::zeros_like(masters_)),
        ctx_(std::move(ctx)) {
    if (auto e = validate_options(o); !e.empty()) throw error("precis::sgd: " + e);
  }
  /// Refused at compile time: master weights in device memory (a cuda_context model's
  /// masters()), which this optimizer would read and write on the host.
  template <class T>
  sgd(std::vector<device_span<T>> masters, sgd_options o = {}, std::vector<bool> decay = {},
     cpu_context ctx = cpu_context{1}) {
    static_assert(!is_device_span_v<device_span<T>>,
                  "precis: these master weights are in device memory (precis::device_span: a "
                  "cuda_context model's masters()); precis::sgd updates host memory");
    (void)masters, (void)o, (void)decay, (void)ctx;
  }

  /// One update from the gradients (any gradient element type, read as float).
  template <gradients G>
  void step(G& grads) {
#if !defined(__CUDACC__)
    using detail::vmath::splat;
#endif
    const auto& o = options_;
    const sgd_constants<float> f = make_sgd_constants(o, steps_ == 0);
#if !defined(__CUDACC__)
    const sgd_constants<detail::vmath::vf> c{splat(f.momentum), splat(f.kept), splat(f.minus_lr),
                                            splat(f.weight_decay), f.first, f.with_momentum,
                                            f.nesterov};
#endif
    detail::for_each_master(
        masters_, grads, "precis::sgd", [&](std::size_t i, std::span<float> w, auto g) {
          float* const buf = velocity_[i].data();
          const bool decays = decay_[i] && o.weight_decay != 0.0;
          detail::for_gradient_blocks(ctx_, g, [&](std::size_t k, std::size_t n, const float* gf) {
#if defined(__CUDACC__)
            // nvcc also compiles sgd_update (host-device) for the device, where the host's
            // vectors do not exist: from CUDA code, one float at a time, the same bits.
            for (std::size_t e = 0; e < n; ++e) {
              float b = f.with_momentum && !f.first ? buf[k + e] : 0.0f;
              sgd_update<scalar_update_math>(w[k + e], b, gf[e], f, decays);
              if (f.with_momentum) buf[k + e] = b;
            }
#else
            detail::for_vectors(n, [&](std::size_t j, std::size_t lanes) {
              float* const wp = w.data() + k + j;
              float* const bp = buf + k + j;
              auto wv = detail::load_lanes(wp, lanes);
              auto bv = c.with_momentum && !c.first ? detail::load_lanes(bp, lanes)
                                                    : detail::vmath::vf{};
              sgd_update<detail::vector_update_math>(wv, bv, detail::load_lanes(gf + j, lanes), c,
                                                     decays);
              if (c.with_momentum) detail::store_lanes(bp, bv, lanes);
              detail::store_lanes(wp, wv, lanes);
            });
#endif
          });
        });
    ++steps_;
  }

  /// The learning rate of the next step.
  double lr() const { return options_.lr; }
  /// Sets the learning rate of the following steps (e.g. a schedule's
  /// precis::warmup_cosine::lr()).
  void set_lr(double lr) { options_.lr = lr; }
  /// The options in force (those given, the latest set_lr, or those a loaded checkpoint
  /// holds).
  const sgd_options& options() const { return options_; }
  /// Updates applied so far.
  std::uint64_t steps() const { return steps_; }

  /// Visits the state for precis::save_state and precis::load_state: every option, the
  /// step count and the momentum buffers.
  template <class Archive>
  void visit_state(Archive& a) {
    a.field("lr", options_.lr);
    a.field("momentum", options_.momentum);
    a.field("dampening", options_.dampening);
    a.field("weight_decay", options_.weight_decay);
    std::uint32_t nesterov = options_.nesterov ? 1U : 0U;
    a.field("nesterov", nesterov);
    options_.nesterov = nesterov != 0;
    a.field("steps", steps_);
    detail::visit_buffers(a, "velocity", velocity_);
  }
  /// Empty when the options are valid and the momentum buffers match the master weights;
  /// otherwise what is wrong.
  std::string validate() const {
    if (auto e = validate_options(options_); !e.empty()) return e;
    return detail::check_buffers(velocity_, masters_, "velocity");
  }
  /// Bytes of optimizer state (the momentum buffers).
  std::size_t state_bytes() const { return detail::buffer_bytes(velocity_); }

  /// Empty when `o` is a valid set of options; otherwise what is wrong (the constructor
  /// throws it as precis::error).
  static std::string validate_options(const sgd_options& o) {
    if (!(o.lr >= 0.0) || !(o.momentum >= 0.0) || !(o.weight_decay >= 0.0) || !std::isfinite(o.lr) ||
        !std::isfinite(o.momentum) || !std::isfinite(o.weight_decay)) {
      return "lr, momentum and weight_decay must be finite and non-negative";
    }
    if (!(o.dampening >= 0.0 && o.dampening <= 1.0)) return "dampening must be in [0, 1]";
    if (o.nesterov && (o.momentum == 0.0 || o.dampening != 0.0)) {
      return "nesterov needs momentum and no dampening";
    }
    return {};
  }

 private:

  std::vector<std::span<float>> masters_;
  sgd_options options_;
  std::vector<bool> decay_;
  std::vector<std::vector<float>> velocity_;
  cpu_context ctx_;
  std::uint64_t steps_ = 0;
};

/// Adam with decoupled weight decay, on float master weights with float moments: the same
/// bits as torch.optim.AdamW (foreach or for-loop; not fused=True, whose kernel orders
/// the operations differently) for float32 weights and gradients, every step. Bias
/// correction counts applied steps only. Each element is updated by precis::adamw_update
/// (optim/update.hpp: PyTorch's order, the constants formed in double and rounded to float,
/// the decayed weight rounded before the update is added as PyTorch's separate pass rounds
/// it), so the bits depend neither on -march or -ffp-contract nor on the thread count, and a
/// device optimizer calling the same function gives them too.
class adamw {
 public:
  /// The kind a checkpoint records (precis::save_state).
  static constexpr std::string_view kind = "adamw";

  /// `decay`: for each master tensor, whether weight decay applies (empty: all of them);
  /// `ctx`: the threads the updates run on (give the model's context, whose threads are idle
  /// during the update; the default is one thread).
  adamw(std::vector<std::span<float>> masters, adamw_options o = {}, std::vector<bool> decay = {},
        cpu_context ctx = cpu_context{1})
      : masters_(std::move(masters)),
        options_(o),
        decay_(detail::decay_flags(std::move(decay), masters_.size(), "precis::adamw")),
        m_(detail::zeros_like(masters_)),
        v_(detail::zeros_like(masters_)),
        ctx_(std::move(ctx)) {
    if (auto e = validate_options(o); !e.empty()) throw error("precis::adamw: " + e);
  }
  /// Refused at compile time: master weights in device memory (a cuda_context model's
  /// masters()), which this optimizer would read and write on the host.
  template <class T>
  adamw(std::vector<device_span<T>> masters, adamw_options o = {}, std::vector<bool> decay = {},
       cpu_context ctx = cpu_context{1}) {
    static_assert(!is_device_span_v<device_span<T>>,
                  "precis: these master weights are in device memory (precis::device_span: a "
                  "cuda_context model's masters()); precis::adamw updates host memory");
    (void)masters, (void)o, (void)decay, (void)ctx;
  }

  /// One update from the gradients (any gradient element type, read as float). Throws
  /// precis::error, before anything is updated, when the gradient tensors do not match the
  /// master weights in number or size.
  template <gradients G>
  void step(G& grads) {
#if !defined(__CUDACC__)
    using detail::vmath::splat;
#endif
    const auto& o = options_;
    const std::uint64_t t = steps_ + 1;
    const adamw_constants<float> f = make_adamw_constants(o, t);
#if !defined(__CUDACC__)
    const adamw_constants<detail::vmath::vf> c{
        splat(f.keep),      splat(f.lerp),       splat(f.beta2), splat(f.one_minus_beta2),
        splat(f.step_size), splat(f.bias2_sqrt), splat(f.eps),   f.small_weight};
#endif
    detail::for_each_master(
        masters_, grads, "precis::adamw", [&](std::size_t i, std::span<float> w, auto g) {
          float* const m = m_[i].data();
          float* const v = v_[i].data();
          const bool decays = decay_[i] && o.weight_decay != 0.0;
          detail::for_gradient_blocks(ctx_, g, [&](std::size_t k, std::size_t n, const float* gf) {
#if defined(__CUDACC__)
            // From CUDA code one float at a time (see sgd::step), the same bits.
            for (std::size_t e = 0; e < n; ++e) {
              adamw_update<scalar_update_math>(w[k + e], m[k + e], v[k + e], gf[e], f, decays);
            }
#else
            detail::for_vectors(n, [&](std::size_t j, std::size_t lanes) {
              float* const wp = w.data() + k + j;
              float* const mp = m + k + j;
              float* const vp = v + k + j;
              auto wv = detail::load_lanes(wp, lanes);
              auto mv = detail::load_lanes(mp, lanes);
              auto vv = detail::load_lanes(vp, lanes);
              adamw_update<detail::vector_update_math>(wv, mv, vv, detail::load_lanes(gf + j, lanes),
                                                       c, decays);
              detail::store_lanes(wp, wv, lanes);
              detail::store_lanes(mp, mv, lanes);
              detail::store_lanes(vp, vv, lanes);
            });
#endif
          });
        });
    steps_ = t;
  }

  /// The learning rate of the next step.
  double lr() const { return options_.lr; }
  /// Sets the learning rate of the following steps (e.g. a schedule's
  /// precis::warmup_cosine::lr()).
  void set_lr(double lr) { options_.lr = lr; }
  /// The options in force (those given, the latest set_lr, or those a loaded checkpoint
  /// holds).
  const adamw_options& options() const { return options_; }
  /// Updates applied so far (the t of the bias correction).
  std::uint64_t steps() const { return steps_; }

  /// Visits the state for precis::save_state and precis::load_state: every option, the
  /// step count and both moments.
  template <class Archive>
  void visit_state(Archive& a) {
    a.field("lr", options_.lr);
    a.field("beta1", options_.beta1);
    a.field("beta2", options_.beta2);
    a.field("eps", options_.eps);
    a.field("weight_decay", options_.weight_decay);
    a.field("steps", steps_);
    detail::visit_buffers(a, "m", m_);
    detail::visit_buffers(a, "v", v_);
  }
  /// Empty when the options are valid and both moments match the master weights; otherwise
  /// what is wrong.
  std::string validate() const {
    if (auto e = validate_options(options_); !e.empty()) return e;
    if (auto e = detail::check_buffers(m_, masters_, "m"); !e.empty()) return e;
    return detail::check_buffers(v_, masters_, "v");
  }
  /// Bytes of optimizer state (both moments).
  std::size_t state_bytes() const { return detail::buffer_bytes(m_) + detail::buffer_bytes(v_); }

  /// Empty when `o` is a valid set of options; otherwise what is wrong (the constructor
  /// throws it as precis::error).
  static std::string validate_options(const adamw_options& o) {
    if (!(o.lr >= 0.0) || !std::isfinite(o.lr) || !(o.beta1 >= 0.0 && o.beta1 < 1.0) ||
        !(o.beta2 >= 0.0 && o.beta2 < 1.0) || !(o.eps > 0.0) || !std::isfinite(o.eps) ||
        !(o.weight_decay >= 0.0) || !std::isfinite(o.weight_decay)) {
      return "needs finite lr >= 0, betas in [0, 1), eps > 0, weight_decay >= 0";
    }
    return {};
  }

 private:

  std::vector<std::span<float>> masters_;
  adamw_options options_;
  std::vector<bool> decay_;
  std::vector<std::vector<float>> m_, v_;
  cpu_context ctx_;
  std::uint64_t steps_ = 0;
};

/// A learning-rate schedule that advances only on applied optimizer steps: linear warmup
/// then cosine decay to `final_lr` over `total_steps`. Checkpointable with the model and
/// optimizer (precis::save_checkpoint), so a resumed run continues the same schedule.
class warmup_cosine {
 public:
  /// The kind a checkpoint records (precis::save_state).
  static constexpr std::string_view kind = "warmup_cosine";

  /// A schedule rising linearly from base_lr / warmup_steps to `base_lr` over the first
  /// `warmup_steps` steps, then following half a cosine down to `final_lr` at step
  /// `total_steps`, where it stays (at base_lr when warmup_steps == total_steps). Throws
  /// precis::error unless 0 < total_steps, warmup_steps <= total_steps and both rates are
  /// finite and non-negative.
  warmup_cosine(double base_lr, std::uint64_t warmup_steps, std::uint64_t total_steps, double final_lr = 0.0)
      : base_(base_lr), final_(final_lr), warmup_(warmup_steps), total_(total_steps) {
    if (auto e = validate(); !e.empty()) throw error("precis::warmup_cosine: " + e);
  }
  /// The learning rate for the current step (in double, as the optimizers take it).
  double lr() const {
    if (step_ < warmup_) return base_ * double(step_ + 1) / double(warmup_);
    const double progress = double(std::min(step_, total_) - warmup_) / double(std::max<std::uint64_t>(1, total_ - warmup_));
    return final_ +
           detail::mul((base_ - final_) * 0.5, 1.0 + std::cos(3.14159265358979323846 * progress));
  }
  /// Moves on by one step when the optimizer applied it (a skipped step does not count).
  void advance(bool applied) { step_ += applied ? 1U : 0U; }
  /// The learning rates of the next `steps` applied steps, from the current one: entry k is
  /// lr() after k more applied steps. A table a device optimizer indexes by its
  /// applied-step count (precis::device_adamw), so that skipped steps on the device do not
  /// advance the schedule either.
  std::vector<double> lr_table(std::uint64_t steps) const {
    warmup_cosine s = *this;
    std::vector<double> out;
    out.reserve(static_cast<std::size_t>(steps));
    for (std::uint64_t k = 0; k < steps; ++k) {
      out.push_back(s.lr());
      s.advance(true);
    }
    return out;
  }
  /// Applied steps counted so far.
  std::uint64_t step() const { return step_; }

  /// Visits the state for precis::save_state and precis::load_state: both rates, the
  /// warmup and total step counts and the current step.
  template <class Archive>
  void visit_state(Archive& a) {
    a.field("base_lr", base_);
    a.field("final_lr", final_);
    a.field("warmup_steps", warmup_);
    a.field("total_steps", total_);
    a.field("step", step_);
  }
  /// Empty when the schedule is consistent; otherwise what is wrong.
  std::string validate() const {
    if (total_ == 0 || warmup_ > total_) return "needs 0 < total_steps and warmup_steps <= total_steps";
    if (!(base_ >= 0.0) || !(final_ >= 0.0) || !std::isfinite(base_) || !std::isfinite(final_)) {
      return "the learning rates must be finite and non-negative";
    }
    return {};
  }

 private:
  double base_, final_;
  std::uint64_t warmup_, total_, step_ = 0;
};

}  // namespace precis
