/// @file
/// Measured ranges per layer, and where the first non-finite value came from.
///
///     precis::diagnostics::monitor mon({.every = 100});
///     for (...) trainer.step(ctx, x, labels, mon);   // the monitored overload of step()
///     std::puts(mon.table().c_str());
///     write_file("ranges.csv", mon.csv());
///
/// The monitor is chosen by type where training runs: nn::trainer::step(ctx, batches,
/// monitor) reads the model's buffers after the step's passes; nn::trainer::step(ctx,
/// batches) is the same code with every monitor call compiled out (no branch, no extra
/// pass). On an observed step (the scaler's step count a multiple of `every`) it reads, for
/// every layer and every product of an attention layer (by path and tag):
///
///   - what it read (its first input) and its forward output, as stored; a sum of branches
///     (nn::residual) counts as an output of the layer whose type stores it;
///   - the input gradient(s) the layer gave, as computed (scaled by the loss scale) and as
///     the true gradient (divided by it);
///   - the gradients of its parameters, likewise (after the step's last micro-batch).
///
/// For each it keeps the largest finite magnitude, counts of zeros and non-finite values,
/// the share of values that overflow each candidate format (float16, bfloat16,
/// float8_e4m3, float8_e5m2: |v| > the format's max) and a histogram of their binary
/// exponents, from which the shares that would become subnormal or round to zero in each
/// format follow, at the scale they were measured at or at any power-of-two loss scale
/// (what precis::diagnostics::advise uses). Every observed step also adds a row to the
/// amax series (series_csv, gnuplot_script).
///
/// Non-finite values: the first one met (step, layer, forward or backward) is kept. When a
/// step is skipped because a gradient was not finite, the monitor reads the buffers whether
/// or not the step was due and records which layer produced the first non-finite value:
/// the first layer in forward order whose output is not finite, else the last in forward
/// order (the first the backward pass reached) whose input gradient is not finite, else
/// the first parameter gradient. With several micro-batches, the buffers are those of the
/// last one.
///
/// Host models only (nn::build for cpu_context).
#pragma once

#include <precis/config.hpp>
#include <precis/nn/build.hpp>
#include <precis/numeric/bfloat16.hpp>
#include <precis/numeric/convert.hpp>
#include <precis/numeric/float16.hpp>
#include <precis/numeric/float8.hpp>
#include <precis/policy/describe.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace precis::diagnostics {

/// The formats the monitor measures values against.
enum class format { float16, bfloat16, float8_e4m3, float8_e5m2 };
/// Every format, in the order the per-format counts (value_stats::overflows) use.
inline constexpr std::array<format, 4> all_formats{format::float16, format::bfloat16,
                                                   format::float8_e4m3, format::float8_e5m2};

/// What a format holds: its largest finite value, and the binary exponents of its
/// smallest normal and smallest subnormal values (2^min_normal_exponent,
/// 2^min_subnormal_exponent).
struct format_range {
  std::string_view name;       ///< the format's name ("float16", "float8_e4m3")
  double max;                  ///< its largest finite value
  int min_normal_exponent;     ///< the binary exponent of its smallest normal value
  int min_subnormal_exponent;  ///< the binary exponent of its smallest subnormal value
};

namespace detail {
template <class T>
constexpr format_range range_of_type(std::string_view name) {
  using tr = format_traits<T>;
  const int min_normal = 1 - tr::exponent_bias;
  return {name, double(float(tr::max())), min_normal, min_normal - tr::mantissa_bits};
}
}  // namespace detail

/// The range of `f`, from precis's format traits.
constexpr format_range range_of(format f) {
  switch (f) {
    case format::float16: return detail::range_of_type<float16>("float16");
    case format::bfloat16: return detail::range_of_type<bfloat16>("bfloat16");
    case format::float8_e4m3: return detail::range_of_type<float8_e4m3>("float8_e4m3");
    case format::float8_e5m2: return detail::range_of_type<float8_e5m2>("float8_e5m2");
  }
  return {};
}

