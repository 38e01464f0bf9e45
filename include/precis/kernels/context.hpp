// precis/kernels/context.hpp: the execution context a kernel runs in. Its type selects
// the backend at compile time (cpu_context here; cuda_context in the CUDA backend), and
// it owns what the backend needs (threads; streams and library handles on the GPU).
#pragma once

#include <precis/config.hpp>

#include <algorithm>
#include <cstddef>
#include <thread>
#include <vector>

namespace precis {

/// Runs kernels on the host. `threads` is how many threads a kernel may use (0: all the
/// hardware offers). Results do not depend on it: work is split so that every output
/// element is computed by the same sequence of operations whatever the thread count.
struct cpu_context {
  unsigned threads = 0;

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
  std::vector<std::thread> workers;
  workers.reserve(parts - 1);
  const std::size_t chunk = (n + parts - 1) / parts;
  for (std::size_t p = 1; p < parts; ++p) {
    const std::size_t b = std::min(n, p * chunk), e = std::min(n, b + chunk);
    if (b < e) workers.emplace_back([&f, b, e] { f(b, e); });
  }
  f(std::size_t(0), std::min(n, chunk));
  for (auto& w : workers) w.join();
}

}  // namespace detail

}  // namespace precis
