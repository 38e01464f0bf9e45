// float8 scaling recipes: delayed scaling's amax history and current scaling.
#include <precis/scaling/scaling.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <span>

using precis::float8_e4m3;
using precis::float8_e5m2;

TEST_CASE("delayed scaling: scale = max / (max of the amax history) / 2^margin") {
  precis::delayed_scaling_options o;
  o.history_length = 4;
  precis::delayed_scaling<float8_e4m3> d(o);
  CHECK(d.scale() == 1.0f);
  d.update(2.0f);
  CHECK(d.scale() == 448.0f / 2.0f);
  d.update(8.0f);
  CHECK(d.scale() == 448.0f / 8.0f);
  d.update(1.0f);  // the history's max is still 8
  CHECK(d.scale() == 448.0f / 8.0f);
  d.update(0.5f);
  d.update(0.25f);  // the history holds 8, 1, 0.5, 0.25
  CHECK(d.scale() == 448.0f / 8.0f);
  CHECK(d.amax_history() == std::vector<float>{8.0f, 1.0f, 0.5f, 0.25f});
  d.update(0.125f);  // 8 drops out
  CHECK(d.scale() == 448.0f / 1.0f);
  CHECK(d.amax_history() == std::vector<float>{1.0f, 0.5f, 0.25f, 0.125f});
  CHECK(d.inverse_scale() == 1.0f / 448.0f);
}

TEST_CASE("delayed scaling: zero and non-finite amax keep the previous scale") {
  precis::delayed_scaling<float8_e5m2> d;
  d.update(4.0f);
  const float s = d.scale();
  CHECK(s == 57344.0f / 4.0f);
  d.update(0.0f);
  CHECK(d.scale() == s);
  d.update(INFINITY);
  CHECK(d.scale() == s);
  d.update(NAN);
  CHECK(d.scale() == s);
  CHECK(d.amax_history().size() == 1);
}

TEST_CASE("delayed scaling: most recent amax, and margin") {
  precis::delayed_scaling_options o;
  o.algorithm = precis::amax_algorithm::most_recent;
  o.margin = 2;
  precis::delayed_scaling<float8_e4m3> d(o);
  d.update(8.0f);
  d.update(2.0f);
  CHECK(d.scale() == 448.0f / 2.0f / 4.0f);
}

TEST_CASE("amax values are reduced across processes") {
  struct two_process {
    float other = 16.0f;
    bool any(bool b) { return b; }
    void max(std::span<float> v) {
      for (auto& x : v) x = std::max(x, other);
    }
  };
  precis::delayed_scaling<float8_e4m3, two_process> d;
  d.update(1.0f);
  CHECK(d.scale() == 448.0f / 16.0f);
  precis::current_scaling<float8_e4m3, two_process> c;
  c.update(2.0f);
  CHECK(c.scale() == 448.0f / 16.0f);
}

TEST_CASE("current scaling follows this step's amax") {
  precis::current_scaling<float8_e5m2> c(1);
  c.update(4.0f);
  CHECK(c.scale() == 57344.0f / 4.0f / 2.0f);
  c.update(0.0f);
  CHECK(c.scale() == 57344.0f / 4.0f / 2.0f);
  c.update(1024.0f);
  CHECK(c.scale() == 57344.0f / 1024.0f / 2.0f);
}
