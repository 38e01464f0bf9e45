/// @file
/// SGD and AdamW on the device: precis::device_sgd and precis::device_adamw update a device
/// model's float master weights (its masters(), precis::device_span) from its float gradients
/// with float state in device memory, one launch per step for every tensor (a chunk table made
/// once), queued on the context's stream with no host synchronisation:
///
///     precis::device_adamw opt(ctx, model.masters(), model.gradients(), {.lr = 1e-3},
///                              model.decay_mask(), schedule.lr_table(total_steps));
///     ... backward, unscale_and_check_async(..., found_inf) ...
///     opt.step_async(ctx, found_inf);   // skips on the device when *found_inf is set
///
/// Each element is updated by the host optimizers' own functions (optim/update.hpp:
/// precis::adamw_update, precis::sgd_update with precis::scalar_update_math), so the device
/// gives the host optimizers' bits for the same gradients. A step whose found-inf flag is
/// set changes no weight, no moment and no step count, and the step count lives on the
/// device: the constants of every step (the learning rate of applied step t, AdamW's bias
/// corrections) are formed on the host when the optimizer is made, as a table indexed by
/// that count, so nothing is read back. Since the host does not know which steps were
/// skipped, the table's length is the number of steps that can be queued, applied or not. load() and store() move the state from and to a host
/// optimizer, for checkpoints. Compiled by nvcc only (include from a .cu file).
#pragma once

#include <precis/config.hpp>
#include <precis/kernels/cuda/common.hpp>
#include <precis/kernels/cuda_context.hpp>
#include <precis/optim/optimizers.hpp>
#include <precis/optim/update.hpp>
#include <precis/scaling/checkpoint.hpp>
#include <precis/tensor/device_span.hpp>
#include <precis/tensor/device_tensor.hpp>

