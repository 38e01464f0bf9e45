// nn::trainer: a step under each preset lowers the loss, accumulation equals one batch,
// clipping sees unscaled gradients, non-finite steps change nothing, and a run resumed
// from a checkpoint continues bit-identically.
#include <precis/nn/shape.hpp>
#include <precis/precis.hpp>

#include <doctest/doctest.h>

#include "model_helpers.hpp"
#include "random.hpp"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

#include <xtensor/xview.hpp>

using namespace precis;

namespace {

const cpu_context ctx{2};

// A fixed batch: four Gaussian blobs in 16 dimensions.
template <class T>
struct batch {
  host_tensor<T, 2> x;
  host_tensor<std::int32_t, 1> t;
};

template <class T>
batch<T> make_batch(std::size_t rows, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  batch<T> b{host_tensor<T, 2>(std::array<std::size_t, 2>{rows, 16}),
             host_tensor<std::int32_t, 1>(std::array<std::size_t, 1>{rows})};
  for (std::size_t r = 0; r < rows; ++r) {
    const auto c = std::int32_t(r % 4);
    b.t(r) = c;
    for (std::size_t k = 0; k < 16; ++k) {
      b.x(r, k) = T(n(g) * 0.5f + (k % 4 == std::size_t(c) ? 1.5f : 0.0f));
    }
  }
  return b;
}

template <class P>
auto small_model(std::uint64_t seed) {
  return nn::build<typename P::storage_type, 2>(P{}, nn::seq(nn::linear(16, 32), nn::gelu(), nn::linear(32, 4)),
                                                {.seed = seed});
}
template <class T>
using batch_of = nn::micro_batch<host_tensor<T, 2>, host_tensor<std::int32_t, 1>>;

using precis_test::masters_of;

}  // namespace

TEST_CASE_TEMPLATE("one step under each preset lowers the loss on a fixed batch", P, presets::fp32, presets::tf32,
                   presets::bf16_mixed, presets::fp16_mixed) {
  using S = typename P::storage_type;
  auto model = small_model<P>(3);
  nn::softmax_cross_entropy<P> loss;
  sgd opt(model.masters(), {.lr = 0.2f});
  scaler_for<P> scaler;
  nn::trainer tr(model, loss, opt, scaler);
  const auto b = make_batch<S>(64, 9);
  const double before = nn::evaluate(ctx, model, loss, b.x, b.t).loss;
  nn::step_record r;
  int attempts = 0;
  do {
    r = tr.step(ctx, b.x, b.t);
    ++attempts;
  } while (r.skipped && attempts < 20);  // a float16 scaler may back off from 2^16 first
  REQUIRE_FALSE(r.skipped);
  CHECK(r.loss == doctest::Approx(before).epsilon(0.02));
  const double after = nn::evaluate(ctx, model, loss, b.x, b.t).loss;
  CHECK(after < before - 0.01);
  CHECK(std::isfinite(r.grad_norm));
  CHECK(r.grad_norm > 0.0);
}

TEST_CASE("two micro-batches give the step one batch of both gives") {
  using P = presets::fp32;
  auto a = small_model<P>(5), b = small_model<P>(5);
  nn::softmax_cross_entropy<P> la, lb;
  sgd oa(a.masters(), {.lr = 0.5f}), ob(b.masters(), {.lr = 0.5f});
  no_scaling sa, sb;
  nn::trainer ta(a, la, oa, sa), tb(b, lb, ob, sb);
  const auto whole = make_batch<float>(64, 2);
  batch<float> h1{xt::view(whole.x, xt::range(0, 32), xt::all()), xt::view(whole.t, xt::range(0, 32))};
  batch<float> h2{xt::view(whole.x, xt::range(32, 64), xt::all()), xt::view(whole.t, xt::range(32, 64))};
  const auto ra = ta.step(ctx, whole.x, whole.t);
  const std::array<batch_of<float>, 2> parts{{{h1.x, h1.t}, {h2.x, h2.t}}};
  const auto rb = tb.step(ctx, parts);
  CHECK(rb.loss == doctest::Approx(ra.loss).epsilon(1e-6));
  CHECK(rb.grad_norm == doctest::Approx(ra.grad_norm).epsilon(1e-5));
  const auto wa = masters_of(a), wb = masters_of(b);
  for (std::size_t i = 0; i < wa.size(); ++i) CHECK(wb[i] == doctest::Approx(wa[i]).epsilon(1e-5));
}

