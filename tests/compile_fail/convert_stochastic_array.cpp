// Array conversion with stochastic rounding: it needs random bits per element.
#include <precis/numeric/numeric.hpp>
#include <vector>
void f() {
  std::vector<float> x(4);
  std::vector<precis::bfloat16> y(4);
  precis::convert<precis::rounding::stochastic>(x, y);
}
