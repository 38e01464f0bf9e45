// The DBNet example's synthetic set: the same seed gives the same images and regions, each
// word's ink lies inside its region and every readable region holds ink, unreadable words
// are marked ###, a set written in the ICDAR layout reads back (pixels and corners), and the
// set example_dbnet_cuda makes in memory is the one example_dbnet writes and reads back.
#include "../../examples/dbnet/run.hpp"
#include "../../examples/dbnet/synth.hpp"

#include <doctest/doctest.h>

#include <opencv2/imgcodecs.hpp>

#include <filesystem>
#include <string>

#include <unistd.h>

using dbnet::point;

namespace {

bool same_pixels(const cv::Mat& a, const cv::Mat& b) { return a.size() == b.size() && cv::norm(a, b, cv::NORM_INF) == 0; }

/// Whether pixel (x, y) is inside quad q grown by `margin` px (distance to the polygon).
bool near_quad(const std::array<point, 4>& q, double x, double y, double margin) {
  std::vector<cv::Point2f> c;
  for (const auto& p : q) c.emplace_back(float(p.x), float(p.y));
  return cv::pointPolygonTest(c, cv::Point2f(float(x), float(y)), true) >= -margin;
}

}  // namespace

TEST_CASE("the same seed gives the same image and regions; another index another") {
  const auto a = dbnet::synth_image(7, 3), b = dbnet::synth_image(7, 3), c = dbnet::synth_image(7, 4);
  CHECK(same_pixels(a.image, b.image));
  CHECK(a.regions == b.regions);
  CHECK(!same_pixels(a.image, c.image));
  CHECK(a.image.rows == 256);
  CHECK(a.image.cols == 256);
  CHECK(a.image.type() == CV_8UC3);
}

TEST_CASE("every word's ink lies in its region; readable regions hold ink; the rest are ###") {
  std::size_t readable = 0, unreadable = 0;
  for (std::uint64_t i = 0; i < 30; ++i) {
    const auto s = dbnet::synth_image(11, i);
    CHECK(!s.regions.empty());
    for (int y = 0; y < s.ink.rows; ++y) {
      for (int x = 0; x < s.ink.cols; ++x) {
        if (s.ink.at<std::uint8_t>(y, x) < 128) continue;
        bool inside = false;
        for (const auto& r : s.regions) inside = inside || near_quad(r.corners, x, y, 1.5);
        INFO("image " << i << ", pixel " << x << "," << y);
        CHECK(inside);
      }
    }
    for (const auto& r : s.regions) {
      if (r.transcription == "###") {
        ++unreadable;
        CHECK(r.ignored);
        continue;
      }
      ++readable;
      CHECK(!r.ignored);
      for (const auto& c : r.corners) {
        CHECK(c.x >= 0);
        CHECK(c.y >= 0);
        CHECK(c.x <= 256);
        CHECK(c.y <= 256);
      }
      int ink = 0;
      for (int y = 0; y < s.ink.rows; ++y) {
        for (int x = 0; x < s.ink.cols; ++x) ink += (s.ink.at<std::uint8_t>(y, x) >= 128 && near_quad(r.corners, x, y, 0)) ? 1 : 0;
      }
      CHECK(ink > 4);
    }
  }
  CHECK(readable > 100);
  CHECK(unreadable > 5);
}

TEST_CASE("a set written in the ICDAR layout reads back") {
  const auto dir = std::filesystem::temp_directory_path() / ("precis_synth_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  dbnet::write_synth_set(dir, 5, 10, 3);
  const auto set = dbnet::load_icdar_dir(dir);
  REQUIRE(set.size() == 3);
  for (std::size_t k = 0; k < 3; ++k) {
    const auto s = dbnet::synth_image(5, 10 + k);
    CHECK(set[k].id == k + 1);
    CHECK(same_pixels(cv::imread(set[k].image.string(), cv::IMREAD_COLOR), s.image));
    REQUIRE(set[k].regions.size() == s.regions.size());
    for (std::size_t j = 0; j < s.regions.size(); ++j) {
      CHECK(set[k].regions[j].transcription == s.regions[j].transcription);
      for (std::size_t c = 0; c < 4; ++c) {
        CHECK(set[k].regions[j].corners[c].x == std::round(s.regions[j].corners[c].x));
        CHECK(set[k].regions[j].corners[c].y == std::round(s.regions[j].corners[c].y));
      }
    }
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("the set made in memory (example_dbnet_cuda's) is the set written and read back (example_dbnet's)") {
  const auto dir = std::filesystem::temp_directory_path() / ("precis_synth_set_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const std::size_t side = 64;
  dbnet::write_synth_set(dir, 7, 20, 4, {.width = int(side), .height = int(side)});
  dbnet::run::dataset files;
  files.side = side;
  for (auto& s : dbnet::load_icdar_dir(dir)) {
    const std::string path = s.image.string();
    dbnet::run::add_sample(files, cv::imread(path, cv::IMREAD_COLOR), std::move(s), path);
  }
  const auto memory = dbnet::run::synthesize_set(7, 20, 4, side);
  REQUIRE(memory.count == 4);
  REQUIRE(files.count == 4);
  CHECK(memory.x == files.x);
  CHECK(memory.shrink == files.shrink);
  CHECK(memory.shrink_mask == files.shrink_mask);
  CHECK(memory.thresh == files.thresh);
  CHECK(memory.thresh_mask == files.thresh_mask);
  for (std::size_t k = 0; k < 4; ++k) {
    CHECK(memory.samples[k].id == files.samples[k].id);
    REQUIRE(memory.samples[k].regions.size() == files.samples[k].regions.size());
    for (std::size_t j = 0; j < files.samples[k].regions.size(); ++j) {
      const auto& a = memory.samples[k].regions[j];
      const auto& b = files.samples[k].regions[j];
      CHECK(a.transcription == b.transcription);
      CHECK(a.ignored == b.ignored);
      for (std::size_t c = 0; c < 4; ++c) CHECK((a.corners[c].x == b.corners[c].x && a.corners[c].y == b.corners[c].y));
    }
  }
  std::filesystem::remove_all(dir);
}
