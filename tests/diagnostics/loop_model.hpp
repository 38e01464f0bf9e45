// The model of the advisor's closed loop (tests/diagnostics): a small classifier with one
// layer (`boost`) whose activations are scaled past float16's 65504, trained on a fixed
// set of Gaussian blobs. Its tags live in a named namespace so that the generated policy
// header can name them.
#pragma once

#include <precis/precis.hpp>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <type_traits>

namespace diag_loop {

struct fc1 : precis::layer<precis::op::matmul> {};
struct act : precis::layer<precis::op::elementwise> {};
struct boost : precis::layer<precis::op::elementwise> {};
struct norm : precis::layer<precis::op::layer_norm> {};
struct head : precis::layer<precis::op::matmul> {};

/// boost multiplies by 1e5: GELU outputs of about 1 become about 1e5.
inline auto blueprint() {
  namespace nn = precis::nn;
  return nn::seq(nn::linear<fc1>(16, 32), nn::gelu<act>(), nn::scale<boost>(1e5),
                 nn::layer_norm<norm>(32), nn::linear<head>(32, 4));
}

/// Four Gaussian blobs in 16 dimensions (labels 0..3), the same on every platform for a
/// seed (std::mt19937_64 and a Box-Muller transform written out here).
template <class T>
struct data {
  precis::host_tensor<T, 2> x;
  precis::host_tensor<std::int32_t, 1> labels;
};

template <class T>
data<T> make_data(std::size_t rows, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  const auto uniform = [&] { return (double(g() >> 11) + 0.5) * 0x1p-53; };
  data<T> d{precis::host_tensor<T, 2>(std::array<std::size_t, 2>{rows, 16}),
            precis::host_tensor<std::int32_t, 1>(std::array<std::size_t, 1>{rows})};
  for (std::size_t r = 0; r < rows; ++r) {
    const auto c = std::int32_t(r % 4);
    d.labels(r) = c;
    for (std::size_t k = 0; k < 16; ++k) {
      const double n =
          std::sqrt(-2.0 * std::log(uniform())) * std::cos(6.283185307179586 * uniform());
      d.x(r, k) = T(float(n * 0.8 + (k % 4 == std::size_t(c) ? 1.0 : 0.0)));
    }
  }
  return d;
}

/// Steps of every run in the loop.
inline constexpr int loop_steps = 60;

/// What a run reached.
struct outcome {
  double train_loss = 0.0;
  double test_accuracy = 0.0;
  int skipped = 0;
};

/// Trains the blueprint under `Map` for `steps` full-batch steps of AdamW (scaler: Scaler),
/// observing with `mon` (a precis::diagnostics::monitor, or nullptr), and evaluates on a
/// held-out set.
template <class Map, class Scaler, class Monitor = std::nullptr_t>
outcome train(Map map, int steps, Monitor* mon = nullptr) {
  namespace nn = precis::nn;
  using In = typename precis::policy_for_t<fc1, Map>::storage_type;
  using HeadPolicy = precis::policy_for_t<head, Map>;
  const precis::cpu_context ctx{1};
  auto model = nn::build<In, 2>(map, blueprint(), {.seed = 5});
  nn::softmax_cross_entropy<HeadPolicy> loss;
  precis::adamw opt(model.masters(), {.lr = 3e-3, .weight_decay = 0.0});
  Scaler scaler;
  nn::trainer tr(model, loss, opt, scaler);
  const auto train_set = make_data<In>(256, 1);
  const auto test_set = make_data<In>(256, 2);
  outcome o;
  for (int s = 0; s < steps; ++s) {
    nn::step_record r;
    if constexpr (std::is_same_v<Monitor, std::nullptr_t>) {
      r = tr.step(ctx, train_set.x, train_set.labels);
    } else {
      r = tr.step(ctx, train_set.x, train_set.labels, *mon);
    }
    o.skipped += r.skipped ? 1 : 0;
    o.train_loss = r.loss;
  }
  o.test_accuracy = nn::evaluate(ctx, model, loss, test_set.x, test_set.labels).accuracy;
  return o;
}

}  // namespace diag_loop
