// DBNet's loss and training step on the device against the host (examples/dbnet): the
// device loss on the same inputs (the value and its three terms within a float sum's bound,
// the same hard negatives, ties and NaN terms included, and at the selection's edges: no
// positives, no negatives, every negative kept, none kept; past one tile of CUB's sort; one
// loss reused across batch sizes; the gradients within their types' bounds),
// the waived float16 binarization's NaN gradients, the waived float16 sums in the host's
// index order, and a DBNet at width 8 trained
// for three steps on both sides under fp32, bf16_mixed and fp16_mixed. Exits 77 (skipped)
// where no GPU is present.
#include <precis/nn/cuda.hpp>  // first: the device kernels, then nn

#include "../../examples/dbnet/loss_cuda.hpp"
#include "../../examples/dbnet/model.hpp"
#include "device_test.hpp"

#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

namespace {

using namespace precis_test;
using namespace precis;

std::uint64_t next(std::uint64_t& s) {
  s += 0x9E3779B97F4A7C15ULL;
  std::uint64_t z = s;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}
double uniform(std::uint64_t& s) { return double(next(s) >> 11) * 0x1.0p-53; }

/// Logits, thresholds and targets on [n, 1, h, w], with text on a fraction of the pixels.
/// With `ties`, the logits take four values only, so that many negatives share a term.
template <class T>
struct batch {
  host_tensor<T, 4> x, t;
  dbnet::targets y;
};

template <class T>
batch<T> make_batch(std::size_t n, std::size_t h, std::size_t w, std::uint64_t seed, bool ties = false) {
  batch<T> b;
  const std::array<std::size_t, 4> shape{n, 1, h, w};
  b.x.resize(shape);
  b.t.resize(shape);
  for (auto* m : {&b.y.shrink, &b.y.shrink_mask, &b.y.thresh, &b.y.thresh_mask}) m->resize(shape);
  for (std::size_t i = 0; i < b.x.size(); ++i) {
    const double u = uniform(seed);
    b.x.data()[i] = T(float(ties ? std::floor(u * 4) - 1.5 : 8.0 * u - 4.0));
    b.t.data()[i] = T(float(0.2 + 0.6 * uniform(seed)));
    b.y.shrink.data()[i] = uniform(seed) < 0.1 ? 1.0F : 0.0F;
    b.y.shrink_mask.data()[i] = uniform(seed) < 0.9 ? 1.0F : 0.0F;
    b.y.thresh.data()[i] = float(0.3 + 0.4 * uniform(seed));
    b.y.thresh_mask.data()[i] = uniform(seed) < 0.5 ? 1.0F : 0.0F;
  }
  return b;
}

dbnet::device_targets upload(const dbnet::targets& t) {
  return {to_device(t.shrink), to_device(t.shrink_mask), to_device(t.thresh), to_device(t.thresh_mask)};
}

template <class LP, class BP, class T>
using device_loss = dbnet::basic_loss<LP, BP, nn::values<nn::sig<T, T, 4>, nn::sig<T, T, 4>>, cuda_context>;

// The device loss `device` (made with `o`) against a host loss on batch b.
template <class LP, class BP, class T>
void check_loss_on(cuda_context& ctx, const std::string& tag, const batch<T>& b, device_loss<LP, BP, T>& device,
                   double dloss = 1.0, bool finite = true, const dbnet::loss_options& o = {}) {
  using sig = nn::values<nn::sig<T, T, 4>, nn::sig<T, T, 4>>;
  const cpu_context cpu{2};
  dbnet::basic_loss<LP, BP, sig> host(o);
  const double want = double(host.forward(cpu, std::tuple{&b.x, &b.t}, b.y));
  const auto [hx, ht] = host.backward(cpu, dloss);
  const auto x = to_device(b.x), t = to_device(b.t);
  const auto y = upload(b.y);
  const auto& value = device.forward(ctx, std::tuple{&x, &t}, y);
  const auto [dx, dt] = device.backward(ctx, dloss);
  const double got = double(to_host(value, ctx.stream()).data()[0]);
  const auto ht_terms = host.terms(), dt_terms = device.terms(ctx);
  expect(device.kept(ctx) == host.kept(), tag + ": the same hard negatives");
  if (!finite) {
    // NaN terms are kept (as +inf, first): the BCE and the loss are NaN on both sides.
    expect(std::isnan(got) && std::isnan(want), tag + ": a NaN loss");
    return;
  }
  // A float sum of n terms in another order: within n ulps of the magnitudes summed.
  const double sum_bound = double(b.x.size()) * 0x1.0p-24;
  expect(std::abs(got - want) <= 4 * sum_bound * (std::abs(want) + 1), tag + ": the loss");
  expect(std::abs(dt_terms.bce - ht_terms.bce) <= 4 * sum_bound * (ht_terms.bce + 1), tag + ": the BCE term");
  expect(std::abs(dt_terms.dice - ht_terms.dice) <= 4 * sum_bound, tag + ": the dice term");
  expect(std::abs(dt_terms.l1 - ht_terms.l1) <= 4 * sum_bound, tag + ": the L1 term");
  expect(dt_terms.positives == ht_terms.positives && dt_terms.negatives_kept == ht_terms.negatives_kept,
         tag + ": the counts");
  // Each gradient element is the host's formula on the host's values, with the sums'
  // scalars (a float sum's bound apart) in it.
  compare(tag + " dP", ctx, *dx, *hx, 8 * bound<T>() + 4 * sum_bound);
  compare(tag + " dT", ctx, *dt, *ht, 8 * bound<T>() + 4 * sum_bound);
}
// A device loss of its own against the host's on batch b.
template <class LP, class BP, class T>
void check_loss(cuda_context& ctx, const std::string& tag, const batch<T>& b, double dloss = 1.0,
                bool finite = true, const dbnet::loss_options& o = {}) {
  device_loss<LP, BP, T> device(o);
  check_loss_on<LP, BP>(ctx, tag, b, device, dloss, finite, o);
}

// The seed's loss configuration (float16 everywhere, rule fp32_operation waived) and its edge.
using half_waived = unsafe<policy<float16, float16, float16, float, float16>, rule::fp32_operation>;
using sig16 = nn::values<nn::sig<float16, float16, 4>, nn::sig<float16, float16, 4>>;

// Under half_waived: the same overflow of B's exp on the background, and the same NaN
// gradients, as on the host.
void check_waived(cuda_context& ctx) {
  auto b = make_batch<float16>(1, 4, 4, 5);
  b.x.data()[0] = float16(-4.0F);  // P ~ 0.018, T = 0.5: -50 (P - T) = 24 > log(65504)
  b.t.data()[0] = float16(0.5F);
  b.y.shrink.data()[0] = 0.0F;
  b.y.shrink_mask.data()[0] = 1.0F;
  const cpu_context cpu{1};
  dbnet::basic_loss<half_waived, half_waived, sig16> host;
  dbnet::basic_loss<half_waived, half_waived, sig16, cuda_context> device;
  (void)host.forward(cpu, std::tuple{&b.x, &b.t}, b.y);
  const auto [hx, ht] = host.backward(cpu);
  const auto x = to_device(b.x), t = to_device(b.t);
  const auto y = upload(b.y);
  (void)device.forward(ctx, std::tuple{&x, &t}, y);
  const auto [dx, dt] = device.backward(ctx);
  expect(device.binary_map(ctx)[0] == 0.0F, "waived float16: B is 0 where exp overflowed");
  const auto gx = to_host(*dx, ctx.stream()), gt = to_host(*dt, ctx.stream());
  expect(std::isnan(float(gx.data()[0])) && std::isnan(float(gt.data()[0])), "waived float16: NaN gradients");
  std::size_t same = 0;
  for (std::size_t i = 0; i < gx.size(); ++i) {
    same += (std::isnan(float(gx.data()[i])) == std::isnan(float(hx->data()[i]))) ? 1U : 0U;
  }
  expect(same == gx.size(), "waived float16: NaN where the host has NaN");
}

// The seed's configuration sums in float16: in index order on the host, where a sum of
// terms below 1 stops growing (0.5 added to 1024 rounds back to 1024; log 2 added to 2048
// rounds back to 2048). Every pixel is a positive with logit 0 and threshold 0.5, so that
// each pixel's terms are the same values on both sides (BCE log 2, B 0.5): 8192 pixels give
// the host a BCE sum of 2048, not 5678, and B y m of 1024, not 4096. The device must give the
// host's sums, not a tree's.
void check_waived_sums(cuda_context& ctx) {
  auto b = make_batch<float16>(2, 64, 64, 9);
  for (std::size_t i = 0; i < b.x.size(); ++i) {
    b.x.data()[i] = float16(0.0F);
    b.t.data()[i] = float16(0.5F);
    b.y.shrink.data()[i] = 1.0F;
    b.y.shrink_mask.data()[i] = 1.0F;
  }
  const cpu_context cpu{1};
  dbnet::basic_loss<half_waived, half_waived, sig16> host;
  dbnet::basic_loss<half_waived, half_waived, sig16, cuda_context> device;
  const double want = double(host.forward(cpu, std::tuple{&b.x, &b.t}, b.y));
  const auto x = to_device(b.x), t = to_device(b.t);
  const auto y = upload(b.y);
  const double got = double(to_host(device.forward(ctx, std::tuple{&x, &t}, y), ctx.stream()).data()[0]);
  const auto h = host.terms(), d = device.terms(ctx);
  expect(std::abs(h.bce - 0.25) < 1e-3, "waived float16 sums: the host's BCE sum stops at 2048 (the test's premise)");
  expect(d.bce == h.bce, "waived float16 sums: the host's BCE term");
  expect(d.dice == h.dice, "waived float16 sums: the host's dice term");
  expect(d.l1 == h.l1, "waived float16 sums: the host's L1 term");
  expect(got == want, "waived float16 sums: the host's loss");
}

// A DBNet at width 8 trained three steps on each side from the same masters (SGD with
// momentum, the example's optimizer family): the same losses within the storage type's
// bounds over a deep model, the same skipped steps.
template <class P, class Scaler>
void check_step(cuda_context& ctx, const std::string& tag) {
  using S = typename P::storage_type;
  using Map = decltype(make_policy_map(P{}));
  const cpu_context cpu{2};
  const dbnet::config c{.width = 8, .inner = 16};
  auto host = nn::build<S, 4>(Map{}, dbnet::blueprint(c), {.seed = 3});
  auto dev = nn::build<S, 4, cuda_context>(Map{}, dbnet::blueprint(c), {.seed = 3});
  nn::copy_masters(ctx, host, dev);
  dbnet::loss_t<Map, decltype(host)> host_loss;
  dbnet::loss_t<Map, decltype(dev)> dev_loss;
  const sgd_options o{.lr = 0.01, .momentum = 0.9, .weight_decay = 1e-4};
  sgd host_opt(host.masters(), o, host.decay_mask());
  device_sgd dev_opt(ctx, dev.masters(), dev.gradients(), o, dev.decay_mask(), 8);
  Scaler host_scaler, dev_scaler;
  nn::trainer host_train(host, host_loss, host_opt, host_scaler, {.max_grad_norm = 5.0});
  nn::trainer dev_train(ctx, dev, dev_loss, dev_opt, dev_scaler, {.max_grad_norm = 5.0});
  std::vector<nn::step_record> want;
  std::vector<device_tensor<S, 4>> xs;
  std::vector<dbnet::device_targets> ys;
  for (std::uint64_t s = 0; s < 3; ++s) {
    const auto b = make_batch<S>(2, 64, 64, 40 + s);
    host_tensor<S, 4> images(std::array<std::size_t, 4>{2, 3, 64, 64});
    std::uint64_t seed = 90 + s;
    for (auto& v : images) v = S(float(2.0 * uniform(seed) - 1.0));
    want.push_back(host_train.step(cpu, images, b.y));
    xs.push_back(to_device(images));
    ys.push_back(upload(b.y));
    dev_train.step(ctx, xs.back(), ys.back());
  }
  const auto got = dev_train.records(ctx);
  expect(got.size() == want.size(), tag + ": one record per step");
  for (std::size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    const std::string at = tag + " step " + std::to_string(i + 1);
    expect(got[i].skipped == want[i].skipped, at + ": skipped as on the host");
    if (!want[i].skipped) {
      expect(std::abs(got[i].loss - want[i].loss) <= 64 * bound<S>() * std::abs(want[i].loss), at + ": loss");
    }
  }
}

}  // namespace

