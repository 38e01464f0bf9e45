// What example_dbnet (the CPU) and example_dbnet_cuda (a GPU) share: the options and
// their parsing, the synthetic data read back through the ICDAR loader and its targets, the
// policy maps beyond the presets, the per-run records, scoring a batch of probability maps
// against the ground truth, and the outputs (summary.csv, curves.csv, steps.csv, the
// pictures) and the --check verdict. The training loops are each program's own. Nothing
// here reads or writes image files (OpenCV's imgcodecs, which example_dbnet_cuda does not
// link: a GPU machine has no use for its many libraries).
#pragma once

#include "../common.hpp"
#include "../report.hpp"
#include "evaluate.hpp"
#include "icdar.hpp"
#include "labels.hpp"
#include "loss.hpp"
#include "maps.hpp"
#include "model.hpp"
#include "postprocess.hpp"
#include "synth.hpp"

#include <boost/hana.hpp>
#include <opencv2/imgproc.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace dbnet::run {

using namespace precis;

struct options {
  std::size_t epochs = 10, batch = 8, train = 480, val = 200, size = 256, width = 16, inner = 64, seed = 1;
  unsigned threads = 0;
  double lr = 2e-3, weight_decay = 1e-4;
  bool check = false;
  std::size_t time_steps = 0;  // --time N: time N steps per policy instead of training
  image_layout layout = image_layout::nchw;  // --layout nchw|nhwc: the model's image layout
  bool graph = false;  // --graph: each training step as a CUDA graph (the GPU run's)
  std::set<std::string> policies;  // empty: all
  std::filesystem::path out = "dbnet_output";
  std::uint64_t monitor_every = 0;  // --monitor N: observe every N-th step (0: off)
  std::filesystem::path advise;     // --advise FILE: write the advised policy map
  std::string command;              // the command line (the advised map names it)
};

// ---- the data: images normalised, targets made once ----

/// The reference's per-channel means (its images are read by OpenCV, so in BGR order).
constexpr float channel_mean[3] = {122.67891434F, 116.66876762F, 104.00698793F};

struct dataset {
  std::size_t count = 0, side = 0;
  std::vector<float> x;                  // [count, 3, side, side]: (pixel - mean) / 255
  std::vector<float> shrink, shrink_mask, thresh, thresh_mask;  // [count, side, side]
  std::vector<dbnet::sample> samples;    // ground truth as read from the ICDAR files
  std::vector<cv::Mat> images;           // as read (for pictures)
};

/// Appends one image (CV_8UC3, side x side) with its ground truth to d: the image
/// normalised, its targets made (labels.hpp). `what` names it in errors.
inline void add_sample(dataset& d, const cv::Mat& img, sample s, const std::string& what) {
  const std::size_t side = d.side, px = side * side, i = d.count;
  if (img.empty()) throw error("example_dbnet: cannot read " + what);
  if (std::size_t(img.rows) != side || std::size_t(img.cols) != side) {
    throw error("example_dbnet: " + what + " is " + std::to_string(img.cols) + " x " + std::to_string(img.rows) +
                ", expected " + std::to_string(side) + " x " + std::to_string(side));
  }
  d.x.resize((i + 1) * 3 * px);
  for (auto* v : {&d.shrink, &d.shrink_mask, &d.thresh, &d.thresh_mask}) v->resize((i + 1) * px);
  for (std::size_t c = 0; c < 3; ++c) {
    for (std::size_t y = 0; y < side; ++y) {
      const auto* row = img.ptr<cv::Vec3b>(int(y));
      for (std::size_t xx = 0; xx < side; ++xx) {
        d.x[(i * 3 + c) * px + y * side + xx] = (float(row[xx][int(c)]) - channel_mean[c]) / 255.0F;
      }
    }
  }
  auto regions = s.regions;
  const auto maps = make_labels(regions, int(side), int(side));
  std::copy(maps.shrink.begin(), maps.shrink.end(), d.shrink.begin() + std::ptrdiff_t(i * px));
  std::copy(maps.shrink_mask.begin(), maps.shrink_mask.end(), d.shrink_mask.begin() + std::ptrdiff_t(i * px));
  std::copy(maps.thresh.begin(), maps.thresh.end(), d.thresh.begin() + std::ptrdiff_t(i * px));
  std::copy(maps.thresh_mask.begin(), maps.thresh_mask.end(), d.thresh_mask.begin() + std::ptrdiff_t(i * px));
  d.images.push_back(img);
  d.samples.push_back(std::move(s));
  d.count = i + 1;
}

