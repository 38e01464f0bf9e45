/// @file
/// A policy map, as C++ source, from a monitored run.
///
///     precis::diagnostics::monitor mon;
///     ... train in float (or under any map) with trainer.step(ctx, x, y, mon) ...
///     precis::write_file_atomically("advised_map.hpp", precis::diagnostics::advise(mon));
///
/// For each layer the advisor picks the narrowest candidate that holds what was measured,
/// in the order float16, bfloat16, float:
///
///   float16   the amax of what the layer reads and gives (a layer stores both in its type)
///             times `headroom` is within 65504, and at the loss scale a
///             float16 run would train at (the largest power of two up to 2^16 that keeps
///             every measured gradient within 65504, or options.loss_scale) at most
///             `max_zero_fraction` of its input and parameter gradients round to zero;
///   bfloat16  the same against bfloat16's range, gradients unscaled;
///   float     otherwise (also where non-finite values were measured).
///
/// Layers that share a tag share its advice (the widest of theirs). Layers with nn::tags'
/// positional tags can only be overridden by operation kind (for_op). The most common
/// advice becomes the map's default; every other choice is an override, with the measured
/// reason as a comment on its line. Every named tag also gets its measured range declared
/// (precis::measured_max_abs: the amax times the headroom), so rule d refuses a later map
/// that stores the layer in a type that cannot hold it.
///
/// The header names tags by their C++ names: include it after the tags are declared and
/// before anything asks for their policies. Tags in an anonymous namespace or local to a
/// function cannot be named from it; advise() throws precis::error for them.
#pragma once

#include <precis/config.hpp>
#include <precis/diagnostics/monitor.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace precis::diagnostics {

/// Options of advise().
struct advice_options {
  /// A format must hold the measured amax times this (2^4: room for growth in training).
  double headroom = 16.0;
  /// The largest share of a layer's gradients allowed to round to zero in its format.
  double max_zero_fraction = 1e-3;
  /// The loss scale float16 gradients are judged at; 0: the scale a dynamic scaler would
  /// settle near (see the file comment).
  double loss_scale = 0.0;
  /// The name of the map the header defines.
  std::string map_name = "advised_map";
  /// A line for the header's first comment (say how the run was made); "" for none.
  std::string note = {};
};

/// The advisor's choice for a layer.
enum class choice { float16, bfloat16, float32 };

/// The type a choice stands for, as C++ spells it: "float16", "bfloat16" or "float".
constexpr std::string_view choice_name(choice c) {
  return c == choice::float16 ? "float16" : c == choice::bfloat16 ? "bfloat16" : "float";
}

/// The advice for one layer (or one product of an attention layer).
struct layer_advice {
  std::string path;               ///< the layer's path in the model ("" for a root layer)
  std::string tag;                ///< its tag as describe prints it
  choice pick = choice::float32;  ///< the narrowest candidate that holds what was measured
  std::string reason;             ///< "forward amax 1.9e+05 x 16 > float16 max 65504 -> bfloat16"
};

