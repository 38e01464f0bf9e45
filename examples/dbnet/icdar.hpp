// ICDAR 2015 text-localisation files: ground truth (gt_img_N.txt), results (res_img_N.txt)
// and the directory layout, read and written without OpenCV.
//
//     auto regions = dbnet::parse_gt(text, "gt_img_7.txt");     // one file's content
//     auto set = dbnet::load_icdar_dir("ch4_test_images", "Challenge4_Test_Task1_GT");
//     dbnet::write_gt(dir / "gt_img_7.txt", regions);
//
// A ground-truth line is `x1,y1,x2,y2,x3,y3,x4,y4,transcription`: four corners in pixels
// (whole numbers; the real set's files begin with a UTF-8 byte-order mark and end lines
// with CR LF, both accepted) and the rest of the line as the transcription, commas
// included; `###` marks a region to ignore ("do not care"). A result line is the eight
// coordinates alone. Each of these throws precis::error naming the file and the line:
//   - fewer than eight coordinates, or a coordinate that is not a whole number or lies
//     beyond +-1,000,000;
//   - a row of more than four corners (the fields after the eighth are all whole numbers
//     and there is an even number of them: a polygon, not a quadrilateral);
//   - a NUL byte or a line longer than 64 KiB.
// A quadrilateral of zero area is kept, marked ignored (as DBNet's loaders do).
#pragma once

#include <precis/config.hpp>
#include <precis/io/file.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace dbnet {

/// A pixel position.
struct point {
  double x = 0, y = 0;
  friend bool operator==(const point&, const point&) = default;
};

/// A quadrilateral text region: its corners in the file's order, and its transcription.
struct text_region {
  std::array<point, 4> corners{};
  std::string transcription;
  /// Excluded from training and evaluation: "###", or no area.
  bool ignored = false;
  friend bool operator==(const text_region&, const text_region&) = default;
};

/// Twice the signed area of a polygon (shoelace), positive when the corners run
/// counter-clockwise in a y-up frame.
template <class Points>
double twice_signed_area(const Points& p) {
  double s = 0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const auto& a = p[i];
    const auto& b = p[(i + 1) % p.size()];
    s += a.x * b.y - b.x * a.y;
  }
  return s;
}

/// The largest coordinate accepted, in pixels.
inline constexpr double max_coordinate = 1e6;
/// The longest line accepted, in bytes.
inline constexpr std::size_t max_line_bytes = 1 << 16;

namespace detail {

inline bool parse_whole(std::string_view s, double& out) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  if (s.empty()) return false;
  std::int64_t v = 0;
  const auto* end = s.data() + s.size();
  const auto r = std::from_chars(s.data() + (s.front() == '+' ? 1 : 0), end, v);
  if (r.ec != std::errc() || r.ptr != end) return false;
  out = double(v);
  return true;
}

[[noreturn]] inline void bad_line(const std::string& file, std::size_t line, const std::string& what) {
  throw precis::error("dbnet: " + file + ", line " + std::to_string(line) + ": " + what);
}

/// The lines of `text` without a leading byte-order mark, CR LF endings or empty lines;
/// calls f(line_number, line).
template <class F>
void for_each_line(std::string_view text, const std::string& file, F&& f) {
  if (text.substr(0, 3) == "\xEF\xBB\xBF") text.remove_prefix(3);
  std::size_t number = 0;
  while (!text.empty()) {
    ++number;
    const std::size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    while (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.size() > max_line_bytes) bad_line(file, number, "the line is longer than 64 KiB");
    if (line.find('\0') != std::string_view::npos) bad_line(file, number, "the line holds a NUL byte");
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
    f(number, line);
  }
}

/// Splits off the first eight comma-separated coordinates; the rest (after the eighth
/// comma, or "" when there is none) is returned.
inline std::string_view read_corners(std::string_view line, const std::string& file, std::size_t number,
                                     std::array<point, 4>& corners, bool rest_allowed) {
  for (std::size_t c = 0; c < 8; ++c) {
    const std::size_t comma = line.find(',');
    if (comma == std::string_view::npos && c < 7) {
      bad_line(file, number, "expected 8 coordinates x1,y1,...,x4,y4, found " + std::to_string(c + 1) + " fields");
    }
    const std::string_view field = line.substr(0, comma);
    double v = 0;
    if (!parse_whole(field, v)) {
      bad_line(file, number, "coordinate " + std::to_string(c + 1) + " (\"" + std::string(field.substr(0, 40)) +
                                 "\") is not a whole number");
    }
    if (std::abs(v) > max_coordinate) bad_line(file, number, "coordinate " + std::to_string(c + 1) + " is beyond 1e6");
    (c % 2 == 0 ? corners[c / 2].x : corners[c / 2].y) = v;
    line = comma == std::string_view::npos ? std::string_view{} : line.substr(comma + 1);
    if (comma == std::string_view::npos) break;
  }
  if (!rest_allowed && !line.empty()) {
    // A confidence after the corners is allowed in results; more corners are not.
    double v = 0;
    if (line.find(',') != std::string_view::npos || !parse_whole(line, v)) {
      bad_line(file, number, "expected 8 coordinates and at most a score after them");
    }
  }
  return line;
}

}  // namespace detail