#if defined(__CUDACC__)

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace precis {

namespace detail::cuda {

/// One block's share of a step: `size` elements of one parameter's master weights `w`, its
/// two state buffers (`s0`, `s1`: AdamW's moments, SGD's momentum in s0) and its gradient.
struct optimizer_chunk {
  float* w;
  float* s0;
  float* s1;
  const float* g;
  std::uint32_t size;
  std::uint32_t decays;
  void* work = nullptr;         ///< the working copy's elements of the chunk (fused refresh), or null
  std::uint32_t work_kind = 0;  ///< its element type (working_kind)
};

/// The element types a fused refresh writes: a device model's 16-bit working copies.
enum class working_kind : std::uint32_t { none = 0, bfloat16 = 1, float16 = 2 };

/// The working_kind of element type S (none for a type the fused refresh does not write).
template <class S>
constexpr working_kind working_kind_of() {
  if constexpr (std::is_same_v<S, precis::bfloat16>) {
    return working_kind::bfloat16;
  } else if constexpr (std::is_same_v<S, precis::float16>) {
    return working_kind::float16;
  } else {
    return working_kind::none;
  }
}

/// Writes the working copy's element i of chunk k from master value w: rounded to
/// nearest-even with IEEE overflow, as the cast of parameter::refresh() rounds it.
__device__ inline void store_working(const optimizer_chunk& k, std::uint32_t i, float w) {
  if (k.work_kind == std::uint32_t(working_kind::bfloat16)) {
    static_cast<precis::bfloat16*>(k.work)[i] = convert<precis::bfloat16, rounding::nearest_even, overflow::infinity>(w);
  } else if (k.work_kind == std::uint32_t(working_kind::float16)) {
    static_cast<precis::float16*>(k.work)[i] = convert<precis::float16, rounding::nearest_even, overflow::infinity>(w);
  }
}

// Templates, so that every translation unit may define them (see scaling_kernels.hpp).
template <class Constants = adamw_constants<float>>
__global__ void adamw_chunks(const optimizer_chunk* chunks, const Constants* table,
                             const std::uint64_t* applied, const int* found_inf) {
  if (found_inf != nullptr && *found_inf != 0) return;
  const Constants c = table[*applied];  // the constants of step t = applied + 1
  const optimizer_chunk k = chunks[blockIdx.x];
  for (std::uint32_t i = threadIdx.x; i < k.size; i += blockDim.x) {
    float w = k.w[i], m = k.s0[i], v = k.s1[i];
    adamw_update<scalar_update_math>(w, m, v, k.g[i], c, k.decays != 0);
    k.w[i] = w;
    k.s0[i] = m;
    k.s1[i] = v;
    store_working(k, i, w);
  }
}

template <class Constants = sgd_constants<float>>
__global__ void sgd_chunks(const optimizer_chunk* chunks, const Constants* table,
                           const std::uint64_t* applied, const int* found_inf) {
  if (found_inf != nullptr && *found_inf != 0) return;
  const Constants c = table[*applied];
  const optimizer_chunk k = chunks[blockIdx.x];
  for (std::uint32_t i = threadIdx.x; i < k.size; i += blockDim.x) {
    float w = k.w[i], b = c.with_momentum && !c.first ? k.s0[i] : 0.0F;
    sgd_update<scalar_update_math>(w, b, k.g[i], c, k.decays != 0);
    k.w[i] = w;
    if (c.with_momentum) k.s0[i] = b;
    store_working(k, i, w);
  }
}

/// Counts an applied step: after the update kernel, in stream order.
template <class Count = std::uint64_t>
__global__ void count_applied(Count* applied, const int* found_inf) {
  if (found_inf == nullptr || *found_inf == 0) ++*applied;
}

/// What device_sgd and device_adamw share: the tensors' chunk table (made once), the state
/// buffers (zero at first), the applied-step count and the table of per-step constants, all
/// in device memory; the host keeps only how many steps it has queued.
template <class Constants>
class device_optimizer_state {
 public:
  device_optimizer_state(cuda_context& ctx, std::string_view who,
                         const std::vector<device_span<float>>& masters,
                         const std::vector<device_span<float>>& grads, std::vector<bool> decay,
                         int states, const std::vector<Constants>& table)
      : who_(who),
        applied_({1}, ctx.stream()),
        table_({table.size()}, ctx.stream()),
        capacity_(table.size()) {
    if (grads.size() != masters.size()) {
      throw error(std::string(who) + ": " + std::to_string(grads.size()) +
                  " gradient tensors for " + std::to_string(masters.size()) + " parameters");
    }
    const std::vector<bool> decays = decay_flags(std::move(decay), masters.size(), who);
    std::size_t total = 0;
    for (std::size_t i = 0; i < masters.size(); ++i) {
      if (grads[i].size() != masters[i].size()) {
        throw error(std::string(who) + ": gradient tensor " + std::to_string(i) + " has " +
                    std::to_string(grads[i].size()) + " elements, the parameter has " +
                    std::to_string(masters[i].size()));
      }
      sizes_.push_back(masters[i].size());
      offsets_.push_back(total);
      total += masters[i].size();
    }
    for (int s = 0; s < states; ++s) {
      state_.emplace_back(std::array<std::size_t, 1>{total}, ctx.stream());
      if (total != 0) {
        check(cudaMemsetAsync(state_.back().data(), 0, total * sizeof(float), ctx.stream()),
              "cudaMemsetAsync");
      }
    }
    std::vector<optimizer_chunk>& chunks = host_chunks_;
    for (std::size_t i = 0; i < masters.size(); ++i) {
      first_chunk_.push_back(chunks.size());
      for_each_chunk(masters[i].size(), [&](std::size_t b, std::size_t n) {
        chunks.push_back({masters[i].data() + b,
                          states > 0 ? state_[0].data() + offsets_[i] + b : nullptr,
                          states > 1 ? state_[1].data() + offsets_[i] + b : nullptr,
                          grads[i].data() + b, static_cast<std::uint32_t>(n),
                          decays[i] ? 1U : 0U});
      });
    }
    first_chunk_.push_back(chunks.size());
    chunks_ = device_tensor<optimizer_chunk, 1>({chunks.size()}, ctx.stream());
    upload_chunks(ctx);
    if (!table.empty()) {
      check(cudaMemcpyAsync(table_.data(), table.data(), table.size() * sizeof(table[0]),
                            cudaMemcpyHostToDevice, ctx.stream()),
            "cudaMemcpyAsync");
    }
    set_applied(ctx, 0);
  }

  /// Throws precis::error, before anything is queued, when the steps queued so far could
  /// have used up the constants table.
  /// Steps that can still be queued before the table is full.
  std::uint64_t remaining() const { return capacity_ - queued_; }
  void reserve_step() {
    if (queued_ >= capacity_) {
      throw error(who_ + ": its table of per-step constants holds " + std::to_string(capacity_) +
                  " steps, and as many have been queued; make the optimizer with a longer "
                  "learning-rate table (or max_steps)");
    }
    ++queued_;
  }
  /// Gives back the place of the step queued last (one that was captured into a CUDA graph
  /// rather than run).
  void release_step() {
    if (queued_ > 0) --queued_;
  }
  /// Counts the step just queued as applied on the device unless *found_inf is set.
  void count(cuda_context& ctx, const int* found_inf) {
    count_applied<<<1, 1, 0, ctx.stream()>>>(applied_.data(), found_inf);
    check(cudaGetLastError(), who_ + "::step_async");
  }
  /// Sets the applied-step count (queued on ctx's stream).
  void set_applied(cuda_context& ctx, std::uint64_t steps) {
    if (steps > capacity_) {
      throw error(who_ + ": " + std::to_string(steps) + " steps applied, but its table of "
                  "per-step constants holds " + std::to_string(capacity_));
    }
    const std::uint64_t h = steps;
    check(cudaMemcpyAsync(applied_.data(), &h, sizeof h, cudaMemcpyHostToDevice, ctx.stream()),
          "cudaMemcpyAsync");
    ctx.synchronize();  // `h` lives on this stack frame
    queued_ = steps;
  }
  /// The applied-step count, read back (waits for the device).
  std::uint64_t applied(cuda_context& ctx) const {
    std::uint64_t h = 0;
    check(cudaMemcpyAsync(&h, applied_.data(), sizeof h, cudaMemcpyDeviceToHost, ctx.stream()),
          "cudaMemcpyAsync");
    ctx.synchronize();
    return h;
  }
  /// State buffer `s` of tensor `i`, read back (waits for the device).
  std::vector<float> download(cuda_context& ctx, int s, std::size_t i) const {
    std::vector<float> out(sizes_[i]);
    if (!out.empty()) {
      check(cudaMemcpyAsync(out.data(), state_[std::size_t(s)].data() + offsets_[i],
                            out.size() * sizeof(float), cudaMemcpyDeviceToHost, ctx.stream()),
            "cudaMemcpyAsync");
    }
    ctx.synchronize();
    return out;
  }
  /// Writes `values` into state buffer `s` of tensor `i` (waits: the host vector may go).
  void upload(cuda_context& ctx, int s, std::size_t i, const std::vector<float>& values) {
    if (values.size() != sizes_[i]) {
      throw error(who_ + ": state tensor " + std::to_string(i) + " has " +
                  std::to_string(sizes_[i]) + " elements, the host optimizer's " +
                  std::to_string(values.size()));
    }
    if (!values.empty()) {
      check(cudaMemcpyAsync(state_[std::size_t(s)].data() + offsets_[i], values.data(),
                            values.size() * sizeof(float), cudaMemcpyHostToDevice, ctx.stream()),
            "cudaMemcpyAsync");
    }
    ctx.synchronize();
  }

  /// Makes the update write each tensor's working copy too (working[i]: its elements and
  /// type, or null / none for a tensor without one): the refresh fused into the step.
  void set_working(cuda_context& ctx, const std::vector<std::pair<void*, working_kind>>& working) {
    if (working.size() != sizes_.size()) {
      throw error(who_ + ": " + std::to_string(working.size()) + " working copies for " +
                  std::to_string(sizes_.size()) + " parameters");
    }
    for (std::size_t i = 0; i < working.size(); ++i) {
      const auto [data, kind] = working[i];
      const std::size_t bytes = kind == working_kind::none ? 0 : 2;  // both kinds are 16-bit
      std::size_t offset = 0;
      for (std::size_t c = first_chunk_[i]; c < first_chunk_[i + 1]; ++c) {
        auto& k = host_chunks_[c];
        k.work = data == nullptr || bytes == 0 ? nullptr : static_cast<char*>(data) + offset * bytes;
        k.work_kind = k.work == nullptr ? 0U : std::uint32_t(kind);
        offset += k.size;
      }
    }
    upload_chunks(ctx);
  }
  std::size_t tensors() const { return sizes_.size(); }
  /// Bytes of the per-element state (moments, momentum buffers).
  std::size_t state_bytes() const {
    std::size_t n = 0;
    for (const auto& t : state_) n += t.size() * sizeof(float);
    return n;
  }
  unsigned blocks() const { return static_cast<unsigned>(chunks_.size()); }
  const optimizer_chunk* chunks() const { return chunks_.data(); }
  const Constants* table() const { return table_.data(); }
  const std::uint64_t* applied_pointer() const { return applied_.data(); }
  const std::string& who() const { return who_; }

 private:
  // Pageable sources are staged before cudaMemcpyAsync returns; host_chunks_ stays anyway.
  void upload_chunks(cuda_context& ctx) {
    if (!host_chunks_.empty()) {
      check(cudaMemcpyAsync(chunks_.data(), host_chunks_.data(), host_chunks_.size() * sizeof(host_chunks_[0]),
                            cudaMemcpyHostToDevice, ctx.stream()),
            "cudaMemcpyAsync");
    }
  }

  std::string who_;
  std::vector<std::size_t> sizes_, offsets_;
  std::vector<optimizer_chunk> host_chunks_;
  std::vector<std::size_t> first_chunk_;  // tensor i's chunks: [first_chunk_[i], first_chunk_[i + 1])
  std::vector<device_tensor<float, 1>> state_;
  device_tensor<optimizer_chunk, 1> chunks_;
  device_tensor<std::uint64_t, 1> applied_;
  device_tensor<Constants, 1> table_;
  std::uint64_t capacity_ = 0;
  std::uint64_t queued_ = 0;
};

/// `lr` for each of `steps` steps.
inline std::vector<double> constant_lr(double lr, std::uint64_t steps) {
  return std::vector<double>(static_cast<std::size_t>(steps), lr);
}

/// What distinguishes AdamW on the device: its host optimizer, options, constants, state
/// buffers (named as the host optimizer's checkpoint names them) and kernel.
struct adamw_kind {
  using host = adamw;
  using options = adamw_options;
  using constants = adamw_constants<float>;
  static constexpr std::string_view name = "precis::device_adamw";
  static constexpr std::array<std::string_view, 2> states = {"m", "v"};
  static constants make(const options& o, std::uint64_t t) { return make_adamw_constants(o, t); }
  static void launch(cuda_context& ctx, unsigned blocks, const optimizer_chunk* chunks,
                     const constants* table, const std::uint64_t* applied, const int* found_inf) {
    adamw_chunks<><<<blocks, 256, 0, ctx.stream()>>>(chunks, table, applied, found_inf);
  }
};

/// What distinguishes SGD on the device (see adamw_kind).
struct sgd_kind {
  using host = sgd;
  using options = sgd_options;
  using constants = sgd_constants<float>;
  static constexpr std::string_view name = "precis::device_sgd";
  static constexpr std::array<std::string_view, 1> states = {"velocity"};
  static constants make(const options& o, std::uint64_t t) { return make_sgd_constants(o, t == 1); }
  static void launch(cuda_context& ctx, unsigned blocks, const optimizer_chunk* chunks,
                     const constants* table, const std::uint64_t* applied, const int* found_inf) {
    sgd_chunks<><<<blocks, 256, 0, ctx.stream()>>>(chunks, table, applied, found_inf);
  }
};

}  // namespace detail::cuda

/// An optimizer on the device with its host optimizer's bits (see the file comment):
/// precis::device_adamw (precis::adamw's update) or precis::device_sgd (precis::sgd's). The
/// masters and gradients are a device model's masters() and gradients() (the same order,
/// fixed addresses); `lr_by_step[t - 1]` is the learning rate of applied step t (a
/// schedule's lr_table()), and its length the number of steps that can be queued (applied
/// or skipped).
template <class Kind>
class basic_device_optimizer {
 public:
  /// The options type: adamw_options or sgd_options.
  using options_type = typename Kind::options;
  /// The host optimizer whose bits it gives and whose state it loads and stores.
  using host_type = typename Kind::host;

  /// Throws precis::error for invalid options (at any step's learning rate), or gradients
  /// that do not match the masters in number or size; allocates and zeroes the state on
  /// ctx's stream.
  basic_device_optimizer(cuda_context& ctx, const std::vector<device_span<float>>& masters,
                         const std::vector<device_span<float>>& gradients, options_type o,
                         std::vector<bool> decay, const std::vector<double>& lr_by_step)
      : options_(o),
        state_(ctx, Kind::name, masters, gradients, std::move(decay),
               static_cast<int>(Kind::states.size()), table(o, lr_by_step)),
        lrs_({lr_by_step.size()}) {
    if (!lr_by_step.empty()) {
      check(cudaMemcpyAsync(lrs_.data(), lr_by_step.data(), lr_by_step.size() * sizeof(double),
                            cudaMemcpyHostToDevice, ctx.stream()),
            "cudaMemcpyAsync");
      ctx.synchronize();  // `lr_by_step` is the caller's
    }
  }
  /// The same with the options' learning rate, for `max_steps` queued steps.
  basic_device_optimizer(cuda_context& ctx, const std::vector<device_span<float>>& masters,
                         const std::vector<device_span<float>>& gradients, options_type o,
                         std::vector<bool> decay, std::uint64_t max_steps)
      : basic_device_optimizer(ctx, masters, gradients, o, std::move(decay),
                               detail::cuda::constant_lr(o.lr, max_steps)) {}

  /// One step on ctx's stream, skipped on the device when `*found_inf` (a device flag; null
  /// for none) is set. Throws precis::error, queuing nothing, when as many steps have been
  /// queued as the learning-rate table holds.
  void step_async(cuda_context& ctx, const int* found_inf = nullptr) {
    state_.reserve_step();
    if (state_.blocks() != 0) {
      Kind::launch(ctx, state_.blocks(), state_.chunks(), state_.table(),
                   state_.applied_pointer(), found_inf);
      check(cudaGetLastError(), std::string(Kind::name) + "::step_async");
    }
    state_.count(ctx, found_inf);
  }

  /// Counts a step queued other than by step_async (a replayed CUDA graph that holds one)
  /// against the learning-rate table: throws precis::error when the table is full, so that
  /// no step runs past it.
  void reserve_replay() { state_.reserve_step(); }
  /// Gives back the table place that a step_async captured into a CUDA graph took (the
  /// capture does not run it; each replay takes its own place).
  void release_capture() { state_.release_step(); }
  /// Fuses the working-copy refresh into the update: each step also writes tensor i's
  /// working copy (working[i]: its elements and type, bfloat16 or float16; null / none for a
  /// tensor without one), rounded as parameter::refresh() rounds it, and a skipped step
  /// leaves it as it leaves the master. nn::trainer on the device calls it with the model's
  /// working copies. Throws precis::error when the count is not the masters'.
  void fuse_refresh(cuda_context& ctx, const std::vector<std::pair<void*, detail::cuda::working_kind>>& working) {
    state_.set_working(ctx, working);
  }
  /// Steps that can still be queued (step_async or reserve_replay) before the table is full.
  std::uint64_t steps_left() const { return state_.remaining(); }
  /// Bytes of its per-element state in device memory (the host optimizers' state_bytes()).
  std::size_t state_bytes() const { return state_.state_bytes(); }
  /// Applied steps (AdamW's t), read back: waits for the device.
  std::uint64_t steps(cuda_context& ctx) const { return state_.applied(ctx); }
  /// Device pointer to the applied-step count, for kernels that follow the optimizer.
  const std::uint64_t* applied_steps() const { return state_.applied_pointer(); }
  /// Device pointer to the learning rates by applied step (lr_by_step; element t - 1 is
  /// applied step t's), for step records.
  const double* learning_rates() const { return lrs_.data(); }
  /// How many learning rates learning_rates() holds.
  std::size_t learning_rate_count() const { return lrs_.size(); }

  /// Takes the state and the step count of `host` (over masters of the same sizes); waits
  /// for the copies. Throws precis::error when the sizes differ or the count exceeds the
  /// table.
  void load(cuda_context& ctx, const host_type& host) {
    for (std::size_t s = 0; s < Kind::states.size(); ++s) {
      for (std::size_t i = 0; i < state_.tensors(); ++i) {
        state_.upload(ctx, static_cast<int>(s), i,
                      state_field<std::vector<float>>(host, field(s, i)));
      }
    }
    state_.set_applied(ctx, host.steps());
  }
  /// Writes the state and the step count into `host` (for precis::save_checkpoint); waits for
  /// the device. Throws precis::error, changing nothing, when `host` does not fit.
  void store(cuda_context& ctx, host_type& host) const {
    const std::uint64_t steps = state_.applied(ctx);
    std::vector<std::vector<std::vector<float>>> values(Kind::states.size());
    for (std::size_t s = 0; s < Kind::states.size(); ++s) {
      for (std::size_t i = 0; i < state_.tensors(); ++i) {
        values[s].push_back(state_.download(ctx, static_cast<int>(s), i));
      }
    }
    assign_state_fields(host, [&](auto set) {
      set("steps", steps);
      for (std::size_t s = 0; s < values.size(); ++s) {
        for (std::size_t i = 0; i < values[s].size(); ++i) set(field(s, i), values[s][i]);
      }
    });
  }
  /// The options it was made with (their lr is unused when a table was given).
  const options_type& options() const { return options_; }

 private:
  static std::string field(std::size_t state, std::size_t tensor) {
    return std::string(Kind::states[state]) + "." + std::to_string(tensor);
  }
  static std::vector<typename Kind::constants> table(options_type o, const std::vector<double>& lrs) {
    const std::string who(Kind::name);
    if (auto e = host_type::validate_options(o); !e.empty()) throw error(who + ": " + e);
    std::vector<typename Kind::constants> out;
    for (std::size_t t = 1; t <= lrs.size(); ++t) {
      o.lr = lrs[t - 1];
      if (auto e = host_type::validate_options(o); !e.empty()) {
        throw error(who + ": step " + std::to_string(t) + ": " + e);
      }
      out.push_back(Kind::make(o, t));
    }
    return out;
  }

  options_type options_;
  detail::cuda::device_optimizer_state<typename Kind::constants> state_;
  device_tensor<double, 1> lrs_;
};

/// AdamW on the device, with precis::adamw's bits (see basic_device_optimizer).
using device_adamw = basic_device_optimizer<detail::cuda::adamw_kind>;
/// SGD with momentum on the device, with precis::sgd's bits (see basic_device_optimizer).
using device_sgd = basic_device_optimizer<detail::cuda::sgd_kind>;

}  // namespace precis

#endif  // __CUDACC__
