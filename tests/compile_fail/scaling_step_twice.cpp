// Stepping with gradients that stay usable for a second step.
#include <precis/scaling/scaling.hpp>
#include <vector>
struct opt {
  void step(std::vector<float>&) {}
};
void f() {
  precis::dynamic_scaler s;
  opt o;
  auto u = precis::unscale(s.scaled_gradients(std::vector<float>{1.0f}));
  s.step(o, u);
}
