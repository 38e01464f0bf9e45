/// @file
/// The loss-scaling kernels on the device: the fused multi-tensor unscale + non-finite check
/// (float, bfloat16, float16 gradients), the amax reduction and the scaled cast for float8, and the
/// scale updates (dynamic loss scaling, float8 delayed scaling) on state kept in device memory, all
/// stream-ordered with no host synchronisation (except the convenience overload that returns a bool
/// and the copies of a state back to its host object, which wait). A device state is loaded from
/// and stored back to the host scaler or recipe it mirrors, so that it can be checkpointed with
/// save_state like any other. Compiled by nvcc only (include from a .cu file).
#pragma once

#include <precis/config.hpp>
#include <precis/kernels/cuda/cast.hpp>
#include <precis/kernels/cuda/common.hpp>
#include <precis/kernels/cuda_context.hpp>
#include <precis/kernels/unscale.hpp>
#include <precis/scaling/checkpoint.hpp>
#include <precis/scaling/fp8.hpp>
#include <precis/scaling/scalers.hpp>
#include <precis/tensor/device_span.hpp>
#include <precis/tensor/device_tensor.hpp>

#if defined(__CUDACC__)

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

namespace precis {

/// The state of a dynamic loss scaler kept in device memory, so that the scale can be
/// updated after each step without the host reading found-inf.
struct device_scaler_state {
  float scale;                    ///< the loss scale
  std::uint32_t growth_tracker;   ///< consecutive finite steps since the last growth or backoff
  std::uint32_t hysteresis_left;  ///< non-finite steps still tolerated before the next backoff
};

namespace detail::cuda {

// One block per chunk of one tensor (common.hpp's chunk_elements).
template <class T>
struct chunk {
  T* data;
  std::uint32_t size;
};

/// x * inv rounded once to T; sets `bad` when the stored result is infinite or NaN.
template <class T>
__device__ inline T unscale_one(T x, float inv, int& bad) {
  float v = float(x) * inv;
  if constexpr (std::is_same_v<T, float>) {
    bad |= !::isfinite(v);
    return v;
  } else {
    const T r(v);                  // rounds once, as the host kernel does
    bad |= !::isfinite(float(r));  // an overflow of the format counts
    return r;
  }
}

// Each thread moves 16 bytes at a time (4 floats, 8 bfloat16 / float16) where the chunk
// starts on a 16-byte boundary: one 2-byte access per element leaves most of the memory
// bandwidth unused. The elements past the last whole vector, and chunks that start
// elsewhere, go one at a time. Every element is rounded as in the scalar loop.
template <class T>
__global__ void unscale_chunks(const chunk<T>* chunks, const float* scale, int* found_inf) {
  constexpr std::uint32_t per = 16 / sizeof(T);
  const chunk<T> c = chunks[blockIdx.x];
  const float inv = 1.0f / *scale;
  int bad = 0;
  std::uint32_t done = 0;
  if (reinterpret_cast<std::uintptr_t>(c.data) % 16 == 0) {
    auto* vectors = reinterpret_cast<uint4*>(c.data);
    const std::uint32_t whole = c.size / per;
    for (std::uint32_t i = threadIdx.x; i < whole; i += blockDim.x) {
      uint4 raw = vectors[i];
      T e[per];
      memcpy(e, &raw, sizeof raw);
#pragma unroll
      for (std::uint32_t j = 0; j < per; ++j) e[j] = unscale_one(e[j], inv, bad);
      memcpy(&raw, e, sizeof raw);
      vectors[i] = raw;
    }
    done = whole * per;
  }
  for (std::uint32_t i = done + threadIdx.x; i < c.size; i += blockDim.x)
    c.data[i] = unscale_one(c.data[i], inv, bad);
  if (__syncthreads_or(bad) && threadIdx.x == 0) *found_inf = 1;
}

/// Folds every thread's m (a magnitude, or NaN) into *amax: the block's maximum (NaN
/// wins), then one atomicMax on its bits -- non-negative floats order as their bit patterns
/// do, and NaN (above +inf) wins, as it should. A template so that every translation unit
/// may define it.
template <class M = float>
__device__ void fold_amax(M m, float* amax) {
  __shared__ M shared[32];
  m = block_reduce(m, max_nan_op<M>{}, shared);
  if (threadIdx.x == 0) atomicMax(reinterpret_cast<unsigned*>(amax), __float_as_uint(m));
}

template <class T>
__global__ void amax_kernel(const T* x, std::size_t n, float* amax) {
  float m = 0.0f;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    m = max_nan(m, fabsf(float(x[i])));  // fmaxf would drop a NaN
  }
  fold_amax(m, amax);
}

// A template so that the header can define it in every translation unit.
template <class Options = dynamic_scaler_options>
__global__ void update_scale_kernel(device_scaler_state* s, const int* found_inf, Options o) {
  // The host dynamic_scaler's update, step for step.
  if (*found_inf) {
    s->growth_tracker = 0;
    if (--s->hysteresis_left == 0) {
      const float backed_off = static_cast<float>(double(s->scale) * o.backoff_factor);
      s->scale = backed_off < o.min_scale ? o.min_scale : backed_off;
      s->hysteresis_left = o.hysteresis;
    }
  } else {
    s->hysteresis_left = o.hysteresis;
    if (++s->growth_tracker == o.growth_interval) {
      const float grown = static_cast<float>(double(s->scale) * o.growth_factor);
      if (::isfinite(grown)) s->scale = grown > o.max_scale ? o.max_scale : grown;
      s->growth_tracker = 0;
    }
  }
}

/// out[i] = saturate_cast<F>(x[i] * *scale), and max|x[i]| folded into *amax (NaN wins):
/// the float8 cast of a tensor with this step's scale, measuring the amax the next scale
/// comes from, in one pass. In packs of V elements (16 bytes of x) where both pointers are
/// aligned for them (V = 1 otherwise), the last n % V one per thread.
template <int V, class F, class T>
__global__ void scaled_cast_kernel(const T* x, F* out, std::size_t n, const float* scale, float* amax) {
  const float s = *scale;
  float m = 0.0F;
  const std::size_t packs = n / V, t = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x;
  for (std::size_t p = t; p < packs; p += std::size_t(gridDim.x) * blockDim.x) {
    const auto in = load_pack<V>(x + p * V);
    pack<F, V> o;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float v = float(in.v[k]);
      o.v[k] = saturate_cast<F>(v * s);
      m = max_nan(m, fabsf(v));
    }
    store_pack<V>(out + p * V, o);
  }
  if (const std::size_t i = packs * V + t; V > 1 && i < n) {
    const float v = float(x[i]);
    out[i] = saturate_cast<F>(v * s);
    m = max_nan(m, fabsf(v));
  }
  fold_amax(m, amax);
}

