// A mistake precis refuses: clipping gradients that are still multiplied by the loss scale.
#include <precis/scaling/scaling.hpp>

#include <vector>

int main() {
  precis::dynamic_scaler scaler;
  auto grads = scaler.scaled_gradients(std::vector<float>(10, 1.0f));
  precis::clip_grad_norm(grads, 1.0);  // too early: unscale first
}