/// Images first .. first + count - 1 of the synthetic set made from `seed`, made in memory:
/// the pixels write_synth_set writes (PNG is lossless) and the ground truth it writes, its
/// corners rounded and read back through the ICDAR parser, so the same set as the one read
/// from its files (ids from 1).
inline dataset synthesize_set(std::uint64_t seed, std::size_t first, std::size_t count, std::size_t side) {
  dataset d;
  d.side = side;
  const synth_options so{.width = int(side), .height = int(side)};
  for (std::size_t i = first; i < first + count; ++i) {
    auto made = synth_image(seed, i, so);
    for (auto& r : made.regions) {
      for (auto& c : r.corners) c = point{std::round(c.x), std::round(c.y)};
    }
    sample s;
    s.id = i - first + 1;
    const std::string n = std::to_string(s.id);
    s.regions = parse_gt(format_gt(made.regions), "gt_img_" + n + ".txt");
    add_sample(d, made.image, std::move(s), "synthetic image " + n);
  }
  return d;
}

/// Images order[first, first + n) and their targets as a batch: images [n, 3, side, side],
/// or [n, side, side, 3] for a channels-last model; the one-channel target maps [n, 1, side,
/// side] or [n, side, side, 1] (the same values in memory).
inline void gather(const dataset& d, const std::vector<std::size_t>& order, std::size_t first, std::size_t n,
                   host_tensor<float, 4>& x, dbnet::targets* t, image_layout layout = image_layout::nchw) {
  const std::size_t s = d.side, px = s * s;
  const bool last = layout == image_layout::nhwc;
  x.resize(last ? std::array<std::size_t, 4>{n, s, s, 3} : std::array<std::size_t, 4>{n, 3, s, s});
  if (t) {
    for (auto* m : {&t->shrink, &t->shrink_mask, &t->thresh, &t->thresh_mask}) {
      m->resize(last ? std::array<std::size_t, 4>{n, s, s, 1} : std::array<std::size_t, 4>{n, 1, s, s});
    }
  }
  for (std::size_t b = 0; b < n; ++b) {
    const std::size_t i = order[first + b];
    if (last) {
      for (std::size_t q = 0; q < px; ++q) {
        for (std::size_t c = 0; c < 3; ++c) x.data()[(b * px + q) * 3 + c] = d.x[(i * 3 + c) * px + q];
      }
    } else {
      std::copy_n(d.x.data() + i * 3 * px, 3 * px, x.data() + b * 3 * px);
    }
    if (!t) continue;
    std::copy_n(d.shrink.data() + i * px, px, t->shrink.data() + b * px);
    std::copy_n(d.shrink_mask.data() + i * px, px, t->shrink_mask.data() + b * px);
    std::copy_n(d.thresh.data() + i * px, px, t->thresh.data() + b * px);
    std::copy_n(d.thresh_mask.data() + i * px, px, t->thresh_mask.data() + b * px);
  }
}

// ---- policy maps beyond the presets, and the entries of each program's sweep ----

template <class Map, class Scaler>
struct entry {
  using map = Map;
  using scaler = Scaler;
  std::string_view name;
  std::string_view note;
};

// ---- records ----

struct epoch_record {
  double train_loss = 0, precision = 0, recall = 0, hmean = 0, scale = 1, seconds = 0;
  std::size_t skipped = 0;
};

