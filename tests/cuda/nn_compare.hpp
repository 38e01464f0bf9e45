// What the device nn tests share: a model built from one blueprint on the host and on the
// device (cuda_context) with the same masters, run forward and backward on the same input,
// and the device's output, input gradient and parameter gradients compared with the host's.
// Include after <precis/nn/cuda.hpp>.
#pragma once

#include "device_test.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace precis_test {

/// Layer tags of the device nn tests' small models.
struct fc1 : precis::layer<precis::op::matmul> {
  static constexpr std::string_view name = "fc1";
};
/// @copydoc fc1
struct fc2 : precis::layer<precis::op::matmul> {
  static constexpr std::string_view name = "fc2";
};

/// Each device parameter gradient against the host's: max |device - host| <= limit * max
/// |host| (a value that is not finite on either side, or another size, fails).
template <class Host, class Device>
void compare_gradients(const std::string& tag, precis::cuda_context& ctx, Host& host, Device& device,
                       double limit) {
  std::map<std::string, std::vector<float>> host_grads;
  host.for_each_parameter([&](const std::string& path, const auto& p) {
    host_grads[path] = std::vector<float>(p.grad().begin(), p.grad().end());
  });
  device.for_each_parameter([&](const std::string& path, const auto& p) {
    const auto got = precis::to_host(p.grad(), ctx.stream());
    const auto& want = host_grads.at(path);
    double err = got.size() == want.size() ? 0 : HUGE_VAL, norm = 0;
    for (std::size_t i = 0; i < want.size() && i < got.size(); ++i) {
      const double a = double(got.data()[i]), b = double(want[i]);
      if (!std::isfinite(a) || !std::isfinite(b)) {  // NaN must not pass, on either side
        err = HUGE_VAL;
        break;
      }
      err = std::max(err, std::abs(a - b));
      norm = std::max(norm, std::abs(b));
    }
    expect(err <= limit * norm, tag + " gradient of " + path);
  });
}

/// compare_models' default `prepare`: the masters as the seed draws them.
struct no_prepare {
  template <class Model>
  void operator()(Model&) const {}
};

/// Builds `blueprint` under P on both sides (input rank R), copies the masters, and
/// compares one forward and backward pass on random data (the input of shape x_shape, the
/// output gradient of the model's output shape), within `factor` times the storage
/// (output) and gradient types' bounds. Both models are built in image layout `layout`
/// (x_shape is given in it). `prepare(host)` may set the host model's masters first (they
/// are copied to the device after it).
template <class P, std::size_t R, class Blueprint, class Prepare = no_prepare>
void compare_models(precis::cuda_context& ctx, const std::string& tag, const Blueprint& blueprint,
                    const std::array<std::size_t, R>& x_shape, double factor = 4,
                    precis::image_layout layout = precis::image_layout::nchw, Prepare prepare = {}) {
  using S = typename P::storage_type;
  using G = typename P::gradient_type;
  const precis::cpu_context cpu{2};
  auto host = precis::nn::build<S, R>(P{}, blueprint, {.seed = 7, .layout = layout});
  auto device = precis::nn::build<S, R, precis::cuda_context>(P{}, blueprint, {.seed = 7, .layout = layout});
  prepare(host);
  precis::nn::copy_masters(ctx, host, device);
  device.zero_grad(ctx);
  host.zero_grad();
  const auto x = random_tensor<S, R>(x_shape);
  const auto y_shape = host.output_shape(x_shape);
  const auto dy = random_tensor<G, std::tuple_size_v<decltype(y_shape)>>(y_shape, 0.1F);
  const auto xd = to_device(x);
  const auto dyd = to_device(dy);
  compare(tag + " forward", ctx, device.forward(ctx, xd), host.forward(cpu, x), factor * bound<S>());
  compare(tag + " input gradient", ctx, device.backward(ctx, dyd), host.backward(cpu, dy), factor * bound<G>());
  compare_gradients(tag, ctx, host, device, factor * bound<G>());
}

}  // namespace precis_test
