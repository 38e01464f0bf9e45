/// @file
/// Per-tensor scaling recipes for float8 tensors.
///
/// A float8 tensor is stored as x * scale, with scale chosen so that the tensor's largest
/// magnitude (amax) lands near the format's max (448 for e4m3, 57344 for e5m2):
/// scale = max / amax / 2^margin.
#pragma once

#include <precis/config.hpp>
#include <precis/numeric/float8.hpp>
#include <precis/numeric/format_traits.hpp>
#include <precis/scaling/reducer.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace precis {

/// Which amax a delayed-scaling recipe scales by.
enum class amax_algorithm {
  max,          ///< the largest amax in the history (the default)
  most_recent,  ///< the latest amax
};

/// Options of delayed_scaling.
struct delayed_scaling_options {
  std::uint32_t history_length = 1024;  ///< amax values kept
  amax_algorithm algorithm = amax_algorithm::max;  ///< which amax of the history to use
  std::int32_t margin = 0;  ///< scale = max / amax / 2^margin
};

namespace detail {
template <class Format>
constexpr float fp8_max() {
  static_assert(std::is_same_v<Format, float8_e4m3> || std::is_same_v<Format, float8_e5m2>,
                "precis: float8 scaling recipes are for float8_e4m3 and float8_e5m2");
  return float(format_traits<Format>::max());
}
/// The scale that maps amax to fmax / 2^margin (host and device).
PRECIS_HOST_DEVICE float scale_from_amax(float fmax, float amax, std::int32_t margin, float previous) {
#if PRECIS_DEVICE_CODE
  using ::isfinite;
  const auto ldexp = [](float v, int e) { return ::ldexpf(v, e); };
#else
  using std::isfinite;
  const auto ldexp = [](float v, int e) { return std::ldexp(v, e); };
#endif
  // A zero or non-finite amax says nothing about the range: keep the previous scale.
  if (!(amax > 0.0f) || !isfinite(amax)) return previous;
  const float s = ldexp(fmax / amax, -margin);
  return isfinite(s) && s > 0.0f ? s : previous;
}
}  // namespace detail

/// Delayed scaling for one tensor in `Format`: the scale for the next step comes from the
/// history of past amax values (its max, or the most recent), so no pass over the tensor
/// is needed before casting it. A zero or non-finite amax is not recorded and keeps the
/// previous scale.
template <class Format, reducer Reducer = single_process>
class delayed_scaling {
 public:
  /// The kind a checkpoint records (precis::save_state).
  static constexpr std::string_view kind = "delayed_scaling";
  /// The float8 format the tensor is cast to: float8_e4m3 or float8_e5m2.
  using format = Format;

  /// A recipe with scale 1 and an empty history; `r` agrees amaxes across processes.
  /// Throws precis::error when `o.history_length` is 0.
  explicit delayed_scaling(delayed_scaling_options o = {}, Reducer r = {})
      : options_(o), reducer_(std::move(r)), history_(o.history_length, 0.0f) {
    if (o.history_length == 0) throw error("precis::delayed_scaling: history_length must be at least 1");
  }

  /// Multiply by this before casting to Format.
  float scale() const { return scale_; }
  /// Multiply by this after reading Format values.
  float inverse_scale() const { return 1.0f / scale_; }
  /// The amax values recorded, oldest first.
  std::vector<float> amax_history() const {
    std::vector<float> h;
    const std::uint32_t n = std::min(recorded_, options_.history_length);
    for (std::uint32_t i = 0; i < n; ++i) {
      h.push_back(history_[(next_ + options_.history_length - n + i) % options_.history_length]);
    }
    return h;
  }
  /// The options in force (those given, or those a loaded checkpoint holds).
  const delayed_scaling_options& options() const { return options_; }
  /// Replaces the reducer the amaxes are agreed through (the recorded state is kept).
  void set_reducer(Reducer r) { reducer_ = std::move(r); }

