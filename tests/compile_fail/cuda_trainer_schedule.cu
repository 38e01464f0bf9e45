// The device trainer given a schedule object: on the device the learning rates are the
// optimizer's table (warmup_cosine::lr_table), indexed by its applied-step count.
#include <precis/nn/cuda.hpp>  // first: the device kernels, then nn

#include <cstdint>

struct fc : precis::layer<precis::op::matmul> {
  static constexpr std::string_view name = "fc";
};

void f(precis::cuda_context& ctx, precis::device_adamw& opt, precis::warmup_cosine&) {
  using P = precis::presets::bf16_mixed;
  auto model = precis::nn::build<precis::bfloat16, 2, precis::cuda_context>(P{}, precis::nn::linear<fc>(8, 4));
  precis::nn::softmax_cross_entropy<P, std::int32_t, precis::cuda_context> loss;
  precis::no_scaling scaler;
  precis::nn::trainer<decltype(model), decltype(loss), precis::device_adamw, precis::no_scaling,
                      precis::warmup_cosine, precis::cuda_context>
      train(ctx, model, loss, opt, scaler);
}
