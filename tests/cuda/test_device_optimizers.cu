// precis::device_adamw and precis::device_sgd against the host optimizers: from the same
// masters and gradients, every step gives the host's bits (weights, moments, momentum, the
// step count); a step whose device found-inf flag is set changes nothing and does not
// advance the learning-rate table; store() gives a host optimizer that continues as the
// host one does; a step beyond the table throws before anything is queued.
#include <precis/optim/device_optimizers.hpp>

#include "device_test.hpp"

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

using precis::device_span;
using precis::device_tensor;
using precis_test::expect;

const std::size_t sizes[] = {1, 17, 70001, 131075};  // one chunk, one, two and three chunks
const std::vector<bool> decay = {true, false, true, true};

std::vector<float> normal(std::size_t n, float sd) {
  std::normal_distribution<float> d(0.0F, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(precis_test::rng);
  return v;
}

// Host vectors and device copies of the same masters, and device gradient buffers that the
// device optimizer keeps pointing at (a model's gradients do not move).
struct tensors {
  std::vector<std::vector<float>> host;
  std::vector<device_tensor<float, 1>> device, grads;

  explicit tensors(precis::cuda_context& ctx) {
    for (std::size_t n : sizes) {
      host.push_back(normal(n, 1.0F));
      device.emplace_back(std::array<std::size_t, 1>{n});
      grads.emplace_back(std::array<std::size_t, 1>{n});
      precis::check(cudaMemcpy(device.back().data(), host.back().data(), n * sizeof(float),
                               cudaMemcpyHostToDevice),
                    "cudaMemcpy");
    }
    ctx.synchronize();
  }
  std::vector<device_span<float>> masters() {
    std::vector<device_span<float>> out;
    for (auto& t : device) out.emplace_back(t.data(), t.size());
    return out;
  }
  std::vector<device_span<float>> gradients() {
    std::vector<device_span<float>> out;
    for (auto& t : grads) out.emplace_back(t.data(), t.size());
    return out;
  }
  std::vector<std::span<float>> host_spans() {
    return std::vector<std::span<float>>(host.begin(), host.end());
  }
  // New gradients on both sides (queued on ctx's stream before the step that reads them).
  std::vector<std::vector<float>> new_gradients(precis::cuda_context& ctx) {
    std::vector<std::vector<float>> g;
    for (std::size_t i = 0; i < grads.size(); ++i) {
      g.push_back(normal(grads[i].size(), 0.3F));
      precis::check(cudaMemcpyAsync(grads[i].data(), g.back().data(), g.back().size() * sizeof(float),
                                    cudaMemcpyHostToDevice, ctx.stream()),
                    "cudaMemcpyAsync");
    }
    ctx.synchronize();
    return g;
  }
  bool same(precis::cuda_context& ctx, const std::string& what) {
    bool ok = true;
    for (std::size_t i = 0; i < host.size(); ++i) {
      std::vector<float> back(host[i].size());
      precis::check(cudaMemcpyAsync(back.data(), device[i].data(), back.size() * sizeof(float),
                                    cudaMemcpyDeviceToHost, ctx.stream()),
                    "cudaMemcpyAsync");
      ctx.synchronize();
      const bool same_bits = std::memcmp(back.data(), host[i].data(), back.size() * sizeof(float)) == 0;
      expect(same_bits, what + ": tensor " + std::to_string(i) + " has the host's bits");
      ok = ok && same_bits;
    }
    return ok;
  }
};

void set_flag(precis::cuda_context& ctx, int* flag, int value) {
  precis::check(cudaMemcpyAsync(flag, &value, sizeof value, cudaMemcpyHostToDevice, ctx.stream()),
                "cudaMemcpyAsync");
  ctx.synchronize();
}

// Steps 1..6; step 3 is skipped (found-inf set on the device; the host optimizer is not
// stepped and its schedule does not advance).
template <class Host, class Device, class Options>
void check_optimizer(const std::string& name, precis::cuda_context& ctx, const Options& o) {
  tensors t(ctx);
  precis::warmup_cosine schedule(o.lr, 2, 8, o.lr / 10);
  Host host(t.host_spans(), o, decay);
  // Six steps can be queued: the table is indexed by applied steps, but the host, which
  // does not read the count back, budgets for every queued step.
  Device device(ctx, t.masters(), t.gradients(), o, decay, schedule.lr_table(6));
  device_tensor<int, 1> found({1});
  for (int step = 1; step <= 6; ++step) {
    const bool skip = step == 3;
    const auto g = t.new_gradients(ctx);
    set_flag(ctx, found.data(), skip ? 1 : 0);
    device.step_async(ctx, found.data());
    if (!skip) {
      host.set_lr(schedule.lr());
      std::vector<std::vector<float>> grads = g;
      host.step(grads);
    }
    schedule.advance(!skip);
    if (!t.same(ctx, name + " step " + std::to_string(step))) break;
    expect(device.steps(ctx) == host.steps(), name + ": the step count follows applied steps");
  }
  // Six steps were queued: a seventh is refused before any launch.
  precis_test::expect_error(name + ": beyond the table", [&] { device.step_async(ctx, found.data()); },
                            "table of per-step constants holds 6 steps");
  // Its state, stored into a host optimizer, is the host's own.
  Host stored(t.host_spans(), o, decay);
  stored.set_lr(host.lr());
  device.store(ctx, stored);
  expect(precis::save_state(stored) == precis::save_state(host), name + ": store() gives the host's state");
}

}  // namespace

int main() {
  if (!precis_test::have_gpu()) return precis_test::skipped;
  precis::cuda_context ctx;
  check_optimizer<precis::adamw, precis::device_adamw>(
      "adamw", ctx, precis::adamw_options{.lr = 1e-2, .weight_decay = 0.1});
  check_optimizer<precis::adamw, precis::device_adamw>(
      "adamw (beta1 0.3: the other lerp form)", ctx,
      precis::adamw_options{.lr = 3e-3, .beta1 = 0.3, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.05});
  check_optimizer<precis::sgd, precis::device_sgd>(
      "sgd (momentum, dampening)", ctx,
      precis::sgd_options{.lr = 0.05, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01});
  check_optimizer<precis::sgd, precis::device_sgd>(
      "sgd (Nesterov)", ctx, precis::sgd_options{.lr = 0.02, .momentum = 0.8, .weight_decay = 0.02, .nesterov = true});
  check_optimizer<precis::sgd, precis::device_sgd>("sgd (plain)", ctx, precis::sgd_options{.lr = 0.1});
  // Gradients that do not match the masters are refused when the optimizer is made.
  {
    tensors t(ctx);
    auto grads = t.gradients();
    grads.pop_back();
    precis_test::expect_error("gradients of another count", [&] {
      precis::device_adamw opt(ctx, t.masters(), grads, {}, decay, 4);
    }, "gradient tensors for");
  }
  return precis_test::finish();
}