TEST_CASE(
    "a micro-batch the model or the loss refuses changes nothing: the step checks them all first") {
  using P = presets::fp32;
  auto m = small_model<P>(5);
  nn::softmax_cross_entropy<P> loss;
  sgd opt(m.masters(), {.lr = 0.5f});
  no_scaling scaler;
  nn::trainer tr(m, loss, opt, scaler);
  const auto good = make_batch<float>(32, 2);
  (void)tr.step(ctx, good.x, good.t);
  std::vector<float> grads;
  m.for_each_parameter([&](const std::string&, const auto& p) {
    grads.insert(grads.end(), p.grad().begin(), p.grad().end());
  });
  const auto masters = masters_of(m);
  // The second micro-batch has 15 features where the first layer takes 16.
  const host_tensor<float, 2> narrow(std::array<std::size_t, 2>{32, 15});
  const std::array<batch_of<float>, 2> parts{{{good.x, good.t}, {narrow, good.t}}};
  CHECK_THROWS_AS(tr.step(ctx, parts), error);
  // And a second micro-batch with fewer targets than rows.
  const host_tensor<std::int32_t, 1> few(std::array<std::size_t, 1>{31});
  const std::array<batch_of<float>, 2> short_targets{{{good.x, good.t}, {good.x, few}}};
  CHECK_THROWS_WITH_AS(tr.step(ctx, short_targets),
                       "precis::nn::trainer::step: 31 targets for a batch of 32", error);
  std::vector<float> after;
  m.for_each_parameter([&](const std::string&, const auto& p) {
    after.insert(after.end(), p.grad().begin(), p.grad().end());
  });
  CHECK(std::memcmp(after.data(), grads.data(), grads.size() * sizeof(float)) ==
        0);  // not zeroed, not added to
  CHECK(masters_of(m) == masters);
}

TEST_CASE("clipping acts on unscaled gradients; the record has the norm before clipping") {
  // The same model under float16 with a static scale of 1024 and under float without one:
  // the norms agree to float16's precision, so the float16 norm was taken after unscaling.
  auto h = small_model<presets::fp16_mixed>(8);
  auto f = small_model<presets::fp32>(8);
  nn::softmax_cross_entropy<presets::fp16_mixed> lh;
  nn::softmax_cross_entropy<presets::fp32> lf;
  const float lr = 1.0f, max_norm = 1e-3f;
  sgd oh(h.masters(), {.lr = lr}), of(f.masters(), {.lr = lr});
  static_scaler sh(1024.0f);
  no_scaling sf;
  nn::trainer th(h, lh, oh, sh, {.max_grad_norm = max_norm});
  nn::trainer tf(f, lf, of, sf);
  const auto bh = make_batch<float16>(64, 4);
  const auto bf = make_batch<float>(64, 4);
  const auto before = masters_of(h);
  const auto rh = th.step(ctx, bh.x, bh.t);
  const auto rf = tf.step(ctx, bf.x, bf.t);
  REQUIRE_FALSE(rh.skipped);
  CHECK(rh.scale == 1024.0f);
  CHECK(rh.grad_norm == doctest::Approx(rf.grad_norm).epsilon(0.01));
  CHECK(rh.grad_norm > 10 * max_norm);
  // SGD with lr 1 moved the weights by exactly the clipped gradient.
  const auto after = masters_of(h);
  double moved = 0.0;
  for (std::size_t i = 0; i < after.size(); ++i) moved += double(after[i] - before[i]) * double(after[i] - before[i]);
  CHECK(std::sqrt(moved) == doctest::Approx(max_norm).epsilon(1e-3));
}

