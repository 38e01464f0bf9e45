// Scaler checkpoints: round trips, and every kind of damage refused with the scaler left
// unchanged.
#include <precis/scaling/scaling.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct null_optimizer {
  void step(std::vector<float>&) {}
};

precis::dynamic_scaler trained_scaler() {
  precis::dynamic_scaler_options o;
  o.growth_interval = 3;
  o.hysteresis = 2;
  o.min_scale = 4.0f;
  precis::dynamic_scaler s(o);
  null_optimizer opt;
  const bool pattern[] = {false, false, false, true, true, false, true, false, false};
  for (bool inf : pattern) {
    std::vector<float> g{inf ? NAN : 1.0f};
    s.step(opt, s.scaled_gradients(std::move(g)));
  }
  return s;
}

template <class S>
void check_rejects_all_damage(S& target, const std::string& good) {
  const std::string before = precis::save_state(target);
  auto unchanged = [&] { return precis::save_state(target) == before; };
  // Truncation at every byte.
  for (std::size_t n = 0; n < good.size(); ++n) {
    CHECK_THROWS_AS(precis::load_state(target, std::string_view(good).substr(0, n)), precis::error);
    REQUIRE(unchanged());
  }
  // Every byte flipped.
  for (std::size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] = static_cast<char>(bad[i] ^ 0x5A);
    CHECK_THROWS_AS(precis::load_state(target, bad), precis::error);
    REQUIRE(unchanged());
  }
  // Trailing bytes.
  CHECK_THROWS_AS(precis::load_state(target, good + "x"), precis::error);
  CHECK(unchanged());
}

}  // namespace

TEST_CASE("dynamic scaler state round-trips, counters, history and options included") {
  auto s = trained_scaler();
  const std::string bytes = precis::save_state(s);
  precis::dynamic_scaler fresh;
  precis::load_state(fresh, bytes);
  CHECK(fresh.scale() == s.scale());
  CHECK(fresh.growth_tracker() == s.growth_tracker());
  CHECK(fresh.hysteresis_left() == s.hysteresis_left());
  CHECK(fresh.steps() == s.steps());
  CHECK(fresh.skipped_steps() == s.skipped_steps());
  CHECK(fresh.options().growth_interval == 3);
  CHECK(fresh.options().min_scale == 4.0f);
  CHECK(fresh.scale_history().size() == s.scale_history().size());
  CHECK(precis::save_state(fresh) == bytes);
  // Both continue identically.
  null_optimizer opt;
  for (bool inf : {false, true, false, false, false}) {
    std::vector<float> g1{inf ? NAN : 1.0f}, g2 = g1;
    CHECK(s.step(opt, s.scaled_gradients(std::move(g1))).scale_after ==
          fresh.step(opt, fresh.scaled_gradients(std::move(g2))).scale_after);
  }
  // Streams too.
  std::stringstream io;
  precis::save_state(s, io);
  precis::dynamic_scaler from_stream;
  precis::load_state(from_stream, io);
  CHECK(precis::save_state(from_stream) == precis::save_state(s));
}

TEST_CASE("damaged dynamic scaler checkpoints are refused and change nothing") {
  auto s = trained_scaler();
  const std::string good = precis::save_state(s);
  precis::dynamic_scaler target;
  check_rejects_all_damage(target, good);
}

TEST_CASE("wrong version, wrong kind and garbage say what is wrong") {
  auto s = trained_scaler();
  std::string bytes = precis::save_state(s);
  precis::dynamic_scaler target;
  std::string v2 = bytes;
  v2[8] = 7;  // the version field follows the 8-byte magic
  CHECK_THROWS_WITH(precis::load_state(target, v2), doctest::Contains("format version 7 is not supported"));
  v2[8] = 1;  // version 1 stored the scaler's factors as f32
  CHECK_THROWS_WITH(precis::load_state(target, v2), doctest::Contains("format version 1 is not supported"));
  precis::static_scaler other(8.0f);
  CHECK_THROWS_WITH(precis::load_state(other, bytes),
                    doctest::Contains("holds the state of a dynamic_scaler, not of a static_scaler"));
  CHECK(other.scale() == 8.0f);
  CHECK_THROWS_WITH(precis::load_state(target, "hello world, not a checkpoint"),
                    doctest::Contains("magic bytes"));
}

