/// @file
/// The execution context a kernel runs in. Its type selects the backend at compile time
/// (cpu_context here; cuda_context in the CUDA backend), and it owns what the backend needs
/// (threads; streams and library handles on the GPU).
#pragma once

#include <precis/config.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace precis {

namespace detail {

/// Worker threads that run the parts of one job at a time: part 0 on the calling thread,
/// part p on worker p - 1 (parts beyond the workers on the caller, after its own). Started
/// once and kept, so a kernel pays a wake-up rather than a thread start per call.
class thread_pool {
 public:
  explicit thread_pool(unsigned workers) : posted_(new posted_count[workers]) {
    threads_.reserve(workers);
    for (unsigned w = 0; w < workers; ++w) threads_.emplace_back([this, w] { work(w); });
  }
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;
  ~thread_pool() {
    {
      const std::lock_guard lock(m_);
      stop_.store(true, std::memory_order_release);
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }

  /// Runs job(p) for every p in [0, parts) and returns when all are done; false, having run
  /// nothing, when the pool is already running a job (a kernel called from inside a part).
  /// An exception from any part is rethrown here once every part has finished (the
  /// caller's own first, else the first a worker threw).
  bool try_run(std::size_t parts, const std::function<void(std::size_t)>& job) {
    std::unique_lock busy(busy_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    const std::size_t on_workers = std::min<std::size_t>(parts > 0 ? parts - 1 : 0, threads_.size());
    job_ = &job;
    pending_.store(on_workers, std::memory_order_relaxed);
    {
      // Under m_: a worker about to sleep sees its post. Only the workers with a part are
      // posted to; the others never look at job_, so none can read a later job's fields
      // while taking part in an earlier one.
      const std::lock_guard lock(m_);
      for (std::size_t w = 0; w < on_workers; ++w) {
        posted_[w].count.fetch_add(1, std::memory_order_release);
      }
    }
    if (on_workers > 0) wake_.notify_all();
    std::exception_ptr failure;
    try {
      job(0);
      for (std::size_t p = on_workers + 1; p < parts; ++p) job(p);
    } catch (...) {
      failure = std::current_exception();  // the workers still use `job`: wait for them first
    }
    if (!spin_until([this] { return pending_.load(std::memory_order_acquire) == 0; })) {
      std::unique_lock lock(m_);
      done_.wait(lock, [this] { return pending_.load(std::memory_order_acquire) == 0; });
    }
    job_ = nullptr;
    std::exception_ptr from_worker = std::exchange(worker_failure_, nullptr);
    if (!failure) failure = std::move(from_worker);  // the caller's own comes first
    if (failure) std::rethrow_exception(failure);
    return true;
  }

 private:
  // Waits a little by polling (a wake-up through the kernel costs tens of microseconds,
  // as much as a small kernel); true when `ready` became true meanwhile.
  template <class Ready>
  static bool spin_until(Ready ready) {
    for (int i = 0; i < 1000; ++i) {
      if (ready()) return true;
      std::this_thread::yield();
    }
    return ready();
  }

  // Worker w runs part w + 1 of each job posted to it. A job is posted to it only after
  // the previous job has finished (the caller waits for pending_ == 0), so its count moves
  // by one at a time and job_ stays the posted job's until this worker has run its part.
  void work(std::size_t w) {
    std::atomic<std::uint64_t>& count = posted_[w].count;
    std::uint64_t seen = 0;
    for (;;) {
      const auto posted = [&] {
        return stop_.load(std::memory_order_acquire) ||
               count.load(std::memory_order_acquire) != seen;
      };
      if (!spin_until(posted)) {
        std::unique_lock lock(m_);
        wake_.wait(lock, posted);
      }
      if (stop_.load(std::memory_order_acquire)) return;
      seen = count.load(std::memory_order_acquire);
      try {
        (*job_)(w + 1);
      } catch (...) {
        const std::lock_guard lock(m_);
        if (!worker_failure_) worker_failure_ = std::current_exception();
      }
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        const std::lock_guard lock(m_);
        done_.notify_one();
      }
    }
  }

  std::mutex busy_;  // held by the caller of the job in progress
  std::mutex m_;     // with the condition variables, for threads that stopped polling
  std::condition_variable wake_, done_;
  // Jobs posted to each worker, on its own cache line.
  struct alignas(64) posted_count {
    std::atomic<std::uint64_t> count{0};
  };
  std::unique_ptr<posted_count[]> posted_;
  const std::function<void(std::size_t)>* job_ = nullptr;  // written before the posts
  std::atomic<std::size_t> pending_{0};
  std::exception_ptr worker_failure_;  // the first exception a worker's part threw (under m_)
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

/// The pool of a cpu_context and its copies, started on first use.
struct pool_slot {
  std::once_flag started;
  std::unique_ptr<thread_pool> pool;
};

/// What the oneDNN engine keeps for a context (engine, streams, primitives cached per
/// shape, scratch memory). Defined by precis/kernels/cpu/onednn.hpp, which only
/// precis::onednn builds include; incomplete here, so the core needs nothing of oneDNN.
struct onednn_state;

/// The engine state of a cpu_context and its copies, made on first use.
struct engine_slot {
  std::once_flag started;
  std::shared_ptr<onednn_state> onednn;
};

/// Large float buffers a context keeps between kernels (the convolutions' column matrices,
/// converted operands, packed panels), so that a training step after the first allocates
/// none of them and touches no fresh pages. A buffer is taken for the length of one kernel
/// and given back when it ends; several kernels, or a kernel and one called from inside
/// it, each take their own. At most `kept` buffers are kept, the largest ones.
class scratch_cache {
 public:
  static constexpr std::size_t kept = 6;
  /// Buffers below this many bytes come from the allocator each time (it reuses them).
  static constexpr std::size_t min_bytes = std::size_t(1) << 20;

  struct free_aligned {
    void operator()(float* q) const { ::operator delete[](q, std::align_val_t(64)); }
  };
  using block = std::unique_ptr<float[], free_aligned>;

  /// A 64-byte aligned block of at least n floats, and its size: the smallest kept one
  /// that holds n, else a new one.
  std::pair<block, std::size_t> take(std::size_t n) {
    {
      const std::lock_guard lock(m_);
      std::size_t best = free_.size();
      for (std::size_t i = 0; i < free_.size(); ++i) {
        if (free_[i].second >= n &&
            (best == free_.size() || free_[i].second < free_[best].second)) {
          best = i;
        }
      }
      if (best != free_.size()) {
        auto found = std::move(free_[best]);
        free_.erase(free_.begin() + std::ptrdiff_t(best));
        return found;
      }
    }
    return {allocate(n), n};
  }

  /// Keeps a block taken from here (dropping the smallest kept one when full).
  void give(block b, std::size_t n) {
    const std::lock_guard lock(m_);
    free_.emplace_back(std::move(b), n);
    if (free_.size() > kept) {
      const auto smallest =
          std::min_element(free_.begin(), free_.end(),
                           [](const auto& a, const auto& c) { return a.second < c.second; });
      free_.erase(smallest);
    }
  }

  static block allocate(std::size_t n) {
    return block(static_cast<float*>(
        ::operator new[](std::max<std::size_t>(n, 1) * sizeof(float), std::align_val_t(64))));
  }

 private:
  std::mutex m_;
  std::vector<std::pair<block, std::size_t>> free_;
};

}  // namespace detail

/// Runs kernels on the host. `threads` is how many threads a kernel may use (0: all the
/// hardware offers). Results do not depend on it: work is split so that every output
/// element is computed by the same sequence of operations whatever the thread count.
///
/// A context with more than one thread starts its worker threads on the first kernel that
/// uses them and keeps them until the context and all its copies are gone (copies share
/// them). A kernel called from inside another kernel's part runs its own parts one after
/// another on the calling thread, with the same results.
struct cpu_context {
  /// How many threads a kernel may use (0: all the hardware offers).
  unsigned threads = 0;
  /// The worker threads, shared by copies and started on first use (see above).
  std::shared_ptr<detail::pool_slot> workers = std::make_shared<detail::pool_slot>();
  /// State of the engines behind hardware products (oneDNN's primitives, cached per
  /// shape, and their scratch memory), shared by copies and made on first use. A context
  /// runs one kernel at a time: kernels called concurrently from several threads on one
  /// context (or its copies) are serialised where they share this state.
  std::shared_ptr<detail::engine_slot> engines = std::make_shared<detail::engine_slot>();
  /// Scratch buffers kept between kernels, shared by copies (see detail::scratch_cache).
  std::shared_ptr<detail::scratch_cache> scratch = std::make_shared<detail::scratch_cache>();

