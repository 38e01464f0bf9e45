// What the examples' and the GPU benchmarks' programs share (CUDA code only): the GPU's name,
// an order of samples uploaded for the device's batch gathers, and a timer of a stream's work.
#pragma once

#include <precis/kernels/cuda_context.hpp>
#include <precis/tensor/device_tensor.hpp>
#include <precis/tensor/host_tensor.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace examples {

/// The name of device 0.
inline std::string gpu_name() {
  cudaDeviceProp prop{};
  precis::check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  return prop.name;
}

/// `order` as 32-bit indices in device memory (waits for the copy: the host values are this
/// call's).
inline precis::device_tensor<std::int32_t, 1> upload_order(precis::cuda_context& ctx,
                                                           const std::vector<std::size_t>& order) {
  auto h = precis::host_tensor<std::int32_t, 1>::from_shape({order.size()});
  for (std::size_t i = 0; i < order.size(); ++i) h(i) = std::int32_t(order[i]);
  auto d = precis::to_device(h, ctx.stream());
  ctx.synchronize();
  return d;
}

/// The device's time between two points of a stream's queue: two CUDA events, made and
/// destroyed with the timer. start(s) and stop(s) record them on stream s; elapsed_ms()
/// waits for the second and gives the milliseconds between them.
class stream_timer {
 public:
  stream_timer() {
    precis::check(cudaEventCreate(&begin_), "cudaEventCreate");
    const cudaError_t e = cudaEventCreate(&end_);
    if (e != cudaSuccess) {
      (void)cudaEventDestroy(begin_);
      precis::check(e, "cudaEventCreate");
    }
  }
  stream_timer(const stream_timer&) = delete;
  stream_timer& operator=(const stream_timer&) = delete;
  ~stream_timer() {
    (void)cudaEventDestroy(begin_);
    (void)cudaEventDestroy(end_);
  }
  void start(cudaStream_t s) { precis::check(cudaEventRecord(begin_, s), "cudaEventRecord"); }
  void stop(cudaStream_t s) { precis::check(cudaEventRecord(end_, s), "cudaEventRecord"); }
  float elapsed_ms() const {
    precis::check(cudaEventSynchronize(end_), "cudaEventSynchronize");
    float ms = 0;
    precis::check(cudaEventElapsedTime(&ms, begin_, end_), "cudaEventElapsedTime");
    return ms;
  }

 private:
  cudaEvent_t begin_ = nullptr, end_ = nullptr;
};

}  // namespace examples
