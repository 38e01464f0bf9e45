// DBNet's training targets from quadrilateral text regions, as the reference
// implementation (MhLiao's DB: MakeShrinkMap, MakeBorderMap) makes them:
//
//   - shrink map: each region offset inwards by D = A (1 - r^2) / L (A its area, L its
//     perimeter, r = 0.4) with Clipper's round joins, filled with 1;
//   - shrink mask: 1 except on ignored regions: `###`, regions narrower or lower than
//     min_text_size (8 px), regions of less than 1 px^2, and regions the inward offset
//     empties;
//   - threshold map: each kept region offset outwards by the same D; inside it every pixel
//     gets 1 - min(1, d / D), d its distance to the nearest edge of the region, the largest
//     over regions, then scaled from [0, 1] to [thresh_min, thresh_max] = [0.3, 0.7];
//   - threshold mask: 1 inside the outward offsets.
//
// One difference from the reference: d is the distance to the edge segment. The reference
// computes it from the triangle the pixel makes with the edge's end points, which for
// pixels beyond an end point gives the distance to the edge's line instead; the two agree
// everywhere along the region except past its corners.
//
// Regions are first clipped to the image. Needs Clipper (Debian: libpolyclipping-dev) and
// OpenCV's imgproc (filling polygons).
#pragma once

#include "icdar.hpp"

#include <opencv2/imgproc.hpp>
#include <polyclipping/clipper.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <vector>

namespace dbnet {

/// The reference's settings.
struct label_options {
  double shrink_ratio = 0.4;
  double min_text_size = 8;
  float thresh_min = 0.3F, thresh_max = 0.7F;
};

/// Per-pixel targets of one image, each h x w, row-major.
struct label_maps {
  int height = 0, width = 0;
  std::vector<float> shrink, shrink_mask, thresh, thresh_mask;
};

/// The perimeter of a polygon.
template <class Points>
double perimeter(const Points& p) {
  double s = 0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const auto& a = p[i];
    const auto& b = p[(i + 1) % p.size()];
    s += std::hypot(double(b.x) - double(a.x), double(b.y) - double(a.y));
  }
  return s;
}

/// DB's offset distance A (1 - r^2) / L.
inline double shrink_distance(const std::array<point, 4>& q, double ratio) {
  const double l = perimeter(q);
  return l == 0 ? 0 : std::abs(twice_signed_area(q)) / 2 * (1 - ratio * ratio) / l;
}

/// The polygon `q` offset by `delta` pixels (negative: inwards) with Clipper's round joins
/// (integer coordinates, as pyclipper uses them); the first path Clipper gives, or none
/// when the offset empties the polygon.
inline std::vector<cv::Point> offset_polygon(const std::array<point, 4>& q, double delta) {
  ClipperLib::Path path;
  for (const auto& c : q) path.emplace_back(ClipperLib::cInt(std::lround(c.x)), ClipperLib::cInt(std::lround(c.y)));
  ClipperLib::ClipperOffset off;
  off.AddPath(path, ClipperLib::jtRound, ClipperLib::etClosedPolygon);
  ClipperLib::Paths out;
  off.Execute(out, delta);
  std::vector<cv::Point> poly;
  if (!out.empty()) {
    for (const auto& p : out.front()) poly.emplace_back(int(p.X), int(p.Y));
  }
  return poly;
}

/// The distance from (px, py) to the segment a-b.
inline double segment_distance(double px, double py, const point& a, const point& b) {
  const double dx = b.x - a.x, dy = b.y - a.y, len2 = dx * dx + dy * dy;
  double t = len2 > 0 ? ((px - a.x) * dx + (py - a.y) * dy) / len2 : 0;
  t = std::clamp(t, 0.0, 1.0);
  return std::hypot(px - (a.x + t * dx), py - (a.y + t * dy));
}

/// The targets for `regions` on an h x w image; sets `ignored` on the regions the shrink
/// step ignores (see the file comment).
inline label_maps make_labels(std::vector<text_region>& regions, int height, int width, const label_options& o = {}) {
  label_maps m;
  m.height = height;
  m.width = width;
  const std::size_t n = std::size_t(height) * std::size_t(width);
  cv::Mat shrink = cv::Mat::zeros(height, width, CV_32F), shrink_mask = cv::Mat::ones(height, width, CV_32F);
  cv::Mat thresh_mask = cv::Mat::zeros(height, width, CV_32F);
  std::vector<float> canvas(n, 0.0F);
  auto corners_of = [](const std::array<point, 4>& q) {
    std::vector<cv::Point> v;
    for (const auto& c : q) v.emplace_back(int(std::lround(c.x)), int(std::lround(c.y)));
    return v;
  };
  for (auto& r : regions) {
    for (auto& c : r.corners) {
      c.x = std::clamp(c.x, 0.0, double(width - 1));
      c.y = std::clamp(c.y, 0.0, double(height - 1));
    }
    double x0 = r.corners[0].x, x1 = x0, y0 = r.corners[0].y, y1 = y0;
    for (const auto& c : r.corners) {
      x0 = std::min(x0, c.x), x1 = std::max(x1, c.x), y0 = std::min(y0, c.y), y1 = std::max(y1, c.y);
    }
    if (r.transcription == "###" || std::abs(twice_signed_area(r.corners)) < 2.0 || std::min(x1 - x0, y1 - y0) < o.min_text_size) r.ignored = true;
    const double d = shrink_distance(r.corners, o.shrink_ratio);
    std::vector<cv::Point> inner;
    if (!r.ignored) {
      inner = offset_polygon(r.corners, -d);
      if (inner.size() < 3) r.ignored = true;
    }
    if (r.ignored) {
      cv::fillPoly(shrink_mask, std::vector<std::vector<cv::Point>>{corners_of(r.corners)}, cv::Scalar(0.0));
      continue;
    }
    cv::fillPoly(shrink, std::vector<std::vector<cv::Point>>{inner}, cv::Scalar(1.0));

    // The threshold map: inside the outward offset, 1 - min(1, distance to the region's
    // edges / d), the largest over regions.
    const auto outer = offset_polygon(r.corners, d);
    if (outer.size() < 3) continue;
    cv::fillPoly(thresh_mask, std::vector<std::vector<cv::Point>>{outer}, cv::Scalar(1.0));
    const cv::Rect box = cv::boundingRect(outer) & cv::Rect(0, 0, width, height);
    for (int y = box.y; y < box.y + box.height; ++y) {
      for (int x = box.x; x < box.x + box.width; ++x) {
        double nearest = d;
        for (std::size_t e = 0; e < 4; ++e) {
          nearest = std::min(nearest, segment_distance(x, y, r.corners[e], r.corners[(e + 1) % 4]));
        }
        float& v = canvas[std::size_t(y) * std::size_t(width) + std::size_t(x)];
        v = std::max(v, float(1.0 - nearest / d));
      }
    }
  }
  auto flat = [n](const cv::Mat& mat) {
    std::vector<float> v(n);
    std::copy(mat.ptr<float>(0), mat.ptr<float>(0) + n, v.begin());
    return v;
  };
  m.shrink = flat(shrink);
  m.shrink_mask = flat(shrink_mask);
  m.thresh_mask = flat(thresh_mask);
  m.thresh.resize(n);
  for (std::size_t i = 0; i < n; ++i) m.thresh[i] = canvas[i] * (o.thresh_max - o.thresh_min) + o.thresh_min;
  return m;
}

}  // namespace dbnet
