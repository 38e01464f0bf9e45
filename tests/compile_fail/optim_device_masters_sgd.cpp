// precis::sgd given master weights in device memory (a cuda_context model's masters()).
#include <precis/optim/optim.hpp>

#include <vector>

void f(float* device_weights) {
  std::vector<precis::device_span<float>> masters{{device_weights, 16}};
  precis::sgd opt(masters, {.lr = 0.1});
}
