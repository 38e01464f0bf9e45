// Training checkpoints: round trip, all-or-nothing loading, refusal of damaged files, and
// crash safety: a writer killed at arbitrary moments leaves a loadable checkpoint.
#include <precis/optim/optim.hpp>
#include <precis/scaling/scaling.hpp>

#include "random.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

namespace {

namespace fs = std::filesystem;

// A stand-in for model weights.
struct weights {
  static constexpr std::string_view kind = "test_weights";
  std::vector<float> w;
  bool fail_while_saving = false;
  template <class Archive>
  void visit_state(Archive& a) {
    if (fail_while_saving) throw precis::error("weights: simulated failure while saving");
    a.floats("w", w);
  }
  std::string validate() const { return w.empty() ? "no weights" : std::string(); }
};

fs::path scratch_dir() {
  const auto dir = fs::temp_directory_path() /
                   ("precis_ckpt_" + std::to_string(::getpid()) + "_" +
                    std::to_string(precis_test::rng()() % 1000000));
  fs::create_directories(dir);
  return dir;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const fs::path& p, const std::string& s) {
  std::ofstream(p, std::ios::binary) << s;
}

int count_temporaries(const fs::path& dir) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.path().string().find(".tmp-") != std::string::npos;
  return n;
}

}  // namespace

TEST_CASE("model, optimizer and scaler round-trip through one file") {
  const auto dir = scratch_dir();
  weights model{{1.0f, 2.0f, 3.0f}};
  std::vector<float> master{0.5f, -0.5f};
  precis::adamw opt({std::span<float>(master)});
  precis::dynamic_scaler scaler;
  std::vector<float> g{0.1f, 0.2f};
  opt.step(g);
  scaler.update(true);
  precis::save_checkpoint(dir / "ckpt", model, opt, scaler);
  CHECK(count_temporaries(dir) == 0);

  weights model2{{9.0f}};
  std::vector<float> master2{0.5f, -0.5f};
  precis::adamw opt2({std::span<float>(master2)});
  precis::dynamic_scaler scaler2;
  precis::load_checkpoint(dir / "ckpt", model2, opt2, scaler2);
  CHECK(model2.w == model.w);
  CHECK(opt2.steps() == 1);
  CHECK(scaler2.scale() == scaler.scale());
  CHECK(precis::save_state(opt2) == precis::save_state(opt));
  fs::remove_all(dir);
}

TEST_CASE("a failure while saving leaves the previous checkpoint and no temporary file") {
  const auto dir = scratch_dir();
  weights model{{1.0f}};
  precis::dynamic_scaler scaler;
  precis::save_checkpoint(dir / "ckpt", model, scaler);
  const std::string before = read_file(dir / "ckpt");
  model.w = {2.0f};
  model.fail_while_saving = true;
  CHECK_THROWS_AS(precis::save_checkpoint(dir / "ckpt", scaler, model), precis::error);
  CHECK(read_file(dir / "ckpt") == before);
  CHECK(count_temporaries(dir) == 0);
  fs::remove_all(dir);
}

namespace {
// Writes one field twice, as a layer whose visit_state still saves the parameters that
// nn::model saves did.
struct twice_written {
  static constexpr std::string_view kind = "test_twice";
  std::vector<float> w{1.0f};
  template <class Archive>
  void visit_state(Archive& a) {
    a.floats("layer.weight", w);
    a.floats("layer.weight", w);
  }
  std::string validate() const { return {}; }
};
}  // namespace

TEST_CASE("a field written twice is refused when saving, before the file is touched") {
  const auto dir = scratch_dir();
  weights model{{1.0f}};
  precis::save_checkpoint(dir / "ckpt", model);
  const std::string before = read_file(dir / "ckpt");
  CHECK_THROWS_WITH_AS(precis::save_checkpoint(dir / "ckpt", twice_written{}),
                       doctest::Contains("field named 'layer.weight' is written twice"), precis::error);
  CHECK(read_file(dir / "ckpt") == before);
  CHECK(count_temporaries(dir) == 0);
  fs::remove_all(dir);
}

TEST_CASE("damaged checkpoints are refused and nothing is loaded") {
  const auto dir = scratch_dir();
  weights model{{1.0f, 2.0f}};
  precis::dynamic_scaler scaler;
  scaler.update(true);
  precis::save_checkpoint(dir / "ckpt", model, scaler);
  const std::string good = read_file(dir / "ckpt");

  weights target{{7.0f}};
  precis::dynamic_scaler target_scaler;
  auto unchanged = [&] { return target.w == std::vector<float>{7.0f} && target_scaler.scale() == 65536.0f; };
  for (std::size_t n = 0; n < good.size(); n += 7) {
    write_file(dir / "bad", good.substr(0, n));
    CHECK_THROWS_AS(precis::load_checkpoint(dir / "bad", target, target_scaler), precis::error);
    REQUIRE(unchanged());
  }
  for (std::size_t i = 0; i < good.size(); i += 5) {
    std::string bad = good;
    bad[i] = static_cast<char>(bad[i] ^ 0x21);
    write_file(dir / "bad", bad);
    CHECK_THROWS_AS(precis::load_checkpoint(dir / "bad", target, target_scaler), precis::error);
    REQUIRE(unchanged());
  }
  CHECK_THROWS_WITH(precis::load_checkpoint(dir / "ckpt", target), doctest::Contains("holds 2 parts, 1 were asked for"));
  CHECK_THROWS_WITH(precis::load_checkpoint(dir / "ckpt", target_scaler, target),
                    doctest::Contains("not of a"));
  CHECK(unchanged());
  CHECK_THROWS_WITH(precis::load_checkpoint(dir / "missing", target), doctest::Contains("cannot open"));
  fs::remove_all(dir);
}

TEST_CASE("a writer killed at arbitrary moments leaves a complete checkpoint") {
  const auto dir = scratch_dir();
  const auto file = dir / "ckpt";
  // Two large, different states; the writer alternates between them forever.
  weights a{std::vector<float>(1 << 20, 1.0f)}, b{std::vector<float>(1 << 20, 2.0f)};
  precis::save_checkpoint(file, a);
  std::uniform_int_distribution<int> delay_us(0, 40000);
  for (int round = 0; round < 6; ++round) {
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      for (int i = 0;; ++i) precis::save_checkpoint(file, i % 2 ? a : b);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us(precis_test::rng())));
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    weights loaded{{0.0f}};
    REQUIRE_NOTHROW(precis::load_checkpoint(file, loaded));
    REQUIRE(loaded.w.size() == a.w.size());
    CHECK((loaded.w == a.w || loaded.w == b.w));
  }
  fs::remove_all(dir);
}
