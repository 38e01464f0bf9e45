// The device scaling kernels against the host ones on the same random inputs: the fused
// unscale (float, bfloat16, float16; with infinities and NaN), amax, the device scale
// update against dynamic_scaler, and casts. Exits 77 (skipped) where no GPU is present.
#include <precis/kernels/cuda/scaling_kernels.hpp>
#include <precis/tensor/device_tensor.hpp>

#include "../gpu.hpp"

#include <bit>
#include <cmath>
#include <cstdint>
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
void check_unscale(precis::cuda_context& ctx, std::mt19937& g, int poison) {
  std::normal_distribution<float> d(0.0f, 3000.0f);
  std::vector<precis::host_tensor<T, 1>> host;
  // The last tensor is seen from its second element: chunks off a 16-byte boundary take
  // the one-element path (the others, whole 16-byte vectors and then their tails). The one
  // before it is seen without its last element, which must come back untouched.
  for (std::size_t n : {1u, 7u, 65536u, 70001u, 300000u, 100002u}) {
    auto t = precis::host_tensor<T, 1>::from_shape({n});
    for (auto& v : t) v = T(d(g));
    host.push_back(t);
  }
  // poison 1, 2, 3: one NaN where a whole vector, a tail, one element at a time is read.
  if (poison == 1) host[3](5) = T(NAN);
  if (poison == 2) host[3](70000) = T(NAN);
  if (poison == 3) host[5](777) = T(NAN);
  std::vector<precis::device_tensor<T, 1>> dev;
  std::vector<std::span<T>> dev_spans;
  std::vector<std::span<T>> host_spans;
  for (auto& t : host) {
    const std::size_t skip = &t == &host.back() ? 1 : 0;
    const std::size_t drop = &t == &host[4] ? 1 : 0;
    dev.push_back(precis::to_device(t));
    dev_spans.push_back(dev.back().span().subspan(skip, t.size() - skip - drop));
    host_spans.push_back(std::span<T>(t.data() + skip, t.size() - skip - drop));
  }
  const float inv = 1.0f / 1024.0f;
  const bool dev_found = precis::unscale_and_check(ctx, std::span<const std::span<T>>(dev_spans), inv);
  const bool host_found = precis::unscale_and_check(std::span<const std::span<T>>(host_spans), inv);
  expect(dev_found == host_found, "found_inf agrees");
  expect(dev_found == (poison != 0), "found_inf is right");
  for (std::size_t k = 0; k < host.size(); ++k) {
    const auto back = precis::to_host(dev[k]);
    for (std::size_t i = 0; i < back.size(); ++i) {
      const bool both_nan = std::isnan(float(back(i))) && std::isnan(float(host[k](i)));
      expect(both_nan || bits(back(i)) == bits(host[k](i)), "unscaled values agree bit for bit");
    }
  }
}

/// Device delayed scaling against the host recipe, step for step, from a recipe that has
/// already run a few steps on the host: the scaled cast's bits, then the scale, inverse
/// scale and amax history after every update (a NaN step and an all-zero step are not
/// recorded; a history longer than a block's 256 threads is reduced in full).
template <class F>
void check_delayed(precis::cuda_context& ctx, std::mt19937& g, std::uint32_t length,
                   precis::amax_algorithm algorithm, std::int32_t margin) {
  precis::delayed_scaling_options fo;
  fo.history_length = length;
  fo.algorithm = algorithm;
  fo.margin = margin;
  precis::delayed_scaling<F> host_recipe(fo);
  for (float a : {3.0f, 700.0f, 0.25f}) host_recipe.update(a);
  precis::device_delayed_scaling<F> dev_recipe(ctx, host_recipe);
  // lt_matmul takes inverse_scale() as a float8 scale pointer: it must be 16-byte aligned.
  expect(reinterpret_cast<std::uintptr_t>(dev_recipe.inverse_scale()) % 16 == 0 &&
             reinterpret_cast<std::uintptr_t>(dev_recipe.scale()) % 16 == 0,
         "the recipe's scale pointers are 16-byte aligned");
  auto xs = precis::host_tensor<precis::bfloat16, 1>::from_shape({50001});
  precis::device_tensor<F, 1> x8({xs.size()});
  for (int step = 0; step < 12; ++step) {
    const float spread = std::ldexp(1.0f, (step * 5) % 17 - 6);
    std::normal_distribution<float> dd(0.0f, spread);
    for (auto& v : xs) v = precis::bfloat16(step == 7 ? 0.0f : dd(g));
    if (step == 4) xs(123) = std::numeric_limits<precis::bfloat16>::quiet_NaN();
    const auto dxs = precis::to_device(xs);
    precis::scaled_cast_async(ctx, dxs, x8, dev_recipe.scale(), dev_recipe.amax());
    dev_recipe.update_async(ctx);
    const auto h8 = precis::to_host(x8, ctx.stream());
    float amax = 0.0f;
    bool same = true;
    for (std::size_t i = 0; i < xs.size(); ++i) {
      const float v = float(xs(i));
      amax = std::isnan(v) || std::isnan(amax) ? NAN : std::max(amax, std::fabs(v));
      same &= h8(i).bits() == precis::saturate_cast<F>(v * host_recipe.scale()).bits();
    }
    expect(same, "scaled cast gives the host's bits");
    host_recipe.update(amax);
    precis::delayed_scaling<F> back(fo);
    dev_recipe.store(ctx, back);
    expect(back.scale() == host_recipe.scale(), "device delayed scale equals the host's");
    expect(back.amax_history() == host_recipe.amax_history(), "device amax history equals the host's");
    float inv = 0.0f;
    precis::check(cudaMemcpyAsync(&inv, dev_recipe.inverse_scale(), sizeof inv, cudaMemcpyDeviceToHost,
                                  ctx.stream()),
                  "cudaMemcpyAsync");
    ctx.synchronize();
    expect(inv == host_recipe.inverse_scale(), "device inverse scale equals the host's");
  }
  precis::delayed_scaling_options other = fo;
  other.margin = margin + 1;
  precis::delayed_scaling<F> mismatched(other);
  bool threw = false;
  try {
    dev_recipe.store(ctx, mismatched);
  } catch (const precis::error&) {
    threw = true;
  }
  expect(threw, "storing into a recipe with other options is refused");
}

}  // namespace