TEST_CASE("a consistent-looking but invalid state is refused") {
  // A checkpoint whose checksum is right but whose scale lies below min_scale.
  precis::dynamic_scaler_options o;
  o.min_scale = 8.0f;
  o.init_scale = 16.0f;
  precis::dynamic_scaler s(o);
  std::string bytes = precis::save_state(s);
  // Find the "scale" field's float (16.0f = 0x41800000) and set it to 2.0f, then re-sign.
  const std::string sixteen("\x00\x00\x80\x41", 4);
  const auto at = bytes.find(sixteen, bytes.find("scale"));
  REQUIRE(at != std::string::npos);
  bytes.replace(at, 4, std::string("\x00\x00\x00\x40", 4));
  bytes.resize(bytes.size() - 4);
  const std::uint32_t crc = precis::detail::crc32(bytes);
  bytes.append(reinterpret_cast<const char*>(&crc), 4);
  precis::dynamic_scaler target;
  CHECK_THROWS_WITH(precis::load_state(target, bytes), doctest::Contains("outside [min_scale, max_scale]"));
  CHECK(target.scale() == 65536.0f);
}

TEST_CASE("float8 recipes keep their amax history across a checkpoint") {
  precis::delayed_scaling_options o;
  o.history_length = 8;
  precis::delayed_scaling<precis::float8_e4m3> d(o);
  for (float a : {3.0f, 5.0f, 2.0f, 0.0f, 7.0f}) d.update(a);
  const std::string bytes = precis::save_state(d);
  precis::delayed_scaling<precis::float8_e4m3> fresh;
  precis::load_state(fresh, bytes);
  CHECK(fresh.amax_history() == d.amax_history());
  CHECK(fresh.scale() == d.scale());
  CHECK(fresh.options().history_length == 8);
  d.update(1.0f);
  fresh.update(1.0f);
  CHECK(fresh.scale() == d.scale());
  check_rejects_all_damage(fresh, bytes);

  precis::current_scaling<precis::float8_e5m2> c;
  c.update(3.0f);
  precis::current_scaling<precis::float8_e5m2> c2;
  precis::load_state(c2, precis::save_state(c));
  CHECK(c2.scale() == c.scale());
}

TEST_CASE("state fields are read and set by name, validated, all or nothing") {
  auto s = trained_scaler();
  CHECK(precis::state_field<float>(s, "scale") == s.scale());
  CHECK(precis::state_field<std::uint32_t>(s, "growth_tracker") == s.growth_tracker());
  CHECK(precis::state_field<std::uint64_t>(s, "skipped_steps") == s.skipped_steps());
  // Several fields at once (as a device state is copied back).
  precis::assign_state_fields(s, [](auto set) {
    set("scale", 16.0f);
    set("growth_tracker", std::uint32_t{2});
    set("hysteresis_left", std::uint32_t{1});
  });
  CHECK(s.scale() == 16.0f);
  CHECK(s.growth_tracker() == 2);
  CHECK(s.hysteresis_left() == 1);
  // An inconsistent result changes nothing, even when an earlier field was fine.
  const std::string before = precis::save_state(s);
  CHECK_THROWS_WITH_AS(precis::assign_state_fields(s, [](auto set) {
                         set("scale", 32.0f);
                         set("growth_tracker", std::uint32_t{3});  // not below growth_interval 3
                       }),
                       doctest::Contains("growth_tracker must be below growth_interval"), precis::error);
  CHECK(precis::save_state(s) == before);
  // Unknown names and wrong types are refused by name.
  CHECK_THROWS_WITH_AS(precis::state_field<float>(s, "no_such_field"), doctest::Contains("no_such_field"),
                       precis::error);
  CHECK_THROWS_WITH_AS(precis::state_field<std::uint32_t>(s, "scale"), doctest::Contains("\"scale\""),
                       precis::error);
  // The float8 recipe's history, as a whole array.
  precis::delayed_scaling_options o;
  o.history_length = 4;
  precis::delayed_scaling<precis::float8_e4m3> d(o);
  for (float a : {3.0f, 5.0f}) d.update(a);
  const auto h = precis::state_field<std::vector<float>>(d, "amax_history");
  CHECK(h == std::vector<float>{3.0f, 5.0f, 0.0f, 0.0f});
  precis::delayed_scaling<precis::float8_e4m3> e(o);
  precis::assign_state_fields(e, [&](auto set) {
    set("amax_history", h);
    set("next", std::uint32_t{2});
    set("recorded", std::uint32_t{2});
    set("scale", d.scale());
  });
  CHECK(e.amax_history() == d.amax_history());
  CHECK(e.scale() == d.scale());
  e.update(1.0f);
  d.update(1.0f);
  CHECK(e.scale() == d.scale());
}
