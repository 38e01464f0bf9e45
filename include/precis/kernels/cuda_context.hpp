/// @file
/// What device kernels run with: a stream, the cuBLASLt and cuDNN handles, a reusable workspace and
/// the plans made for earlier calls, all owned by one object the user holds (no globals).
#pragma once

#include <precis/config.hpp>
#include <precis/cuda_error.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <unordered_map>
#include <utility>

#if PRECIS_CUDA

namespace precis {

/// Runs kernels on one CUDA device and stream. Creating it creates a stream and the
/// library handles; destroying it synchronises the stream and releases them. Move-only.
/// Like a stream, a context is used by one host thread at a time.
class cuda_context {
 public:
  /// pool_keep's default: the device's pool keeps all the memory freed into it.
  static constexpr std::uint64_t keep_all = ~std::uint64_t(0);

  /// A context on `device` with its own non-blocking stream. Stream-ordered allocations
  /// (scratch of reductions, losses and statistics; device tensors made with a stream) come
  /// from the device's current memory pool, which by default hands its freed memory back to
  /// the driver at every synchronisation, so that a step after one (a timed step, a step
  /// whose records were read) maps its scratch anew. The context raises that pool's release
  /// threshold (cudaMemPoolAttrReleaseThreshold) to `pool_keep` bytes where it is lower:
  /// freed memory up to that amount stays in the pool for the next allocation, as a caching
  /// allocator keeps it. The pool is the device's, shared with the rest of the process; pass
  /// 0 to leave it as it is (cudaMemPoolTrimTo still returns memory on request). precis's own
  /// cudaMalloc calls (device tensors made without a stream, convolution plans, the NCCL
  /// reducer's scratch) trim the pool and try again when the device is out of memory.
  explicit cuda_context(int device = 0, std::uint64_t pool_keep = keep_all) : device_(device), id_(next_id()) {
    check(cudaSetDevice(device), "cudaSetDevice");
    if (pool_keep > 0) keep_freed_memory(device, pool_keep);
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    try {
      check(cublasLtCreate(&blas_), "cublasLtCreate");
      check(cudnnCreate(&dnn_), "cudnnCreate");
      check(cudnnSetStream(dnn_, stream_), "cudnnSetStream");
    } catch (...) {
      release();
      throw;
    }
  }
  /// Takes over `o`'s stream, handles, workspace and plans; `o` is left empty.
  cuda_context(cuda_context&& o) noexcept { swap(o); }
  /// Releases this context's resources (after draining its stream), then takes over `o`'s;
  /// `o` is left empty.
  cuda_context& operator=(cuda_context&& o) noexcept {
    if (this != &o) {
      release();
      swap(o);
    }
    return *this;
  }
  cuda_context(const cuda_context&) = delete;
  cuda_context& operator=(const cuda_context&) = delete;
  ~cuda_context() { release(); }

  /// The CUDA device it runs on.
  int device() const { return device_; }
  /// A number no other context of the process has had (0 for one moved from): what objects
  /// outside the context key their cached plans on, where a handle's address may come back
  /// for a context made after this one is gone.
  std::uint64_t id() const { return id_; }
  /// Its stream, on which every kernel and library call of the context is queued.
  cudaStream_t stream() const { return stream_; }
  /// Its cuBLASLt handle.
  cublasLtHandle_t blas_lt() const { return blas_; }
  /// Its cuDNN handle, bound to stream().
  cudnnHandle_t dnn() const { return dnn_; }

  /// Whether the stream is being captured into a CUDA graph (an invalidated capture counts):
  /// what must not allocate, wait or build plans then asks.
  bool capturing() const {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    check(cudaStreamIsCapturing(stream_, &status), "cudaStreamIsCapturing");
    return status != cudaStreamCaptureStatusNone;
  }

  /// conv_workspace_limit's default: no limit, cuDNN's first fitting algorithm whatever its
  /// workspace.
  static constexpr std::size_t no_workspace_limit = ~std::size_t(0);
  /// The most workspace, in bytes, a convolution's algorithm may ask for: an algorithm of
  /// cuDNN's ranked list that needs more is passed over for the next (implicit-GEMM ones need
  /// little or none). Read when a convolution's plan is made; plans are kept per limit, so a
  /// changed limit applies to every call after it. The choice depends on the shape, the
  /// device and this limit alone, never on the memory free at the time, so that a run gives
  /// the same bits every time.
  std::size_t conv_workspace_limit() const { return conv_workspace_limit_; }
  /// Sets conv_workspace_limit() (no_workspace_limit: none). A convolution for which no
  /// algorithm fits then throws precis::error naming the limit.
  void set_conv_workspace_limit(std::size_t bytes) { conv_workspace_limit_ = bytes; }
  /// The bytes the shared workspace holds now (0 before the first request): the largest any
  /// call has asked for (cuBLASLt's products, convolutions, fused attention, the multi-tensor
  /// kernels' chunk tables).
  std::size_t workspace_size() const { return workspace_bytes_; }

