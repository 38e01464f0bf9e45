// The device trainer named from code that did not include <precis/nn/cuda.hpp> (a host
// translation unit): the primary template says where the device one is declared.
#include <precis/kernels/cuda_context.hpp>
#include <precis/precis.hpp>

#include <cstdint>

struct fc : precis::layer<precis::op::matmul> {
  static constexpr std::string_view name = "fc";
};

using P = precis::presets::bf16_mixed;
using model_type = decltype(precis::nn::build<precis::bfloat16, 2>(P{}, precis::nn::linear<fc>(8, 4)));
using loss_type = precis::nn::softmax_cross_entropy<P>;

std::size_t f() {
  return sizeof(precis::nn::trainer<model_type, loss_type, precis::adamw, precis::no_scaling, precis::nn::no_schedule,
                                    precis::cuda_context>);
}
