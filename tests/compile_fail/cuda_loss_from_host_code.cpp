// The device softmax cross-entropy named from code that did not include
// <precis/nn/cuda.hpp> (a host translation unit): the primary template says where the device
// one is declared.
#include <precis/kernels/cuda_context.hpp>
#include <precis/precis.hpp>

#include <cstdint>

std::size_t f() {
  return sizeof(precis::nn::basic_softmax_cross_entropy<precis::presets::bf16_mixed, std::int32_t,
                                                        precis::cuda_context>);
}
