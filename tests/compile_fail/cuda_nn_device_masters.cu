// A host optimizer given a device model's master weights: they are device spans, which the
// host optimizers refuse, instead of host spans of device pointers they would dereference.
#include <precis/nn/cuda.hpp>  // first: the device kernels, then nn
#include <precis/optim/optim.hpp>

void f(precis::cuda_context& ctx) {
  auto model = precis::nn::build<precis::bfloat16, 4, precis::cuda_context>(
      precis::presets::bf16_mixed{}, precis::nn::seq(precis::nn::batch_norm(8), precis::nn::relu()));
  model.refresh(ctx);
  precis::adamw opt(model.masters());
}
