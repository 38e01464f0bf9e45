// Unscaling without giving the scaled gradients up: they could be unscaled again.
#include <precis/scaling/scaling.hpp>
#include <vector>
void f() {
  precis::dynamic_scaler s;
  auto g = s.scaled_gradients(std::vector<float>{1.0f});
  precis::unscale(g);
}
