/// @file
/// The data-parallel reducer for models on the device, over NCCL. Link precis::nccl (precis::cuda +
/// NCCL). The same interface as precis::mpi_reducer (precis/distributed/mpi.hpp): a precis::reducer
/// for the scalers and float8 recipes, plus the gradient average (`average`), here on device
/// gradients; nn::trainer steps host models only, so a device training loop calls it itself.
///
///     ncclComm_t comm;  // made by the caller (ncclCommInitRank with an id from rank 0)
///     precis::nccl_reducer reducer(comm, ctx);     // ctx: the model's cuda_context
///     precis::basic_dynamic_scaler<precis::nccl_reducer> scaler({}, reducer);
///
/// Everything runs on the context's stream; `any` and `max` wait for their results (they
/// decide on the host whether to step and with which scales). The gradients travel as float
/// and are averaged by NCCL (ncclAvg), one ncclAllReduce per tensor inside one NCCL group
/// (NCCL fuses them). Every NCCL and CUDA call is checked: a failure throws
/// precis::cuda_error naming the call and NCCL's or CUDA's message.
///
/// Compiled and linked in precis's CUDA build; run only where GPUs are present.
#pragma once

#include <precis/config.hpp>
#include <precis/cuda_error.hpp>
#include <precis/kernels/cuda_context.hpp>
#include <precis/scaling/reducer.hpp>
#include <precis/tensor/device_span.hpp>
#include <precis/tensor/device_tensor.hpp>

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

namespace precis {

/// Checks an NCCL status: `check(ncclAllReduce(...), "ncclAllReduce")`.
inline void check(ncclResult_t status, std::string_view call,
                  const source_location& where = source_location::current()) {
  if (status != ncclSuccess) {
    throw cuda_error(call, static_cast<int>(status), ncclGetErrorString(status), where);
  }
}

/// The reducer of a data-parallel run over an NCCL communicator, on `ctx`'s stream (both
/// the caller's, and both must outlive it).
class nccl_reducer {
 public:
  /// A reducer over `comm` on `ctx`'s stream; allocates a small device scratch buffer for
  /// the host values of any() and max(). Throws precis::error when `comm` is null and
  /// precis::cuda_error when an NCCL or CUDA call fails.
  nccl_reducer(ncclComm_t comm, cuda_context& ctx) : comm_(comm), ctx_(&ctx) {
    if (comm == nullptr) throw error("precis::nccl_reducer: the communicator is null");
    check(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
    check(ncclCommCount(comm_, &size_), "ncclCommCount");
    auto* p = static_cast<float*>(detail::device_malloc(scratch_floats * sizeof(float)));
    scratch_ = std::shared_ptr<float>(p, [](float* q) { cudaFree(q); });
  }

  /// This process's rank in the communicator.
  int rank() const { return rank_; }
  /// The number of processes in the communicator.
  int size() const { return size_; }

  /// Logical OR of the flag over the processes (a max over 0/1 on the device).
  bool any(bool local_found_inf) const {
    float v = local_found_inf ? 1.0f : 0.0f;
    reduce_host(std::span<float>(&v, 1), ncclMax);
    return v != 0.0f;
  }

  /// Elementwise maximum over the processes of host values, in place (the float8 recipes'
  /// amaxes), through the device in chunks of the reducer's scratch buffer.
  void max(std::span<float> values) const { reduce_host(values, ncclMax); }

  /// Replaces every device gradient (as a device model's gradients() gives them) by its mean
  /// over the processes.
  void average(std::vector<device_span<float>>& device_grads) {
    check(ncclGroupStart(), "ncclGroupStart");
    for (auto span : device_grads) {
      if (span.empty()) continue;
      const ncclResult_t r = ncclAllReduce(span.data(), span.data(), span.size(), ncclFloat,
                                           ncclAvg, comm_, ctx_->stream());
      if (r != ncclSuccess) {
        (void)ncclGroupEnd();
        check(r, "ncclAllReduce");
      }
      bytes_ += span.size() * sizeof(float);
    }
    check(ncclGroupEnd(), "ncclGroupEnd");
  }

  /// Gradient bytes this process has handed to the all-reduce so far.
  std::uint64_t gradient_bytes() const { return bytes_; }

 private:
  static constexpr std::size_t scratch_floats = 4096;

  void reduce_host(std::span<float> values, ncclRedOp_t op) const {
    const cudaStream_t s = ctx_->stream();
    for (std::size_t done = 0; done < values.size(); done += scratch_floats) {
      const std::size_t n = std::min(scratch_floats, values.size() - done);
      check(cudaMemcpyAsync(scratch_.get(), values.data() + done, n * sizeof(float),
                            cudaMemcpyHostToDevice, s),
            "cudaMemcpyAsync");
      check(ncclAllReduce(scratch_.get(), scratch_.get(), n, ncclFloat, op, comm_, s),
            "ncclAllReduce");
      check(cudaMemcpyAsync(values.data() + done, scratch_.get(), n * sizeof(float),
                            cudaMemcpyDeviceToHost, s),
            "cudaMemcpyAsync");
      check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    }
  }

  ncclComm_t comm_;
  cuda_context* ctx_;
  int rank_ = 0, size_ = 1;
  std::shared_ptr<float> scratch_;
  std::uint64_t bytes_ = 0;
};

static_assert(reducer<nccl_reducer>);

}  // namespace precis
