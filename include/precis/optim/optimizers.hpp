// precis/optim/optimizers.hpp: optimizers that update float master weights from gradients
// of any gradient type, with float state: SGD with momentum and AdamW. They work with the
// scalers: a scaler calls `step(grads)` only for finite gradients, so a skipped step
// changes neither the weights nor the optimizer's state or step count.
#pragma once

#include <precis/config.hpp>
#include <precis/scaling/gradients.hpp>

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

/// Options of sgd (PyTorch's SGD: momentum buffer starts as the first gradient).
struct sgd_options {
  float lr = 0.01f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;  ///< L2 penalty added to the gradient
  bool nesterov = false;
};

/// Stochastic gradient descent with momentum, on float master weights.
class sgd {
 public:
  static constexpr std::string_view kind = "sgd";

  /// `masters`: the float master weights, in the order the gradients come in; `decay`: for
  /// each of them, whether weight decay applies (empty: all).
  sgd(std::vector<std::span<float>> masters, sgd_options o = {}, std::vector<bool> decay = {})
      : masters_(std::move(masters)),
        options_(o),
        decay_(detail::decay_flags(std::move(decay), masters_.size(), "precis::sgd")),
        velocity_(detail::zeros_like(masters_)) {
    if (!(o.lr >= 0.0f) || !(o.momentum >= 0.0f) || !(o.weight_decay >= 0.0f)) {
      throw error("precis::sgd: lr, momentum and weight_decay must be non-negative");
    }
    if (o.nesterov && o.momentum == 0.0f) throw error("precis::sgd: nesterov needs momentum");
  }

  /// One update from the gradients (any gradient element type, read as float).
  template <gradients G>
  void step(G& grads) {
    detail::for_each_master(masters_, grads, "precis::sgd", [&](std::size_t i, std::span<float> w, auto g) {
      auto& buf = velocity_[i];
      const float wd = decay_[i] ? options_.weight_decay : 0.0f;
      for (std::size_t k = 0; k < w.size(); ++k) {
        float d = float(g[k]) + wd * w[k];
        if (options_.momentum != 0.0f) {
          buf[k] = steps_ == 0 ? d : options_.momentum * buf[k] + d;
          d = options_.nesterov ? d + options_.momentum * buf[k] : buf[k];
        }
        w[k] -= options_.lr * d;
      }
    });
    ++steps_;
  }

  float lr() const { return options_.lr; }
  void set_lr(float lr) { options_.lr = lr; }
  /// Updates applied so far.
  std::uint64_t steps() const { return steps_; }

  template <class Archive>
  void visit_state(Archive& a) {
    a.field("lr", options_.lr);
    a.field("momentum", options_.momentum);
    a.field("weight_decay", options_.weight_decay);
    std::uint32_t nesterov = options_.nesterov ? 1U : 0U;
    a.field("nesterov", nesterov);
    options_.nesterov = nesterov != 0;
    a.field("steps", steps_);
    detail::visit_buffers(a, "velocity", velocity_);
  }
  std::string validate() const { return detail::check_buffers(velocity_, masters_, "velocity"); }
  /// Bytes of optimizer state (the momentum buffers).
  std::size_t state_bytes() const { return detail::buffer_bytes(velocity_); }

 private:
  std::vector<std::span<float>> masters_;
  sgd_options options_;
  std::vector<bool> decay_;
  std::vector<std::vector<float>> velocity_;
  std::uint64_t steps_ = 0;
};

/// Options of adamw (PyTorch's AdamW defaults).
struct adamw_options {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;  ///< decoupled: w -= lr * weight_decay * w
};

/// Adam with decoupled weight decay, on float master weights with float moments. Bias
/// correction counts applied steps only.
class adamw {
 public:
  static constexpr std::string_view kind = "adamw";

  /// `decay`: for each master tensor, whether weight decay applies (empty: all of them).
  adamw(std::vector<std::span<float>> masters, adamw_options o = {}, std::vector<bool> decay = {})
      : masters_(std::move(masters)),
        options_(o),
        decay_(detail::decay_flags(std::move(decay), masters_.size(), "precis::adamw")),
        m_(detail::zeros_like(masters_)),
        v_(detail::zeros_like(masters_)) {
    if (!(o.lr >= 0.0f) || !(o.beta1 >= 0.0f && o.beta1 < 1.0f) || !(o.beta2 >= 0.0f && o.beta2 < 1.0f) ||
        !(o.eps > 0.0f) || !(o.weight_decay >= 0.0f)) {
      throw error("precis::adamw: needs lr >= 0, betas in [0, 1), eps > 0, weight_decay >= 0");
    }
  }

