// The device trainer given a scaler of several processes: its scale and counters live in
// device memory for one process; a data-parallel run's found-inf and amax reductions are
// the host trainer's.
#include <precis/nn/cuda.hpp>  // first: the device kernels, then nn

#include <cstdint>
#include <span>

struct fc : precis::layer<precis::op::matmul> {
  static constexpr std::string_view name = "fc";
};

// Stands for a reducer across processes (MPI's, NCCL's).
struct other_processes {
  bool any(bool flag) const { return flag; }
  void max(std::span<float>) const {}
};

void f(precis::cuda_context& ctx, precis::device_adamw& opt) {
  using P = precis::presets::fp16_mixed;
  auto model = precis::nn::build<precis::float16, 2, precis::cuda_context>(P{}, precis::nn::linear<fc>(8, 4));
  precis::nn::softmax_cross_entropy<P, std::int32_t, precis::cuda_context> loss;
  precis::basic_dynamic_scaler<other_processes> scaler;
  precis::nn::trainer train(ctx, model, loss, opt, scaler);
}
