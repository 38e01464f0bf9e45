// What the GPU step benchmarks (bench_vit_gpu, bench_dbnet_gpu) share: the device memory in
// use, the stream-ordered pool (which a cuda_context keeps) trimmed so that a map's figure
// counts its own high-water mark, the median of synchronised steps, and the table of rows
// they print and write as each is timed.
// CUDA code only.
#pragma once

#include <precis/kernels/cuda_context.hpp>

#include <nvtx3/nvToolsExt.h>

#include "../../examples/common.hpp"
#include "../../examples/device.hpp"
#include "../../examples/report.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace bench {

/// Device memory in use, MiB (cudaMemGetInfo: everything this process and others hold).
inline double used_mib() {
  std::size_t free = 0, total = 0;
  precis::check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return double(total - free) / double(1 << 20);
}

/// Gives back what the device's stream-ordered pool keeps (every cuda_context has it keep
/// its freed memory, so that its peak stays counted in used_mib()): call before a map, so
/// that its figure is its own.
inline void trim_pool() {
  cudaMemPool_t pool = nullptr;
  precis::check(cudaDeviceGetDefaultMemPool(&pool, 0), "cudaDeviceGetDefaultMemPool");
  precis::check(cudaMemPoolTrimTo(pool, 0), "cudaMemPoolTrimTo");
}

/// A step's times, each the median over the timed steps: the synchronised wall time (`ms`),
/// the host's time to queue the step (step() returning, before the wait: where it is close
/// to `ms`, the host's launches, not the device, set the pace), and the device's time from
/// the step's first queued work to its last (events on the context's stream).
struct step_times {
  double ms = 0, enqueue_ms = 0, gpu_ms = 0;
};