  /// The workspace's current address (null before the first request): a CUDA graph that
  /// captured work using it is stale once this changes (the old one was freed).
  const void* workspace_address() const { return workspace_; }
  /// A device workspace of at least `bytes`, kept and grown across calls (stream-ordered).
  /// Throws precis::error where it would grow while the stream is captured into a CUDA graph:
  /// the graph would own the new workspace and free the old one, and the context would keep
  /// an address valid only inside the graph (run the work once before capturing it).
  void* workspace(std::size_t bytes) {
    if (bytes > workspace_bytes_) {
      if (capturing()) {
        throw error("precis::cuda_context::workspace: " + std::to_string(bytes) + " bytes, more than the " +
                    std::to_string(workspace_bytes_) +
                    " it holds, asked for while its stream is captured into a CUDA graph; run the work once "
                    "before capturing it");
      }
      if (workspace_) check(cudaFreeAsync(workspace_, stream_), "cudaFreeAsync");
      workspace_ = nullptr;
      workspace_bytes_ = 0;
      check(cudaMallocAsync(&workspace_, bytes, stream_), "cudaMallocAsync");
      workspace_bytes_ = bytes;
    }
    return workspace_;
  }

  /// The plan of type Plan made for `key`: made by `make()` (returning a Plan) on the first
  /// call with that key and kept until the context goes, so that library descriptors and
  /// algorithm searches are paid once per shape rather than once per call. Key is a
  /// trivially copyable value without padding (compared byte for byte).
  template <class Plan, class Key, class Make>
  Plan& plan(const Key& key, Make&& make) {
    static_assert(std::has_unique_object_representations_v<Key>,
                  "precis: a plan key is compared byte for byte: use an array of integers");
    std::string k(typeid(Plan).name());
    k.append(reinterpret_cast<const char*>(&key), sizeof key);
    auto it = plans_.find(k);
    if (it == plans_.end()) {
      std::shared_ptr<void> made = std::make_shared<Plan>(make());
      it = plans_.emplace(std::move(k), std::move(made)).first;
    }
    return *static_cast<Plan*>(it->second.get());
  }

  /// How many plans the context keeps.
  std::size_t plan_count() const { return plans_.size(); }

  /// Waits for everything queued on the stream.
  void synchronize() const { check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

 private:
  static void keep_freed_memory(int device, std::uint64_t bytes) {
    cudaMemPool_t pool = nullptr;
    check(cudaDeviceGetMemPool(&pool, device), "cudaDeviceGetMemPool");
    std::uint64_t kept = 0;
    check(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &kept),
          "cudaMemPoolGetAttribute(ReleaseThreshold)");
    if (kept < bytes) {
      check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &bytes),
            "cudaMemPoolSetAttribute(ReleaseThreshold)");
    }
  }
  void swap(cuda_context& o) noexcept {
    std::swap(device_, o.device_);
    std::swap(id_, o.id_);
    std::swap(stream_, o.stream_);
    std::swap(blas_, o.blas_);
    std::swap(dnn_, o.dnn_);
    std::swap(workspace_, o.workspace_);
    std::swap(workspace_bytes_, o.workspace_bytes_);
    std::swap(conv_workspace_limit_, o.conv_workspace_limit_);
    std::swap(plans_, o.plans_);
  }
  static std::uint64_t next_id() {
    static std::atomic<std::uint64_t> last{0};
    return last.fetch_add(1, std::memory_order_relaxed) + 1;
  }
  // Destruction cannot throw: statuses are ignored here, the stream is drained first.
  void release() noexcept {
    if (stream_) (void)cudaStreamSynchronize(stream_);
    plans_.clear();  // descriptors go before the handles
    if (workspace_) (void)cudaFree(workspace_);
    if (dnn_) (void)cudnnDestroy(dnn_);
    if (blas_) (void)cublasLtDestroy(blas_);
    if (stream_) (void)cudaStreamDestroy(stream_);
    workspace_ = nullptr;
    dnn_ = nullptr;
    blas_ = nullptr;
    stream_ = nullptr;
    workspace_bytes_ = 0;
  }

  int device_ = 0;
  std::uint64_t id_ = 0;
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t blas_ = nullptr;
  cudnnHandle_t dnn_ = nullptr;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 0;
  std::size_t conv_workspace_limit_ = no_workspace_limit;
  std::unordered_map<std::string, std::shared_ptr<void>> plans_;
};

}  // namespace precis

#endif
