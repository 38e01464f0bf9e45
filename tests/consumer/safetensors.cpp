// The installed precis::safetensors: a file written and read back through the installed
// headers and the nlohmann_json the package config found.
#include <precis/io/safetensors.hpp>

#include <cstdio>
#include <vector>

int main() {
  namespace st = precis::safetensors;
  const std::vector<float> w{1.0f, -2.0f, 0.5f};
  const auto f = st::file::parse(st::serialize({st::tensor("w", {3}, w)}, {{"format", "pt"}}));
  const bool ok = f.floats(f.at("w")) == w && f.metadata().at("format") == "pt";
  std::printf("precis::safetensors round trip: %s\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
