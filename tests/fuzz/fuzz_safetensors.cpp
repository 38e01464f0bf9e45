// libFuzzer harness for the safetensors reader (precis/io/safetensors.hpp). Any input must
// either be refused with precis::error or parse into entries that cover the data exactly;
// every float tensor converts, and writing the parsed file again and reading it back gives
// the same names, types, shapes, bytes and metadata. Anything else (a crash, a sanitizer
// report, another exception) is a bug.
//
// Built with clang's -fsanitize=fuzzer where libFuzzer is there (target fuzz_safetensors;
// CTest runs it for a bounded number of inputs from tests/fuzz/corpus/safetensors), and with
// replay_main.cpp everywhere (fuzz_safetensors_corpus: every corpus file once).
#include <precis/io/safetensors.hpp>

#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

namespace st = precis::safetensors;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    const auto f = st::file::parse(bytes, "fuzz input");
    std::vector<st::tensor_data> again;
    std::size_t at = 0;
    for (const auto& e : f.tensors()) {
      if (e.begin != at || e.end < e.begin || e.end - e.begin != e.elements() * st::size_of(e.type)) std::abort();
      at = e.end;
      if (st::converts_to_float(e.type) && f.floats(e).size() != e.elements()) std::abort();
      const auto raw = f.bytes(e);
      again.push_back({e.name, e.type, e.shape, std::string(reinterpret_cast<const char*>(raw.data()), raw.size())});
    }
    const auto g = st::file::parse(st::serialize(again, f.metadata()), "rewritten");
    if (g.tensors().size() != f.tensors().size() || g.metadata() != f.metadata()) std::abort();
    for (const auto& e : f.tensors()) {
      const st::entry* h = g.find(e.name);
      if (h == nullptr || h->type != e.type || h->shape != e.shape) std::abort();
      const auto a = f.bytes(e), b = g.bytes(*h);
      if (a.size() != b.size() || !std::equal(a.begin(), a.end(), b.begin())) std::abort();
    }
  } catch (const precis::error&) {
    // Refused with a message: what malformed input must give.
  }
  return 0;
}