TEST_CASE("the host trainer refuses bad options: a negative or NaN clipping norm, CUDA graphs") {
  auto m = small_model<presets::fp32>(8);
  nn::softmax_cross_entropy<presets::fp32> loss;
  sgd opt(m.masters(), {.lr = 0.1});
  no_scaling scaler;
  CHECK_THROWS_WITH_AS(nn::trainer(m, loss, opt, scaler, {.max_grad_norm = -1.0}),
                       doctest::Contains("max_grad_norm must be >= 0"), error);
  CHECK_THROWS_WITH_AS(nn::trainer(m, loss, opt, scaler, {.max_grad_norm = std::nan("")}),
                       doctest::Contains("max_grad_norm must be >= 0"), error);
  CHECK_THROWS_WITH_AS(nn::trainer(m, loss, opt, scaler, {.graph = true}),
                       doctest::Contains("a host trainer has none"), error);
}

TEST_CASE("a step with non-finite gradients changes no weight, optimizer state or schedule") {
  using P = presets::fp16_mixed;
  auto model = small_model<P>(1);
  nn::softmax_cross_entropy<P> loss;
  adamw opt(model.masters());
  static_scaler scaler(1e9f);  // float16 gradients overflow at this scale
  warmup_cosine schedule(1e-3f, 2, 10);
  nn::trainer tr(model, loss, opt, scaler, schedule);
  const auto b = make_batch<float16>(32, 3);
  const auto before = masters_of(model);
  const auto r = tr.step(ctx, b.x, b.t);
  CHECK(r.skipped);
  CHECK_FALSE(std::isfinite(r.grad_norm));
  CHECK(masters_of(model) == before);
  CHECK(opt.steps() == 0);
  CHECK(schedule.step() == 0);
  CHECK(scaler.skipped_steps() == 1);
}

namespace {

using resume_policy = presets::fp16_mixed;

auto resume_model(std::uint64_t seed) {
  return nn::build<float16, 2>(resume_policy{},
                               nn::seq(nn::linear(16, 32), nn::batch_norm(32), nn::gelu(), nn::dropout(0.2),
                                       nn::linear(32, 4)),
                               {.seed = seed});
}
using resume_model_t = decltype(resume_model(0));

struct run {
  resume_model_t model;
  nn::softmax_cross_entropy<resume_policy> loss;
  adamw opt;
  dynamic_scaler scaler;
  warmup_cosine schedule;
  explicit run(std::uint64_t seed)
      : model(resume_model(seed)),
        opt(model.masters(), {.lr = 1e-2f}),
        scaler({.init_scale = 1e6f, .growth_interval = 2}),  // backs off, then grows: state that matters
        schedule(1e-2f, 3, 12) {}
  std::vector<nn::step_record> train(std::size_t from, std::size_t to) {
    nn::trainer tr(model, loss, opt, scaler, schedule);
    std::vector<nn::step_record> out;
    for (std::size_t s = from; s < to; ++s) {
      const auto b1 = make_batch<float16>(32, 100 + 2 * s), b2 = make_batch<float16>(32, 101 + 2 * s);
      const std::array<batch_of<float16>, 2> parts{{{b1.x, b1.t}, {b2.x, b2.t}}};
      out.push_back(tr.step(ctx, parts));
    }
    return out;
  }
};

}  // namespace