  /// Records this step's amax of the tensor (reduced across processes) and computes the
  /// scale for the next step.
  void update(float local_amax) {
    float amax[1] = {local_amax};
    reducer_.max(std::span<float>(amax));
    if (amax[0] > 0.0f && std::isfinite(amax[0])) {
      history_[next_] = amax[0];
      next_ = (next_ + 1) % options_.history_length;
      ++recorded_;
    }
    float reference = 0.0f;
    if (recorded_ > 0) {
      if (options_.algorithm == amax_algorithm::max) {
        reference = *std::max_element(history_.begin(), history_.end());
      } else {
        reference = history_[(next_ + options_.history_length - 1) % options_.history_length];
      }
    }
    scale_ = detail::scale_from_amax(detail::fp8_max<Format>(), reference, options_.margin, scale_);
  }

  /// Visits the state for precis::save_state and precis::load_state: the scale, the
  /// options, the history position and count, and the amax history.
  template <class Archive>
  void visit_state(Archive& a) {
    a.field("scale", scale_);
    a.field("history_length", options_.history_length);
    auto algo = static_cast<std::uint32_t>(options_.algorithm);
    a.field("algorithm", algo);
    options_.algorithm = static_cast<amax_algorithm>(algo);
    auto margin = static_cast<std::uint32_t>(options_.margin);
    a.field("margin", margin);
    options_.margin = static_cast<std::int32_t>(margin);
    a.field("next", next_);
    a.field("recorded", recorded_);
    a.floats("amax_history", history_);
  }

  /// Empty when the state is consistent; otherwise what is wrong.
  std::string validate() const {
    if (options_.history_length == 0) return "history_length must be at least 1";
    if (history_.size() != options_.history_length) return "the amax history does not have history_length entries";
    if (next_ >= options_.history_length) return "the history position lies outside the history";
    if (static_cast<std::uint32_t>(options_.algorithm) > 1) return "algorithm is not a known amax algorithm";
    if (!(scale_ > 0.0f) || !std::isfinite(scale_)) return "the scale must be finite and positive";
    for (float v : history_) {
      if (!(v >= 0.0f) || !std::isfinite(v)) return "the amax history holds a negative or non-finite value";
    }
    return {};
  }

 private:
  delayed_scaling_options options_;
  Reducer reducer_;
  float scale_ = 1.0f;
  std::vector<float> history_;
  std::uint32_t next_ = 0;
  std::uint32_t recorded_ = 0;
};

/// Current scaling for one tensor in `Format`: the scale comes from this step's amax,
/// measured just before the cast.
template <class Format, reducer Reducer = single_process>
class current_scaling {
 public:
  /// The kind a checkpoint records (precis::save_state).
  static constexpr std::string_view kind = "current_scaling";
  /// The float8 format the tensor is cast to: float8_e4m3 or float8_e5m2.
  using format = Format;

  /// A recipe with scale 1; the scale is max / amax / 2^`margin`, and `r` agrees amaxes
  /// across processes.
  explicit current_scaling(std::int32_t margin = 0, Reducer r = {})
      : margin_(margin), reducer_(std::move(r)) {}

  /// Multiply by this before casting to Format.
  float scale() const { return scale_; }
  /// Multiply by this after reading Format values.
  float inverse_scale() const { return 1.0f / scale_; }
  /// Replaces the reducer the amaxes are agreed through.
  void set_reducer(Reducer r) { reducer_ = std::move(r); }

  /// Sets the scale from this step's amax (reduced across processes).
  void update(float local_amax) {
    float amax[1] = {local_amax};
    reducer_.max(std::span<float>(amax));
    scale_ = detail::scale_from_amax(detail::fp8_max<Format>(), amax[0], margin_, scale_);
  }

  /// Visits the state for precis::save_state and precis::load_state: the scale and the
  /// margin.
  template <class Archive>
  void visit_state(Archive& a) {
    a.field("scale", scale_);
    auto margin = static_cast<std::uint32_t>(margin_);
    a.field("margin", margin);
    margin_ = static_cast<std::int32_t>(margin);
  }
  /// Empty when the scale is finite and positive; otherwise what is wrong.
  std::string validate() const {
    if (!(scale_ > 0.0f) || !std::isfinite(scale_)) return "the scale must be finite and positive";
    return {};
  }

 private:
  std::int32_t margin_;
  Reducer reducer_;
  float scale_ = 1.0f;
};

}  // namespace precis
