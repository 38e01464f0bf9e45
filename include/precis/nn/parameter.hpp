// precis/nn/parameter.hpp: a trainable tensor, and the small pieces every layer shares.
//
// A parameter keeps three tensors: the master weights in the policy's master type (float;
// what the optimizer updates), a working copy in the storage type that the kernels read
// (cast once per step by `refresh()`; when the storage type is the master type the master
// is read directly and no copy is kept), and the gradient in the master type.
//
// Gradient semantics: each backward pass rounds a parameter's gradient once to the
// policy's gradient type (so a float16 gradient overflows or underflows as float16 does)
// and adds it to the master-type gradient, where micro-batches accumulate and where
// unscaling, clipping and the optimizer work — as mixed-precision training keeps its
// fp32 gradients next to fp32 master weights.
#pragma once

#include <precis/config.hpp>
#include <precis/kernels/cast.hpp>
#include <precis/kernels/common.hpp>
#include <precis/tensor/host_tensor.hpp>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace precis::nn {

/// A trainable tensor of rank N: master weights and gradient in M (float or double),
/// the working copy in S. Its buffers never move: assigning a parameter copies the values
/// into the existing storage, so an optimizer holding spans of the master weights stays
/// valid when a checkpoint is loaded into the model.
template <class S, class M, std::size_t N>
class parameter {
  static_assert(std::is_same_v<M, float> || std::is_same_v<M, double>,
                "precis: nn layers keep master weights in float (or double); a policy with "
                "narrower master weights (presets::bf16_pure) is not supported by precis::nn");

 public:
  using storage_type = S;
  using master_type = M;
  using shape_type = std::array<std::size_t, N>;

  explicit parameter(const shape_type& shape) : master_(shape), grad_(shape) {
    master_.fill(M(0));
    grad_.fill(M(0));
    if constexpr (!same_storage) working_ = host_tensor<S, N>(shape);
  }
  parameter(const parameter&) = default;
  /// Copies the values of `other` into this parameter's buffers (they keep their
  /// addresses). Throws precis::error when the shapes differ.
  parameter& operator=(const parameter& other) {
    if (this != &other) assign(other);
    return *this;
  }
  parameter& operator=(parameter&& other) {
    if (this != &other) assign(other);
    return *this;
  }
  ~parameter() = default;

  /// The master weights (update them, then call refresh()).
  host_tensor<M, N>& master() { return master_; }
  const host_tensor<M, N>& master() const { return master_; }
  /// The working copy the kernels read: the master rounded to S at the last refresh().
  const host_tensor<S, N>& value() const {
    if constexpr (same_storage) {
      return master_;
    } else {
      return working_;
    }
  }
  /// The gradient, accumulated over backward passes since zero_grad().
  host_tensor<M, N>& grad() { return grad_; }
  const host_tensor<M, N>& grad() const { return grad_; }

  /// Rounds the master weights to the working copy (nearest-even), once per step.
  void refresh(const cpu_context& ctx = {}) {
    if constexpr (!same_storage) precis::cast(ctx, master_, working_);
  }
  void zero_grad() { grad_.fill(M(0)); }
  /// grad += part, elementwise in M (part is a gradient already rounded to its type).
  template <class G>
  void accumulate(const host_tensor<G, N>& part) {
    check_same_shape("precis::nn::parameter: gradient", part, master_);
    M* g = grad_.data();
    const G* p = part.data();
    for (std::size_t i = 0, n = size(); i < n; ++i) g[i] += static_cast<M>(p[i]);
  }

  std::span<M> master_span() { return {master_.data(), size()}; }
  std::span<M> grad_span() { return {grad_.data(), size()}; }
  std::size_t size() const { return master_.size(); }
  /// Bytes held: master weights, gradient and (when S is not M) the working copy.
  std::size_t bytes() const { return size() * (2 * sizeof(M) + (same_storage ? 0 : sizeof(S))); }

  /// Saves or loads the master weights as `name` (see precis::save_checkpoint); a loaded
  /// tensor of the wrong size is reported by validate().
  template <class Archive>
  void visit_state(Archive& a, const std::string& name) {
    std::vector<float> v(master_.begin(), master_.end());
    a.floats(name, v);
    if (v.size() != size()) {
      problem_ = name + " has " + std::to_string(v.size()) + " values, the model has " +
                 std::to_string(size());
      return;
    }
    std::copy(v.begin(), v.end(), master_.begin());
    refresh();
  }
  /// Empty, or what a load found wrong.
  const std::string& problem() const { return problem_; }

 private:
  static constexpr bool same_storage = std::is_same_v<S, M>;

  void assign(const parameter& other) {
    check_same_shape("precis::nn::parameter: assigning a parameter of another shape (parameters "
                     "keep their storage)",
                     other.master_, master_);
    std::copy(other.master_.begin(), other.master_.end(), master_.begin());
    std::copy(other.grad_.begin(), other.grad_.end(), grad_.begin());
    if constexpr (!same_storage) std::copy(other.working_.begin(), other.working_.end(), working_.begin());
    problem_ = other.problem_;
  }

  host_tensor<M, N> master_;
  host_tensor<M, N> grad_;
  host_tensor<S, N> working_;  // empty when S is M
  std::string problem_;
};

/// Whether a forward pass is for training (dropout active, batch statistics) or
/// evaluation (dropout off, running statistics).
enum class mode { train, eval };

namespace detail {

/// SplitMix64's finaliser: a well-mixed 64-bit value from a counter.
constexpr std::uint64_t mix64(std::uint64_t z) {
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

/// A double in [0, 1) from (seed, stream, index).
constexpr double unit_random(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  const std::uint64_t h = mix64(mix64(seed ^ mix64(stream)) + index);
  return double(h >> 11) * 0x1.0p-53;
}

template <class S, class M, std::size_t N>
void fill_uniform(parameter<S, M, N>& p, std::uint64_t seed, std::uint64_t stream, double bound) {
  auto& m = p.master();
  for (std::size_t i = 0; i < m.size(); ++i) {
    m.data()[i] = static_cast<M>((2.0 * unit_random(seed, stream, i) - 1.0) * bound);
  }
  p.refresh();
}

}  // namespace detail

}  // namespace precis::nn