/// scaled_cast_kernel over n elements on ctx's stream: in 16-byte packs where both pointers
/// allow (device tensors always do), else one element per thread. Throws precis::error when
/// the launch fails.
template <class F, class T>
void scaled_cast_elements(cuda_context& ctx, const T* x, F* out, std::size_t n, const float* scale, float* amax) {
  if (n == 0) return;
  constexpr int V = pack_width<T, F>;
  if (pack_aligned<V>(x, out)) {
    scaled_cast_kernel<V><<<grid_for(n / V + 1), 256, 0, ctx.stream()>>>(x, out, n, scale, amax);
  } else {
    scaled_cast_kernel<1><<<grid_for(n), 256, 0, ctx.stream()>>>(x, out, n, scale, amax);
  }
  check(cudaGetLastError(), "precis::scaled_cast_async");
}

/// The delayed-scaling update of delayed_scaling::update, step for step, by one block: the
/// amax recorded when positive and finite, the reference (the history's max, or the
/// latest) and the new scale; *amax is then zeroed for the next step's measurement.
/// scale and inverse_scale each start a 16-byte slot: cuBLASLt refuses float8 scale
/// pointers that are not 16-byte aligned (see lt_matmul), and inverse_scale() is one.
struct delayed_header {
  alignas(16) float scale;
  alignas(16) float inverse_scale;
  std::uint32_t next;
  std::uint32_t recorded;
};
static_assert(offsetof(delayed_header, inverse_scale) % 16 == 0 &&
                  offsetof(delayed_header, scale) % 16 == 0,
              "precis: the float8 scale pointers must be 16-byte aligned within the header");