/// The times of `steps` calls of step(), each waited for (ctx synchronised), after `warmup`
/// untimed ones. Each timed step is an NVTX range named "precis_step" (what
/// bench/cuda/profile_on_gpu.sh gives Nsight Compute to profile; nothing without a tool).
template <class Step>
step_times median_step(precis::cuda_context& ctx, Step&& step, std::size_t warmup, std::size_t steps) {
  for (std::size_t i = 0; i < warmup; ++i) step();
  ctx.synchronize();
  examples::stream_timer timer;
  std::vector<double> wall, enqueue, gpu;
  for (std::size_t i = 0; i < steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    nvtxRangePushA("precis_step");
    timer.start(ctx.stream());
    step();
    timer.stop(ctx.stream());
    nvtxRangePop();
    const auto t1 = std::chrono::steady_clock::now();
    ctx.synchronize();
    const auto t2 = std::chrono::steady_clock::now();
    wall.push_back(std::chrono::duration<double, std::milli>(t2 - t0).count());
    enqueue.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    gpu.push_back(timer.elapsed_ms());
  }
  const auto median = [](std::vector<double>& v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  return {median(wall), median(enqueue), median(gpu)};
}

/// One configuration under one map: its step times and the memory it held.
struct row {
  std::string config, policy;
  step_times t;
  double mib = 0;
  double workspace_mib = 0;  ///< the context's shared workspace at the end (cuda_context::workspace_size)
};

/// The rows a run has timed. With a file name, each row is written as it is timed
/// (config,policy,precis_ms,precis_peak_mib,precis_enqueue_ms,precis_gpu_ms,precis_workspace_mib,gpu; the file
/// rewritten whole, atomically), so that a row that throws, or a run stopped by its time
/// limit, keeps every row timed before it.
class table {
 public:
  explicit table(std::string csv) : csv_(std::move(csv)), gpu_(examples::csv_field(examples::gpu_name())) {}

  /// Times one row: f() gives it. An exception is printed with the row's config and policy
  /// and counted (failures()), and the run goes on with the next row. Throws precis::error
  /// when the file cannot be written.
  template <class F>
  void add(const std::string& config, const std::string& policy, F&& f) {
    try {
      rows_.push_back(f());
    } catch (const std::exception& ex) {
      std::fprintf(stderr, "%s %s: %s\n", config.c_str(), policy.c_str(), ex.what());
      ++failures_;
      return;
    }
    const row& r = rows_.back();
    std::printf("%-22s %-17s %9.3f ms/step %8.0f MiB (queue %.3f ms, device %.3f ms, workspace %.0f MiB)\n",
                r.config.c_str(), r.policy.c_str(), r.t.ms, r.mib, r.t.enqueue_ms, r.t.gpu_ms, r.workspace_mib);
    std::fflush(stdout);
    if (csv_.empty()) return;
    std::ostringstream out;
    out << "config,policy,precis_ms,precis_peak_mib,precis_enqueue_ms,precis_gpu_ms,precis_workspace_mib,gpu\n";
    for (const auto& w : rows_) {
      out << w.config << "," << w.policy << "," << w.t.ms << "," << w.mib << "," << w.t.enqueue_ms << ","
        << w.t.gpu_ms << "," << w.workspace_mib << "," << gpu_ << "\n";
    }
    examples::write_file(csv_, out.str());
  }
  /// Whether no row was timed or attempted.
  bool empty() const { return rows_.empty() && failures_ == 0; }
  /// Rows that threw.
  std::size_t failures() const { return failures_; }
  /// Prints every row timed.
  void print() const {
    std::printf("%-22s %-17s %12s %12s %12s %12s %14s\n", "config", "policy", "ms/step", "memory MiB", "queue ms",
                "device ms", "workspace MiB");
    for (const auto& r : rows_) {
      std::printf("%-22s %-17s %12.3f %12.0f %12.3f %12.3f %14.0f\n", r.config.c_str(), r.policy.c_str(), r.t.ms,
                  r.mib, r.t.enqueue_ms, r.t.gpu_ms, r.workspace_mib);
    }
  }

 private:
  std::string csv_, gpu_;
  std::vector<row> rows_;
  std::size_t failures_ = 0;
};

/// The configurations and rows a run times: --config names one configuration, --policy a
/// comma-separated list of row names (a map's name, with `_graph` or `_nhwc` where the row
/// has them); empty: all.
struct selection {
  std::string config_name;
  std::vector<std::string> policies;
  bool config(std::string_view name) const { return config_name.empty() || config_name == name; }
  bool policy(std::string_view name) const {
    return policies.empty() || std::find(policies.begin(), policies.end(), name) != policies.end();
  }
};

/// Reads --steps, --warmup, --config, --policy and --csv; false on anything else (print the
/// usage).
inline bool parse(int argc, char** argv, std::size_t& steps, std::size_t& warmup, selection& want, std::string& csv) {
  if (argc % 2 == 0) return false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    char* end = nullptr;
    if (a == "--steps" || a == "--warmup") {
      const unsigned long v = std::strtoul(argv[i + 1], &end, 10);
      if (*end != '\0') return false;
      (a == "--steps" ? steps : warmup) = v;
    } else if (a == "--config") {
      want.config_name = argv[i + 1];
    } else if (a == "--policy") {
      std::stringstream list(argv[i + 1]);
      for (std::string p; std::getline(list, p, ',');) {
        if (!p.empty()) want.policies.push_back(p);
      }
    } else if (a == "--csv") {
      csv = argv[i + 1];
    } else {
      return false;
    }
  }
  return steps > 0;
}

/// Whether a device is present (prints "skipped" when not).
inline bool have_device() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("skipped: no CUDA device\n");
    return false;
  }
  return true;
}

/// A step benchmark's main: reads the options, exits 77 without a device, prints the GPU,
/// calls add(rows, want, warmup, steps) to time the configurations and rows `want` (a
/// selection) names into `rows` (a table: rows.add(config, policy, f) for each), and prints
/// them. Returns the exit status: 2 when --config and --policy name nothing, 1 when a row
/// threw (the others timed and written all the same), else 0.
template <class Add>
int run(int argc, char** argv, const char* program, Add&& add) {
  std::size_t steps = 20, warmup = 5;
  selection want;
  std::string csv;
  if (!parse(argc, argv, steps, warmup, want, csv)) {
    std::fprintf(stderr, "usage: %s [--steps N] [--warmup N] [--config NAME] [--policy NAME,...] [--csv FILE]\n",
                 argv[0]);
    return 2;
  }
  if (!have_device()) return 77;
  std::printf("GPU: %s; %zu warm-up and %zu timed steps per map\n", examples::gpu_name().c_str(), warmup, steps);
  try {
    table rows(csv);
    add(rows, want, warmup, steps);
    if (rows.empty()) {
      std::fprintf(stderr, "%s: --config and --policy name no configuration and row it times\n", program);
      return 2;
    }
    rows.print();
    if (rows.failures() != 0) {
      std::fprintf(stderr, "%s: %zu row(s) failed\n", program, rows.failures());
      return 1;
    }
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "%s: %s\n", program, ex.what());
    return 1;
  }
  return 0;
}

}  // namespace bench
