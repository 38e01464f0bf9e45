// Clipping gradients that are still multiplied by the loss scale.
#include <precis/scaling/scaling.hpp>
#include <vector>
void f() {
  precis::dynamic_scaler s;
  auto g = s.scaled_gradients(std::vector<float>{1.0f});
  precis::clip_grad_norm(g, 1.0);
}
