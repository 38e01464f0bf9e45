// cpu_context's worker threads: every part runs once per call, on as many threads as
// asked, whichever workers the previous call used; a kernel called from inside a part
// runs inline; an exception in a part reaches the caller after every part has finished;
// copies share the workers.
#include <precis/kernels/context.hpp>
#include <precis/kernels/cpu/gemm_kernel.hpp>

#include <doctest/doctest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using precis::cpu_context;
using precis::detail::parallel_for;

TEST_CASE("parallel_for covers [0, n) once per call, on the context's threads") {
  const cpu_context ctx{3};
  for (int round = 0; round < 200; ++round) {
    const std::size_t n = 1 + std::size_t(round) * 7;
    std::vector<std::atomic<int>> hits(n);
    std::mutex m;
    std::set<std::thread::id> ids;
    parallel_for(ctx, n, 1, [&](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i) ++hits[i];
      const std::lock_guard lock(m);
      ids.insert(std::this_thread::get_id());
    });
    for (std::size_t i = 0; i < n; ++i) REQUIRE(hits[i].load() == 1);
    CHECK(ids.size() <= std::min<std::size_t>(3, n));
    if (n >= 3) CHECK(ids.count(std::this_thread::get_id()) == 1);  // the caller takes part 0
  }
}

TEST_CASE("jobs that use some of the workers, then all of them, run each part once") {
  // More workers than cores, and calls that alternate between 2 and 4 parts: a worker with
  // no part in one job must not take part in the next one early or twice (that made the
  // caller wait forever). Run under CTest's timeout.
  const cpu_context ctx{4};
  for (int round = 0; round < 500000; ++round) {
    const std::size_t n = round % 3 == 0 ? 4 : 2;
    std::array<std::atomic<int>, 4> hits{};
    parallel_for(ctx, n, 1, [&](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i) ++hits[i];
    });
    for (std::size_t i = 0; i < 4; ++i) REQUIRE(hits[i].load() == (i < n ? 1 : 0));
  }
}

TEST_CASE("a parallel_for inside a part runs inline, with the same coverage") {
  const cpu_context ctx{2};
  std::atomic<long> total{0};
  parallel_for(ctx, 4, 1, [&](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i) {
      parallel_for(ctx, 100, 1, [&](std::size_t b2, std::size_t e2) {
        for (std::size_t j = b2; j < e2; ++j) total += long(j);
      });
    }
  });
  CHECK(total.load() == 4 * 4950);
}

TEST_CASE("an exception in a part reaches the caller after every part has run") {
  const cpu_context ctx{2};
  std::atomic<int> finished{0};
  CHECK_THROWS_AS(parallel_for(ctx, 2, 1,
                               [&](std::size_t b, std::size_t) {
                                 if (b == 0) throw std::runtime_error("part 0");
                                 std::this_thread::sleep_for(std::chrono::milliseconds(20));
                                 ++finished;
                               }),
                  std::runtime_error);
  CHECK(finished.load() == 1);
  // The pool is usable afterwards.
  std::atomic<int> parts{0};
  parallel_for(ctx, 2, 1, [&](std::size_t, std::size_t) { ++parts; });
  CHECK(parts.load() == 2);
}

TEST_CASE("an exception in a worker's part reaches the caller; the caller's own comes first") {
  const cpu_context ctx{3};
  std::atomic<int> finished{0};
  const auto throw_from = [&](std::size_t thrower) {
    return [&finished, thrower](std::size_t b, std::size_t) {
      if (b == thrower) throw std::runtime_error("part " + std::to_string(b));
      if (b == 2) throw std::logic_error("part 2");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      ++finished;
    };
  };
  // Part 1 (a worker) throws, part 2 (another worker) too: one of theirs arrives.
  CHECK_THROWS_AS(parallel_for(ctx, 3, 1, throw_from(1)), std::exception);
  CHECK(finished.load() == 1);  // part 0 ran to its end
  // Part 0 (the caller) and part 2 throw: the caller's.
  CHECK_THROWS_WITH_AS(parallel_for(ctx, 3, 1, throw_from(0)), "part 0", std::runtime_error);
  CHECK(finished.load() == 2);  // part 1 ran to its end
  std::atomic<int> parts{0};
  parallel_for(ctx, 3, 1, [&](std::size_t, std::size_t) { ++parts; });
  CHECK(parts.load() == 3);
}

TEST_CASE("copies share the workers; a copy outliving the original keeps them") {
  std::set<std::thread::id> first, second;
  std::mutex m;
  auto record = [&](std::set<std::thread::id>& ids) {
    return [&](std::size_t, std::size_t) {
      const std::lock_guard lock(m);
      ids.insert(std::this_thread::get_id());
    };
  };
  cpu_context copy;
  {
    const cpu_context ctx{2};
    parallel_for(ctx, 2, 1, record(first));
    copy = ctx;
  }
  parallel_for(copy, 2, 1, record(second));
  CHECK(first == second);
  CHECK(first.size() == 2);
}

TEST_CASE("a context's scratch buffers are reused, each held by one kernel at a time") {
  using precis::detail::float_buffer;
  using precis::detail::scratch_cache;
  const cpu_context ctx{2};
  const std::size_t big = scratch_cache::min_bytes / sizeof(float) * 4;
  const float *first = nullptr, *second = nullptr;
  {
    const float_buffer a(ctx, big);
    first = a.get();
    CHECK(reinterpret_cast<std::uintptr_t>(first) % 64 == 0);
    // Taken while `a` is held: another block.
    const float_buffer b(ctx, big);
    second = b.get();
    CHECK(second != first);
  }
  // Both are kept by the cache now, so a new allocation cannot have either address.
  const auto kept = [&](const float* p) { return p == first || p == second; };
  {
    // A smaller request and one of the same size take the two kept blocks.
    const float_buffer c(ctx, big / 2);
    const float_buffer d(ctx, big);
    CHECK(kept(c.get()));
    CHECK(kept(d.get()));
    CHECK(c.get() != d.get());
    const float_buffer e(ctx, big);  // nothing kept is free: a new block
    CHECK(!kept(e.get()));
  }
  // A copy of the context shares the cache.
  const cpu_context copy = ctx;
  {
    const float_buffer f(copy, big);
    CHECK(reinterpret_cast<std::uintptr_t>(f.get()) % 64 == 0);
  }
  {
    const float_buffer f(copy, big);
    const float_buffer g(copy, big);
    CHECK((kept(f.get()) || kept(g.get())));
  }
  scratch_cache cache;
  for (std::size_t i = 1; i <= scratch_cache::kept + 2; ++i)
    cache.give(scratch_cache::allocate(i), i);
  // The smallest two were dropped: a request for 1 float gets the smallest kept, 3.
  auto [block, size] = cache.take(1);
  CHECK(size == 3);
  CHECK(block != nullptr);
  // Concurrent kernels on copies of one context hold distinct blocks.
  std::vector<const float*> held(4);
  std::vector<std::thread> threads;
  std::atomic<int> ready{0};
  for (std::size_t t = 0; t < held.size(); ++t) {
    threads.emplace_back([&, t] {
      const float_buffer h(copy, big);
      held[t] = h.get();
      ++ready;
      while (ready.load() < int(held.size())) std::this_thread::yield();
    });
  }
  for (auto& t : threads) t.join();
  CHECK(std::set<const float*>(held.begin(), held.end()).size() == held.size());
}