struct result {
  std::string name;    // in the outputs: the map's, with "_graph" for the GPU run's --graph
  std::string policy;  // the map's
  std::string note;
  std::size_t epochs_run = 0, steps = 0, skipped = 0;
  double precision = 0, recall = 0, hmean = 0, ms_per_step = 0, final_scale = 1, peak_rss_mib = 0;
  std::size_t param_bytes = 0, optim_bytes = 0, activation_bytes = 0;
  long first_nonfinite = -1;  // the first step whose gradients were not finite (every scaler skips it)
  std::string stopped;        // why training stopped early, if it did
  std::vector<epoch_record> epochs;
  std::vector<nn::step_record> records;
  std::vector<dbnet::loss_terms> terms;  // per step: the loss's terms (before their weights)
};

/// Scores images [first, first + n) of `val` from their probability heads' logits (n maps
/// of side x side, in the model's storage type T): sigmoid in float, the boxes, matched
/// with the ground truth into `total`; the detections go to found[first + b].
template <class T>
void score_images(const dataset& val, std::size_t first, std::size_t n, const T* logits,
                  std::vector<std::vector<std::array<point, 4>>>& found, match_counts& total) {
  const int side = int(val.side);
  std::vector<float> prob(val.side * val.side);
  for (std::size_t b = 0; b < n; ++b) {
    const T* l = logits + b * prob.size();
    for (std::size_t i = 0; i < prob.size(); ++i) prob[i] = 1.0F / (1.0F + std::exp(-float(l[i])));
    for (const auto& d : detect_boxes(prob.data(), side, side, side, side)) found[first + b].push_back(d.corners);
    total += match_image(val.samples[first + b].regions, found[first + b]);
  }
}

/// Prints an epoch's line and keeps it in r; a run whose epoch applied no step is stopped
/// (every scaler, no_scaling too, skips a step whose gradients are not finite, so nothing
/// more is learnt).
inline void end_epoch(result& r, const epoch_record& er, std::size_t ep, std::size_t epochs, std::size_t applied,
                      bool tty) {
  r.epochs.push_back(er);
  std::printf("%s  %-17s epoch %2zu/%zu  train loss %.4f  P %.3f  R %.3f  H-mean %.4f  skipped so far %zu  "
              "scale %g  %.1f s\n",
              tty ? "\r" : "", r.name.c_str(), ep + 1, epochs, er.train_loss, er.precision, er.recall, er.hmean,
              er.skipped, er.scale, er.seconds);
  if (applied == 0) {
    r.stopped = "every step of epoch " + std::to_string(ep + 1) +
                " had gradients that were not finite and was skipped: training stopped";
  }
  if (!r.stopped.empty()) std::printf("  %s: %s\n", r.name.c_str(), r.stopped.c_str());
  std::fflush(stdout);
}

/// Notes a step's record in r (the first step with gradients not finite, the applied
/// count, the loss sum of the applied finite steps).
inline void note_step(result& r, const nn::step_record& rec, std::size_t& applied, double& loss_sum,
                      std::size_t& counted) {
  r.records.push_back(rec);
  if (!std::isfinite(rec.grad_norm) && r.first_nonfinite < 0) r.first_nonfinite = long(r.records.size() - 1);
  applied += rec.skipped ? 0U : 1U;
  if (!rec.skipped && std::isfinite(rec.loss)) {
    loss_sum += rec.loss;
    ++counted;
  }
}