namespace detail {

inline std::string short_number(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.5g", v);
  return b;
}

inline std::string scale_string(double s) {
  const int e = std::ilogb(s);
  return std::ldexp(1.0, e) == s ? std::string("2^") + std::to_string(e) : short_number(s);
}

/// The loss scale float16 gradients are judged at.
inline double judged_scale(const monitor& m, const advice_options& o) {
  if (o.loss_scale > 0.0) return o.loss_scale;
  double g = 0.0;
  for (const auto& r : m.layers()) g = std::max({g, r.input_grad.amax, r.param_grad.amax});
  const double fp16_max = range_of(format::float16).max;
  double s = 65536.0;
  while (g * s > fp16_max && s > 0x1p-64) s /= 2.0;
  return s;
}

inline layer_advice advise_one(const layer_record& r, const advice_options& o, double scale) {
  layer_advice a{r.path, r.tag, choice::float32, {}};
  const bool by_input = r.input.amax > r.output.amax;
  const double range = std::max(r.input.amax, r.output.amax);
  const std::string amax = std::string(by_input ? "input amax " : "forward amax ") +
                           short_number(range) + " x " + short_number(o.headroom);
  if (r.observations == 0) {
    a.reason = "not observed -> float";
    return a;
  }
  if (r.input.nonfinite + r.output.nonfinite + r.input_grad.nonfinite + r.param_grad.nonfinite !=
      0) {
    a.reason = "non-finite values measured -> float";
    return a;
  }
  const auto zero_share = [&](format f, double s) {
    return std::max(r.input_grad.zero_fraction(f, s), r.param_grad.zero_fraction(f, s));
  };
  const double need = range * o.headroom;
  const auto f16 = range_of(format::float16), bf16 = range_of(format::bfloat16);
  const double z16 = zero_share(format::float16, scale);
  if (need <= f16.max && r.declared_max_abs <= f16.max && z16 <= o.max_zero_fraction) {
    a.pick = choice::float16;
    a.reason = amax + " <= " + short_number(f16.max) + ", " + short_number(100.0 * z16) +
               std::string("% of gradients round to zero at loss scale ") + scale_string(scale) +
               " -> float16";
    return a;
  }
  std::string why16 =
      need > f16.max ? amax + " > float16 max " + short_number(f16.max)
      : r.declared_max_abs > f16.max
          ? std::string("declared max_abs ") + short_number(r.declared_max_abs) + " > float16 max"
          : short_number(100.0 * z16) + "% of gradients round to zero in float16 at loss scale " +
                scale_string(scale);
  const double zb = zero_share(format::bfloat16, 1.0);
  if (need <= bf16.max && zb <= o.max_zero_fraction) {
    a.pick = choice::bfloat16;
    a.reason = why16 + " -> bfloat16";
    return a;
  }
  a.reason =
      why16 + "; " +
      (need > bf16.max ? amax + " > bfloat16 max"
                       : short_number(100.0 * zb) + "% of gradients round to zero in bfloat16") +
      " -> float";
  return a;
}

/// The policy a choice is spelled as for an operation kind (kinds under rule c compute in
/// float whatever they store).
inline std::string policy_source(choice c, bool fp32_rule) {
  switch (c) {
    case choice::float16:
      return fp32_rule ? "precis::policy<precis::float16, float, float, float>"
                       : "precis::presets::fp16_mixed";
    case choice::bfloat16:
      return fp32_rule ? "precis::policy<precis::bfloat16, float, float, float>"
                       : "precis::presets::bf16_mixed";
    case choice::float32: return "precis::presets::fp32";
  }
  return {};
}

inline void check_nameable(const std::string& tag_type) {
  if (tag_type.find("anonymous") != std::string::npos || tag_type.find('(') != std::string::npos) {
    throw error(
        std::string("precis::diagnostics::advise: the tag ") + tag_type +
        " cannot be named from another file (anonymous namespace or local class); declare it in a "
        "named namespace");
  }
}

}  // namespace detail

/// The advice for every layer the monitor saw, in its order (see the file comment).
inline std::vector<layer_advice> advise_layers(const monitor& m, const advice_options& o = {}) {
  if (!(o.headroom >= 1.0)) throw error("precis::diagnostics::advise: headroom must be at least 1");
  if (!(o.max_zero_fraction >= 0.0 && o.max_zero_fraction <= 1.0))
    throw error("precis::diagnostics::advise: max_zero_fraction must be in [0, 1]");
  const double scale = detail::judged_scale(m, o);
  std::vector<layer_advice> out;
  for (const auto& r : m.layers()) out.push_back(detail::advise_one(r, o, scale));
  return out;
}

