// Fashion-MNIST for the ViT example: the IDX files as Debian's dataset-fashion-mnist installs
// them (gzip-compressed, under /usr/share/datasets/fashion-mnist/), read with zlib.
//
//     auto train = vit::load_fashion_mnist(dir, vit::split::train);   // 60,000 images
//     auto test = vit::load_fashion_mnist(dir, vit::split::test);     // 10,000 images
//
// IDX: a 4-byte magic (0, 0, element type, rank), then `rank` big-endian 32-bit sizes, then
// the elements, row-major. Images are rank 3 (count, rows, columns), labels rank 1, both of
// unsigned bytes (type 0x08). Every size is checked against the bytes there are before
// anything is read, so a damaged file throws precis::error naming the file and what is
// wrong, and nothing past the end is read: a bad gzip stream, a truncated or overlong
// file, a wrong magic, type or rank, an empty axis, labels outside 0..9, images and labels
// that disagree in count.
#pragma once

#include <precis/precis.hpp>

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

namespace vit {

/// Where Debian's dataset-fashion-mnist puts the files.
inline const std::filesystem::path fashion_mnist_dir = "/usr/share/datasets/fashion-mnist";

/// The largest decompressed file read (the training images are 47 MB).
inline constexpr std::size_t max_idx_bytes = std::size_t(1) << 28;

/// The whole decompressed content of the gzip file `path`. Throws precis::error if the
/// file cannot be read, is not gzip, is damaged or truncated, or exceeds `limit` bytes.
inline std::vector<std::uint8_t> read_gzip(const std::filesystem::path& path, std::size_t limit = max_idx_bytes) {
  const std::string name = path.string();
  std::ifstream f(path, std::ios::binary);
  if (!f) throw precis::error(name + ": cannot open the file");
  const std::vector<std::uint8_t> packed((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) throw precis::error(name + ": reading the file failed");
  if (packed.size() < 2 || packed[0] != 0x1f || packed[1] != 0x8b) {
    throw precis::error(name + ": not a gzip file (it does not start with the bytes 1f 8b)");
  }
  z_stream z{};
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) throw precis::error(name + ": zlib could not start inflating");
  std::vector<std::uint8_t> out;
  std::array<std::uint8_t, 1 << 16> chunk{};
  z.next_in = const_cast<Bytef*>(packed.data());  // zlib's API is not const; it only reads
  std::size_t fed = 0;
  int rc = Z_OK;
  while (rc != Z_STREAM_END) {
    if (z.avail_in == 0 && fed < packed.size()) {
      const std::size_t n = std::min<std::size_t>(packed.size() - fed, std::numeric_limits<uInt>::max());
      z.next_in = const_cast<Bytef*>(packed.data() + fed);
      z.avail_in = static_cast<uInt>(n);
      fed += n;
    }
    z.next_out = chunk.data();
    z.avail_out = static_cast<uInt>(chunk.size());
    rc = inflate(&z, Z_NO_FLUSH);
    const std::size_t got = chunk.size() - z.avail_out;
    if (rc != Z_OK && rc != Z_STREAM_END && !(rc == Z_BUF_ERROR && got > 0)) {
      const std::string why = rc == Z_BUF_ERROR ? "the gzip stream is truncated"
                              : z.msg != nullptr ? std::string("the gzip stream is damaged (") + z.msg + ")"
                                                 : "the gzip stream is damaged";
      inflateEnd(&z);
      throw precis::error(name + ": " + why);
    }
    if (out.size() + got > limit) {
      inflateEnd(&z);
      throw precis::error(name + ": decompresses to more than " + std::to_string(limit) + " bytes");
    }
    out.insert(out.end(), chunk.begin(), chunk.begin() + static_cast<std::ptrdiff_t>(got));
  }
  const bool trailing = z.avail_in != 0 || fed != packed.size();
  inflateEnd(&z);
  if (trailing) throw precis::error(name + ": bytes after the end of the gzip stream");
  return out;
}

/// An IDX array of unsigned bytes: its sizes and its elements, row-major.
struct idx_array {
  std::vector<std::size_t> shape;
  std::vector<std::uint8_t> values;
};

/// Parses the IDX content `bytes` of unsigned bytes with `rank` axes. `name` names the file
/// in errors.
inline idx_array parse_idx(const std::vector<std::uint8_t>& bytes, std::size_t rank, const std::string& name) {
  auto bad = [&](const std::string& what) { throw precis::error(name + ": " + what); };
  if (bytes.size() < 4) bad("truncated: " + std::to_string(bytes.size()) + " bytes, shorter than the 4-byte IDX magic");
  if (bytes[0] != 0 || bytes[1] != 0) bad("not an IDX file (the magic does not start with two zero bytes)");
  if (bytes[2] != 0x08) {
    const char* hex = "0123456789abcdef";
    bad(std::string("IDX element type 0x") + hex[bytes[2] / 16] + hex[bytes[2] % 16] + ", expected 0x08 (unsigned byte)");
  }
  if (bytes[3] != rank) bad("IDX rank " + std::to_string(bytes[3]) + ", expected " + std::to_string(rank));
  const std::size_t header = 4 + 4 * rank;
  if (bytes.size() < header) {
    bad("truncated: " + std::to_string(bytes.size()) + " bytes, shorter than the " + std::to_string(header) +
        "-byte header");
  }
  idx_array a;
  std::size_t count = 1;
  for (std::size_t d = 0; d < rank; ++d) {
    const std::uint8_t* p = bytes.data() + 4 + 4 * d;
    const std::size_t n = (std::size_t(p[0]) << 24) | (std::size_t(p[1]) << 16) | (std::size_t(p[2]) << 8) | p[3];
    if (n == 0) bad("axis " + std::to_string(d) + " has size 0");
    if (count > max_idx_bytes / n) bad("the sizes in the header describe more than " + std::to_string(max_idx_bytes) + " bytes");
    count *= n;
    a.shape.push_back(n);
  }
  const std::size_t have = bytes.size() - header;
  if (have < count) {
    bad("truncated: the header describes " + std::to_string(count) + " bytes of data, the file has " +
        std::to_string(have));
  }
  if (have > count) {
    bad(std::to_string(have - count) + " bytes after the " + std::to_string(count) + " bytes the header describes");
  }
  a.values.assign(bytes.begin() + static_cast<std::ptrdiff_t>(header), bytes.end());
  return a;
}

/// Which half of the dataset.
enum class split { train, test };

/// Images and labels of one split: `pixels` holds count x rows x cols bytes, `labels` count
/// values in 0..classes-1.
struct image_set {
  std::size_t count = 0, rows = 0, cols = 0;
  std::vector<std::uint8_t> pixels, labels;
  static constexpr std::size_t classes = 10;
};

/// Reads a pair of IDX files (images rank 3, labels rank 1) and checks that they agree.
inline image_set load_idx_pair(const std::filesystem::path& images, const std::filesystem::path& labels) {
  auto img = parse_idx(read_gzip(images), 3, images.string());
  auto lab = parse_idx(read_gzip(labels), 1, labels.string());
  if (img.shape[0] != lab.shape[0]) {
    throw precis::error(labels.string() + ": " + std::to_string(lab.shape[0]) + " labels for the " +
                        std::to_string(img.shape[0]) + " images of " + images.string());
  }
  for (std::size_t i = 0; i < lab.values.size(); ++i) {
    if (lab.values[i] >= image_set::classes) {
      throw precis::error(labels.string() + ": label " + std::to_string(lab.values[i]) + " of item " + std::to_string(i) +
                          " is not a class 0.." + std::to_string(image_set::classes - 1));
    }
  }
  return {img.shape[0], img.shape[1], img.shape[2], std::move(img.values), std::move(lab.values)};
}

/// Fashion-MNIST's training (60,000) or test (10,000) images from `dir`.
inline image_set load_fashion_mnist(const std::filesystem::path& dir, split which) {
  if (!std::filesystem::is_directory(dir)) {
    throw precis::error(dir.string() + ": no such directory (Debian installs Fashion-MNIST there with "
                        "apt-get install dataset-fashion-mnist)");
  }
  const std::string stem = which == split::train ? "train" : "t10k";
  return load_idx_pair(dir / (stem + "-images-idx3-ubyte.gz"), dir / (stem + "-labels-idx1-ubyte.gz"));
}

/// The mean and standard deviation of a set's pixels scaled to [0, 1], in double: the
/// examples normalise both splits with the training set's.
struct pixel_statistics {
  double mean = 0, sd = 1;
};
inline pixel_statistics statistics_of(const image_set& s) {
  double sum = 0, sum2 = 0;
  for (const auto p : s.pixels) {
    const double v = double(p) / 255.0;
    sum += v;
    sum2 += v * v;
  }
  const double n = double(s.pixels.size()), mean = sum / n;
  return {mean, std::sqrt(sum2 / n - mean * mean)};
}

}  // namespace vit
