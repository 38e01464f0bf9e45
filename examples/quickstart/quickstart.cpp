// A first model: tags -> map -> build -> trainer -> describe -> checkpoint.
#include <precis/precis.hpp>
#include <xtensor/xrandom.hpp>

#include <cstdint>
#include <cstdio>

using namespace precis;

// Layer tags name layers for the map; a tag may declare what is known about the layer.
struct hidden : layer<op::matmul, max_abs<200000>> {};  // its activations reach 2e5
struct head : layer<op::matmul> {};

int main() {
  // float16 with loss scaling, but bfloat16 for `hidden`: float16 stops at 65504.
  constexpr auto map =
      make_policy_map(presets::fp16_mixed{}, for_layer<hidden>(presets::bf16_mixed{}));
  auto model = nn::build<float, 2>(
      map, nn::seq(nn::linear<hidden>(8, 64), nn::gelu(), nn::linear<head>(64, 4)), {.seed = 1});

  const cpu_context ctx{2};
  nn::softmax_cross_entropy_for<nn::tags::loss, decltype(map)> loss;
  adamw opt(model.masters(), {.lr = 1e-2}, model.decay_mask(), ctx);
  scaler_for<presets::fp16_mixed> scaler;  // dynamic_scaler: float16 gradients need one
  nn::trainer train(model, loss, opt, scaler, {.max_grad_norm = 1.0});

  xt::random::seed(1);  // 256 rows of 8 features; a row's class is the largest of its first 4
  host_tensor<float, 2> x = xt::random::randn<float>({256, 8});
  host_tensor<std::int32_t, 1> y = xt::zeros<std::int32_t>({256});
  for (std::size_t i = 0; i < 256; ++i)
    for (std::size_t c = 1; c < 4; ++c) y(i) = x(i, c) > x(i, std::size_t(y(i))) ? int(c) : y(i);
  for (int step = 1; step <= 200; ++step) {
    const nn::step_record r = train.step(ctx, x, y);
    if (step % 50 == 0)
      std::printf("step %3d  loss %.4f  scale %g\n", step, r.loss, double(r.scale));
  }
  std::puts(nn::describe(model).c_str());
  save_checkpoint("quickstart.ckpt", model, opt, scaler);
}