// A template so that the header can define it in every translation unit.
template <class Header = delayed_header>
__global__ void delayed_update_kernel(Header* h, float* history, std::uint32_t length, float* amax,
                                      int most_recent, std::int32_t margin, float fmax) {
  __shared__ float shared[32];
  const Header old = *h;  // every thread reads before thread 0 writes
  const float a = *amax;
  const bool record = a > 0.0F && ::isfinite(a);
  __syncthreads();
  if (threadIdx.x == 0 && record) history[old.next] = a;
  __syncthreads();
  const std::uint32_t next = record ? (old.next + 1) % length : old.next;
  const std::uint32_t recorded = old.recorded + (record ? 1U : 0U);
  float reference = 0.0F;
  if (recorded > 0) {  // the same for every thread
    if (most_recent) {
      reference = history[(next + length - 1) % length];
    } else {
      float m = 0.0F;
      for (std::uint32_t i = threadIdx.x; i < length; i += blockDim.x) m = fmaxf(m, history[i]);
      reference = block_reduce(m, [](float x, float y) { return fmaxf(x, y); }, shared);
    }
  }
  if (threadIdx.x == 0) {
    const float scale = scale_from_amax(fmax, reference, margin, old.scale);
    *h = {scale, 1.0F / scale, next, recorded};
    *amax = 0.0F;
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
    detail::cuda::for_each_chunk(t.size(), [&](std::size_t b, std::size_t len) {
      chunks.push_back({t.data() + b, static_cast<std::uint32_t>(len)});
    });
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

/// Copies the scale and counters of a host dynamic scaler into a device state (queued on
/// ctx's stream; `s` may go away once this returns).
inline void load_device_state(cuda_context& ctx, const dynamic_scaler& s, device_scaler_state* state) {
  const device_scaler_state h{s.scale(), s.growth_tracker(), s.hysteresis_left()};
  check(cudaMemcpyAsync(state, &h, sizeof h, cudaMemcpyHostToDevice, ctx.stream()), "cudaMemcpyAsync");
  // A pageable source is staged before cudaMemcpyAsync returns: `h` may go out of scope.
}

/// Writes a device state back into the host scaler it mirrors (its scale and counters; the
/// host's step counts and scale history are the host's), e.g. before save_state. Waits for
/// the device. Throws precis::error, leaving `s` unchanged, when the device state is not a
/// consistent state of `s` (a scale outside its bounds, counters out of range).
inline void store_device_state(cuda_context& ctx, const device_scaler_state* state, dynamic_scaler& s) {
  device_scaler_state h{};
  check(cudaMemcpyAsync(&h, state, sizeof h, cudaMemcpyDeviceToHost, ctx.stream()), "cudaMemcpyAsync");
  ctx.synchronize();
  assign_state_fields(s, [&](auto set) {
    set("scale", h.scale);
    set("growth_tracker", h.growth_tracker);
    set("hysteresis_left", h.hysteresis_left);
  });
}

/// A float8 delayed-scaling recipe (delayed_scaling<Format>, single process) whose state --
/// scale, inverse scale, amax history -- lives in device memory, so that a training step
/// casts with the scale, measures the amax and updates the scale without the host reading
/// anything. Load it from and store it to a host delayed_scaling<Format> to checkpoint it.
/// Its memory is freed on the stream of the context it was made with: destroy it before
/// that context.
template <class Format>
class device_delayed_scaling {
 public:
  /// The float8 format it scales for (float8_e4m3 or float8_e5m2).
  using format = Format;

  /// The state of `host` (options, scale, history) copied to the device on ctx's stream.
  device_delayed_scaling(cuda_context& ctx, const delayed_scaling<Format>& host)
      : options_(host.options()),
        header_({1}, ctx.stream()),
        history_({host.options().history_length}, ctx.stream()),
        amax_({1}, ctx.stream()) {
    load(ctx, host);
  }

  /// The options in force (those of the host recipe last loaded).
  const delayed_scaling_options& options() const { return options_; }

  /// Replaces the device state with `host`'s (same history length). Queued on ctx's stream.
  void load(cuda_context& ctx, const delayed_scaling<Format>& host) {
    if (host.options().history_length != options_.history_length) {
      throw error("precis::device_delayed_scaling: the host recipe keeps " +
                  std::to_string(host.options().history_length) + " amax values, this one " +
                  std::to_string(options_.history_length));
    }
    options_ = host.options();
    // Staged copies (pageable sources), so the host vectors may go when this returns.
    const detail::cuda::delayed_header h{host.scale(), host.inverse_scale(),
                                         state_field<std::uint32_t>(host, "next"),
                                         state_field<std::uint32_t>(host, "recorded")};
    const std::vector<float> history = state_field<std::vector<float>>(host, "amax_history");
    check(cudaMemcpyAsync(header_.data(), &h, sizeof h, cudaMemcpyHostToDevice, ctx.stream()), "cudaMemcpyAsync");
    check(cudaMemcpyAsync(history_.data(), history.data(), history.size() * sizeof(float), cudaMemcpyHostToDevice,
                          ctx.stream()),
          "cudaMemcpyAsync");
    check(cudaMemsetAsync(amax_.data(), 0, sizeof(float), ctx.stream()), "cudaMemsetAsync");
  }

  /// Writes the device state into `host` (whose options must be this recipe's), waiting
  /// for the device. Throws precis::error, leaving `host` unchanged, on an inconsistent
  /// state.
  void store(cuda_context& ctx, delayed_scaling<Format>& host) const {
    const delayed_scaling_options& o = host.options();
    if (o.history_length != options_.history_length || o.algorithm != options_.algorithm ||
        o.margin != options_.margin) {
      throw error("precis::device_delayed_scaling: the host recipe's options (history " +
                  std::to_string(o.history_length) + ", margin " + std::to_string(o.margin) +
                  ") are not this recipe's (history " + std::to_string(options_.history_length) +
                  ", margin " + std::to_string(options_.margin) + ") or its amax algorithm differs");
    }
    detail::cuda::delayed_header h{};
    std::vector<float> history(options_.history_length);
    check(cudaMemcpyAsync(&h, header_.data(), sizeof h, cudaMemcpyDeviceToHost, ctx.stream()), "cudaMemcpyAsync");
    check(cudaMemcpyAsync(history.data(), history_.data(), history.size() * sizeof(float), cudaMemcpyDeviceToHost,
                          ctx.stream()),
          "cudaMemcpyAsync");
    ctx.synchronize();
    assign_state_fields(host, [&](auto set) {
      set("scale", h.scale);
      set("next", h.next);
      set("recorded", h.recorded);
      set("amax_history", history);
    });
  }

  /// Device pointers: multiply by *scale() before casting to Format (scaled_cast does),
  /// by *inverse_scale() after reading Format values (lt_matmul's a_scale / b_scale).
  const float* scale() const {
    return reinterpret_cast<const float*>(reinterpret_cast<const char*>(header_.data()) +
                                          offsetof(detail::cuda::delayed_header, scale));
  }
  /// Device pointer to 1 / scale, the factor that undoes the scaling (see scale()).
  const float* inverse_scale() const {
    return reinterpret_cast<const float*>(reinterpret_cast<const char*>(header_.data()) +
                                          offsetof(detail::cuda::delayed_header, inverse_scale));
  }
  /// The amax measured since the last update (scaled_cast folds into it; zeroed by update).
  float* amax() { return amax_.data(); }

  /// delayed_scaling::update on the device: records the measured amax, computes the next
  /// scale and zeroes the amax. Queued on ctx's stream; no host synchronisation.
  void update_async(cuda_context& ctx) {
    detail::cuda::delayed_update_kernel<><<<1, 256, 0, ctx.stream()>>>(
        header_.data(), history_.data(), options_.history_length, amax_.data(),
        options_.algorithm == amax_algorithm::most_recent ? 1 : 0, options_.margin,
        detail::fp8_max<Format>());
    check(cudaGetLastError(), "precis::device_delayed_scaling::update_async");
  }

 private:
  delayed_scaling_options options_;
  device_tensor<detail::cuda::delayed_header, 1> header_;
  device_tensor<float, 1> history_;
  device_tensor<float, 1> amax_;
};

/// out = saturate_cast<F>(x * *scale) element by element on the device (F a float8 format;
/// *scale a device float, e.g. device_delayed_scaling::scale()), folding max|x| into *amax
/// (device; NaN wins) in the same pass. Throws precis::error naming both shapes, before
/// any launch, when they differ.
template <class F, kernel_element T, std::size_t N>
void scaled_cast_async(cuda_context& ctx, const device_tensor<T, N>& x, device_tensor<F, N>& out,
                       const float* scale, float* amax) {
  static_assert(is_float8_v<F>, "precis: scaled_cast_async casts to float8_e4m3 or float8_e5m2");
  check_shape("precis::scaled_cast_async: out", out, x.shape());
  if (x.size() == 0) return;
  detail::cuda::scaled_cast_elements(ctx, x.data(), out.data(), x.size(), scale, amax);
}

namespace detail::cuda {

// Templates, so that every translation unit may define them (see update_scale_kernel).

/// partial[b] = the sum of squares of chunk b's elements, in double (each square exact),
/// each thread's strided share in order, then the block's tree: a fixed order.
template <class T = float>
__global__ void square_sums(const chunk<T>* chunks, double* partial) {
  __shared__ double shared[32];
  const chunk<T> c = chunks[blockIdx.x];
  double s = 0.0;
  for (std::uint32_t i = threadIdx.x; i < c.size; i += blockDim.x) {
    const double v = double(c.data[i]);
    s = __dadd_rn(s, __dmul_rn(v, v));
  }
  s = block_reduce(s, [](double a, double b) { return __dadd_rn(a, b); }, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

/// *norm = sqrt(the partial sums added in a fixed order); *factor = the clipping factor
/// max_norm / (norm + 1e-6) rounded to float when the norm is finite and above max_norm
/// (max_norm > 0), else 1 (clip_grad_norm's rule).
template <class T = float>
__global__ void finish_norm(const double* partial, unsigned count, double max_norm, double* norm,
                            float* factor) {
  __shared__ double shared[32];
  double s = 0.0;
  for (unsigned i = threadIdx.x; i < count; i += blockDim.x) s = __dadd_rn(s, partial[i]);
  s = block_reduce(s, [](double a, double b) { return __dadd_rn(a, b); }, shared);
  if (threadIdx.x == 0) {
    const double n = ::sqrt(s);
    *norm = n;
    *factor = max_norm > 0.0 && ::isfinite(n) && n > max_norm ? static_cast<float>(max_norm / (n + 1e-6)) : 1.0f;
  }
}

/// Every element times *factor, rounded once (clip_grad_norm's update); nothing when the
/// factor is 1.
template <class T = float>
__global__ void scale_chunks(const chunk<T>* chunks, const float* factor) {
  const float f = *factor;
  if (f == 1.0f) return;
  const chunk<T> c = chunks[blockIdx.x];
  for (std::uint32_t i = threadIdx.x; i < c.size; i += blockDim.x) c.data[i] = T(__fmul_rn(float(c.data[i]), f));
}

}  // namespace detail::cuda

/// The float gradients of a device model (its gradients(), at fixed addresses) as one chunk
/// table made once, for the multi-tensor passes of a training step: unscale with found-inf,
/// the joint L2 norm and clipping. Each pass is one or two launches on ctx's stream, with
/// no host synchronisation and no allocation, so a step built from them can be captured
/// into a CUDA graph.
///
/// The norm is accumulated in double, as the host's grad_norm, in another fixed order
/// (each chunk's threads, then the chunks): the same value on every device and run, within
/// a few double roundings of the host's.
class device_gradient_set {
 public:
  /// The chunk table of `gradients` (device spans of float), uploaded on ctx's stream.
  device_gradient_set(cuda_context& ctx, const std::vector<device_span<float>>& gradients) {
    std::vector<detail::cuda::chunk<float>> chunks;
    for (const auto& g : gradients) {
      detail::cuda::for_each_chunk(g.size(), [&](std::size_t b, std::size_t n) {
        chunks.push_back({g.data() + b, static_cast<std::uint32_t>(n)});
      });
    }
    count_ = static_cast<unsigned>(chunks.size());
    if (count_ == 0) return;
    chunks_ = device_tensor<detail::cuda::chunk<float>, 1>({chunks.size()});
    partial_ = device_tensor<double, 1>({chunks.size()});
    check(cudaMemcpyAsync(chunks_.data(), chunks.data(), chunks.size() * sizeof(chunks[0]),
                          cudaMemcpyHostToDevice, ctx.stream()),
          "cudaMemcpyAsync");
    ctx.synchronize();  // `chunks` is this frame's
  }

  /// Divides every gradient by `*scale` (device) and sets `*found_inf` (device; zeroed by
  /// the caller) when a result is infinite or NaN, as unscale_and_check_async.
  void unscale_async(cuda_context& ctx, const float* scale, int* found_inf) const {
    if (count_ == 0) return;
    detail::cuda::unscale_chunks<float><<<count_, 256, 0, ctx.stream()>>>(chunks_.data(), scale, found_inf);
    check(cudaGetLastError(), "precis::device_gradient_set::unscale_async");
  }
  /// Writes the joint L2 norm to `*norm` and the clipping factor for `max_norm` to
  /// `*factor` (both device; 1 when max_norm is 0, the norm is within it, or it is not
  /// finite).
  void norm_async(cuda_context& ctx, double max_norm, double* norm, float* factor) {
    if (count_ != 0) {
      detail::cuda::square_sums<<<count_, 256, 0, ctx.stream()>>>(chunks_.data(), partial_.data());
      check(cudaGetLastError(), "precis::device_gradient_set::norm_async");
    }
    detail::cuda::finish_norm<<<1, 256, 0, ctx.stream()>>>(partial_.data(), count_, max_norm, norm, factor);
    check(cudaGetLastError(), "precis::device_gradient_set::norm_async");
  }
  /// Multiplies every gradient by `*factor` (device) unless it is 1.
  void clip_async(cuda_context& ctx, const float* factor) const {
    if (count_ == 0) return;
    detail::cuda::scale_chunks<<<count_, 256, 0, ctx.stream()>>>(chunks_.data(), factor);
    check(cudaGetLastError(), "precis::device_gradient_set::clip_async");
  }
  /// Chunks in the table (blocks per pass).
  unsigned chunks() const { return count_; }

 private:
  device_tensor<detail::cuda::chunk<float>, 1> chunks_;
  device_tensor<double, 1> partial_;
  unsigned count_ = 0;
};

}  // namespace precis


#endif