/// A histogram of binary exponents: bin e counts the values v with 2^e <= |v| < 2^(e+1),
/// for e in [lowest, highest] (values beyond land in the end bins).
class exponent_histogram {
 public:
  static constexpr int lowest = -256;  ///< the exponent of the first bin
  static constexpr int highest = 255;  ///< the exponent of the last bin

  /// Counts `count` values with exponent e (clamped to [lowest, highest]).
  void add(int e, std::uint64_t count = 1) { bins_[index(e)] += count; }
  /// Adds the counts of another histogram.
  void merge(const exponent_histogram& o) {
    for (std::size_t i = 0; i < bins_.size(); ++i) bins_[i] += o.bins_[i];
  }
  /// Values with exponent below e (|v| < 2^e).
  std::uint64_t below(int e) const {
    std::uint64_t n = 0;
    for (int i = lowest; i < std::min(e, highest + 1); ++i) n += bins_[index(i)];
    return n;
  }
  /// All values counted.
  std::uint64_t total() const {
    std::uint64_t n = 0;
    for (auto b : bins_) n += b;
    return n;
  }

 private:
  static std::size_t index(int e) { return std::size_t(std::clamp(e, lowest, highest) - lowest); }
  std::array<std::uint64_t, std::size_t(highest - lowest + 1)> bins_{};
};

/// Magnitudes of a set of values (see the file comment). Fractions are of all values seen.
struct value_stats {
  std::uint64_t values = 0;                  ///< values seen
  std::uint64_t zeros = 0;                   ///< exactly zero
  std::uint64_t nonfinite = 0;               ///< infinite or NaN
  double amax = 0.0;                         ///< largest finite magnitude
  exponent_histogram exponents;              ///< binary exponents of the finite nonzero values
  std::array<std::uint64_t, 4> overflows{};  ///< per format (all_formats' order): |v| > its max

  /// Adds one value (as a double: exact for every element type).
  void add(double v) {
    ++values;
    const double a = std::fabs(v);
    if (!(a <= 1.7976931348623157e308)) {
      ++nonfinite;
      return;
    }
    if (a == 0.0) {
      ++zeros;
      return;
    }
    amax = std::max(amax, a);
    // The binary exponent from the bits (double subnormals land in the lowest bin).
    exponents.add(int((std::bit_cast<std::uint64_t>(a) >> 52) & 0x7ff) - 1023);
    for (std::size_t f = 0; f < all_formats.size(); ++f)
      overflows[f] += std::uint64_t(a > maxima[f]);
  }
  /// Adds the counts of another set (the amax is the larger of the two).
  void merge(const value_stats& o) {
    values += o.values;
    zeros += o.zeros;
    nonfinite += o.nonfinite;
    amax = std::max(amax, o.amax);
    exponents.merge(o.exponents);
    for (std::size_t f = 0; f < overflows.size(); ++f) overflows[f] += o.overflows[f];
  }
  /// Share of the values beyond f's max (they become infinite, or saturate in float8_e4m3).
  double overflow_fraction(format f) const { return share(overflows[std::size_t(f)]); }
  /// Share of the values that, multiplied by `scale` (a power of two), round to zero in f:
  /// nonzero and below half its smallest subnormal.
  double zero_fraction(format f, double scale = 1.0) const {
    return share(exponents.below(range_of(f).min_subnormal_exponent - 1 - shift(scale)));
  }
  /// Share of the values that, multiplied by `scale`, land in f's subnormal range (kept,
  /// with fewer significant bits) or round up to its smallest subnormal.
  double subnormal_fraction(format f, double scale = 1.0) const {
    const int s = shift(scale);
    const auto r = range_of(f);
    return share(exponents.below(r.min_normal_exponent - s) -
                 exponents.below(r.min_subnormal_exponent - 1 - s));
  }

