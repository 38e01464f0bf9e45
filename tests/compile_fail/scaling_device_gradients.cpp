// Unscaling gradients in device memory (a cuda_context model's gradients()) on the host.
#include <precis/scaling/scaling.hpp>

#include <vector>

void f(float* device_grads) {
  precis::dynamic_scaler scaler;
  std::vector<precis::device_span<float>> grads{{device_grads, 16}};
  auto u = precis::unscale(scaler.scaled_gradients(std::move(grads)));
}
