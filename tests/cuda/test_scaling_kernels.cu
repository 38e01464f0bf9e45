// The device scaling kernels against the host ones on the same random inputs: the fused
// unscale (float, bfloat16, float16; with infinities and NaN), amax, the device scale
// update against dynamic_scaler, and casts. Exits 77 (skipped) where no GPU is present.
#include <precis/kernels/cuda/scaling_kernels.hpp>
#include <precis/tensor/device_tensor.hpp>

#include "../gpu.hpp"

#include <bit>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

namespace {

int failures = 0;
void expect(bool ok, const char* what) {
  if (!ok && failures++ < 20) std::printf("FAILED: %s\n", what);
}

template <class T>
std::uint32_t bits(T v) {
  if constexpr (std::is_same_v<T, float>) {
    return std::bit_cast<std::uint32_t>(v);
  } else {
    return v.bits();
  }
}

template <class T>
void check_unscale(precis::cuda_context& ctx, std::mt19937& g, bool poison) {
  std::normal_distribution<float> d(0.0f, 3000.0f);
  std::vector<precis::host_tensor<T, 1>> host;
  for (std::size_t n : {1u, 7u, 65536u, 70001u, 300000u}) {
    auto t = precis::host_tensor<T, 1>::from_shape({n});
    for (auto& v : t) v = T(d(g));
    host.push_back(t);
  }
  if (poison) host[3](5) = T(NAN);
  std::vector<precis::device_tensor<T, 1>> dev;
  std::vector<std::span<T>> dev_spans;
  std::vector<std::span<T>> host_spans;
  for (auto& t : host) {
    dev.push_back(precis::to_device(t));
    dev_spans.push_back(dev.back().span());
    host_spans.push_back(std::span<T>(t.data(), t.size()));
  }
  const float inv = 1.0f / 1024.0f;
  const bool dev_found = precis::unscale_and_check(ctx, std::span<const std::span<T>>(dev_spans), inv);
  const bool host_found = precis::unscale_and_check(std::span<const std::span<T>>(host_spans), inv);
  expect(dev_found == host_found, "found_inf agrees");
  expect(dev_found == poison, "found_inf is right");
  for (std::size_t k = 0; k < host.size(); ++k) {
    const auto back = precis::to_host(dev[k]);
    for (std::size_t i = 0; i < back.size(); ++i) {
      const bool both_nan = std::isnan(float(back(i))) && std::isnan(float(host[k](i)));
      expect(both_nan || bits(back(i)) == bits(host[k](i)), "unscaled values agree bit for bit");
    }
  }
}

}  // namespace

int main() {
  if (!precis_test::have_gpu()) return precis_test::skipped;
  precis::cuda_context ctx;
  std::mt19937 g(std::random_device{}());
  for (bool poison : {false, true}) {
    check_unscale<float>(ctx, g, poison);
    check_unscale<precis::bfloat16>(ctx, g, poison);
    check_unscale<precis::float16>(ctx, g, poison);
  }

  // amax against the host max.
  auto x = precis::host_tensor<precis::bfloat16, 1>::from_shape({1000003});
  std::normal_distribution<float> d(0.0f, 10.0f);
  float host_amax = 0.0f;
  for (auto& v : x) {
    v = precis::bfloat16(d(g));
    host_amax = std::max(host_amax, std::fabs(float(v)));
  }
  auto dx = precis::to_device(x);
  precis::device_tensor<float, 1> amax({1});
  precis::check(cudaMemset(amax.data(), 0, sizeof(float)), "cudaMemset");
  precis::amax_async(ctx, std::span<const precis::bfloat16>(dx.span()), amax.data());
  expect(precis::to_host(amax, ctx.stream())(0) == host_amax, "amax equals the host max");
  // One NaN anywhere makes amax NaN (the float8 scalers then keep their scale).
  x(777777) = std::numeric_limits<precis::bfloat16>::quiet_NaN();
  dx = precis::to_device(x);
  precis::check(cudaMemset(amax.data(), 0, sizeof(float)), "cudaMemset");
  precis::amax_async(ctx, std::span<const precis::bfloat16>(dx.span()), amax.data());
  expect(std::isnan(precis::to_host(amax, ctx.stream())(0)), "amax of a tensor with a NaN is NaN");

  // The device scale update follows dynamic_scaler step for step.
  precis::dynamic_scaler_options o;
  o.growth_interval = 3;
  o.hysteresis = 2;
  o.min_scale = 256.0f;
  precis::dynamic_scaler host_scaler(o);
  precis::device_tensor<precis::device_scaler_state, 1> state({1});
  precis::device_scaler_state s0{o.init_scale, 0, o.hysteresis};
  precis::check(cudaMemcpy(state.data(), &s0, sizeof s0, cudaMemcpyHostToDevice), "cudaMemcpy");
  precis::device_tensor<int, 1> flag({1});
  for (int step = 0; step < 200; ++step) {
    const int inf = (step % 7 == 3 || (step > 100 && step < 140)) ? 1 : 0;
    precis::check(cudaMemcpy(flag.data(), &inf, sizeof inf, cudaMemcpyHostToDevice), "cudaMemcpy");
    precis::update_scale_async(ctx, state.data(), flag.data(), o);
    host_scaler.update(inf != 0);
    const auto s = precis::to_host(state, ctx.stream())(0);
    expect(s.scale == host_scaler.scale(), "device scale equals host scale");
    expect(s.growth_tracker == host_scaler.growth_tracker(), "growth trackers agree");
  }

  // Casts against the host conversion.
  auto f = precis::host_tensor<float, 1>::from_shape({100003});
  for (auto& v : f) v = d(g) * 100.0f;
  auto df = precis::to_device(f);
  precis::device_tensor<precis::float8_e4m3, 1> d8({f.size()});
  precis::cast(ctx, std::span<const float>(df.span()), d8.span());
  const auto h8 = precis::to_host(d8, ctx.stream());
  for (std::size_t i = 0; i < f.size(); ++i) expect(h8(i).bits() == precis::float8_e4m3(f(i)).bits(), "cast to e4m3");
  // Tensor casts with the host cast's modes give the host cast's bits.
  const precis::cpu_context cpu{1};
  auto want = precis::host_tensor<precis::float8_e5m2, 1>::from_shape({f.size()});
  precis::cast<precis::rounding::toward_zero, precis::overflow::saturate>(cpu, f, want);
  precis::device_tensor<precis::float8_e5m2, 1> d5({f.size()});
  precis::cast<precis::rounding::toward_zero, precis::overflow::saturate>(ctx, df, d5);
  const auto h5 = precis::to_host(d5, ctx.stream());
  for (std::size_t i = 0; i < f.size(); ++i) expect(h5(i).bits() == want(i).bits(), "saturating toward-zero cast to e5m2");

  std::printf("%d failures\n", failures);
  return failures == 0 ? 0 : 1;
}