 private:
  static constexpr std::array<double, 4> maxima{
      range_of(all_formats[0]).max, range_of(all_formats[1]).max, range_of(all_formats[2]).max,
      range_of(all_formats[3]).max};
  static int shift(double scale) {
    return scale > 0.0 && std::isfinite(scale) ? std::ilogb(scale) : 0;
  }
  double share(std::uint64_t n) const { return values == 0 ? 0.0 : double(n) / double(values); }
};

namespace detail {

/// The largest float not above t (t >= 0): for a float a, a > t exactly when a > it.
inline float float_below(double t) {
  if (!(t < 3.4028234663852886e38)) return 3.4028234663852886e38f;
  float d = static_cast<float>(t);
  if (double(d) > t) d = std::nextafter(d, 0.0f);
  return d;
}

/// Adds the floats v[0, n) to `stored` and, when `unscaled` is given, the same values
/// divided by `scale` to it: in one pass over the bit patterns (magnitudes compare as
/// unsigned integers), the unscaled histogram shifted from the stored one where `scale`
/// is a power of two (a second pass where it is not).
inline void scan_floats(const float* v, std::size_t n, double scale, value_stats& stored,
                        value_stats* unscaled) {
  std::array<std::uint32_t, 4> limit{}, limit_unscaled{};
  for (std::size_t f = 0; f < 4; ++f) {
    const double m = range_of(all_formats[f]).max;
    limit[f] = std::bit_cast<std::uint32_t>(float_below(m));
    limit_unscaled[f] = std::bit_cast<std::uint32_t>(float_below(m * scale));
  }
  std::array<std::uint64_t, 256> hist{};
  std::array<std::uint64_t, 4> over{}, over_unscaled{};
  std::uint64_t zeros = 0, nonfinite = 0;
  std::uint32_t amax = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t b = std::bit_cast<std::uint32_t>(v[i]) & 0x7fffffffu;
    if (b >= 0x7f800000u) {
      ++nonfinite;
      continue;
    }
    if (b == 0) {
      ++zeros;
      continue;
    }
    amax = std::max(amax, b);
    ++hist[b >> 23];
    for (std::size_t f = 0; f < 4; ++f) {
      over[f] += std::uint64_t(b > limit[f]);
      over_unscaled[f] += std::uint64_t(b > limit_unscaled[f]);
    }
  }
  // Float subnormals (bin 0): their exponents from the leading bit.
  std::array<std::uint64_t, 23> sub{};
  if (hist[0] != 0) {
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t b = std::bit_cast<std::uint32_t>(v[i]) & 0x7fffffffu;
      if (b != 0 && b < 0x00800000u) ++sub[std::size_t(31 - std::countl_zero(b))];
    }
  }
  const auto fill = [&](value_stats& s, int shift, double divide_by,
                        const std::array<std::uint64_t, 4>& o) {
    s.values += n;
    s.zeros += zeros;
    s.nonfinite += nonfinite;
    s.amax = std::max(s.amax, double(std::bit_cast<float>(amax)) / divide_by);
    for (int e = 1; e < 255; ++e) {
      if (hist[std::size_t(e)] != 0) s.exponents.add(e - 127 - shift, hist[std::size_t(e)]);
    }
    for (int k = 0; k < 23; ++k) {
      if (sub[std::size_t(k)] != 0) s.exponents.add(k - 149 - shift, sub[std::size_t(k)]);
    }
    for (std::size_t f = 0; f < 4; ++f) s.overflows[f] += o[f];
  };
  fill(stored, 0, 1.0, over);
  if (unscaled == nullptr) return;
  const int k = scale > 0.0 && std::isfinite(scale) ? std::ilogb(scale) : 0;
  if (scale > 0.0 && std::ldexp(1.0, k) == scale) {
    fill(*unscaled, k, scale, over_unscaled);
  } else {
    for (std::size_t i = 0; i < n; ++i) unscaled->add(double(v[i]) / scale);
  }
}

}  // namespace detail