/// A header defining `inline constexpr auto <map_name>` (a precis::policy_map) and the
/// measured ranges of the named tags, with the reasons as comments (see the file comment).
/// Throws precis::error when the monitor saw nothing or a tag cannot be named.
inline std::string advise(const monitor& m, const advice_options& o = {}) {
  if (m.layers().empty()) throw error("precis::diagnostics::advise: the monitor observed no layer");
  const auto advice = advise_layers(m, o);
  const auto& records = m.layers();

  // Groups: a named tag, or an operation kind for positional tags. The widest advice wins.
  struct group {
    bool positional = false;
    std::string key;  // tag type, or op type
    bool fp32_rule = false;
    choice pick = choice::float16;
    std::size_t decisive = 0;  // the record whose advice decided
    double amax = 0.0;
    std::vector<std::size_t> members;
  };
  std::vector<group> groups;
  std::map<std::string, std::size_t> by_key;
  for (std::size_t i = 0; i < records.size(); ++i) {
    const auto& r = records[i];
    const std::string key = (r.positional ? "op:" : "tag:") + (r.positional ? r.op : r.tag_type);
    auto [it, fresh] = by_key.emplace(key, groups.size());
    if (fresh)
      groups.push_back({r.positional,
                        r.positional ? r.op : r.tag_type,
                        r.fp32_rule,
                        advice[i].pick,
                        i,
                        0.0,
                        {}});
    group& g = groups[it->second];
    if (!r.positional) detail::check_nameable(r.tag_type);
    if (int(advice[i].pick) > int(g.pick)) {
      g.pick = advice[i].pick;
      g.decisive = i;
    }
    g.amax = std::max({g.amax, r.output.amax, r.input.amax});
    g.members.push_back(i);
  }

  // The default: the choice of most groups (the narrower on a tie).
  std::array<int, 3> votes{};
  for (const auto& g : groups) ++votes[std::size_t(g.pick)];
  const choice fallback = choice(std::max_element(votes.begin(), votes.end()) - votes.begin());

  std::map<std::string, choice> op_choice;  // op type -> override
  for (const auto& g : groups) {
    if (g.positional && g.pick != fallback) op_choice[g.key] = g.pick;
  }

  std::string h;
  if (!o.note.empty()) {
    if (o.note.find('\n') != std::string::npos)
      throw error("precis::diagnostics::advise: the note must be one line");
    h += "// " + o.note + "\n";
  }
  h += "// A precis policy map advised by precis::diagnostics::advise from a monitored run: " +
       std::to_string(m.series().size()) + " observed steps, headroom x" +
       detail::short_number(o.headroom) + std::string(", at most ") +
       detail::short_number(100.0 * o.max_zero_fraction) +
       "% of a layer's gradients rounding to zero, float16 gradients judged at loss scale " +
       detail::scale_string(detail::judged_scale(m, o)) +
       ".\n// Include it after the model's layer tags are declared, before any model is built with "
       "them.\n"
       "// Layers:\n";
  for (std::size_t i = 0; i < records.size(); ++i) {
    h += std::string("//   ") + nn::path_or_root(records[i].path) + " (" + records[i].tag +
         "): " + advice[i].reason + "\n";
  }
  h += "#pragma once\n\n#include <precis/policy/policy.hpp>\n\n";

  // Measured ranges of the named tags.
  for (const auto& g : groups) {
    if (g.positional) continue;
    const double bound = std::ceil(g.amax * o.headroom);
    if (!(bound < 1.8e19)) {
      h += std::string("// ") + g.key + ": no measured_max_abs (the range " +
           detail::short_number(bound) + " exceeds what max_abs<> takes)\n";
      continue;
    }
    char b[32];
    std::snprintf(b, sizeof b, "%.0f", std::max(bound, 1.0));
    h += std::string("template <>\nstruct precis::measured_max_abs<::") + g.key +
         "> {\n  using type = precis::max_abs<" + b + std::string("ULL>;  // measured amax ") +
         detail::short_number(g.amax) + " x " + detail::short_number(o.headroom) + "\n};\n";
  }

  h += std::string("\ninline constexpr auto ") + o.map_name + " = precis::make_policy_map(\n";
  std::vector<std::string> lines;
  lines.push_back(std::string("    ") + detail::policy_source(fallback, false) +
                  "{}  // default: " + std::string(choice_name(fallback)) + ", the advice of " +
                  std::to_string(votes[std::size_t(fallback)]) + " of " +
                  std::to_string(groups.size()) + " tags and positional kinds");
  for (const auto& g : groups) {
    if (!g.positional) continue;
    const auto it = op_choice.find(g.key);
    if (it == op_choice.end()) continue;
    const auto& r = records[g.decisive];
    lines.push_back(std::string("    precis::for_op<::") + g.key + ">(" +
                    detail::policy_source(g.pick, g.fp32_rule) + "{})  // " +
                    nn::path_or_root(r.path) + ": " + advice[g.decisive].reason);
  }
  for (const auto& g : groups) {
    if (g.positional) continue;
    const auto& r = records[g.decisive];
    const auto it = op_choice.find(r.op);
    const choice effective = it == op_choice.end() ? fallback : it->second;
    if (g.pick == effective) continue;
    lines.push_back(std::string("    precis::for_layer<::") + g.key + ">(" +
                    detail::policy_source(g.pick, g.fp32_rule) + "{})  // " +
                    nn::path_or_root(r.path) + ": " + advice[g.decisive].reason);
  }
  for (std::size_t i = 0; i < lines.size(); ++i) {
    // The comma goes before the comment.
    const auto c = lines[i].find("  // ");
    h += lines[i].substr(0, c) + (i + 1 < lines.size() ? "," : "") + lines[i].substr(c) + "\n";
  }
  h += ");\n";
  return h;
}

}  // namespace precis::diagnostics
