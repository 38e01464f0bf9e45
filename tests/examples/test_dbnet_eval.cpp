// The DBNet example's evaluation and post-processing on hand-made cases: the ICDAR 2015
// protocol's IoU threshold, one-to-one greedy matching in ground-truth order, ### regions
// and the detections inside them, sums over a set; boxes found in a probability map where
// they were drawn, grown by the unclip distance; and the loop closed: the shrink map of a
// set of regions, post-processed, scores H-mean 1 against them.
#include "../../examples/dbnet/evaluate.hpp"
#include "../../examples/dbnet/postprocess.hpp"

#include <doctest/doctest.h>

#include <vector>

using dbnet::point;
using quad = std::array<point, 4>;

namespace {

quad rect(double x0, double y0, double x1, double y1) { return {point{x0, y0}, point{x1, y0}, point{x1, y1}, point{x0, y1}}; }

dbnet::text_region region(const quad& q, const char* text = "word") { return {q, text, false}; }

}  // namespace

TEST_CASE("areas and IoU of quadrilaterals") {
  CHECK(dbnet::quad_area(rect(0, 0, 10, 20)) == 200.0);
  CHECK(dbnet::intersection_area(rect(0, 0, 10, 10), rect(5, 0, 15, 10)) == 50.0);
  CHECK(dbnet::iou(rect(0, 0, 10, 10), rect(5, 0, 15, 10)) == doctest::Approx(50.0 / 150));
  CHECK(dbnet::iou(rect(0, 0, 10, 10), rect(20, 20, 30, 30)) == 0.0);
  // A diamond inside a square: half its area.
  CHECK(dbnet::intersection_area(rect(0, 0, 10, 10), quad{point{5, 0}, point{10, 5}, point{5, 10}, point{0, 5}}) == 50.0);
}

TEST_CASE("the protocol: IoU above 0.5, one-to-one, greedy in ground-truth order") {
  const std::vector<dbnet::text_region> truth{region(rect(0, 0, 100, 20)), region(rect(0, 50, 100, 70))};
  SUBCASE("exact and shifted detections") {
    // Shifted by a quarter: IoU 75 / 125 = 0.6 (matched); by a half: 1/3 (not).
    const auto m = dbnet::match_image(truth, {rect(25, 0, 125, 20), rect(50, 50, 150, 70)});
    CHECK(m.regions == 2);
    CHECK(m.detections == 2);
    CHECK(m.matched == 1);
    const auto s = dbnet::scores_of(m);
    CHECK(s.precision == 0.5);
    CHECK(s.recall == 0.5);
    CHECK(s.hmean == 0.5);
  }
  SUBCASE("two detections of one region: one match") {
    const auto m = dbnet::match_image(truth, {rect(0, 0, 100, 20), rect(2, 0, 100, 20)});
    CHECK(m.matched == 1);
    CHECK(m.detections == 2);
  }
  SUBCASE("greedy: the first region takes the first detection above 0.5, even if a later one fits better") {
    // One detection fitting both regions' union poorly and one fitting region 0 exactly:
    // region 0 takes detection 0 (IoU 0.6), leaving detection 1 (IoU 1 with region 0, 0
    // with region 1) unmatched.
    const std::vector<dbnet::text_region> t{region(rect(0, 0, 100, 20))};
    const auto m = dbnet::match_image(t, {rect(25, 0, 125, 20), rect(0, 0, 100, 20)});
    CHECK(m.matched == 1);
    CHECK(dbnet::scores_of(m).precision == 0.5);
  }
  SUBCASE("### regions and detections mostly inside them count for nothing") {
    std::vector<dbnet::text_region> t = truth;
    t.push_back(region(rect(200, 0, 300, 20), "###"));
    const auto m = dbnet::match_image(t, {rect(0, 0, 100, 20), rect(210, 0, 310, 20), rect(150, 0, 250, 20)});
    CHECK(m.regions == 2);
    CHECK(m.detections == 2);  // the second is 90% inside ###; the third only 50%
    CHECK(m.matched == 1);
  }
  SUBCASE("sums over a set, and empty cases") {
    dbnet::match_counts total;
    total += dbnet::match_image(truth, {rect(0, 0, 100, 20)});
    total += dbnet::match_image({}, {rect(0, 0, 10, 10)});
    total += dbnet::match_image(truth, {});
    CHECK(total.regions == 4);
    CHECK(total.detections == 2);
    CHECK(total.matched == 1);
    const auto s = dbnet::scores_of(total);
    CHECK(s.precision == 0.5);
    CHECK(s.recall == 0.25);
    CHECK(s.hmean == doctest::Approx(2 * 0.5 * 0.25 / 0.75));
    CHECK(dbnet::scores_of({}).hmean == 0.0);
  }
}