/// Where a value stopped being finite.
enum class pass { forward, backward, parameter_gradient };

/// What a pass produced, in words: "forward output", "input gradient" or "parameter gradient".
constexpr std::string_view pass_name(pass p) {
  return p == pass::forward    ? "forward output"
         : p == pass::backward ? "input gradient"
                               : "parameter gradient";
}

/// A non-finite value: the step, the layer (path) and the pass it appeared in.
struct nonfinite_event {
  std::uint64_t step = 0;                  ///< the step (the scaler's step count)
  std::string layer;                       ///< the layer's path ("" for a root layer)
  diagnostics::pass pass = pass::forward;  ///< the pass whose buffer held it
  /// "step 12: first non-finite value in encoder.0.mlp.fc2 (forward output)".
  std::string message() const {
    return "step " + std::to_string(step) + ": first non-finite value in " +
           nn::path_or_root(layer) + " (" + std::string(pass_name(pass)) + ")";
  }
};

/// What the monitor knows about one layer (or one product of an attention layer).
struct layer_record {
  std::string path;               ///< its path in the model ("" for a root layer)
  std::string tag;                ///< its tag as describe prints it
  std::string tag_type;           ///< its tag's C++ name, as the compiler spells it
  bool positional = false;        ///< an nn::tags tag: a map can only override it by operation kind
  std::string op;                 ///< its operation kind's C++ name ("precis::op::matmul")
  std::string op_name;            ///< the kind's short name ("matmul")
  bool fp32_rule = false;         ///< the kind computes in float whatever its storage (rule c)
  std::string storage;            ///< the storage type it ran under
  std::string gradient;           ///< the gradient type it ran under
  double declared_max_abs = 0.0;  ///< its tag's max_abs<> bound (0: none)
  std::uint64_t observations = 0;  ///< observed steps
  value_stats input;               ///< what the layer read (its first input), as stored
  value_stats output;              ///< forward outputs, as stored (and the sums of branches
                                   ///< stored in its type, see nn::model::for_each_observed)
  value_stats input_grad;          ///< input gradients divided by the loss scale
  value_stats input_grad_scaled;   ///< input gradients as computed (at the loss scale)
  value_stats param_grad;          ///< parameter gradients divided by the loss scale
  value_stats param_grad_scaled;   ///< parameter gradients as computed
};

/// Options of a monitor.
struct monitor_options {
  /// Observe the steps whose index (the scaler's count) is a multiple of this.
  std::uint64_t every = 1;
};

/// One row of the amax series: an observed step's largest magnitudes per layer.
struct series_row {
  std::uint64_t step = 0;  ///< the observed step (the scaler's step count)
  float scale = 1.0f;      ///< the loss scale the step's gradients carried
  /// Per layer, in the order of layers(), the largest finite magnitude of its forward
  /// outputs (output_amax) and of its true input gradients, divided by the loss scale
  /// (input_grad_amax; 0 where none was computed).
  std::vector<double> output_amax, input_grad_amax;  ///< likewise, of the true input gradients
};

/// The monitor (see the file comment). An object the caller owns, like a scaler.
class monitor {
 public:
  /// A monitor that observes the steps `o` names. Throws precis::error when `o.every` is 0.
  explicit monitor(monitor_options o = {}) : options_(o) {
    if (o.every == 0) throw error("precis::diagnostics::monitor: `every` must be at least 1");
  }

  /// Whether step `step` is observed.
  bool due(std::uint64_t step) const { return step % options_.every == 0; }

