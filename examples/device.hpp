// What the examples' GPU programs share (CUDA code only): the GPU's name, and an order of
// samples uploaded for the device's batch gathers.
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

}  // namespace examples
