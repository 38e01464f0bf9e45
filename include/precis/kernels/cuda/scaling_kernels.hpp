// precis/kernels/cuda/scaling_kernels.hpp: the loss-scaling kernels on the device: the
// fused multi-tensor unscale + non-finite check (float, bfloat16, float16 gradients), the
// amax reduction for float8 scaling, and the dynamic scale update, all stream-ordered
// with no host synchronisation (except the convenience overload that returns a bool).
// Compiled by nvcc only (include from a .cu file).
#pragma once

#include <precis/config.hpp>
#include <precis/kernels/cuda/cast.hpp>
#include <precis/kernels/cuda/common.hpp>
#include <precis/kernels/cuda_context.hpp>
#include <precis/kernels/unscale.hpp>
#include <precis/scaling/scalers.hpp>

#if defined(__CUDACC__)

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace precis {

/// The state of a dynamic loss scaler kept in device memory, so that the scale can be
/// updated after each step without the host reading found-inf.
struct device_scaler_state {
  float scale;
  std::uint32_t growth_tracker;
  std::uint32_t hysteresis_left;
};

namespace detail::cuda {

// One block per chunk of up to `chunk_elements` elements of one tensor: the "multi-tensor
// apply" layout, so that many small gradient tensors cost one launch.
inline constexpr std::size_t chunk_elements = 1 << 16;

template <class T>
struct chunk {
  T* data;
  std::uint32_t size;
};

template <class T>
__global__ void unscale_chunks(const chunk<T>* chunks, const float* scale, int* found_inf) {
  const chunk<T> c = chunks[blockIdx.x];
  const float inv = 1.0f / *scale;
  int bad = 0;
  for (std::uint32_t i = threadIdx.x; i < c.size; i += blockDim.x) {
    float v = float(c.data[i]) * inv;
    if constexpr (std::is_same_v<T, float>) {
      c.data[i] = v;
    } else {
      const T r(v);  // rounds once, as the host kernel does
      c.data[i] = r;
      v = float(r);  // an overflow of the format counts
    }
    bad |= !::isfinite(v);
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) *found_inf = 1;
}

template <class T>
__global__ void amax_kernel(const T* x, std::size_t n, float* amax) {
  float m = 0.0f;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    m = max_nan(m, fabsf(float(x[i])));  // fmaxf would drop a NaN
  }
  for (int o = 16; o > 0; o /= 2) m = max_nan(m, __shfl_down_sync(0xFFFFFFFFU, m, o));
  __shared__ float warp_max[32];
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (unsigned w = 1; w < blockDim.x / 32; ++w) m = max_nan(m, warp_max[w]);
    // Non-negative floats order as their bit patterns do; NaN (above +inf) wins, as it should.
    atomicMax(reinterpret_cast<unsigned*>(amax), __float_as_uint(m));
  }
}

// A template so that the header can define it in every translation unit.
template <class Options = dynamic_scaler_options>
__global__ void update_scale_kernel(device_scaler_state* s, const int* found_inf, Options o) {
  // The host dynamic_scaler's update, step for step.
  if (*found_inf) {
    s->growth_tracker = 0;
    if (--s->hysteresis_left == 0) {
      const float backed_off = s->scale * o.backoff_factor;
      s->scale = backed_off < o.min_scale ? o.min_scale : backed_off;
      s->hysteresis_left = o.hysteresis;
    }
  } else {
    s->hysteresis_left = o.hysteresis;
    if (++s->growth_tracker == o.growth_interval) {
      const float grown = s->scale * o.growth_factor;
      if (::isfinite(grown)) s->scale = grown > o.max_scale ? o.max_scale : grown;
      s->growth_tracker = 0;
    }
  }
}

}  // namespace detail::cuda

/// Divides every element of the device tensors by `*scale` (a device pointer) and sets
/// `*found_inf` (device) to 1 if any result is infinite or NaN; one launch for all
/// tensors, queued on ctx's stream. `*found_inf` must be zeroed by the caller.
template <gradient_element T>
void unscale_and_check_async(cuda_context& ctx, std::span<const std::span<T>> tensors,
                             const float* scale, int* found_inf) {
  std::vector<detail::cuda::chunk<T>> chunks;
  for (auto t : tensors) {
    for (std::size_t b = 0; b < t.size(); b += detail::cuda::chunk_elements) {
      const std::size_t len = std::min(detail::cuda::chunk_elements, t.size() - b);
      chunks.push_back({t.data() + b, static_cast<std::uint32_t>(len)});
    }
  }
  if (chunks.empty()) return;
  const std::size_t bytes = chunks.size() * sizeof(chunks[0]);
  auto* table = static_cast<detail::cuda::chunk<T>*>(ctx.workspace(bytes));
  // `chunks` is pageable host memory: CUDA copies it to a staging buffer before
  // cudaMemcpyAsync returns (the runtime's documented behaviour for pageable sources), so
  // it may go out of scope right after, and the host never waits for the device here.
  check(cudaMemcpyAsync(table, chunks.data(), bytes, cudaMemcpyHostToDevice, ctx.stream()),
        "cudaMemcpyAsync");
  detail::cuda::unscale_chunks<T>
      <<<static_cast<unsigned>(chunks.size()), 256, 0, ctx.stream()>>>(table, scale, found_inf);
  check(cudaGetLastError(), "unscale_chunks<<<>>>");
}

/// The same as the host `unscale_and_check` (multiplies by `inv_scale`, returns whether a
/// value is infinite or NaN), for device tensors; waits for the result.
template <gradient_element T>
bool unscale_and_check(cuda_context& ctx, std::span<const std::span<T>> tensors, float inv_scale) {
  struct scratch {
    float scale;
    int found;
  } host{1.0f / inv_scale, 0}, *dev = nullptr;
  check(cudaMallocAsync(reinterpret_cast<void**>(&dev), sizeof(scratch), ctx.stream()), "cudaMallocAsync");
  check(cudaMemcpyAsync(dev, &host, sizeof(scratch), cudaMemcpyHostToDevice, ctx.stream()), "cudaMemcpyAsync");
  unscale_and_check_async(ctx, tensors, &dev->scale, &dev->found);
  check(cudaMemcpyAsync(&host, dev, sizeof(scratch), cudaMemcpyDeviceToHost, ctx.stream()), "cudaMemcpyAsync");
  check(cudaFreeAsync(dev, ctx.stream()), "cudaFreeAsync");
  ctx.synchronize();
  return host.found != 0;
}

/// Folds max|x| of a device tensor into `*amax` (device; set it to 0 first), for float8
/// scaling. A NaN element makes the result NaN, which the float8 scalers refuse to record
/// (the scale is kept). Queued on ctx's stream.
template <class T>
void amax_async(cuda_context& ctx, std::span<const T> x, float* amax) {
  if (x.empty()) return;
  detail::cuda::amax_kernel<T><<<detail::cuda::grid_for(x.size(), 256), 256, 0, ctx.stream()>>>(
      x.data(), x.size(), amax);
  check(cudaGetLastError(), "amax_kernel<<<>>>");
}

/// Updates a device-resident dynamic scaler state from a device found-inf flag, as
/// dynamic_scaler::update does on the host. Queued on ctx's stream; no host sync.
inline void update_scale_async(cuda_context& ctx, device_scaler_state* state, const int* found_inf,
                               const dynamic_scaler_options& options) {
  detail::cuda::update_scale_kernel<><<<1, 1, 0, ctx.stream()>>>(state, found_inf, options);
  check(cudaGetLastError(), "update_scale_kernel<<<>>>");
}

}  // namespace precis

#endif
