// The fused unscale + non-finite check over many gradient tensors (float, bfloat16,
// float16 storage), against a memcpy of the same bytes, in one run.
//
//   bench_unscale [--csv out.csv] [--n elements] [--tensors count]
#include <precis/kernels/unscale.hpp>

#include "common.hpp"

#include <cstdio>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace {

using namespace precis_bench;

template <class T>
void run(const char* name, std::size_t n, std::size_t tensors, table& t) {
  std::mt19937 g(7);
  std::normal_distribution<float> normal(0.0f, 1000.0f);
  std::vector<T> data(n), copy(n);
  for (auto& v : data) v = T(normal(g));
  std::vector<std::span<T>> parts;
  const std::size_t per = n / tensors;
  for (std::size_t i = 0; i < tensors; ++i) {
    parts.emplace_back(data.data() + i * per, i + 1 == tensors ? n - i * per : per);
  }
  const std::size_t bytes = n * sizeof(T);
  const double copy_ms = best_ms([&] { std::memcpy(copy.data(), data.data(), bytes); });
  bool found = false;
  // Alternate 1/2 and 2 so the values neither drift nor change format range.
  float inv = 0.5f;
  const double unscale_ms = best_ms([&] {
    found |= precis::unscale_and_check(std::span<const std::span<T>>(parts), inv);
    inv = inv == 0.5f ? 2.0f : 0.5f;
  });
  if (found) {
    std::printf("error: unexpected non-finite values\n");
    std::exit(1);
  }
  // memcpy reads and writes `bytes`; the in-place unscale reads and writes `bytes` too.
  const double gbs = 2.0 * double(bytes) / 1e6 / unscale_ms;
  t.add({name, std::to_string(tensors), fixed(double(bytes) / (1 << 20), 0), fixed(unscale_ms),
         fixed(copy_ms), fixed(gbs, 1), fixed(copy_ms / unscale_ms)});
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t n = std::size_t(1) << 24, tensors = 64;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--n") n = std::stoul(argv[i + 1]);
    if (std::string(argv[i]) == "--tensors") tensors = std::stoul(argv[i + 1]);
  }
  table t({"gradients", "tensors", "MiB", "unscale ms", "memcpy ms", "unscale GB/s",
           "fraction of memcpy bandwidth"});
  run<float>("float", n, tensors, t);
  run<precis::bfloat16>("bfloat16", n, tensors, t);
  run<precis::float16>("float16", n, tensors, t);
  t.print();
  if (auto path = csv_path(argc, argv); !path.empty()) t.write_csv(path);
}
