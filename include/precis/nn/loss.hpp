/// @file
/// The softmax cross-entropy loss as a layer, and accuracy counting.
#pragma once

#include <precis/kernels/loss.hpp>
#include <precis/nn/module.hpp>
#include <precis/policy/map.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace precis::nn {

/// What the softmax cross-entropy loss is, on either context: its name, policy, the types
/// and rank it reads and gives, its targets' tensor (on context Ctx) and the type of its
/// value. The trainer reads these.
template <Policy P, std::integral Target, class Ctx>
struct softmax_cross_entropy_types {
  /// Its name in error messages: "softmax_cross_entropy".
  static constexpr std::string_view name = "softmax_cross_entropy";
  /// The (resolved) policy it runs under.
  using policy_type = P;
  /// Element type of the logits forward() reads: P's storage type.
  using input_type = typename P::storage_type;
  /// Element type of the gradient backward() returns: P's gradient type.
  using input_grad_type = typename P::gradient_type;
  /// It reads logits [batch, classes].
  static constexpr std::size_t input_rank = 2;
  /// Integer type of the class targets.
  using target_type = Target;
  /// The targets' tensor on Ctx: one class index in [0, classes) per row of the logits.
  using target_tensor = tensor_t<Ctx, Target, 1>;
  /// The type the loss value is computed in (float, or double under a double policy).
  using value_type = precis::detail::math_t<op::loss, P, typename P::storage_type>;
};

/// The mean over the batch of -log softmax(logits)[target], from logits in P's storage
/// type and integer class targets. Computed under rule::fp32_operation (float math, float
/// sum over the batch) unless P waives it: an `unsafe` float16 policy then sums the loss in
/// float16, the failure the rule exists for. backward(dloss) gives dloss * (softmax -
/// onehot) / batch in P's gradient type; pass the loss scale as dloss when scaling.
///
/// On cuda_context (a partial specialisation in <precis/nn/cuda.hpp>) the targets are a
/// device tensor and the loss value is written to device memory.
template <Policy P, std::integral Target = std::int32_t, class Ctx = cpu_context>
class basic_softmax_cross_entropy : public softmax_cross_entropy_types<P, Target, Ctx> {
  static_assert(std::is_same_v<Ctx, cpu_context>,
                "precis: the device softmax_cross_entropy is declared in <precis/nn/cuda.hpp>; "
                "include it first, from CUDA code");
  using S = typename P::storage_type;
  using G = typename P::gradient_type;

 public:
  /// The type the loss value is computed in (float, or double under a double policy).
  using value_type = typename softmax_cross_entropy_types<P, Target, Ctx>::value_type;

  /// The loss of `logits` [batch, classes] against `targets` [batch] (see the class
  /// comment); keeps the addresses of both for backward(), so they must stay alive and
  /// unchanged until then. Throws precis::error for targets of another length, an empty
  /// batch or a target outside [0, classes).
  value_type forward(const cpu_context& ctx, const host_tensor<S, 2>& logits,
                     const host_tensor<Target, 1>& targets) {
    const value_type loss = cross_entropy<P>(ctx, logits, targets);
    logits_.set(logits);
    targets_ = &targets;
    return loss;
  }
  /// The gradient of `dloss` times the loss of the last forward pass with respect to its
  /// logits: dloss * (softmax - onehot) / batch, in P's gradient type. Throws precis::error
  /// without a forward pass.
  const host_tensor<G, 2>& backward(const cpu_context& ctx, double dloss = 1.0) {
    const auto& logits = logits_.get(this->name);
    ensure(dx_, shape_of<2>(logits));
    cross_entropy_backward<P>(ctx, logits, *targets_, dx_, dloss);
    return dx_;
  }
  /// "-": the loss has no parameters (what a layer's shape() gives nn::describe).
  std::string shape() const { return "-"; }
  /// Bytes of its gradient buffer.
  std::size_t own_bytes() const { return bytes_of(dx_); }

 private:
  saved<host_tensor<S, 2>> logits_;
  const host_tensor<Target, 1>* targets_ = nullptr;
  host_tensor<G, 2> dx_;
};

/// The softmax cross-entropy loss under P resolved for losses (float math and sums by
/// rule::fp32_operation unless P waives it).
template <Policy P, std::integral Target = std::int32_t, class Ctx = cpu_context>
using softmax_cross_entropy = basic_softmax_cross_entropy<kernel_policy_t<op::loss, P>, Target, Ctx>;

/// The softmax cross-entropy loss under the policy `Map` gives `Tag` (op::loss): the loss
/// of a model built from that map reads the model's output type when the map gives the
/// loss the storage type of the model's last layer.
template <Layer Tag, class Map, std::integral Target = std::int32_t, class Ctx = cpu_context>
using softmax_cross_entropy_for = basic_softmax_cross_entropy<policy_for_t<Tag, Map>, Target, Ctx>;

/// How many rows of `logits` have their largest value (the first, on ties) at the target.
template <class T, std::integral I>
std::size_t count_correct(const host_tensor<T, 2>& logits, const host_tensor<I, 1>& targets) {
  check_shape("precis::nn::count_correct: targets", targets,
              std::array<std::size_t, 1>{std::size_t(logits.shape()[0])});
  const std::size_t rows = std::size_t(logits.shape()[0]), cols = std::size_t(logits.shape()[1]);
  std::size_t correct = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    const T* row = logits.data() + r * cols;
    std::size_t best = 0;
    for (std::size_t c = 1; c < cols; ++c) {
      if (static_cast<double>(row[c]) > static_cast<double>(row[best])) best = c;
    }
    correct += static_cast<I>(best) == targets.data()[r] ? std::size_t(1) : std::size_t(0);
  }
  return correct;
}

}  // namespace precis::nn
