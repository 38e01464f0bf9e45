// Writes the DBNet example's synthetic text-detection set in the ICDAR 2015 layout, reads it
// back through the ICDAR loader, makes DB's training targets for every image, and draws a
// preview.
//
//   example_dbnet_data [--out DIR] [--train N] [--val N] [--seed S] [--size PX]
//
// Under DIR: data/train/ and data/val/ (img_N.png, gt_img_N.txt), and preview.png: the first
// training images with their regions (green; ### red), each beside its shrink map (white
// where the text kernel is, grey where ignored) and its threshold map. Prints how many
// regions were kept and ignored, and why. The validation images are drawn from another
// seed stream than the training ones (index offset 1,000,000), so the two never share an
// image.
#include "icdar.hpp"
#include "labels.hpp"
#include "synth.hpp"

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>
#include <string_view>

namespace {

struct options {
  std::filesystem::path out = "dbnet_output";
  std::size_t train = 200, val = 50;
  std::uint64_t seed = 1;
  int size = 256;
};

bool number(int argc, char** argv, int& i, unsigned long long min, unsigned long long& v) {
  if (i + 1 >= argc) return false;
  char* end = nullptr;
  v = std::strtoull(argv[++i], &end, 10);
  return *end == '\0' && v >= min;
}

/// A CV_8UC3 picture of a map in [0, 1] (ignored pixels, mask 0, in grey).
cv::Mat picture(const std::vector<float>& v, const std::vector<float>* mask, int h, int w) {
  cv::Mat m(h, w, CV_8UC3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      const std::size_t i = std::size_t(y * w + x);
      const auto g = cv::saturate_cast<std::uint8_t>(255.0 * v[i]);
      m.at<cv::Vec3b>(y, x) = (mask && (*mask)[i] == 0) ? cv::Vec3b(110, 110, 110) : cv::Vec3b(g, g, g);
    }
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    unsigned long long v = 0;
    bool ok = true;
    if (a == "--out" && i + 1 < argc) {
      o.out = argv[++i];
    } else if (a == "--train") {
      ok = number(argc, argv, i, 1, v), o.train = v;
    } else if (a == "--val") {
      ok = number(argc, argv, i, 1, v), o.val = v;
    } else if (a == "--seed") {
      ok = number(argc, argv, i, 0, v), o.seed = v;
    } else if (a == "--size") {
      ok = number(argc, argv, i, 64, v) && v <= 4096, o.size = int(v);
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "usage: %s [--out DIR] [--train N] [--val N] [--seed S] [--size PX (64..4096)]\n", argv[0]);
      return 2;
    }
  }
  try {
    const dbnet::synth_options so{.width = o.size, .height = o.size};
    const auto train_dir = o.out / "data" / "train", val_dir = o.out / "data" / "val";
    dbnet::write_synth_set(train_dir, o.seed, 0, o.train, so);
    dbnet::write_synth_set(val_dir, o.seed, 1'000'000, o.val, so);
    std::printf("wrote %zu training images to %s and %zu validation images to %s\n", o.train,
                train_dir.string().c_str(), o.val, val_dir.string().c_str());

    const int shown = int(std::min<std::size_t>(o.train, 4));
    cv::Mat preview(shown * o.size, 3 * o.size, CV_8UC3, cv::Scalar(0, 0, 0));
    for (const auto& [dir, name] : {std::pair{train_dir, "train"}, std::pair{val_dir, "val"}}) {
      std::size_t kept = 0, marked = 0, small = 0;
      auto set = dbnet::load_icdar_dir(dir);
      for (auto& s : set) {
        const cv::Mat img = cv::imread(s.image.string(), cv::IMREAD_COLOR);
        if (img.empty()) throw precis::error("dbnet: cannot read " + s.image.string());
        for (const auto& r : s.regions) marked += r.transcription == "###" ? 1U : 0U;
        const auto maps = dbnet::make_labels(s.regions, img.rows, img.cols);
        for (const auto& r : s.regions) {
          kept += r.ignored ? 0U : 1U;
          small += (r.ignored && r.transcription != "###") ? 1U : 0U;
        }
        const int row = int(s.id) - 1;
        if (std::string_view(name) == "train" && row < shown) {
          cv::Mat drawn = img.clone();
          for (const auto& r : s.regions) {
            std::vector<cv::Point> p;
            for (const auto& c : r.corners) p.emplace_back(int(c.x), int(c.y));
            cv::polylines(drawn, std::vector<std::vector<cv::Point>>{p}, true,
                          r.ignored ? cv::Scalar(0, 0, 255) : cv::Scalar(0, 220, 0), 1, cv::LINE_AA);
          }
          drawn.copyTo(preview(cv::Rect(0, row * o.size, o.size, o.size)));
          picture(maps.shrink, &maps.shrink_mask, img.rows, img.cols).copyTo(preview(cv::Rect(o.size, row * o.size, o.size, o.size)));
          picture(maps.thresh, nullptr, img.rows, img.cols).copyTo(preview(cv::Rect(2 * o.size, row * o.size, o.size, o.size)));
        }
      }
      std::printf("%s: %zu images, %zu regions kept, %zu marked ###, %zu ignored for size or area\n", name, set.size(),
                  kept, marked, small);
    }
    const auto png = o.out / "preview.png";
    if (!cv::imwrite(png.string(), preview)) throw precis::error("dbnet: cannot write " + png.string());
    std::printf("wrote %s\n", png.string().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "example_dbnet_data: %s\n", e.what());
    return 1;
  }
}
