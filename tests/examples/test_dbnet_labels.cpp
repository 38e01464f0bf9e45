// The DBNet example's training targets on regions whose maps can be worked out by hand: a
// 100 x 100 square shrinks by D = A (1 - 0.4^2) / L = 10000 * 0.84 / 400 = 21 px on every
// side; its threshold map is 0.7 on its edges, 0.3 from D inwards or outwards, linear in
// between; ignored regions are masked out and give no target.
#include "../../examples/dbnet/labels.hpp"

#include <doctest/doctest.h>

#include <vector>

using dbnet::point;

namespace {

dbnet::text_region box(double x0, double y0, double x1, double y1, const char* text = "word") {
  return {{point{x0, y0}, point{x1, y0}, point{x1, y1}, point{x0, y1}}, text, false};
}

struct maps {
  dbnet::label_maps m;
  float shrink(int x, int y) const { return m.shrink[std::size_t(y * m.width + x)]; }
  float shrink_mask(int x, int y) const { return m.shrink_mask[std::size_t(y * m.width + x)]; }
  float thresh(int x, int y) const { return m.thresh[std::size_t(y * m.width + x)]; }
  float thresh_mask(int x, int y) const { return m.thresh_mask[std::size_t(y * m.width + x)]; }
};

}  // namespace

TEST_CASE("a square's shrink and threshold maps, worked out by hand") {
  std::vector<dbnet::text_region> r{box(50, 50, 150, 150)};
  CHECK(dbnet::shrink_distance(r[0].corners, 0.4) == doctest::Approx(21.0));
  const maps t{dbnet::make_labels(r, 200, 220)};
  CHECK(t.m.height == 200);
  CHECK(t.m.width == 220);
  CHECK(!r[0].ignored);
  // Shrunk to [71, 129] on both axes, boundary pixels filled.
  float ones = 0;
  for (float v : t.m.shrink) ones += v;
  CHECK(ones == 59.0F * 59.0F);
  CHECK(t.shrink(100, 100) == 1.0F);
  CHECK(t.shrink(71, 100) == 1.0F);
  CHECK(t.shrink(129, 129) == 1.0F);
  CHECK(t.shrink(70, 100) == 0.0F);
  CHECK(t.shrink(130, 100) == 0.0F);
  for (float v : t.m.shrink_mask) CHECK(v == 1.0F);
  // Threshold: 0.3 + 0.4 (1 - min(1, d / 21)), d the distance to the square's edges.
  CHECK(t.thresh(50, 100) == doctest::Approx(0.7));
  CHECK(t.thresh(40, 100) == doctest::Approx(0.3 + 0.4 * (1 - 10.0 / 21)));
  CHECK(t.thresh(60, 100) == doctest::Approx(0.3 + 0.4 * (1 - 10.0 / 21)));
  CHECK(t.thresh(100, 100) == doctest::Approx(0.3));
  CHECK(t.thresh(40, 40) == doctest::Approx(0.3 + 0.4 * (1 - std::hypot(10.0, 10.0) / 21)));  // past a corner
  CHECK(t.thresh(5, 5) == doctest::Approx(0.3));
  // The mask is the square grown by 21 px with round corners.
  CHECK(t.thresh_mask(30, 100) == 1.0F);
  CHECK(t.thresh_mask(27, 100) == 0.0F);
  CHECK(t.thresh_mask(100, 100) == 1.0F);
  CHECK(t.thresh_mask(32, 32) == 0.0F);  // beyond the rounded corner: 25.5 px from (50, 50)
  CHECK(t.thresh_mask(38, 38) == 1.0F);  // 17 px from the corner
}

TEST_CASE("ignored regions: ###, too small, clipped to the image") {
  std::vector<dbnet::text_region> r{box(10, 10, 60, 40, "###"), box(100, 10, 160, 15), box(180, 150, 260, 230)};
  const maps t{dbnet::make_labels(r, 200, 200)};
  CHECK(r[0].ignored);
  CHECK(r[1].ignored);  // 5 px high, below min_text_size = 8
  CHECK(!r[2].ignored);
  CHECK(t.shrink_mask(30, 20) == 0.0F);
  CHECK(t.shrink(30, 20) == 0.0F);
  CHECK(t.thresh_mask(30, 20) == 0.0F);
  CHECK(t.shrink_mask(130, 12) == 0.0F);
  CHECK(t.shrink_mask(100, 100) == 1.0F);
  // The third is clipped to [180, 199] x [150, 199]: 19 x 49 px, D = 931 * 0.84 / 136 = 5.75.
  CHECK(r[2].corners[2].x == 199.0);
  CHECK(t.shrink(190, 175) == 1.0F);
  CHECK(t.shrink(182, 175) == 0.0F);
  CHECK(t.thresh(180, 175) == doctest::Approx(0.7));
}
