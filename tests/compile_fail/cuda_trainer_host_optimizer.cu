// The device trainer given a host optimizer: a device model steps with device_adamw or
// device_sgd, whose masters and state are in device memory.
#include <precis/nn/cuda.hpp>  // first: the device kernels, then nn
#include <precis/optim/optim.hpp>

#include <cstdint>

struct fc : precis::layer<precis::op::matmul> {
  static constexpr std::string_view name = "fc";
};

void f(precis::cuda_context& ctx, precis::adamw& opt) {
  using P = precis::presets::bf16_mixed;
  auto model = precis::nn::build<precis::bfloat16, 2, precis::cuda_context>(P{}, precis::nn::linear<fc>(8, 4));
  precis::nn::softmax_cross_entropy<P, std::int32_t, precis::cuda_context> loss;
  precis::no_scaling scaler;
  precis::nn::trainer<decltype(model), decltype(loss), precis::adamw, precis::no_scaling,
                      precis::nn::no_schedule, precis::cuda_context>
      train(ctx, model, loss, opt, scaler);
}