  /// The thread count kernels use.
  unsigned thread_count() const {
    if (threads != 0) return threads;
    const unsigned hw = std::thread::hardware_concurrency();
    return hw == 0 ? 1U : hw;
  }
};

namespace detail {

/// Calls f(begin, end) on `ctx.thread_count()` threads over disjoint contiguous parts of
/// [0, n), the calling thread taking the first part. Parts below `min_per_thread` items are
/// not worth a thread.
template <class F>
void parallel_for(const cpu_context& ctx, std::size_t n, std::size_t min_per_thread, F&& f) {
  const std::size_t by_size = std::max<std::size_t>(1, n / std::max<std::size_t>(1, min_per_thread));
  const std::size_t parts = std::min<std::size_t>(ctx.thread_count(), by_size);
  if (parts <= 1) {
    f(std::size_t(0), n);
    return;
  }
  const std::size_t chunk = (n + parts - 1) / parts;
  const std::function<void(std::size_t)> part = [&f, n, chunk](std::size_t p) {
    const std::size_t b = std::min(n, p * chunk), e = std::min(n, b + chunk);
    if (b < e) f(b, e);
  };
  pool_slot* slot = ctx.workers.get();
  if (slot != nullptr) {
    std::call_once(slot->started, [&] { slot->pool = std::make_unique<thread_pool>(ctx.thread_count() - 1); });
    if (slot->pool->try_run(parts, part)) return;
  }
  for (std::size_t p = 0; p < parts; ++p) part(p);
}

}  // namespace detail

}  // namespace precis