  /// Reads every layer's forward output and input gradients (call after a backward pass;
  /// `scale` is the loss scale the gradients carry).
  template <class Model>
  void observe(const Model& model, std::uint64_t step, float scale) {
    static_assert(std::is_same_v<typename Model::context_type, cpu_context>,
                  "precis: the monitor reads host models (nn::build for cpu_context)");
    begin_row(step, scale);
    std::optional<nonfinite_event> first_forward, last_backward;
    std::map<const void*, std::pair<std::size_t, value_stats>> seen;  // outputs read, by address
    model.for_each_observed(
        [&](const std::string& path, auto tag, const auto* x, const auto& y, const auto&... g) {
          layer_record& r = record<Model>(path, tag);
          const std::size_t i = std::size_t(&r - records_.data());
          if (r.observations == 0 || last_step_[i] != step) {
            ++r.observations;
            last_step_[i] = step;
          }
          value_stats out;
          scan(y, 1.0, out, nullptr);
          seen[y.data()] = {y.size(), out};
          if (x != nullptr) {
            // Mostly another layer's output, read already.
            const auto it = seen.find(x->data());
            if (it != seen.end() && it->second.first == x->size()) {
              r.input.merge(it->second.second);
            } else {
              scan(*x, 1.0, r.input, nullptr);
            }
          }
          value_stats grad, grad_scaled;
          (scan(g, double(scale), grad_scaled, &grad), ...);
          r.output.merge(out);
          r.input_grad.merge(grad);
          r.input_grad_scaled.merge(grad_scaled);
          auto& row = rows_.back();
          row.output_amax.resize(records_.size(), 0.0);
          row.input_grad_amax.resize(records_.size(), 0.0);
          row.output_amax[i] = std::max(row.output_amax[i], out.amax);
          row.input_grad_amax[i] = std::max(row.input_grad_amax[i], grad.amax);
          if (out.nonfinite != 0 && !first_forward)
            first_forward = nonfinite_event{step, path, pass::forward};
          if (grad.nonfinite != 0) last_backward = nonfinite_event{step, path, pass::backward};
        });
    // The same order of blame as explain_skip: the forward pass ran first.
    if (first_forward) {
      note_nonfinite(*first_forward);
    } else if (last_backward) {
      note_nonfinite(*last_backward);
    }
  }

  /// Reads every parameter's gradient (after the step's last backward pass, before the
  /// gradients are unscaled).
  template <class Model>
  void observe_parameters(const Model& model, std::uint64_t step, float scale) {
    model.for_each_parameter([&](const std::string& path, const auto& p) {
      const auto owner = path.rfind('.');
      layer_record* r = find(owner == std::string::npos ? std::string() : path.substr(0, owner));
      if (r == nullptr) return;  // a layer that was not observed
      value_stats grad, grad_scaled;
      const auto span = p.grad_span();
      detail::scan_floats(span.data(), span.size(), double(scale), grad_scaled, &grad);
      r->param_grad.merge(grad);
      r->param_grad_scaled.merge(grad_scaled);
      if (grad.nonfinite != 0)
        note_nonfinite(nonfinite_event{step, r->path, pass::parameter_gradient});
    });
  }

  /// Records which layer produced the first non-finite value of a skipped step (see the
  /// file comment); returns that event, or none when every buffer is finite (the
  /// non-finite value was in an earlier micro-batch).
  template <class Model>
  std::optional<nonfinite_event> explain_skip(const Model& model, std::uint64_t step) {
    std::optional<nonfinite_event> first_forward, last_backward;
    model.for_each_observed(
        [&](const std::string& path, auto, const auto*, const auto& y, const auto&... g) {
          if (!first_forward && !all_finite(y))
            first_forward = nonfinite_event{step, path, pass::forward};
          if (!(all_finite(g) && ...)) last_backward = nonfinite_event{step, path, pass::backward};
        });
    std::optional<nonfinite_event> e = first_forward ? first_forward : last_backward;
    if (!e) {
      model.for_each_parameter([&](const std::string& path, const auto& p) {
        if (e) return;
        for (float v : p.grad_span()) {
          if (!std::isfinite(v)) {
            e = nonfinite_event{step, path, pass::parameter_gradient};
            return;
          }
        }
      });
    }
    if (e) {
      skips_.push_back(*e);
      if (!first_) first_ = e;
    }
    return e;
  }