/// The last epoch's scores and the run's totals into r; each validation image's detections
/// (res_img_N.txt) under o.out / r.name.
inline void finish_run(result& r, const options& o, const dataset& val,
                       const std::vector<std::vector<std::array<point, 4>>>& found, double train_seconds) {
  r.epochs_run = r.epochs.size();
  r.steps = r.records.size();
  r.ms_per_step = 1000.0 * train_seconds / double(std::max<std::size_t>(r.steps, 1));
  r.precision = r.epochs.back().precision;
  r.recall = r.epochs.back().recall;
  r.hmean = r.epochs.back().hmean;
  const auto dir = o.out / r.name;
  std::filesystem::create_directories(dir);
  for (std::size_t i = 0; i < val.count; ++i) {
    examples::write_file(dir / ("res_img_" + std::to_string(val.samples[i].id) + ".txt"), format_result(found[i]));
  }
  std::printf("  wrote %s/res_img_N.txt\n", dir.string().c_str());
}

/// The names of a sweep's entries (a Hana tuple of entry<Map, Scaler>).
template <class Sweep>
std::set<std::string> names_of(const Sweep& sweep) {
  std::set<std::string> names;
  boost::hana::for_each(sweep, [&](const auto& e) { names.insert(std::string(e.name)); });
  return names;
}

/// Reads the command line into o (policy names checked against `known`). Returns false on
/// a bad argument (the caller prints its usage). `--device` is not read here.
inline bool parse(int argc, char** argv, options& o, const std::set<std::string>& known) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto number = [&](long long min, auto& out) { return examples::next_count(argc, argv, i, min, out); };
    bool ok = true;
    if (a == "--epochs") {
      ok = number(1, o.epochs);
    } else if (a == "--batch") {
      ok = number(1, o.batch);
    } else if (a == "--train") {
      ok = number(1, o.train);
    } else if (a == "--val") {
      ok = number(1, o.val);
    } else if (a == "--size") {
      ok = number(32, o.size) && o.size % config::image_multiple == 0 && o.size <= 2048;
    } else if (a == "--width") {
      ok = number(1, o.width);
    } else if (a == "--inner") {
      ok = number(4, o.inner);
    } else if (a == "--seed") {
      ok = number(0, o.seed);
    } else if (a == "--threads") {
      ok = number(0, o.threads);
    } else if (a == "--lr" && i + 1 < argc) {
      char* end = nullptr;
      o.lr = std::strtod(argv[++i], &end);
      ok = *end == '\0' && o.lr > 0 && std::isfinite(o.lr);
    } else if (a == "--policy" && i + 1 < argc) {
      std::stringstream list(argv[++i]);
      for (std::string name; std::getline(list, name, ',');) {
        if (!known.contains(name)) {
          std::fprintf(stderr, "example_dbnet: unknown policy '%s'\n", name.c_str());
          ok = false;
        }
        o.policies.insert(name);
      }
    } else if (a == "--out" && i + 1 < argc) {
      o.out = argv[++i];
    } else if (a == "--check") {
      o.check = true;
    } else if (a == "--time") {
      ok = number(1, o.time_steps);
    } else if (a == "--layout" && i + 1 < argc) {
      const std::string_view l = argv[++i];
      ok = l == "nchw" || l == "nhwc";
      o.layout = l == "nhwc" ? image_layout::nhwc : image_layout::nchw;
    } else if (a == "--graph") {
      o.graph = true;
    } else if (a == "--monitor") {
      ok = number(1, o.monitor_every);
    } else if (a == "--advise" && i + 1 < argc) {
      o.advise = argv[++i];
    } else {
      ok = false;
    }
    if (!ok) return false;
  }
  if (o.check && o.time_steps > 0) {
    std::fprintf(stderr, "example_dbnet: --check and --time exclude each other (a timing run checks nothing)\n");
    return false;
  }
  if (o.check) {
    o.epochs = 3;
    o.train = 48;
    o.val = 16;
    o.size = 128;
    o.width = 8;
    o.inner = 32;
    o.batch = 8;
  }
  return true;
}

