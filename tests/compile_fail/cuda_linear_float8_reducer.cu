// A multi-process amax reducer given to a device model with float8 linear layers: the device's
// float8 recipes measure one process's amaxes so far.
#include <precis/nn/cuda.hpp>  // first: the device kernels, then nn

struct fc : precis::layer<precis::op::matmul> {
  static constexpr std::string_view name = "fc";
};

void f(precis::reducer_ref r) {
  auto model = precis::nn::build<precis::bfloat16, 2, precis::cuda_context>(precis::presets::fp8_hybrid{},
                                                                            precis::nn::linear<fc>(16, 16));
  model.set_amax_reducer(r);
}