/// The regions of one ground-truth file's content. `file` names it in errors.
inline std::vector<text_region> parse_gt(std::string_view text, const std::string& file) {
  std::vector<text_region> out;
  detail::for_each_line(text, file, [&](std::size_t number, std::string_view line) {
    text_region r;
    const std::string_view rest = detail::read_corners(line, file, number, r.corners, true);
    // More corners: every field after the eighth coordinate a whole number, in pairs.
    std::size_t fields = 0;
    bool all_numbers = !rest.empty();
    for (std::string_view s = rest; all_numbers;) {
      const std::size_t comma = s.find(',');
      double v = 0;
      all_numbers = detail::parse_whole(s.substr(0, comma), v);
      ++fields;
      if (comma == std::string_view::npos) break;
      s.remove_prefix(comma + 1);
    }
    if (all_numbers && fields >= 2 && fields % 2 == 0) {
      detail::bad_line(file, number,
                       "a polygon of " + std::to_string(4 + fields / 2) + " corners, not a quadrilateral");
    }
    r.transcription = std::string(rest);
    r.ignored = r.transcription == "###" || twice_signed_area(r.corners) == 0.0;
    out.push_back(std::move(r));
  });
  return out;
}

/// The quadrilaterals of one result file's content (eight coordinates per line, optionally
/// followed by a score, which is dropped).
inline std::vector<std::array<point, 4>> parse_result(std::string_view text, const std::string& file) {
  std::vector<std::array<point, 4>> out;
  detail::for_each_line(text, file, [&](std::size_t number, std::string_view line) {
    std::array<point, 4> q{};
    detail::read_corners(line, file, number, q, false);
    out.push_back(q);
  });
  return out;
}

/// Coordinates rounded to whole pixels, as the files hold them.
inline std::string format_corners(const std::array<point, 4>& q) {
  std::string s;
  for (std::size_t i = 0; i < 4; ++i) {
    if (i) s += ',';
    s += std::to_string(std::llround(q[i].x));
    s += ',';
    s += std::to_string(std::llround(q[i].y));
  }
  return s;
}

/// A ground-truth file's content (LF line ends, no byte-order mark).
inline std::string format_gt(const std::vector<text_region>& regions) {
  std::string s;
  for (const auto& r : regions) {
    s += format_corners(r.corners);
    s += ',';
    s += r.transcription;
    s += '\n';
  }
  return s;
}

/// A result file's content, as ICDAR's evaluation server takes it.
inline std::string format_result(const std::vector<std::array<point, 4>>& quads) {
  std::string s;
  for (const auto& q : quads) {
    s += format_corners(q);
    s += '\n';
  }
  return s;
}

/// One image of a set and its ground truth.
struct sample {
  std::size_t id = 0;  // N of img_N
  std::filesystem::path image;
  std::vector<text_region> regions;
};

/// N for "img_N.ext" or "gt_img_N.txt" (prefix given), or 0 when the name is not of that form.
inline std::size_t image_number(const std::string& name, std::string_view prefix) {
  if (name.rfind(prefix, 0) != 0) return 0;
  const std::size_t dot = name.find('.', prefix.size());
  if (dot == std::string::npos || dot == prefix.size()) return 0;
  std::size_t n = 0;
  const auto r = std::from_chars(name.data() + prefix.size(), name.data() + dot, n);
  return r.ec == std::errc() && r.ptr == name.data() + dot ? n : 0;
}

/// The images img_N.{jpg,png} of `images` with their gt_img_N.txt from `gt` (the same
/// directory when empty), ordered by N. Throws precis::error when a directory is missing,
/// an image has no ground truth or a ground truth no image, N appears twice, or a file is
/// malformed (see parse_gt). Other files are left alone.
inline std::vector<sample> load_icdar_dir(const std::filesystem::path& images, std::filesystem::path gt = {}) {
  namespace fs = std::filesystem;
  if (gt.empty()) gt = images;
  for (const auto& d : {images, gt}) {
    if (!fs::is_directory(d)) throw precis::error("dbnet: " + d.string() + " is not a directory");
  }
  std::map<std::size_t, fs::path> imgs, gts;
  for (const auto& e : fs::directory_iterator(images)) {
    const std::string name = e.path().filename().string(), ext = e.path().extension().string();
    if (ext != ".jpg" && ext != ".png" && ext != ".JPG" && ext != ".PNG") continue;
    if (const std::size_t n = image_number(name, "img_"); n != 0 && !imgs.emplace(n, e.path()).second) {
      throw precis::error("dbnet: " + images.string() + " holds two images numbered " + std::to_string(n));
    }
  }
  for (const auto& e : fs::directory_iterator(gt)) {
    const std::string name = e.path().filename().string();
    if (e.path().extension() != ".txt") continue;
    if (const std::size_t n = image_number(name, "gt_img_"); n != 0) gts.emplace(n, e.path());
  }
  for (const auto& [n, p] : gts) {
    if (!imgs.count(n)) throw precis::error("dbnet: " + p.string() + " has no image img_" + std::to_string(n) + ".jpg/.png");
  }
  std::vector<sample> out;
  for (const auto& [n, p] : imgs) {
    const auto g = gts.find(n);
    if (g == gts.end()) throw precis::error("dbnet: " + p.string() + " has no ground truth gt_img_" + std::to_string(n) + ".txt");
    out.push_back({n, p, parse_gt(precis::read_file(g->second, "ground truth"), g->second.string())});
  }
  if (out.empty()) throw precis::error("dbnet: " + images.string() + " holds no img_N.jpg or img_N.png");
  return out;
}

/// Writes a ground-truth file atomically.
inline void write_gt(const std::filesystem::path& path, const std::vector<text_region>& regions) {
  precis::write_file_atomically(path, format_gt(regions));
}

}  // namespace dbnet