/// The results table after a run, and the first non-finite steps.
inline void print_results(const std::vector<result>& results) {
  std::vector<std::vector<std::string>> rows{{"policy", "epochs", "precision", "recall", "H-mean", "skipped",
                                              "final scale", "ms/step", "params", "optimizer", "activations",
                                              "peak RSS", ""}};
  const auto num = examples::format;
  auto kib = [&](std::size_t b) { return num("%.0f KiB", double(b) / 1024.0); };
  for (const auto& r : results) {
    rows.push_back({r.name, std::to_string(r.epochs_run), num("%.4f", r.precision), num("%.4f", r.recall),
                    num("%.4f", r.hmean), std::to_string(r.skipped), num("%g", r.final_scale),
                    num("%.1f", r.ms_per_step), kib(r.param_bytes), kib(r.optim_bytes), kib(r.activation_bytes),
                    num("%.0f MiB", r.peak_rss_mib), r.note});
  }
  std::printf("\n%s", precis::detail::format_table(rows).c_str());
  for (const auto& r : results) {
    if (r.first_nonfinite >= 0) {
      std::printf("%s: first step whose gradients were not finite (skipped): %ld%s%s\n", r.name.c_str(),
                  r.first_nonfinite, r.stopped.empty() ? "" : "; ", r.stopped.c_str());
    }
  }
}

/// summary.csv, curves.csv, steps.csv and curves.png under o.out; summary.csv's last column
/// is `column` ("cpu" or "gpu"), holding `hardware`.
inline void write_outputs(const options& o, const std::vector<result>& results, const std::string& column,
                          const std::string& hardware) {
  std::ostringstream summary, curves, steps;
  summary << "policy,epochs,precision,recall,hmean,skipped_steps,final_scale,ms_per_step,peak_rss_mib," << column
          << "\n";
  for (const auto& r : results) {
    summary << r.name << "," << r.epochs_run << "," << r.precision << "," << r.recall << "," << r.hmean << ","
            << r.skipped << "," << r.final_scale << "," << r.ms_per_step << "," << r.peak_rss_mib << ","
            << examples::csv_field(hardware) << "\n";
  }
  curves << "epoch";
  steps << "step";
  for (const auto& r : results) {
    curves << "," << r.name << "_train_loss," << r.name << "_hmean," << r.name << "_scale";
    steps << "," << r.name << "_loss," << r.name << "_scale," << r.name << "_skipped," << r.name << "_bce,"
          << r.name << "_dice," << r.name << "_l1";
  }
  curves << "\n";
  steps << "\n";
  auto cell = [](double v) { return std::isfinite(v) ? examples::format("%.6g", v) : std::string("nan"); };
  for (std::size_t ep = 0; ep < o.epochs; ++ep) {
    curves << ep + 1;
    for (const auto& r : results) {
      if (ep < r.epochs.size()) {
        curves << "," << cell(r.epochs[ep].train_loss) << "," << r.epochs[ep].hmean << "," << r.epochs[ep].scale;
      } else {
        curves << ",,,";  // stopped early
      }
    }
    curves << "\n";
  }
  std::size_t n = 0;
  for (const auto& r : results) n = std::max(n, r.records.size());
  for (std::size_t s = 0; s < n; ++s) {
    steps << s;
    for (const auto& r : results) {
      if (s < r.records.size()) {
        const auto& rec = r.records[s];
        const auto& lt = r.terms[s];
        steps << "," << cell(rec.loss) << "," << rec.scale << "," << (rec.skipped ? 1 : 0) << "," << cell(lt.bce)
              << "," << cell(lt.dice) << "," << cell(lt.l1);
      } else {
        steps << ",,,,,,";
      }
    }
    steps << "\n";
  }
  examples::write_file(o.out / "summary.csv", summary.str());
  examples::write_file(o.out / "curves.csv", curves.str());
  examples::write_file(o.out / "steps.csv", steps.str());
  std::printf("wrote %s, curves.csv and steps.csv\n", (o.out / "summary.csv").string().c_str());

  const auto png = o.out / "curves.png";
  std::ostringstream g;
  g << "set terminal pngcairo size 1500,450 noenhanced\nset output '" << png.string() << "'\n"
    << "set datafile separator ','\nset datafile missing 'nan'\nset key autotitle columnhead\n"
    << "set multiplot layout 1,3\nset title 'training loss'\nset xlabel 'step'\nset logscale y\nplot";
  for (std::size_t i = 0; i < results.size(); ++i) {
    g << (i ? ", " : " ") << "'" << (o.out / "steps.csv").string() << "' using 1:" << 2 + 6 * i << " with lines";
  }
  g << "\nunset logscale y\nset title 'validation H-mean'\nset xlabel 'epoch'\nset yrange [0:1]\nset xrange [0.5:"
    << double(o.epochs) + 0.5 << "]\nplot";
  for (std::size_t i = 0; i < results.size(); ++i) {
    g << (i ? ", " : " ") << "'" << (o.out / "curves.csv").string() << "' using 1:" << 3 + 3 * i
      << " with linespoints lw 2";
  }
  g << "\nset title 'loss scale'\nset xlabel 'step'\nset autoscale x\nset autoscale y\nset logscale y\nplot";
  for (std::size_t i = 0; i < results.size(); ++i) {
    g << (i ? ", " : " ") << "'" << (o.out / "steps.csv").string() << "' using 1:" << 3 + 6 * i << " with lines lw 2";
  }
  g << "\nunset multiplot\n";
  examples::draw_with_gnuplot(o.out / "curves.gp", g.str(), png);
}