  /// Every layer seen, in the model's order.
  const std::vector<layer_record>& layers() const { return records_; }
  /// The first non-finite value met, if any.
  const std::optional<nonfinite_event>& first_nonfinite() const { return first_; }
  /// The explanations of skipped steps, in order.
  const std::vector<nonfinite_event>& skipped_steps() const { return skips_; }
  /// The amax series, one row per observed step.
  const std::vector<series_row>& series() const { return rows_; }
  /// The options it was made with.
  const monitor_options& options() const { return options_; }

  /// A table: per layer, the storage and gradient types, the largest forward, input-gradient
  /// and parameter-gradient magnitudes (true gradients, divided by the loss scale) and the
  /// shares that overflow or vanish in float16 and float8 (percent). "-" where a layer
  /// computed no input gradient (one reading the model's input, under nn::trainer).
  std::string table() const {
    std::vector<std::vector<std::string>> rows;
    rows.push_back({"layer", "tag", "storage/grad", "out amax", ">fp16", ">e4m3", "grad amax",
                    "0 fp16@scale", "0 fp16", "0 bf16", "0 e5m2@scale", "param grad amax"});
    for (const auto& r : records_) {
      const bool g = r.input_grad.values != 0;
      const auto grad = [g](const std::string& v) { return g ? v : std::string("-"); };
      rows.push_back({nn::path_or_root(r.path), r.tag, r.storage + "/" + r.gradient,
                      number(r.output.amax), percent(r.output.overflow_fraction(format::float16)),
                      percent(r.output.overflow_fraction(format::float8_e4m3)),
                      grad(number(r.input_grad.amax)),
                      grad(percent(r.input_grad_scaled.zero_fraction(format::float16))),
                      grad(percent(r.input_grad.zero_fraction(format::float16))),
                      grad(percent(r.input_grad.zero_fraction(format::bfloat16))),
                      grad(percent(r.input_grad_scaled.zero_fraction(format::float8_e5m2))),
                      number(r.param_grad.amax)});
    }
    std::string out = precis::detail::format_table(rows);
    out += std::string("(") + std::to_string(rows_.size()) +
           " observed steps; >F: share of values above F's max; 0 F: share that "
           "rounds to zero in F, @scale: as computed at the loss scale, else the true gradient)\n";
    if (first_) out += std::string("first non-finite: ") + first_->message() + "\n";
    for (const auto& s : skips_) out += std::string("skipped ") + s.message() + "\n";
    return out;
  }

  /// Every layer's measurements, one row each: amaxes, then per format the shares of
  /// outputs, input gradients (at the loss scale, then true) and parameter gradients (true)
  /// that overflow, become subnormal or round to zero. The input-gradient fields are empty
  /// where a layer computed no input gradient (see table()).
  std::string csv() const {
    // Fields are appended one by one (`"," + s` trips GCC 12's -Wrestrict false positive).
    std::string out =
        "layer,tag,op,storage,gradient,observations,out_amax,grad_amax,param_grad_amax,out_"
        "nonfinite,"
        "grad_nonfinite";
    const auto field = [&out](const std::string& v) {
      out += ',';
      out += v;
    };
    for (format f : all_formats) {
      for (const char* what : {"out", "grad_scaled", "grad", "param_grad"}) {
        for (const char* kind : {"overflow", "subnormal", "zero"}) {
          out += ',';
          out += what;
          out += '_';
          out += kind;
          out += '_';
          out += range_of(f).name;
        }
      }
    }
    out += '\n';
    for (const auto& r : records_) {
      const bool g = r.input_grad.values != 0;
      out += csv_field(r.path);
      for (const std::string& v :
           {csv_field(r.tag), r.op_name, r.storage, r.gradient, std::to_string(r.observations),
            number(r.output.amax), g ? number(r.input_grad.amax) : "", number(r.param_grad.amax),
            std::to_string(r.output.nonfinite), g ? std::to_string(r.input_grad.nonfinite) : ""}) {
        field(v);
      }
      for (format f : all_formats) {
        for (const value_stats* s :
             {&r.output, &r.input_grad_scaled, &r.input_grad, &r.param_grad}) {
          const bool empty = !g && s != &r.output && s != &r.param_grad;
          field(empty ? "" : number(s->overflow_fraction(f)));
          field(empty ? "" : number(s->subnormal_fraction(f)));
          field(empty ? "" : number(s->zero_fraction(f)));
        }
      }
      out += '\n';
    }
    return out;
  }

