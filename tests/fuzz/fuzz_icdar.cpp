// libFuzzer harness for the DBNet example's ICDAR 2015 reader (examples/dbnet/icdar.hpp).
// Any input must be refused with precis::error or read into regions that, written out and
// read again, give the same regions (corners are whole numbers, so nothing is rounded);
// results likewise. Anything else is a bug.
#include "../../examples/dbnet/icdar.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto regions = dbnet::parse_gt(text, "fuzz");
    if (dbnet::parse_gt(dbnet::format_gt(regions), "again") != regions) std::abort();
  } catch (const precis::error&) {
  }
  try {
    const auto quads = dbnet::parse_result(text, "fuzz");
    if (dbnet::parse_result(dbnet::format_result(quads), "again") != quads) std::abort();
  } catch (const precis::error&) {
  }
  return 0;
}
