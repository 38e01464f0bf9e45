// safetensors: files written byte by byte as the format's description has them, read back
// to the bit; each kind of malformed file refused with its message; the writer's files read
// by the reader; a model's weights saved and loaded all-or-nothing through a name map.
#include <precis/io/safetensors.hpp>
#include <precis/nn/safetensors.hpp>
#include <precis/precis.hpp>

#include <doctest/doctest.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

using namespace precis;
namespace st = precis::safetensors;
namespace fs = std::filesystem;

namespace {

/// A file made by hand: the 8-byte length, `header` as given, then `data`.
std::string raw_file(const std::string& header, const std::string& data = {}) {
  std::string out(8, '\0');
  const std::uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

template <class T>
std::string le_bytes(std::initializer_list<T> values) {
  std::string out;
  for (T v : values) out.append(reinterpret_cast<const char*>(&v), sizeof v);
  return out;
}

/// The message precis::error gives for parsing `bytes`, or "" when it parses.
std::string parse_error(const std::string& bytes) {
  try {
    (void)st::file::parse(bytes, "bad.safetensors");
  } catch (const error& e) {
    return e.what();
  }
  return "";
}

void check_refused(const std::string& bytes, const std::string& expected) {
  const std::string msg = parse_error(bytes);
  INFO("message: " << msg);
  CHECK(msg.find("precis::safetensors: bad.safetensors: ") == 0);
  CHECK(msg.find(expected) != std::string::npos);
}

fs::path temp_dir(const char* name) {
  const auto d = fs::temp_directory_path() / (std::string("precis_safetensors_") + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

}  // namespace

TEST_CASE("a file written by hand is read to the bit, in every float dtype") {
  // Values whose bits the formats define: 1.0, -2.0 and each format's smallest subnormal.
  const std::string data = le_bytes<float>({1.5f, -0.0f, 0x1p-149f}) +          // F32 [3]
                           le_bytes<std::uint16_t>({0x3F80, 0xC000, 0x0001}) +  // BF16 [3]
                           le_bytes<std::uint16_t>({0x3C00, 0x8001}) +          // F16 [2]
                           le_bytes<std::uint8_t>({0x38, 0x01}) +               // F8_E4M3 [2]
                           le_bytes<std::uint8_t>({0x3C, 0x01}) +               // F8_E5M2 [2]
                           le_bytes<std::int64_t>({7});                         // I64 []
  const std::string header =
      R"({"b":{"dtype":"BF16","shape":[3,1],"data_offsets":[12,18]},)"
      R"("__metadata__":{"format":"pt","note":"x"},)"
      R"("a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},)"
      R"("h":{"dtype":"F16","shape":[2],"data_offsets":[18,22]},)"
      R"("e4":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[22,24]},)"
      R"("e5":{"dtype":"F8_E5M2","shape":[1,2],"data_offsets":[24,26]},)"
      R"("n":{"dtype":"I64","shape":[],"data_offsets":[26,34]},)"
      R"("empty":{"dtype":"F32","shape":[0,4],"data_offsets":[34,34]}}   )";
  const auto f = st::file::parse(raw_file(header, data), "hand.safetensors");
  REQUIRE(f.tensors().size() == 7);
  // Ordered by their data.
  std::vector<std::string> order;
  for (const auto& t : f.tensors()) order.push_back(t.name);
  CHECK(order == std::vector<std::string>{"a", "b", "h", "e4", "e5", "n", "empty"});
  CHECK(f.metadata().at("format") == "pt");
  CHECK(f.metadata().at("note") == "x");

  auto bits = [](float v) { return std::bit_cast<std::uint32_t>(v); };
  const auto a = f.floats(f.at("a"));
  CHECK(bits(a[0]) == bits(1.5f));
  CHECK(bits(a[1]) == bits(-0.0f));
  CHECK(bits(a[2]) == 1u);
  CHECK(f.floats(f.at("b")) == std::vector<float>{1.0f, -2.0f, 0x1p-133f});
  CHECK(f.at("b").shape == std::vector<std::size_t>{3, 1});
  CHECK(f.floats(f.at("h")) == std::vector<float>{1.0f, -0x1p-24f});
  CHECK(f.floats(f.at("e4")) == std::vector<float>{1.0f, 0x1p-9f});
  CHECK(f.floats(f.at("e5")) == std::vector<float>{1.0f, 0x1p-16f});
  CHECK(f.at("n").elements() == 1);
  CHECK(f.at("n").type == st::dtype::i64);
  CHECK(f.at("empty").elements() == 0);
  CHECK(f.floats(f.at("empty")).empty());
  CHECK(f.find("missing") == nullptr);
  CHECK_THROWS_WITH_AS(f.at("missing"), doctest::Contains("hand.safetensors: there is no tensor named \"missing\""),
                       error);
  CHECK_THROWS_WITH_AS(f.floats(f.at("n")), doctest::Contains("tensor \"n\" has dtype I64, which does not convert"),
                       error);
}

TEST_CASE("malformed files are refused, naming the problem") {
  const std::string ok_entry = R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string eight(8, 'x');
  SUBCASE("well-formed base case parses") { CHECK(parse_error(raw_file("{" + ok_entry + "}", eight)).empty()); }
  SUBCASE("too short for a length") { check_refused("abc", "it must begin with an 8-byte header length"); }
  SUBCASE("header length past the end") {
    std::string b = raw_file("{" + ok_entry + "}", eight);
    const std::uint64_t n = b.size();
    std::memcpy(b.data(), &n, 8);
    check_refused(b, "runs past the end of the file");
  }
  SUBCASE("header length over the limit") {
    std::string b(16, '\0');
    const std::uint64_t n = std::uint64_t(1) << 40;
    std::memcpy(b.data(), &n, 8);
    check_refused(b, "is above the limit");
  }
  SUBCASE("not beginning with {") { check_refused(raw_file(" {}"), "does not begin with '{'"); }
  SUBCASE("bad JSON") { check_refused(raw_file(R"({"w":{"dtype":"F32",)"), "the header is not valid JSON"); }
  SUBCASE("trailing garbage after the object") { check_refused(raw_file("{} x"), "not valid JSON"); }
  SUBCASE("a key twice") {
    check_refused(raw_file("{" + ok_entry + "," + ok_entry + "}", eight), "gives the key \"w\" twice");
    check_refused(raw_file(R"({"w":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})", eight),
                  "gives the key \"dtype\" twice");
  }
  SUBCASE("an entry that is not an object") { check_refused(raw_file(R"({"w":[1]})"), "tensor \"w\" is not a JSON object"); }
  SUBCASE("unknown dtype") {
    check_refused(raw_file(R"({"w":{"dtype":"F12","shape":[2],"data_offsets":[0,8]}})", eight),
                  "tensor \"w\" has the unknown dtype \"F12\"");
  }
  SUBCASE("no dtype") {
    check_refused(raw_file(R"({"w":{"shape":[2],"data_offsets":[0,8]}})", eight), "has no \"dtype\" string");
  }
  SUBCASE("unknown field") {
    check_refused(raw_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", eight),
                  "has an unknown field \"x\"");
  }
  SUBCASE("shape entries must be whole numbers") {
    check_refused(raw_file(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", eight), "not a whole number: -2");
    check_refused(raw_file(R"({"w":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", eight), "not a whole number");
    check_refused(raw_file(R"({"w":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})", eight), "has no \"shape\" array");
  }
  SUBCASE("shape that does not match the bytes") {
    check_refused(raw_file(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", eight),
                  "of dtype F32 and shape [3] needs 12 bytes, its data_offsets give 8");
  }
  SUBCASE("shape whose size overflows") {
    check_refused(raw_file(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", eight),
                  "needs more bytes than a size can hold");
  }
  SUBCASE("offsets") {
    check_refused(raw_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", eight), "end before they begin");
    check_refused(raw_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", eight),
                  "past the end of the data (8 bytes)");
    check_refused(raw_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", eight),
                  "has no \"data_offsets\" pair");
  }
  SUBCASE("overlapping tensors") {
    check_refused(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                           eight),
                  "tensors \"a\" and \"b\" overlap");
  }
  SUBCASE("a hole between tensors, and bytes after the last") {
    check_refused(raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                           R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                           std::string(12, 'x')),
                  "bytes 4 to 8 of the data belong to no tensor");
    check_refused(raw_file("{" + ok_entry + "}", eight + "tail"), "bytes 8 to 12 of the data belong to no tensor");
  }
  SUBCASE("metadata") {
    check_refused(raw_file(R"({"__metadata__":{"a":1}})"), "metadata \"a\" is not a string");
    check_refused(raw_file(R"({"__metadata__":"x"})"), "\"__metadata__\" is not an object of strings");
  }
}

TEST_CASE("the writer's files read back to the bit, header aligned to 8 bytes") {
  const std::vector<float> w{1.0f, -0.5f, 3.25f, 0x1p-140f, 65504.0f, -1e30f};
  const std::vector<bfloat16> b{bfloat16(1.0f), bfloat16(-3.0f), bfloat16::from_bits(0x0001)};
  const auto bytes = st::serialize({st::tensor("layer.weight", {2, 3}, w), st::tensor("layer.bias", {3}, b)},
                                   {{"source", "test"}});
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  CHECK(n % 8 == 0);
  const auto f = st::file::parse(bytes);
  CHECK(f.at("layer.weight").shape == std::vector<std::size_t>{2, 3});
  CHECK(f.floats(f.at("layer.weight")) == w);
  CHECK(f.at("layer.bias").type == st::dtype::bf16);
  CHECK(f.floats(f.at("layer.bias")) == std::vector<float>{1.0f, -3.0f, 0x1p-133f});
  CHECK(f.metadata().at("source") == "test");

  CHECK_THROWS_WITH_AS(st::tensor("x", {4}, w), doctest::Contains("tensor \"x\" of shape [4] is given 6 values"), error);
  CHECK_THROWS_WITH_AS(st::serialize({st::tensor("x", {6}, w), st::tensor("x", {6}, w)}),
                       doctest::Contains("cannot write two tensors named \"x\""), error);

  const auto dir = temp_dir("write");
  st::write(dir / "a.safetensors", {st::tensor("w", {6}, w)});
  CHECK(st::file::read(dir / "a.safetensors").floats(st::file::read(dir / "a.safetensors").at("w")) == w);
  CHECK_THROWS_WITH_AS(st::write(dir / "missing" / "a.safetensors", {st::tensor("w", {6}, w)}),
                       doctest::Contains("cannot create"), error);
  CHECK_THROWS_WITH_AS(st::file::read(dir / "nothing.safetensors"),
                       doctest::Contains("cannot open safetensors file"), error);
  fs::remove_all(dir);
}

namespace {

struct fc : layer<op::matmul> {
  static constexpr std::string_view name = "fc";
};
struct out : layer<op::matmul> {
  static constexpr std::string_view name = "out";
};

auto small_blueprint() {
  return nn::seq(nn::linear<fc>(4, 6), nn::layer_norm(6), nn::gelu(), nn::linear<out>(6, 3));
}

template <class M>
std::vector<std::vector<float>> masters(M& m) {
  std::vector<std::vector<float>> v;
  for (auto s : m.masters()) v.emplace_back(s.begin(), s.end());
  return v;
}

/// The names a PyTorch module of the same layers would give (nn.Sequential's indices).
std::string torch_names(std::string_view path) {
  if (path.starts_with("fc.")) return "0." + std::string(path.substr(3));
  if (path == "1.gamma") return "1.weight";
  if (path == "1.beta") return "1.bias";
  if (path.starts_with("out.")) return "3." + std::string(path.substr(4));
  throw error("no torch name for " + std::string(path));
}

}  // namespace

TEST_CASE("a model's weights saved and loaded through a name map, all or nothing") {
  auto a = nn::build<float, 2>(presets::fp32{}, small_blueprint(), {.seed = 1});
  auto b = nn::build<float, 2>(presets::bf16_mixed{}, small_blueprint(), {.seed = 2});
  REQUIRE(masters(a) != masters(b));
  const auto dir = temp_dir("model");
  nn::save_safetensors(a, dir / "a.safetensors", torch_names, st::dtype::f32, {{"format", "pt"}});
  const auto f = st::file::read(dir / "a.safetensors");
  CHECK(f.find("0.weight") != nullptr);
  CHECK(f.at("0.weight").shape == std::vector<std::size_t>{6, 4});
  CHECK(f.find("1.bias") != nullptr);
  CHECK(f.metadata().at("format") == "pt");

  nn::load_safetensors(b, f, torch_names);
  CHECK(masters(b) == masters(a));
  // The working copies followed: b's first layer stores bfloat16, rounded from the masters.
  b.for_each_parameter([&](const std::string& path, const auto& p) {
    if (path != "fc.weight") return;
    for (std::size_t i = 0; i < p.size(); ++i) {
      CHECK(std::bit_cast<std::uint16_t>(p.value().data()[i]) ==
            std::bit_cast<std::uint16_t>(round_to<bfloat16>(p.master().data()[i])));
    }
  });

  SUBCASE("bfloat16 files hold the masters rounded once") {
    nn::save_safetensors(a, dir / "a_bf16.safetensors", torch_names, st::dtype::bf16);
    auto c = nn::build<float, 2>(presets::fp32{}, small_blueprint(), {.seed = 3});
    nn::load_safetensors(c, st::file::read(dir / "a_bf16.safetensors"), torch_names);
    const auto ma = masters(a), mc = masters(c);
    for (std::size_t t = 0; t < ma.size(); ++t) {
      for (std::size_t i = 0; i < ma[t].size(); ++i) CHECK(mc[t][i] == float(round_to<bfloat16>(ma[t][i])));
    }
  }
  SUBCASE("problems are listed together and nothing is loaded") {
    // A file with one tensor missing, one of another shape, one of an integer type and one
    // that no parameter takes.
    std::vector<st::tensor_data> ts;
    for (const auto& t : f.tensors()) {
      const auto v = f.floats(t);
      if (t.name == "0.bias") continue;
      if (t.name == "3.weight") {
        ts.push_back(st::tensor(t.name, {3, 5}, std::vector<float>(15, 1.0f)));
      } else if (t.name == "1.weight") {
        ts.push_back({t.name, st::dtype::i32, t.shape, std::string(t.elements() * 4, '\0')});
      } else {
        ts.push_back(st::tensor(t.name, t.shape, v));
      }
    }
    ts.push_back(st::tensor("extra", {1}, std::vector<float>{1.0f}));
    auto c = nn::build<float, 2>(presets::fp32{}, small_blueprint(), {.seed = 3});
    const auto before = masters(c);
    const auto bad = st::file::parse(st::serialize(ts), "bad.safetensors");
    try {
      nn::load_safetensors(c, bad, torch_names);
      FAIL("load_safetensors accepted a bad file");
    } catch (const error& e) {
      const std::string msg = e.what();
      INFO(msg);
      CHECK(msg.find("bad.safetensors: nothing was loaded; 4 problems") != std::string::npos);
      CHECK(msg.find("parameter fc.bias: the file has no tensor \"0.bias\"") != std::string::npos);
      CHECK(msg.find("parameter out.weight has shape [3, 6], tensor \"3.weight\" has shape [3, 5]") != std::string::npos);
      CHECK(msg.find("tensor \"1.weight\" has dtype I32") != std::string::npos);
      CHECK(msg.find("tensor \"extra\" is not used by any parameter") != std::string::npos);
    }
    CHECK(masters(c) == before);
  }
  SUBCASE("unused tensors allowed when asked; unit axes ignored; two paths on one name refused") {
    std::vector<st::tensor_data> ts;
    for (const auto& t : f.tensors()) {
      std::vector<std::size_t> shape = t.shape;
      shape.insert(shape.begin(), 1);  // [1, ...] as PyTorch's tokens are saved
      ts.push_back(st::tensor(t.name, shape, f.floats(t)));
    }
    ts.push_back(st::tensor("extra", {1}, std::vector<float>{1.0f}));
    const auto g = st::file::parse(st::serialize(ts), "extra.safetensors");
    auto c = nn::build<float, 2>(presets::fp32{}, small_blueprint(), {.seed = 3});
    CHECK_THROWS_WITH_AS(nn::load_safetensors(c, g, torch_names), doctest::Contains("\"extra\" is not used"), error);
    nn::load_safetensors(c, g, torch_names, {.allow_unused = true});
    CHECK(masters(c) == masters(a));
    CHECK_THROWS_WITH_AS(nn::load_safetensors(c, g, [](std::string_view) { return std::string("0.weight"); }),
                         doctest::Contains("both map to \"0.weight\""), error);
  }
  fs::remove_all(dir);
}
