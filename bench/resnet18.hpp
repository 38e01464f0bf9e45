// The convolutions of ResNet-18 on 224x224 images (the stem and one of each distinct shape
// of each stage), shared by the CPU and device convolution benchmarks.
#pragma once

#include <cstddef>

namespace precis_bench {

/// One convolution: input channels, square input size, output channels, square kernel,
/// stride and padding.
struct conv_layer {
  const char* name;
  std::size_t c, h, co, k, s, p;
  std::size_t out() const { return (h + 2 * p - k) / s + 1; }
};

inline constexpr conv_layer resnet18_layers[] = {
    {"conv1 7x7/2", 3, 224, 64, 7, 2, 3},   {"l1 3x3", 64, 56, 64, 3, 1, 1},
    {"l2 3x3/2", 64, 56, 128, 3, 2, 1},     {"l2 3x3", 128, 28, 128, 3, 1, 1},
    {"l2 1x1/2", 64, 56, 128, 1, 2, 0},     {"l3 3x3/2", 128, 28, 256, 3, 2, 1},
    {"l3 3x3", 256, 14, 256, 3, 1, 1},      {"l4 3x3/2", 256, 14, 512, 3, 2, 1},
    {"l4 3x3", 512, 7, 512, 3, 1, 1},
};

}  // namespace precis_bench