int main() {
  if (!have_gpu()) return skipped;
  cuda_context ctx;
  using f32_loss = kernel_policy_t<op::loss, presets::fp32>;
  using f32_bin = kernel_policy_t<op::exp, presets::fp32>;
  check_loss<f32_loss, f32_bin>(ctx, "fp32", make_batch<float>(2, 40, 56, 1));
  check_loss<f32_loss, f32_bin>(ctx, "fp32 with ties", make_batch<float>(2, 40, 56, 2, true), 1024.0);
  {
    auto b = make_batch<float>(1, 16, 16, 3);
    for (std::size_t i = 0; i < b.x.size(); i += 7) b.x.data()[i] = NAN;  // NaN terms: kept first
    check_loss<f32_loss, f32_bin>(ctx, "fp32 with NaN logits", b, 1.0, false);
  }
  {
    // The edges of the selection: no positives (no negative kept), every negative kept (a
    // ratio past their count), no negatives, and an empty threshold mask (no L1 term).
    auto none = make_batch<float>(1, 20, 24, 8);
    for (auto& v : none.y.shrink) v = 0.0F;
    check_loss<f32_loss, f32_bin>(ctx, "fp32 without positives", none);
    check_loss<f32_loss, f32_bin>(ctx, "fp32 keeping every negative", make_batch<float>(1, 20, 24, 9), 1.0, true,
                                  {.negative_ratio = 1e6});
    auto all = make_batch<float>(1, 20, 24, 10);
    for (auto& v : all.y.shrink) v = 1.0F;
    check_loss<f32_loss, f32_bin>(ctx, "fp32 without negatives", all);
    auto no_l1 = make_batch<float>(1, 20, 24, 11);
    for (auto& v : no_l1.y.thresh_mask) v = 0.0F;
    check_loss<f32_loss, f32_bin>(ctx, "fp32 with an empty threshold mask", no_l1);
    check_loss<f32_loss, f32_bin>(ctx, "fp32 keeping no negative", make_batch<float>(1, 20, 24, 13), 1.0, true,
                                  {.negative_ratio = 0});
  }
  {
    // Past one tile of CUB's radix sort (its multi-block passes, ties at the cut across
    // tiles), and past the launch caps of the grid-stride loops (more than 2^20 elements) and
    // of the sums' blocks (more than 2^22): 4,259,840 pixels whose logits take four values.
    check_loss<f32_loss, f32_bin>(ctx, "fp32 with ties, 4 x 1024 x 1040", make_batch<float>(4, 1024, 1040, 14, true));
    // One device loss given a batch larger than its last and then a smaller one: its buffers
    // grow and are reused, its counts start afresh.
    device_loss<f32_loss, f32_bin, float> reused;
    check_loss_on<f32_loss, f32_bin>(ctx, "fp32 reused, 1 x 20 x 24", make_batch<float>(1, 20, 24, 15), reused);
    check_loss_on<f32_loss, f32_bin>(ctx, "fp32 reused, 2 x 256 x 256 with ties",
                                     make_batch<float>(2, 256, 256, 16, true), reused);
    check_loss_on<f32_loss, f32_bin>(ctx, "fp32 reused, 1 x 40 x 56", make_batch<float>(1, 40, 56, 17), reused);
  }
  using h_loss = kernel_policy_t<op::loss, presets::fp16_mixed>;
  using h_bin = kernel_policy_t<op::exp, presets::fp16_mixed>;
  check_loss<h_loss, h_bin>(ctx, "fp16_mixed", make_batch<float16>(2, 32, 32, 4), 65536.0);
  // Random float16 logits over a million pixels: many terms equal (float16's grid), distinct
  // ones far more than the device's exp and log1p ulps apart, so the kept set is exact.
  check_loss<h_loss, h_bin>(ctx, "fp16_mixed, 4 x 512 x 512", make_batch<float16>(4, 512, 512, 12), 65536.0);
  using b_loss = kernel_policy_t<op::loss, presets::bf16_mixed>;
  using b_bin = kernel_policy_t<op::exp, presets::bf16_mixed>;
  check_loss<b_loss, b_bin>(ctx, "bf16_mixed", make_batch<bfloat16>(2, 32, 32, 6));
  check_waived(ctx);
  check_waived_sums(ctx);
  check_step<presets::fp32, no_scaling>(ctx, "dbnet step fp32");
  check_step<presets::bf16_mixed, no_scaling>(ctx, "dbnet step bf16_mixed");
  check_step<presets::fp16_mixed, dynamic_scaler>(ctx, "dbnet step fp16_mixed");
  // Targets of another shape are refused before any launch.
  {
    dbnet::basic_loss<f32_loss, f32_bin, nn::values<nn::sig<float, float, 4>, nn::sig<float, float, 4>>, cuda_context> l;
    const auto b = make_batch<float>(1, 8, 8, 7);
    const auto x = to_device(b.x), t = to_device(b.t);
    auto y = upload(make_batch<float>(1, 8, 4, 8).y);
    expect_error("loss: targets of another shape", [&] { (void)l.forward(ctx, std::tuple{&x, &t}, y); },
                 "the shrink map");
  }
  return finish();
}
