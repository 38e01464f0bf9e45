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
#include <cstring>
#include <vector>

namespace {

constexpr int sweep = 1 << 21;

// The sweep's i-th float: the pattern 4096 (i mod 2^20), every sign, exponent and top 11
// mantissa bits, exact in the first half and with low bits 0x5A5 in the second. The exact
// half holds the zeros, infinities, NaNs of every payload above bit 11, each format's
// largest finite values and the halfway points past them (448 and 464, 57344 and 61440,
// 65504 and 65520), and the ties of every narrowing: float16's where i is odd (low 13 bits
// 0x1000), bfloat16's where i % 16 == 8, e4m3's where i % 256 == 128, e5m2's where
// i % 512 == 256.
__host__ __device__ inline float sweep_value(int i) {
  constexpr int half = sweep / 2;
  const unsigned bits = static_cast<unsigned>(i % half) * 4096U + (i >= half ? 0x5A5U : 0U);
  float x;
  memcpy(&x, &bits, sizeof x);
  return x;
}

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
    const float x = sweep_value(i);
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
    const float x = sweep_value(i);
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
