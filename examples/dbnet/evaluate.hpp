// The ICDAR 2015 text-localisation protocol (Robust Reading Competition, Challenge 4
// task 1), as its evaluation script defines it:
//
//   - a detection is "do not care" when more than half of its area lies inside one `###`
//     region; `###` regions and such detections count for nothing. (Only `###` decides:
//     the regions training ignores for their size or area are evaluated, as the protocol
//     has it.)
//   - matching is one-to-one and greedy in ground-truth order: each cared-for region takes
//     the first unmatched cared-for detection (in the detections' order) whose IoU with it
//     exceeds 0.5;
//   - over a set: recall = matches / cared-for regions, precision = matches / cared-for
//     detections (0 when there are none), H-mean = 2 P R / (P + R) (0 when both are 0).
//
// Areas and intersections come from Clipper on whole-pixel corners (ICDAR's coordinates
// are whole numbers).
#pragma once

#include "icdar.hpp"

#include <polyclipping/clipper.hpp>

#include <array>
#include <cmath>
#include <cstddef>
#include <vector>

namespace dbnet {

/// Matches and the counts they are divided by, for one image or summed over a set.
struct match_counts {
  std::size_t regions = 0;     // cared-for ground-truth regions
  std::size_t detections = 0;  // cared-for detections
  std::size_t matched = 0;
  match_counts& operator+=(const match_counts& o) {
    regions += o.regions;
    detections += o.detections;
    matched += o.matched;
    return *this;
  }
};

/// Precision, recall and H-mean of a set.
struct detection_scores {
  double precision = 0, recall = 0, hmean = 0;
};

namespace detail {

inline ClipperLib::Path clipper_path(const std::array<point, 4>& q) {
  ClipperLib::Path p;
  for (const auto& c : q) p.emplace_back(ClipperLib::cInt(std::llround(c.x)), ClipperLib::cInt(std::llround(c.y)));
  return p;
}

inline double area_of(const ClipperLib::Paths& ps) {
  double a = 0;
  for (const auto& p : ps) a += ClipperLib::Area(p);
  return std::abs(a);
}

}  // namespace detail

/// The area of a quadrilateral (as Clipper fills it: self-intersecting corners give the
/// area of the filled parts).
inline double quad_area(const std::array<point, 4>& q) {
  ClipperLib::Clipper c;
  c.AddPath(detail::clipper_path(q), ClipperLib::ptSubject, true);
  ClipperLib::Paths out;
  c.Execute(ClipperLib::ctUnion, out, ClipperLib::pftNonZero, ClipperLib::pftNonZero);
  return detail::area_of(out);
}

/// The area common to two quadrilaterals.
inline double intersection_area(const std::array<point, 4>& a, const std::array<point, 4>& b) {
  ClipperLib::Clipper c;
  c.AddPath(detail::clipper_path(a), ClipperLib::ptSubject, true);
  c.AddPath(detail::clipper_path(b), ClipperLib::ptClip, true);
  ClipperLib::Paths out;
  c.Execute(ClipperLib::ctIntersection, out, ClipperLib::pftNonZero, ClipperLib::pftNonZero);
  return detail::area_of(out);
}

/// Intersection over union (0 when the union is empty).
inline double iou(const std::array<point, 4>& a, const std::array<point, 4>& b) {
  const double i = intersection_area(a, b), u = quad_area(a) + quad_area(b) - i;
  return u > 0 ? i / u : 0;
}

/// True for a region the protocol does not count: transcription `###`.
inline bool dont_care(const text_region& t) { return t.transcription == "###"; }

/// One image's matches under the protocol (see the file comment).
inline match_counts match_image(const std::vector<text_region>& truth, const std::vector<std::array<point, 4>>& found) {
  std::vector<bool> det_ignored(found.size(), false);
  for (std::size_t d = 0; d < found.size(); ++d) {
    const double area = quad_area(found[d]);
    for (const auto& t : truth) {
      if (dont_care(t) && area > 0 && intersection_area(t.corners, found[d]) / area > 0.5) {
        det_ignored[d] = true;
        break;
      }
    }
  }
  match_counts m;
  for (const auto& t : truth) m.regions += dont_care(t) ? 0U : 1U;
  for (std::size_t d = 0; d < found.size(); ++d) m.detections += det_ignored[d] ? 0U : 1U;
  std::vector<bool> taken(found.size(), false);
  for (const auto& t : truth) {
    if (dont_care(t)) continue;
    for (std::size_t d = 0; d < found.size(); ++d) {
      if (taken[d] || det_ignored[d]) continue;
      if (iou(t.corners, found[d]) > 0.5) {
        taken[d] = true;
        ++m.matched;
        break;
      }
    }
  }
  return m;
}

/// Precision, recall and H-mean from counts summed over a set.
inline detection_scores scores_of(const match_counts& m) {
  detection_scores s;
  s.recall = m.regions ? double(m.matched) / double(m.regions) : 0.0;
  s.precision = m.detections ? double(m.matched) / double(m.detections) : 0.0;
  s.hmean = s.precision + s.recall > 0 ? 2 * s.precision * s.recall / (s.precision + s.recall) : 0.0;
  return s;
}

}  // namespace dbnet
