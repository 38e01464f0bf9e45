// From DBNet's probability map to text boxes, as the reference implementation's
// boxes_from_bitmap does it:
//
//   1. binarize P at `thresh` (0.3);
//   2. each connected region's outer contour (OpenCV findContours), at most
//      `max_candidates` of them;
//   3. its minimum-area rectangle; dropped when its shorter side is below `min_size` (3);
//   4. its score, the mean of P over the rectangle's pixels; dropped below `box_thresh`;
//   5. the rectangle grown ("unclipped") by A * unclip_ratio / L (A its area, L its
//      perimeter; ratio 1.5) with Clipper's round joins, and the minimum-area rectangle of
//      that; dropped when its shorter side is below min_size + 2;
//   6. its corners scaled from the map's size to the image's, rounded and clipped to it,
//      clockwise from the top-left one.
#pragma once

#include "icdar.hpp"
#include "labels.hpp"

#include <opencv2/imgproc.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <vector>

namespace dbnet {

/// The reference's settings.
struct postprocess_options {
  float thresh = 0.3F;
  float box_thresh = 0.6F;
  double unclip_ratio = 1.5;
  double min_size = 3;
  std::size_t max_candidates = 1000;
};

/// A detected text box and its score (mean probability inside it).
struct detection {
  std::array<point, 4> corners{};
  double score = 0;
};

/// The corners of the minimum-area rectangle of `pts`, clockwise from the top-left (as the
/// reference's get_mini_boxes orders them), and its shorter side.
inline std::array<point, 4> mini_box(const std::vector<cv::Point>& pts, double& shorter) {
  const cv::RotatedRect r = cv::minAreaRect(pts);
  std::array<cv::Point2f, 4> c;
  r.points(c.data());
  std::sort(c.begin(), c.end(), [](const cv::Point2f& a, const cv::Point2f& b) { return a.x < b.x; });
  // The two leftmost: the upper is the first corner, the lower the last; the two
  // rightmost: upper second, lower third.
  const auto [tl, bl] = c[1].y > c[0].y ? std::pair{c[0], c[1]} : std::pair{c[1], c[0]};
  const auto [tr, br] = c[3].y > c[2].y ? std::pair{c[2], c[3]} : std::pair{c[3], c[2]};
  shorter = std::min(r.size.width, r.size.height);
  return {point{tl.x, tl.y}, point{tr.x, tr.y}, point{br.x, br.y}, point{bl.x, bl.y}};
}

/// The mean of `prob` (h x w) over the pixels of the quadrilateral `q`.
inline double box_score(const cv::Mat& prob, const std::array<point, 4>& q) {
  const int h = prob.rows, w = prob.cols;
  double x0 = q[0].x, x1 = x0, y0 = q[0].y, y1 = y0;
  for (const auto& c : q) x0 = std::min(x0, c.x), x1 = std::max(x1, c.x), y0 = std::min(y0, c.y), y1 = std::max(y1, c.y);
  const int xmin = std::clamp(int(std::floor(x0)), 0, w - 1), xmax = std::clamp(int(std::ceil(x1)), 0, w - 1);
  const int ymin = std::clamp(int(std::floor(y0)), 0, h - 1), ymax = std::clamp(int(std::ceil(y1)), 0, h - 1);
  cv::Mat mask = cv::Mat::zeros(ymax - ymin + 1, xmax - xmin + 1, CV_8U);
  std::vector<cv::Point> poly;
  for (const auto& c : q) poly.emplace_back(int(std::lround(c.x)) - xmin, int(std::lround(c.y)) - ymin);
  cv::fillPoly(mask, std::vector<std::vector<cv::Point>>{poly}, cv::Scalar(1));
  return cv::mean(prob(cv::Rect(xmin, ymin, xmax - xmin + 1, ymax - ymin + 1)), mask)[0];
}

/// The text boxes in probability map `prob` (height x width floats, row-major) for an
/// image of image_height x image_width (see the file comment).
inline std::vector<detection> detect_boxes(const float* prob, int height, int width, int image_height, int image_width,
                                           const postprocess_options& o = {}) {
  const cv::Mat p(height, width, CV_32F, const_cast<float*>(prob));
  cv::Mat bitmap;
  cv::compare(p, cv::Scalar(o.thresh), bitmap, cv::CMP_GT);
  std::vector<std::vector<cv::Point>> contours;
  cv::findContours(bitmap, contours, cv::RETR_LIST, cv::CHAIN_APPROX_SIMPLE);
  std::vector<detection> out;
  const std::size_t n = std::min(contours.size(), o.max_candidates);
  for (std::size_t i = 0; i < n; ++i) {
    double side = 0;
    const auto box = mini_box(contours[i], side);
    if (side < o.min_size) continue;
    const double score = box_score(p, box);
    if (score < o.box_thresh) continue;
    const double grow = std::abs(twice_signed_area(box)) / 2 * o.unclip_ratio / perimeter(box);
    const auto grown = offset_polygon(box, grow);
    if (grown.size() < 3) continue;
    const auto big = mini_box(grown, side);
    if (side < o.min_size + 2) continue;
    detection d;
    d.score = score;
    for (std::size_t c = 0; c < 4; ++c) {
      d.corners[c].x = std::clamp(std::round(big[c].x / width * image_width), 0.0, double(image_width));
      d.corners[c].y = std::clamp(std::round(big[c].y / height * image_height), 0.0, double(image_height));
    }
    out.push_back(d);
  }
  return out;
}

}  // namespace dbnet
