// The numeric headers in device code: a kernel decodes every pattern of each format and
// rounds a sweep of floats with every conversion precis offers; the host checks each
// result against precis's host conversions (themselves checked against CUDA's host
// functions). Exits 77 (skipped) where no GPU is present.
#include <precis/numeric/numeric.hpp>

#include "../gpu.hpp"

#include <cuda_runtime.h>

#include <bit>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace {

constexpr int sweep = 1 << 20;

struct device_results {
  float decoded[4][65536];
  std::uint16_t encoded[sweep][8];
};

__global__ void convert_everything(device_results* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < 65536) {
    const auto b = static_cast<std::uint16_t>(i);
    out->decoded[0][i] = precis::float16::from_bits(b);
    out->decoded[1][i] = precis::bfloat16::from_bits(b);
    out->decoded[2][i] = precis::float8_e4m3::from_bits(static_cast<std::uint8_t>(b));
    out->decoded[3][i] = precis::float8_e5m2::from_bits(static_cast<std::uint8_t>(b));
  }
  if (i < sweep) {
    // 4096 * i covers the float patterns with a stride of 2^12.
    const float x = __uint_as_float(static_cast<unsigned>(i) * 4096U + 0x5A5U);
    auto* e = out->encoded[i];
    e[0] = precis::float16(x).bits();
    e[1] = precis::bfloat16(x).bits();
    e[2] = precis::float8_e4m3(x).bits();
    e[3] = precis::float8_e5m2(x).bits();
    e[4] = precis::saturate_cast<precis::float8_e4m3>(x).bits();
    e[5] = precis::saturate_cast<precis::float8_e5m2>(x).bits();
    e[6] = precis::convert<precis::float16, precis::rounding::toward_zero>(x).bits();
    e[7] = precis::stochastic_round<precis::bfloat16>(x, static_cast<std::uint32_t>(i) * 2654435761U).bits();
  }
}

}  // namespace

int main() {
  if (!precis_test::have_gpu()) return precis_test::skipped;
  device_results* d = nullptr;
  if (cudaMalloc(&d, sizeof(device_results)) != cudaSuccess) return 1;
  convert_everything<<<sweep / 256, 256>>>(d);
  std::vector<device_results> h(1);
  if (cudaMemcpy(h.data(), d, sizeof(device_results), cudaMemcpyDeviceToHost) != cudaSuccess) {
    std::printf("kernel or copy failed: %s\n", cudaGetErrorString(cudaGetLastError()));
    return 1;
  }
  cudaFree(d);
  long failures = 0;
  for (std::uint32_t i = 0; i < 65536; ++i) {
    const auto b = static_cast<std::uint16_t>(i);
    const float host[4] = {precis::float16::from_bits(b), precis::bfloat16::from_bits(b),
                           precis::float8_e4m3::from_bits(static_cast<std::uint8_t>(b)),
                           precis::float8_e5m2::from_bits(static_cast<std::uint8_t>(b))};
    for (int f = 0; f < 4; ++f) {
      failures += std::bit_cast<std::uint32_t>(host[f]) !=
                  std::bit_cast<std::uint32_t>(h[0].decoded[f][i]);
    }
  }
  for (int i = 0; i < sweep; ++i) {
    const float x = std::bit_cast<float>(static_cast<unsigned>(i) * 4096U + 0x5A5U);
    const std::uint16_t host[8] = {
        precis::float16(x).bits(),
        precis::bfloat16(x).bits(),
        precis::float8_e4m3(x).bits(),
        precis::float8_e5m2(x).bits(),
        precis::saturate_cast<precis::float8_e4m3>(x).bits(),
        precis::saturate_cast<precis::float8_e5m2>(x).bits(),
        precis::convert<precis::float16, precis::rounding::toward_zero>(x).bits(),
        precis::stochastic_round<precis::bfloat16>(x, static_cast<std::uint32_t>(i) * 2654435761U).bits()};
    for (int k = 0; k < 8; ++k) {
      if (host[k] != h[0].encoded[i][k] && failures++ < 20) {
        std::printf("x=%a conversion %d: host 0x%x device 0x%x\n", double(x), k, host[k],
                    h[0].encoded[i][k]);
      }
    }
  }
  std::printf("%ld mismatches between device and host conversions\n", failures);
  return failures == 0 ? 0 : 1;
}
