// A synthetic text-detection set, made deterministically from a seed with OpenCV: words in
// Hershey fonts (several faces, sizes, stroke widths and colours), rotated or sheared, on
// procedural backgrounds (gradients, noise, and lines, circles and boxes that are not
// text). Words too small to read (under 8 px high) or cut by the image border are marked
// `###` (do not care), as ICDAR 2015 marks unreadable text.
//
//     auto s = dbnet::synth_image(seed, index);           // image + regions
//     dbnet::write_synth_set(dir, seed, first, count);    // img_N.png + gt_img_N.txt
//
// Every random choice comes from SplitMix64 on (seed, index, draw), never from a standard
// library distribution, so the same seed gives the same set on every platform (up to
// OpenCV's own rendering, which is integer arithmetic).
#pragma once

#include "icdar.hpp"

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace dbnet {

/// Sizes and counts of the synthetic images.
struct synth_options {
  int width = 256, height = 256;
  int min_words = 3, max_words = 9;
  /// Largest rotation, degrees; a quarter of the words are sheared instead.
  double max_angle = 30;
};

/// One image and its text regions (corners in pixels, clockwise from the word's top-left).
struct synth_sample {
  cv::Mat image;  // CV_8UC3
  std::vector<text_region> regions;
  cv::Mat ink;  // CV_8U: the words' coverage (0-255), for checking the regions
};

namespace detail {

/// Random draws from (seed, index), SplitMix64 on a counter.
class draws {
 public:
  draws(std::uint64_t seed, std::uint64_t index) : state_(mix(mix(seed) ^ (index * 0xD1B54A32D192ED03ULL))) {}
  std::uint64_t next() { return mix(state_ += 0x9E3779B97F4A7C15ULL); }
  /// In [0, 1).
  double unit() { return double(next() >> 11) * 0x1.0p-53; }
  double uniform(double a, double b) { return a + (b - a) * unit(); }
  /// In [a, b].
  int between(int a, int b) { return a + int(next() % std::uint64_t(b - a + 1)); }
  bool chance(double p) { return unit() < p; }

 private:
  static std::uint64_t mix(std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  std::uint64_t state_;
};

inline cv::Scalar random_colour(draws& r) { return {double(r.between(0, 255)), double(r.between(0, 255)), double(r.between(0, 255))}; }

inline double brightness(const cv::Scalar& c) { return 0.299 * c[2] + 0.587 * c[1] + 0.114 * c[0]; }

inline void background(cv::Mat& img, draws& r) {
  const cv::Scalar a = random_colour(r), b = random_colour(r);
  const bool vertical = r.chance(0.5);
  for (int y = 0; y < img.rows; ++y) {
    for (int x = 0; x < img.cols; ++x) {
      const double t = vertical ? double(y) / img.rows : double(x) / img.cols;
      auto& p = img.at<cv::Vec3b>(y, x);
      for (int c = 0; c < 3; ++c) p[c] = cv::saturate_cast<std::uint8_t>(a[c] + (b[c] - a[c]) * t);
    }
  }
  // Shapes that are not text: lines, circles, boxes.
  const int shapes = r.between(2, 8);
  for (int s = 0; s < shapes; ++s) {
    const cv::Point p(r.between(0, img.cols - 1), r.between(0, img.rows - 1));
    const cv::Point q(r.between(0, img.cols - 1), r.between(0, img.rows - 1));
    const int kind = r.between(0, 2), thickness = r.between(1, 4);
    if (kind == 0) {
      cv::line(img, p, q, random_colour(r), thickness, cv::LINE_AA);
    } else if (kind == 1) {
      cv::circle(img, p, r.between(4, img.cols / 5), random_colour(r), r.chance(0.3) ? -1 : thickness, cv::LINE_AA);
    } else {
      cv::rectangle(img, p, q, random_colour(r), r.chance(0.3) ? -1 : thickness);
    }
  }
  // Noise, from the draws.
  const double amount = r.uniform(0, 18);
  for (int y = 0; y < img.rows; ++y) {
    for (int x = 0; x < img.cols; ++x) {
      auto& p = img.at<cv::Vec3b>(y, x);
      const double n = (r.unit() + r.unit() + r.unit() - 1.5) * amount;
      for (int c = 0; c < 3; ++c) p[c] = cv::saturate_cast<std::uint8_t>(p[c] + n);
    }
  }
}

inline std::string random_word(draws& r) {
  static constexpr std::string_view letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::string w;
  const int n = r.between(2, 9);
  const bool digits = r.chance(0.15);
  for (int i = 0; i < n; ++i) {
    w += digits ? letters[std::size_t(52 + r.between(0, 9))] : letters[std::size_t(r.between(0, 51))];
  }
  return w;
}

}  // namespace detail

/// Image `index` of the set made from `seed` (see the file comment).
inline synth_sample synth_image(std::uint64_t seed, std::uint64_t index, const synth_options& o = {}) {
  detail::draws r(seed, index);
  synth_sample s;
  s.image = cv::Mat(o.height, o.width, CV_8UC3);
  s.ink = cv::Mat::zeros(o.height, o.width, CV_8U);
  detail::background(s.image, r);
  static constexpr std::array<int, 5> faces{cv::FONT_HERSHEY_SIMPLEX, cv::FONT_HERSHEY_DUPLEX, cv::FONT_HERSHEY_COMPLEX,
                                             cv::FONT_HERSHEY_TRIPLEX, cv::FONT_HERSHEY_PLAIN};
  const int words = r.between(o.min_words, o.max_words);
  std::vector<cv::Rect> taken;
  for (int w = 0, tries = 0; w < words && tries < 60; ++tries) {
    const std::string text = detail::random_word(r);
    const int face = faces[std::size_t(r.between(0, int(faces.size()) - 1))];
    const double scale = r.uniform(0.35, 1.6);
    const int thickness = r.between(1, 3);
    int baseline = 0;
    const cv::Size size = cv::getTextSize(text, face, scale, thickness, &baseline);
    // The word's box in its own frame: from the top of the capitals to the baseline plus
    // the descenders, half the stroke around it.
    const double half = thickness / 2.0;
    const double bw = size.width + 2 * half, bh = size.height + baseline + 2 * half;
    const bool shear = r.chance(0.25);
    const double angle = shear ? 0 : r.uniform(-o.max_angle, o.max_angle) * (r.chance(0.4) ? 0 : 1);
    const double k = shear ? r.uniform(-0.4, 0.4) : 0;
    // Where its centre goes; a tenth of the words may run off the image.
    const bool off = r.chance(0.1);
    const double cx = off ? r.uniform(0, o.width) : r.uniform(bw / 2, std::max(bw / 2, o.width - bw / 2));
    const double cy = off ? r.uniform(0, o.height) : r.uniform(bh / 2, std::max(bh / 2, o.height - bh / 2));
    // Local (u, v) around the box centre -> image: rotation, or horizontal shear.
    const double a = angle * CV_PI / 180, ca = std::cos(a), sa = std::sin(a);
    auto to_image = [&](double u, double v) {
      return shear ? point{cx + u + k * v, cy + v} : point{cx + ca * u - sa * v, cy + sa * u + ca * v};
    };
    const std::array<point, 4> q{to_image(-bw / 2, -bh / 2), to_image(bw / 2, -bh / 2), to_image(bw / 2, bh / 2),
                                 to_image(-bw / 2, bh / 2)};
    std::vector<cv::Point2f> qf;
    for (const auto& c : q) qf.emplace_back(float(c.x), float(c.y));
    const cv::Rect bound = cv::boundingRect(qf);
    bool overlaps = false;
    for (const auto& t : taken) overlaps = overlaps || (bound & t).area() > 0;
    if (overlaps) continue;
    taken.push_back(bound);
    ++w;

    // Draw the word upright on its own canvas, then map it into place.
    const int cw = int(std::ceil(bw)) + 2, ch = int(std::ceil(bh)) + 2;
    cv::Mat ink = cv::Mat::zeros(ch, cw, CV_8U);
    cv::putText(ink, text, cv::Point(int(std::lround(1 + half)), int(std::lround(1 + half + size.height))), face, scale,
                cv::Scalar(255), thickness, cv::LINE_AA);
    // canvas (x, y) -> local (x + u0, y + v0) around the box's centre (1 + bw / 2,
    // 1 + bh / 2) -> image.
    cv::Mat m;
    const double u0 = -(1 + bw / 2), v0 = -(1 + bh / 2);
    if (shear) {
      m = (cv::Mat_<double>(2, 3) << 1, k, cx + u0 + k * v0, 0, 1, cy + v0);
    } else {
      m = (cv::Mat_<double>(2, 3) << ca, -sa, cx + ca * u0 - sa * v0, sa, ca, cy + sa * u0 + ca * v0);
    }
    cv::Mat placed;
    cv::warpAffine(ink, placed, m, s.image.size(), cv::INTER_LINEAR, cv::BORDER_CONSTANT, cv::Scalar(0));
    cv::max(s.ink, placed, s.ink);
    // A colour that stands out from the background under the word.
    const cv::Scalar under = cv::mean(s.image(bound & cv::Rect(0, 0, o.width, o.height)));
    cv::Scalar colour = detail::random_colour(r);
    for (int t = 0; t < 8 && std::abs(detail::brightness(colour) - detail::brightness(under)) < 90; ++t) {
      colour = detail::random_colour(r);
    }
    if (std::abs(detail::brightness(colour) - detail::brightness(under)) < 90) {
      colour = detail::brightness(under) > 127 ? cv::Scalar(10, 10, 10) : cv::Scalar(245, 245, 245);
    }
    for (int y = 0; y < o.height; ++y) {
      for (int x = 0; x < o.width; ++x) {
        const double alpha = placed.at<std::uint8_t>(y, x) / 255.0;
        if (alpha == 0) continue;
        auto& p = s.image.at<cv::Vec3b>(y, x);
        for (int c = 0; c < 3; ++c) p[c] = cv::saturate_cast<std::uint8_t>(p[c] * (1 - alpha) + colour[c] * alpha);
      }
    }
    text_region reg;
    reg.corners = q;
    const bool inside = bound.x >= 0 && bound.y >= 0 && bound.x + bound.width <= o.width && bound.y + bound.height <= o.height;
    const bool tiny = size.height + baseline < 8;
    reg.transcription = (inside && !tiny) ? text : "###";
    reg.ignored = !inside || tiny;
    s.regions.push_back(reg);
  }
  return s;
}

/// Writes images first .. first + count - 1 of the set made from `seed` to `dir` in the
/// ICDAR 2015 layout (img_N.png, gt_img_N.txt; N from 1), creating it. Corners are
/// rounded to whole pixels, as the format holds them. Throws precis::error when a file
/// cannot be written.
inline void write_synth_set(const std::filesystem::path& dir, std::uint64_t seed, std::size_t first, std::size_t count,
                            const synth_options& o = {}) {
  std::filesystem::create_directories(dir);
  for (std::size_t i = first; i < first + count; ++i) {
    const auto s = synth_image(seed, i, o);
    const auto n = std::to_string(i - first + 1);
    const auto img = dir / ("img_" + n + ".png");
    if (!cv::imwrite(img.string(), s.image)) throw precis::error("dbnet: cannot write " + img.string());
    auto regions = s.regions;
    for (auto& r : regions) {
      for (auto& c : r.corners) c = point{std::round(c.x), std::round(c.y)};
    }
    write_gt(dir / ("gt_img_" + n + ".txt"), regions);
  }
}

}  // namespace dbnet
