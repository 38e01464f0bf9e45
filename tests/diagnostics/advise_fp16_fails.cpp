// Must not compile: with the advised header's measured ranges in view, a float16 map for
// diag_loop's model breaks rule d on the boosted layer (activations past 65504). The same
// map without the header compiles (tests/diagnostics/test_monitor.cpp builds it).
#include "loop_model.hpp"

#include "advised_map.hpp"

int main() {
  auto model =
      precis::nn::build<precis::float16, 2>(precis::presets::fp16_mixed{}, diag_loop::blueprint());
  return int(model.parameter_count() == 0);
}