  /// The amax series: `step,scale`, then each layer's forward output amax and true
  /// input-gradient amax (columns named by path; empty where none was computed).
  std::string series_csv() const {
    std::string out = "step,scale";
    const auto field = [&out](const std::string& v) {
      out += ',';
      out += v;
    };
    for (const auto& r : records_) field(csv_field("out " + nn::path_or_root(r.path)));
    for (const auto& r : records_) field(csv_field("grad " + nn::path_or_root(r.path)));
    out += '\n';
    for (const auto& row : rows_) {
      out += std::to_string(row.step);
      field(number(row.scale));
      for (std::size_t i = 0; i < records_.size(); ++i)
        field(number(i < row.output_amax.size() ? row.output_amax[i] : 0.0));
      for (std::size_t i = 0; i < records_.size(); ++i) {
        // Empty (not drawn) for a layer that computed no input gradient.
        field(records_[i].input_grad.values == 0
                  ? ""
                  : number(i < row.input_grad_amax.size() ? row.input_grad_amax[i] : 0.0));
      }
      out += '\n';
    }
    return out;
  }

  /// A gnuplot script that draws `png` from series_csv() saved as `series`: every layer's
  /// forward amax over training against each format's max and smallest normal (top), and
  /// its input-gradient amax against the same lines (bottom), on log scales spanning the
  /// measured values and float16's and float8's limits.
  std::string gnuplot_script(const std::string& series, const std::string& png) const {
    std::string s =
        std::string("set terminal pngcairo size 1400,1000 noenhanced\nset output '") + png +
        "'\nset datafile separator ','\nset key outside right font ',7'\nset logscale y\n"
        "set multiplot layout 2,1\n";
    const auto lines = [&] {
      std::string l;
      for (format f : all_formats) {
        const auto r = range_of(f);
        l += std::string(", ") + number(r.max) + " title '" + std::string(r.name) +
             " max' dt 2 lw 2";
        l += std::string(", ") + number(std::ldexp(1.0, r.min_normal_exponent)) + " title '" +
             std::string(r.name) + " smallest normal' dt 3 lw 2";
      }
      return l;
    };
    const std::size_t n = records_.size();
    for (std::size_t part = 0; part < 2; ++part) {
      // The y range: the measured amaxes and float16's and float8's limits (bfloat16's,
      // 2^-126 to 3.4e38, show only where the values come near them).
      double lo = 0x1p-24, hi = 65504.0 * 4;
      for (const auto& row : rows_) {
        for (double v : part == 0 ? row.output_amax : row.input_grad_amax) {
          if (v > 0.0) {
            lo = std::min(lo, v);
            hi = std::max(hi, v);
          }
        }
      }
      s += std::string("set title '") +
           (part == 0 ? "forward output amax" : "input gradient amax (unscaled)") +
           "'\nset xlabel 'step'\nset yrange [" + number(lo / 4) + ":" + number(hi * 4) + "]\n";
      s += "plot ";
      for (std::size_t i = 0; i < n; ++i) {
        s += (i == 0 ? std::string("'") + series + "'" : std::string("''")) +
             " using 1:" + std::to_string(3 + part * n + i) + std::string(" with lines title '") +
             nn::path_or_root(records_[i].path) + "'" + (i + 1 < n ? ", " : "");
      }
      s += lines() + "\n";
    }
    return s + "unset multiplot\n";
  }