int main() {
  if (!precis_test::have_gpu()) return precis_test::skipped;
  precis::cuda_context ctx;
  std::mt19937 g(precis_test::test_seed());
  for (int poison : {0, 1, 2, 3}) {
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
  precis::check(cudaMemsetAsync(amax.data(), 0, sizeof(float), ctx.stream()), "cudaMemsetAsync");
  precis::amax_async(ctx, std::span<const precis::bfloat16>(dx.span()), amax.data());
  expect(precis::to_host(amax, ctx.stream())(0) == host_amax, "amax equals the host max");
  // One NaN anywhere makes amax NaN (the float8 scalers then keep their scale).
  x(777777) = std::numeric_limits<precis::bfloat16>::quiet_NaN();
  dx = precis::to_device(x);
  precis::check(cudaMemsetAsync(amax.data(), 0, sizeof(float), ctx.stream()), "cudaMemsetAsync");
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
  precis::check(cudaMemcpyAsync(state.data(), &s0, sizeof s0, cudaMemcpyHostToDevice, ctx.stream()), "cudaMemcpyAsync");
  precis::device_tensor<int, 1> flag({1});
  for (int step = 0; step < 200; ++step) {
    const int inf = (step % 7 == 3 || (step > 100 && step < 140)) ? 1 : 0;
    precis::check(cudaMemcpyAsync(flag.data(), &inf, sizeof inf, cudaMemcpyHostToDevice, ctx.stream()), "cudaMemcpyAsync");
    precis::update_scale_async(ctx, state.data(), flag.data(), o);
    host_scaler.update(inf != 0);
    const auto s = precis::to_host(state, ctx.stream())(0);
    expect(s.scale == host_scaler.scale(), "device scale equals host scale");
    expect(s.growth_tracker == host_scaler.growth_tracker(), "growth trackers agree");
  }

  // The device state goes back into a host scaler (to checkpoint it) and comes from one.
  {
    precis::dynamic_scaler stored(o);
    precis::store_device_state(ctx, state.data(), stored);
    expect(stored.scale() == host_scaler.scale(), "stored scale equals the host scale");
    expect(stored.growth_tracker() == host_scaler.growth_tracker(), "stored growth tracker");
    expect(stored.hysteresis_left() == host_scaler.hysteresis_left(), "stored hysteresis");
    // Load a state that differs from the device's in every field, then read it back. Each
    // field stays in its valid range (scale within [min_scale, max_scale], growth tracker
    // below growth_interval, hysteresis from 1 to o.hysteresis), or the host scaler refuses it.
    const float other_scale =
        host_scaler.scale() == 2.0f * o.min_scale ? 4.0f * o.min_scale : 2.0f * o.min_scale;
    const std::uint32_t other_tracker = (host_scaler.growth_tracker() + 1) % o.growth_interval;
    const std::uint32_t other_hysteresis = host_scaler.hysteresis_left() == 1 ? 2 : 1;
    precis::dynamic_scaler other(o);
    precis::assign_state_fields(other, [&](auto set) {
      set("scale", other_scale);
      set("growth_tracker", other_tracker);
      set("hysteresis_left", other_hysteresis);
    });
    precis::dynamic_scaler fresh(o);
    precis::load_device_state(ctx, other, state.data());
    precis::store_device_state(ctx, state.data(), fresh);
    expect(fresh.scale() == other_scale && fresh.growth_tracker() == other_tracker &&
               fresh.hysteresis_left() == other_hysteresis,
           "load then store carries scale, growth tracker and hysteresis");
    // An inconsistent device state is refused and leaves the host scaler as it was.
    precis::device_scaler_state bad{-1.0f, 0, 1};
    precis::check(cudaMemcpyAsync(state.data(), &bad, sizeof bad, cudaMemcpyHostToDevice, ctx.stream()), "cudaMemcpyAsync");
    bool threw = false;
    try {
      precis::store_device_state(ctx, state.data(), fresh);
    } catch (const precis::error&) {
      threw = true;
    }
    expect(threw && fresh.scale() == other_scale, "a bad device state is refused");
  }

  // Float8 delayed scaling on the device against the host recipe (see check_delayed).
  check_delayed<precis::float8_e4m3>(ctx, g, 5, precis::amax_algorithm::max, 1);
  check_delayed<precis::float8_e5m2>(ctx, g, 300, precis::amax_algorithm::max, 0);
  check_delayed<precis::float8_e4m3>(ctx, g, 300, precis::amax_algorithm::most_recent, 2);

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
