// The DBNet example's ICDAR 2015 files: lines as the real set writes them (byte-order mark,
// CR LF, commas in transcriptions, ###) read to the values written by hand; each kind of
// malformed line refused naming file and line; results; the directory pairing of images and
// ground truth; files written and read back.
#include "../../examples/dbnet/icdar.hpp"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

namespace fs = std::filesystem;
using dbnet::point;

namespace {

std::string gt_error(const std::string& text) {
  try {
    (void)dbnet::parse_gt(text, "gt_img_9.txt");
  } catch (const precis::error& e) {
    return e.what();
  }
  return "";
}

void touch(const fs::path& p, const std::string& content = "") {
  std::ofstream(p, std::ios::binary) << content;
}

}  // namespace

TEST_CASE("ground-truth lines as ICDAR 2015 writes them") {
  const std::string text =
      "\xEF\xBB\xBF"
      "377,117,463,117,465,130,378,130,Genaxis Theatre\r\n"
      "493,115,519,115,519,131,493,131,[06]\r\n"
      "374,155,409,155,409,170,374,170,###\r\n"
      "\r\n"
      "-3,10,40,10,40,30,-3,30,Hello, world,again\r\n"
      "5,5,5,5,5,5,5,5,x";
  const auto r = dbnet::parse_gt(text, "gt_img_1.txt");
  REQUIRE(r.size() == 5);
  CHECK(r[0].corners == std::array<point, 4>{point{377, 117}, point{463, 117}, point{465, 130}, point{378, 130}});
  CHECK(r[0].transcription == "Genaxis Theatre");
  CHECK(!r[0].ignored);
  CHECK(r[1].transcription == "[06]");
  CHECK(r[2].ignored);
  CHECK(r[3].corners[0] == point{-3, 10});
  CHECK(r[3].transcription == "Hello, world,again");
  CHECK(r[4].ignored);  // no area
  CHECK(!r[4].transcription.empty());
  // Written and read back.
  CHECK(dbnet::parse_gt(dbnet::format_gt(r), "again") == r);
  CHECK(dbnet::twice_signed_area(std::array<point, 4>{point{0, 0}, point{10, 0}, point{10, 5}, point{0, 5}}) == 100.0);
}

TEST_CASE("malformed ground truth is refused naming file and line") {
  auto refused = [](const std::string& text, const std::string& expected) {
    const std::string msg = gt_error(text);
    INFO(msg);
    CHECK(msg.rfind("dbnet: gt_img_9.txt, line ", 0) == 0);
    CHECK(msg.find(expected) != std::string::npos);
  };
  refused("1,2,3,4,5,6,7\n", "line 1: expected 8 coordinates x1,y1,...,x4,y4, found 7 fields");
  refused("1,2,3,4,5,6,7,8,a\n1,2,3,x,5,6,7,8,b\n", "line 2: coordinate 4 (\"x\") is not a whole number");
  refused("1,2,3,4.5,5,6,7,8,a\n", "coordinate 4 (\"4.5\") is not a whole number");
  // A transcription "9,10,a" is text: accepted.
  CHECK(gt_error("1,2,3,4,5,6,7,8,9,10,a\n").empty());
  refused("1,2,3,4,5,6,7,8,9,10\n", "line 1: a polygon of 5 corners, not a quadrilateral");
  refused("\n\n1,2,3,4,5,6,7,8,9,10,11,12\n", "line 3: a polygon of 6 corners");
  refused("1,2,3,4,5,6,7,99999999,a\n", "coordinate 8 is beyond 1e6");
  refused(std::string("1,2,3,4,5,6,7,8,a\0b\n", 20), "holds a NUL byte");
  refused(std::string(70000, 'x'), "longer than 64 KiB");
  CHECK(dbnet::parse_gt("", "empty").empty());
}

TEST_CASE("result files: eight coordinates and an optional score") {
  const auto q = dbnet::parse_result("1,2,3,4,5,6,7,8\r\n10,20,30,20,30,40,10,40,1\n", "res_img_1.txt");
  REQUIRE(q.size() == 2);
  CHECK(q[1][2] == point{30, 40});
  CHECK(dbnet::parse_result(dbnet::format_result(q), "again") == q);
  CHECK_THROWS_WITH_AS(dbnet::parse_result("1,2,3,4,5,6,7,8,word\n", "res_img_1.txt"),
                       doctest::Contains("res_img_1.txt, line 1: expected 8 coordinates and at most a score"),
                       precis::error);
}

TEST_CASE("a directory pairs img_N with gt_img_N, ordered by N") {
  const auto dir = fs::temp_directory_path() / ("precis_icdar_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "images");
  fs::create_directories(dir / "gt");
  touch(dir / "images" / "img_10.jpg");
  touch(dir / "images" / "img_2.png");
  touch(dir / "images" / "notes.txt");
  touch(dir / "gt" / "gt_img_10.txt", "1,1,9,1,9,9,1,9,ten\n");
  touch(dir / "gt" / "gt_img_2.txt", "\xEF\xBB\xBF" "1,1,9,1,9,9,1,9,###\r\n");
  auto set = dbnet::load_icdar_dir(dir / "images", dir / "gt");
  REQUIRE(set.size() == 2);
  CHECK(set[0].id == 2);
  CHECK(set[0].regions[0].ignored);
  CHECK(set[1].id == 10);
  CHECK(set[1].image.filename() == "img_10.jpg");
  CHECK(set[1].regions[0].transcription == "ten");

  touch(dir / "gt" / "gt_img_3.txt", "1,1,9,1,9,9,1,9,x\n");
  CHECK_THROWS_WITH_AS(dbnet::load_icdar_dir(dir / "images", dir / "gt"),
                       doctest::Contains("gt_img_3.txt has no image img_3"), precis::error);
  fs::remove(dir / "gt" / "gt_img_3.txt");
  touch(dir / "images" / "img_4.jpg");
  CHECK_THROWS_WITH_AS(dbnet::load_icdar_dir(dir / "images", dir / "gt"),
                       doctest::Contains("img_4.jpg has no ground truth gt_img_4.txt"), precis::error);
  fs::remove(dir / "images" / "img_4.jpg");
  touch(dir / "gt" / "gt_img_2.txt", "1,1,9,1,9,9,1,x,bad\n");
  CHECK_THROWS_WITH_AS(dbnet::load_icdar_dir(dir / "images", dir / "gt"),
                       doctest::Contains("gt_img_2.txt, line 1: coordinate 8"), precis::error);
  CHECK_THROWS_WITH_AS(dbnet::load_icdar_dir(dir / "missing"), doctest::Contains("is not a directory"),
                       precis::error);
  dbnet::write_gt(dir / "gt" / "gt_img_2.txt", set[0].regions);
  CHECK(dbnet::load_icdar_dir(dir / "images", dir / "gt")[0].regions == set[0].regions);
  fs::remove_all(dir);
}
