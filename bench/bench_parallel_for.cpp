// What a kernel pays to use a second thread: an empty precis::detail::parallel_for on a
// cpu_context (whose worker threads are kept), against starting and joining a std::thread
// per call (what precis did before), in one run.
//
//   bench_parallel_for [--csv out.csv]
#include <precis/kernels/context.hpp>

#include "common.hpp"

#include <cstdio>
#include <string>
#include <thread>

int main(int argc, char** argv) {
  constexpr int calls = 20000;
  const precis::cpu_context ctx{2};
  const double pool_ms = precis_bench::best_ms(
      [&] {
        for (int i = 0; i < calls; ++i) precis::detail::parallel_for(ctx, 2, 1, [](std::size_t, std::size_t) {});
      },
      3);
  const double spawn_ms = precis_bench::best_ms(
      [&] {
        for (int i = 0; i < calls; ++i) {
          std::thread t([] {});
          t.join();
        }
      },
      3);
  precis_bench::table tab({"way", "us per call", "vs thread start"});
  char a[32], b[32];
  std::snprintf(a, sizeof a, "%.2f", pool_ms * 1000.0 / calls);
  std::snprintf(b, sizeof b, "%.3f", pool_ms / spawn_ms);
  tab.add({"cpu_context workers", a, b});
  std::snprintf(a, sizeof a, "%.2f", spawn_ms * 1000.0 / calls);
  tab.add({"std::thread per call", a, "1"});
  tab.print();
  if (const auto path = precis_bench::csv_path(argc, argv); !path.empty()) tab.write_csv(path);
}