  template <gradients G>
  void step(G& grads) {
    const std::uint64_t t = steps_ + 1;
    const double bias1 = 1.0 - std::pow(double(options_.beta1), double(t));
    const double bias2 = 1.0 - std::pow(double(options_.beta2), double(t));
    const float step_size = static_cast<float>(double(options_.lr) / bias1);
    const float bias2_sqrt = static_cast<float>(std::sqrt(bias2));
    detail::for_each_master(masters_, grads, "precis::adamw", [&](std::size_t i, std::span<float> w, auto g) {
      auto& m = m_[i];
      auto& v = v_[i];
      const float keep = decay_[i] ? 1.0f - options_.lr * options_.weight_decay : 1.0f;
      for (std::size_t k = 0; k < w.size(); ++k) {
        const float gk = float(g[k]);
        w[k] *= keep;
        m[k] = options_.beta1 * m[k] + (1.0f - options_.beta1) * gk;
        v[k] = options_.beta2 * v[k] + (1.0f - options_.beta2) * gk * gk;
        w[k] -= step_size * m[k] / (std::sqrt(v[k]) / bias2_sqrt + options_.eps);
      }
    });
    steps_ = t;
  }

  float lr() const { return options_.lr; }
  void set_lr(float lr) { options_.lr = lr; }
  std::uint64_t steps() const { return steps_; }

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
  std::string validate() const {
    if (auto e = detail::check_buffers(m_, masters_, "m"); !e.empty()) return e;
    return detail::check_buffers(v_, masters_, "v");
  }
  /// Bytes of optimizer state (both moments).
  std::size_t state_bytes() const { return detail::buffer_bytes(m_) + detail::buffer_bytes(v_); }

 private:
  std::vector<std::span<float>> masters_;
  adamw_options options_;
  std::vector<bool> decay_;
  std::vector<std::vector<float>> m_, v_;
  std::uint64_t steps_ = 0;
};

/// A learning-rate schedule that advances only on applied optimizer steps: linear warmup
/// then cosine decay to `final_lr` over `total_steps`. Checkpointable with the model and
/// optimizer (precis::save_checkpoint), so a resumed run continues the same schedule.
class warmup_cosine {
 public:
  static constexpr std::string_view kind = "warmup_cosine";

  warmup_cosine(float base_lr, std::uint64_t warmup_steps, std::uint64_t total_steps, float final_lr = 0.0f)
      : base_(base_lr), final_(final_lr), warmup_(warmup_steps), total_(total_steps) {
    if (total_steps == 0 || warmup_steps > total_steps) {
      throw error("precis::warmup_cosine: needs 0 < total_steps and warmup_steps <= total_steps");
    }
  }
  /// The learning rate for the current step.
  float lr() const {
    if (step_ < warmup_) return base_ * float(step_ + 1) / float(warmup_);
    const double progress = double(std::min(step_, total_) - warmup_) / double(std::max<std::uint64_t>(1, total_ - warmup_));
    return static_cast<float>(final_ + (base_ - final_) * 0.5 * (1.0 + std::cos(3.14159265358979323846 * progress)));
  }
  /// Moves on by one step when the optimizer applied it (a skipped step does not count).
  void advance(bool applied) { step_ += applied ? 1U : 0U; }
  std::uint64_t step() const { return step_; }

  template <class Archive>
  void visit_state(Archive& a) {
    a.field("base_lr", base_);
    a.field("final_lr", final_);
    a.field("warmup_steps", warmup_);
    a.field("total_steps", total_);
    a.field("step", step_);
  }
  std::string validate() const {
    if (total_ == 0 || warmup_ > total_) return "needs 0 < total_steps and warmup_steps <= total_steps";
    return {};
  }

 private:
  float base_, final_;
  std::uint64_t warmup_, total_, step_ = 0;
};

}  // namespace precis