TEST_CASE("a run resumed from a checkpoint continues bit-identically") {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("precis_resume_" + std::to_string(precis_test::rng()()));
  std::filesystem::create_directories(dir);
  const auto file = dir / "ckpt.bin";

  run straight(42);
  const auto all = straight.train(0, 10);

  run first(42);
  first.train(0, 5);
  save_checkpoint(file, first.model, first.opt, first.scaler, first.schedule);

  run resumed(1234);  // other initial weights and dropout seeds: the checkpoint must restore them
  load_checkpoint(file, resumed.model, resumed.opt, resumed.scaler, resumed.schedule);
  const auto rest = resumed.train(5, 10);

  bool some_skipped = false;
  for (std::size_t i = 0; i < 5; ++i) {
    INFO("step " << i + 5);
    CHECK(rest[i].step == all[i + 5].step);
    CHECK(std::memcmp(&rest[i].loss, &all[i + 5].loss, sizeof(double)) == 0);
    CHECK(rest[i].scale == all[i + 5].scale);
    CHECK(rest[i].skipped == all[i + 5].skipped);
    CHECK(rest[i].lr == all[i + 5].lr);
  }
  for (const auto& r : all) some_skipped |= r.skipped;
  CHECK(some_skipped);  // the scaler's back-off was part of the run
  const auto a = masters_of(straight.model), b = masters_of(resumed.model);
  REQUIRE(a.size() == b.size());
  CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
  CHECK(straight.model.root().child<1>().running_mean() == resumed.model.root().child<1>().running_mean());
  CHECK(straight.model.root().child<1>().running_var() == resumed.model.root().child<1>().running_var());
  CHECK(straight.model.root().child<3>().calls() == resumed.model.root().child<3>().calls());

  // A truncated checkpoint is refused and leaves everything as it was.
  {
    std::ifstream in(file, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), std::streamsize(bytes.size() / 2));
  }
  const auto kept = masters_of(resumed.model);
  CHECK_THROWS_WITH_AS(load_checkpoint(file, resumed.model, resumed.opt, resumed.scaler, resumed.schedule),
                       doctest::Contains("truncated or corrupted"), error);
  CHECK(masters_of(resumed.model) == kept);
  std::filesystem::remove_all(dir);
}

namespace {
struct encoder_fc : layer<op::matmul> {
  static constexpr std::string_view name = "encoder_fc";
};
struct decoder_fc : layer<op::matmul> {
  static constexpr std::string_view name = "decoder_fc";
};
}  // namespace

TEST_CASE("a checkpoint of another model (other shapes, other names) is refused; nothing changes") {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("precis_shape_" + std::to_string(precis_test::rng()()));
  std::filesystem::create_directories(dir);
  const auto file = dir / "ckpt.bin";
  using P = presets::fp32;
  auto small = nn::build<float, 2>(P{}, nn::seq(nn::linear<encoder_fc>(4, 3)), {.seed = 1});
  auto large = nn::build<float, 2>(P{}, nn::seq(nn::linear<encoder_fc>(4, 5)), {.seed = 1});
  auto renamed = nn::build<float, 2>(P{}, nn::seq(nn::linear<decoder_fc>(4, 3)), {.seed = 1});
  save_checkpoint(file, small);
  const auto kept = masters_of(large);
  CHECK_THROWS_WITH_AS(load_checkpoint(file, large),
                       doctest::Contains("encoder_fc.weight has 12 values, the model has 20"), error);
  CHECK(masters_of(large) == kept);
  const auto kept_renamed = masters_of(renamed);
  CHECK_THROWS_WITH_AS(load_checkpoint(file, renamed), doctest::Contains("decoder_fc.weight"), error);
  CHECK(masters_of(renamed) == kept_renamed);
  // The same model loads, and the parameters are named by their paths.
  auto same = nn::build<float, 2>(P{}, nn::seq(nn::linear<encoder_fc>(4, 3)), {.seed = 9});
  load_checkpoint(file, same);
  CHECK(masters_of(same) == masters_of(small));
  CHECK(same.parameter_names() == std::vector<std::string>{"encoder_fc.weight", "encoder_fc.bias"});
  std::filesystem::remove_all(dir);
}
