// A layer that reads another rank than the one before it gives does not compile: a
// reshape belongs between them.
#include <precis/precis.hpp>

int main() {
  using namespace precis;
  using from = nn::linear_layer<nn::tags::linear, presets::fp32, 3, cpu_context>;
  using to = nn::linear_layer<nn::tags::linear, presets::fp32, 2, cpu_context>;
  nn::sequence<from, to> model(from(nn::linear(4, 4)), to(nn::linear(4, 2)));
  (void)model;
}
