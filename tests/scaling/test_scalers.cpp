// Loss scalers: scale trajectories against PyTorch's update rule, skipped steps, bounds,
// hysteresis, the reducer hook, observability.
#include <precis/policy/presets.hpp>
#include <precis/scaling/scaling.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

using precis::dynamic_scaler;
using precis::dynamic_scaler_options;

// PyTorch's _amp_update_scale_ rule (torch/csrc, GradScaler), transcribed on its own:
// on inf: scale *= backoff, tracker = 0; else tracker += 1 and, at growth_interval, the
// scale grows if the product is finite, and the tracker resets either way. The scale is a
// float, the factors doubles: `float *= double` multiplies in double and rounds once.
struct torch_reference {
  float scale;
  int tracker = 0;
  double growth, backoff;
  int interval;
  void update(bool inf) {
    if (inf) {
      scale = static_cast<float>(scale * backoff);
      tracker = 0;
    } else {
      const int successful = tracker + 1;
      if (successful == interval) {
        const float grown = static_cast<float>(scale * growth);
        if (std::isfinite(grown)) scale = grown;
        tracker = 0;
      } else {
        tracker = successful;
      }
    }
  }
};

struct counting_optimizer {
  int steps = 0;
  void step(std::vector<float>&) { ++steps; }
};

// One training step whose gradients are finite or not (their values do not matter to
// the scale update, only their finiteness).
precis::step_result run_step(auto& scaler, counting_optimizer& opt, bool inf) {
  std::vector<float> g{1.0f, -2.0f, inf ? INFINITY : 3.0f};
  return scaler.step(opt, scaler.scaled_gradients(std::move(g)));
}

dynamic_scaler_options torch_like() {
  dynamic_scaler_options o;
  o.min_scale = std::numeric_limits<float>::denorm_min();  // PyTorch has no bounds
  return o;
}

}  // namespace

TEST_CASE("the dynamic scaler follows PyTorch's rule on scripted sequences") {
  struct script {
    const char* what;
    dynamic_scaler_options options;
    std::vector<bool> infs;
  };
  std::vector<script> scripts;
  {
    auto o = torch_like();
    o.growth_interval = 3;
    scripts.push_back({"growth at exactly the interval", o,
                       {false, false, false, false, false, false, false, true, false, false, false}});
  }
  {
    auto o = torch_like();
    scripts.push_back({"defaults: 2000 clean steps, then a backoff", o, std::vector<bool>(2001, false)});
    scripts.back().infs.push_back(true);
    for (int i = 0; i < 2500; ++i) scripts.back().infs.push_back(i % 700 == 0);
  }
  {
    auto o = torch_like();
    o.init_scale = 0x1p127f;  // growing would overflow to infinity: the guard keeps it
    o.growth_interval = 2;
    scripts.push_back({"finite-growth guard near FLT_MAX", o, {false, false, false, false, true, false, false}});
  }
  {
    auto o = torch_like();
    scripts.push_back({"repeated backoff", o, std::vector<bool>(40, true)});
  }
  for (const auto& s : scripts) {
    INFO(std::string(s.what));
    dynamic_scaler scaler(s.options);
    torch_reference ref{s.options.init_scale, 0, s.options.growth_factor, s.options.backoff_factor,
                        int(s.options.growth_interval)};
    counting_optimizer opt;
    int applied = 0;
    for (std::size_t i = 0; i < s.infs.size(); ++i) {
      const auto r = run_step(scaler, opt, s.infs[i]);
      ref.update(s.infs[i]);
      REQUIRE(r.scale_after == ref.scale);
      REQUIRE(scaler.growth_tracker() == std::uint32_t(ref.tracker));
      REQUIRE(r.applied == !s.infs[i]);
      REQUIRE(r.found_inf == s.infs[i]);
      applied += r.applied;
    }
    CHECK(opt.steps == applied);
    CHECK(scaler.skipped_steps() == s.infs.size() - std::size_t(applied));
  }
}

TEST_CASE("growth happens after exactly growth_interval clean steps") {
  dynamic_scaler_options o;
  o.growth_interval = 2000;
  dynamic_scaler s(o);
  counting_optimizer opt;
  for (int i = 0; i < 1999; ++i) CHECK(run_step(s, opt, false).scale_after == 65536.0f);
  CHECK(run_step(s, opt, false).scale_after == 131072.0f);
  CHECK(s.growth_tracker() == 0);
}

TEST_CASE("hysteresis backs off only after that many consecutive non-finite steps") {
  dynamic_scaler_options o;
  o.hysteresis = 3;
  dynamic_scaler s(o);
  counting_optimizer opt;
  CHECK(run_step(s, opt, true).scale_after == 65536.0f);
  CHECK(run_step(s, opt, true).scale_after == 65536.0f);
  CHECK(run_step(s, opt, true).scale_after == 32768.0f);  // third in a row
  CHECK(s.hysteresis_left() == 3);
  // A clean step resets the count.
  CHECK(run_step(s, opt, true).scale_after == 32768.0f);
  CHECK(run_step(s, opt, false).scale_after == 32768.0f);
  CHECK(run_step(s, opt, true).scale_after == 32768.0f);
  CHECK(run_step(s, opt, true).scale_after == 32768.0f);
  CHECK(run_step(s, opt, true).scale_after == 16384.0f);
  CHECK(opt.steps == 1);
  CHECK(s.skipped_steps() == 7);
}