 private:
  template <class Model, class Tag>
  layer_record& record(const std::string& path, std::type_identity<Tag>) {
    if (auto* r = find(path)) return *r;
    using P = policy_for_t<Tag, typename Model::map_type>;
    layer_record r;
    r.path = path;
    r.tag = std::string(precis::detail::layer_name<Tag>());
    r.tag_type = std::string(precis::detail::type_name<Tag>());
    r.positional = nn::positional_tag_v<Tag>;
    r.op = std::string(precis::detail::type_name<typename Tag::op>());
    r.op_name = std::string(Tag::op::name);
    r.fp32_rule = Tag::op::fp32_rule;
    r.storage = std::string(type_name_v<nn::activation_type_t<P>>);
    r.gradient = std::string(type_name_v<nn::activation_grad_type_t<P>>);
    if constexpr (!std::is_void_v<activation_bound_t<Tag>>)
      r.declared_max_abs = activation_bound_t<Tag>::value;
    index_.emplace(path, records_.size());
    records_.push_back(std::move(r));
    last_step_.push_back(0);
    return records_.back();
  }
  layer_record* find(const std::string& path) {
    const auto it = index_.find(path);
    return it == index_.end() ? nullptr : &records_[it->second];
  }
  void begin_row(std::uint64_t step, float scale) {
    if (rows_.empty() || rows_.back().step != step) rows_.push_back({step, scale, {}, {}});
  }
  void note_nonfinite(const nonfinite_event& e) {
    if (!first_) first_ = e;
  }

  /// Adds a tensor's values to `stored` and, when given, divided by `scale` to `unscaled`.
  template <class Tensor>
  static void scan(const Tensor& t, double scale, value_stats& stored, value_stats* unscaled) {
    using T = std::remove_cvref_t<decltype(*t.data())>;
    const T* d = t.data();
    const std::size_t n = t.size();
    if constexpr (std::is_same_v<T, float>) {
      detail::scan_floats(d, n, scale, stored, unscaled);
    } else if constexpr (std::is_same_v<T, double>) {
      for (std::size_t i = 0; i < n; ++i) {
        stored.add(d[i]);
        if (unscaled != nullptr) unscaled->add(d[i] / scale);
      }
    } else {
      // Narrow formats convert to float exactly, a block at a time.
      std::array<float, 2048> block;
      for (std::size_t first = 0; first < n; first += block.size()) {
        const std::size_t m = std::min(block.size(), n - first);
        precis::convert(std::span<const T>(d + first, m), std::span<float>(block.data(), m));
        detail::scan_floats(block.data(), m, scale, stored, unscaled);
      }
    }
  }
  template <class Tensor>
  static bool all_finite(const Tensor& t) {
    const auto* d = t.data();
    for (std::size_t i = 0; i < t.size(); ++i) {
      if (!std::isfinite(double(d[i]))) return false;
    }
    return true;
  }

  static std::string number(double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.4g", v);
    return b;
  }
  static std::string percent(double v) {
    if (v == 0.0) return "0";
    char b[32];
    std::snprintf(b, sizeof b, "%.3g%%", 100.0 * v);
    return b;
  }
  static std::string csv_field(const std::string& s) {
    if (s.find_first_of(",\"\n") == std::string::npos) return s;
    std::string q = "\"";
    for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
  }
  monitor_options options_;
  std::vector<layer_record> records_;
  std::vector<std::uint64_t> last_step_;
  std::map<std::string, std::size_t> index_;
  std::vector<series_row> rows_;
  std::optional<nonfinite_event> first_;
  std::vector<nonfinite_event> skips_;
};

}  // namespace precis::diagnostics