/// Trains the maps of `sweep` that o.policies selects, in order (train(entry) gives each one's
/// result), and writes the outputs (write_outputs: the last column `column`, holding
/// `hardware`) after each, so that a run stopped by a time limit keeps the maps that finished.
/// A map that throws is reported (`program`: the map: what) and counted in `failed`, and the
/// next one runs.
template <class Sweep, class Train>
std::vector<result> train_each(const char* program, const Sweep& sweep, const options& o, const std::string& column,
                               const std::string& hardware, std::size_t& failed, Train&& train) {
  std::vector<result> results;
  boost::hana::for_each(sweep, [&](const auto& e) {
    if (!o.policies.empty() && !o.policies.contains(std::string(e.name))) return;
    try {
      results.push_back(train(e));
    } catch (const std::exception& ex) {
      std::fprintf(stderr, "%s: %s: %s\n", program, std::string(e.name).c_str(), ex.what());
      ++failed;
      return;
    }
    write_outputs(o, results, column, hardware);
  });
  return results;
}

/// --check: every policy but the waived one trained to the end with finite losses, lowered
/// its training loss (the last epoch's mean below 0.85 of the first step's) and skipped at
/// most a tenth of its steps (bf16_mixed none); the waived seed configuration met the
/// float16 binarization's NaN gradients, as it must.
inline int check(const std::vector<result>& results) {
  int failures = 0;
  for (const auto& r : results) {
    if (r.policy == "fp16_seed_waived") {
      const bool ok = r.first_nonfinite >= 0;
      std::printf("check %-17s first step with gradients not finite: %ld, skipped %zu of %zu: %s\n", r.name.c_str(),
                  r.first_nonfinite, r.skipped, r.steps, ok ? "ok (it fails, as it must)" : "FAILED (it trained)");
      failures += ok ? 0 : 1;
      continue;
    }
    const double first = r.records.front().loss, last = r.epochs.back().train_loss;
    const bool ok = r.stopped.empty() && std::isfinite(last) && last < 0.85 * first && 10 * r.skipped <= r.steps &&
                    (r.policy != "bf16_mixed" || r.skipped == 0);
    std::printf("check %-17s first loss %.4f, last epoch %.4f, H-mean %.4f, skipped %zu: %s\n", r.name.c_str(), first,
                last, r.hmean, r.skipped, ok ? "ok" : "FAILED");
    failures += ok ? 0 : 1;
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace dbnet::run