TEST_CASE("the scale stays within [min_scale, max_scale]") {
  dynamic_scaler_options o;
  o.init_scale = 8.0f;
  o.min_scale = 2.0f;
  o.max_scale = 16.0f;
  o.growth_interval = 1;
  dynamic_scaler s(o);
  counting_optimizer opt;
  CHECK(run_step(s, opt, false).scale_after == 16.0f);
  CHECK(run_step(s, opt, false).scale_after == 16.0f);  // clamped at max
  CHECK(run_step(s, opt, true).scale_after == 8.0f);
  CHECK(run_step(s, opt, true).scale_after == 4.0f);
  auto r = run_step(s, opt, true);
  CHECK(r.scale_after == 2.0f);
  CHECK(!r.at_minimum_scale);  // it could still back off on that step
  // At the minimum it keeps skipping and says so, without aborting.
  for (int i = 0; i < 5; ++i) {
    r = run_step(s, opt, true);
    CHECK(r.scale_after == 2.0f);
    CHECK(r.at_minimum_scale);
    CHECK(!r.applied);
  }
  CHECK(s.steps_at_minimum() == 5);
}

TEST_CASE("at the minimum scale, throw_error aborts loudly after the configured skips") {
  dynamic_scaler_options o;
  o.init_scale = 1.0f;
  o.min_scale = 1.0f;
  o.at_minimum = precis::at_minimum_scale::throw_error;
  o.max_skips_at_minimum = 3;
  dynamic_scaler s(o);
  counting_optimizer opt;
  run_step(s, opt, true);
  run_step(s, opt, true);
  CHECK_THROWS_WITH_AS(run_step(s, opt, true), doctest::Contains("consecutive steps had non-finite"),
                       precis::error);
}

TEST_CASE("bad options are rejected") {
  dynamic_scaler_options o;
  o.backoff_factor = 1.5f;
  CHECK_THROWS_AS(dynamic_scaler{o}, precis::error);
  o = {};
  o.growth_interval = 0;
  CHECK_THROWS_AS(dynamic_scaler{o}, precis::error);
  o = {};
  o.init_scale = INFINITY;
  CHECK_THROWS_AS(dynamic_scaler{o}, precis::error);
  CHECK_THROWS_AS(precis::static_scaler(-1.0f), precis::error);
}

TEST_CASE("static and no scaling skip non-finite steps and keep their scale") {
  precis::static_scaler st(1024.0f);
  precis::no_scaling none;
  counting_optimizer opt;
  CHECK(run_step(st, opt, true).scale_after == 1024.0f);
  CHECK(run_step(st, opt, false).applied);
  CHECK(!run_step(none, opt, true).applied);
  CHECK(run_step(none, opt, false).scale_after == 1.0f);
  CHECK(opt.steps == 2);
}

namespace {
// Two processes in one: the "other" process found an infinity this step.
struct fake_two_process_reducer {
  bool other_found_inf = false;
  float other_amax = 0.0f;
  int calls = 0;
  bool any(bool local) {
    ++calls;
    return local || other_found_inf;
  }
  void max(std::span<float> values) {
    for (auto& v : values) v = std::max(v, other_amax);
  }
};
}  // namespace

TEST_CASE("found-inf flags are reduced across processes") {
  precis::basic_dynamic_scaler<fake_two_process_reducer> s;
  counting_optimizer opt;
  s.reducer_object().other_found_inf = true;
  auto r = run_step(s, opt, false);  // finite here, infinite elsewhere
  CHECK(r.found_inf);
  CHECK(!r.applied);
  CHECK(r.scale_after == 32768.0f);
  CHECK(opt.steps == 0);
  s.reducer_object().other_found_inf = false;
  CHECK(run_step(s, opt, false).applied);
  CHECK(s.reducer_object().calls == 2);
}

TEST_CASE("scale history and sink") {
  dynamic_scaler_options o;
  o.growth_interval = 2;
  dynamic_scaler s(o);
  counting_optimizer opt;
  struct sink {
    std::vector<precis::step_result> seen;
    void on_step(const precis::step_result& r) { seen.push_back(r); }
  } log;
  for (bool inf : {false, false, true, false}) {
    std::vector<float> g{inf ? NAN : 1.0f};
    s.step(opt, precis::unscale(s.scaled_gradients(std::move(g))), log);
  }
  REQUIRE(s.scale_history().size() == 2);
  CHECK(s.scale_history()[0].step == 1);
  CHECK(s.scale_history()[0].scale == 131072.0f);
  CHECK(s.scale_history()[1].step == 2);
  CHECK(s.scale_history()[1].scale == 65536.0f);
  REQUIRE(log.seen.size() == 4);
  CHECK(!log.seen[2].applied);
  CHECK(log.seen[2].scale_before == 131072.0f);
}

// scaler_for follows the policy's gradient type; check_scaler accepts the right pairs.
static_assert(std::is_same_v<precis::scaler_for<precis::presets::fp16_mixed>, dynamic_scaler>);
static_assert(std::is_same_v<precis::scaler_for<precis::presets::fp8_hybrid>, dynamic_scaler>);
static_assert(std::is_same_v<precis::scaler_for<precis::presets::bf16_mixed>, precis::no_scaling>);
static_assert(std::is_same_v<precis::scaler_for<precis::presets::fp32>, precis::no_scaling>);
static_assert(precis::check_scaler<precis::presets::fp16_mixed, dynamic_scaler>());
static_assert(precis::check_scaler<precis::presets::bf16_mixed, precis::no_scaling>());
static_assert(precis::check_scaler<
              precis::unsafe<precis::presets::fp16_mixed, precis::rule::unscaled_gradients>,
              precis::no_scaling>());