TEST_CASE("boxes come out of a probability map where they were drawn, grown by the unclip distance") {
  const int h = 100, w = 160;
  std::vector<float> p(std::size_t(h * w), 0.0F);
  auto fill = [&](int x0, int y0, int x1, int y1, float v) {
    for (int y = y0; y <= y1; ++y) {
      for (int x = x0; x <= x1; ++x) p[std::size_t(y * w + x)] = v;
    }
  };
  fill(30, 40, 69, 59, 0.9F);    // a text kernel
  fill(100, 10, 140, 30, 0.4F);  // above 0.3 but scored 0.4 < 0.6: dropped
  fill(120, 80, 121, 81, 1.0F);  // 2 px: dropped
  const auto found = dbnet::detect_boxes(p.data(), h, w, 2 * h, 2 * w);
  REQUIRE(found.size() == 1);
  CHECK(found[0].score == doctest::Approx(0.9));
  // The kernel's rectangle of corners (30, 40)-(69, 59): 39 x 19, grown by
  // 741 * 1.5 / 116 = 9.58 px, then doubled to the image's size.
  const quad expected = rect(2 * (30 - 9.58), 2 * (40 - 9.58), 2 * (69 + 9.58), 2 * (59 + 9.58));
  // Within 2 px at the image's scale: Clipper offsets and rounds to whole pixels of the map.
  for (std::size_t c = 0; c < 4; ++c) {
    CHECK(std::abs(found[0].corners[c].x - expected[c].x) <= 2.0);
    CHECK(std::abs(found[0].corners[c].y - expected[c].y) <= 2.0);
  }
}

TEST_CASE("shrink maps of regions, post-processed, give the regions back (H-mean 1)") {
  std::vector<dbnet::text_region> truth{region(rect(20, 20, 140, 50)), region(rect(40, 90, 110, 120)),
                                        region({point{150, 60}, point{220, 80}, point{212, 108}, point{142, 88}}),
                                        region(rect(160, 150, 220, 170), "###")};
  auto regions = truth;
  const auto maps = dbnet::make_labels(regions, 200, 240);
  const auto found = dbnet::detect_boxes(maps.shrink.data(), 200, 240, 200, 240);
  std::vector<quad> boxes;
  for (const auto& d : found) boxes.push_back(d.corners);
  CHECK(boxes.size() == 3);
  for (const auto& t : truth) {
    if (dbnet::dont_care(t)) continue;
    double best = 0;
    for (const auto& b : boxes) best = std::max(best, dbnet::iou(t.corners, b));
    // Shrinking by A (1 - 0.4^2) / L and growing by 1.5 A' / L' gives a thin region back
    // smaller than it was: the 120 x 30 one returns as about 113 x 23 (IoU 0.72), the 70 x 30
    // one as about 67 x 27 (0.88).
    INFO("region " << t.corners[0].x << "," << t.corners[0].y << ": best IoU " << best);
    CHECK(best > 0.7);
  }
  const auto s = dbnet::scores_of(dbnet::match_image(truth, boxes));
  CHECK(s.hmean == 1.0);
}
