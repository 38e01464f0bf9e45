// Unscaling gradients that are already unscaled.
#include <precis/scaling/scaling.hpp>
#include <vector>
void f() {
  precis::dynamic_scaler s;
  auto u = precis::unscale(s.scaled_gradients(std::vector<float>{1.0f}));
  auto v = precis::unscale(std::move(u));
}
