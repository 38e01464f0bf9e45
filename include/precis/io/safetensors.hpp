/// @file
/// The safetensors format, in which PyTorch and Hugging Face users exchange weights. Needs
/// nlohmann/json (Debian: nlohmann-json3-dev); the CMake target precis::safetensors brings it.
///
///     auto f = precis::safetensors::file::read("model.safetensors");
///     for (const auto& t : f.tensors()) ... t.name, t.type, t.shape ...
///     std::vector<float> w = f.floats(f.at("head.weight"));
///     precis::safetensors::write("out.safetensors", {safetensors::tensor("w", {2, 3}, values)});
///
/// Layout: an unsigned little-endian 64-bit header length N, N bytes of JSON, then the data.
/// The JSON object maps each tensor's name to {"dtype", "shape", "data_offsets": [begin,
/// end]} (offsets into the data, row-major, little-endian values); the optional key
/// "__metadata__" maps strings to strings. A file is accepted only when all of this holds:
///   - N fits in the file, is at most 100 MB, and the header is one JSON object beginning
///     with '{' (trailing spaces allowed), with no key given twice;
///   - every entry has exactly the three fields, a known dtype, a shape of whole numbers and
///     two offsets with begin <= end, and end - begin = its elements x the dtype's size;
///   - the tensors cover the data exactly: no two overlap, no byte lies between or after
///     them, none reaches past the end;
///   - the metadata, when present, is an object of strings.
/// Anything else throws precis::error naming the source and the problem; nothing is
/// returned half-parsed.
#pragma once

#include <precis/config.hpp>
#include <precis/io/file.hpp>
#include <precis/numeric/numeric.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <limits>
#include <map>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace precis::safetensors {

static_assert(std::endian::native == std::endian::little,
              "precis: the safetensors reader and writer assume a little-endian host");

/// A tensor's element type, as the format names it ("F32", "BF16", ...).
enum class dtype : std::uint8_t {
  boolean,
  u8,
  i8,
  f8_e5m2,
  f8_e4m3,
  i16,
  u16,
  f16,
  bf16,
  i32,
  u32,
  f32,
  f64,
  i64,
  u64,
};

namespace detail {

struct dtype_info {
  dtype type;
  std::string_view name;
  std::size_t size;
  bool floating;  // converts exactly to float
};

inline constexpr std::array<dtype_info, 15> dtypes{{
    {dtype::boolean, "BOOL", 1, false},
    {dtype::u8, "U8", 1, false},
    {dtype::i8, "I8", 1, false},
    {dtype::f8_e5m2, "F8_E5M2", 1, true},
    {dtype::f8_e4m3, "F8_E4M3", 1, true},
    {dtype::i16, "I16", 2, false},
    {dtype::u16, "U16", 2, false},
    {dtype::f16, "F16", 2, true},
    {dtype::bf16, "BF16", 2, true},
    {dtype::i32, "I32", 4, false},
    {dtype::u32, "U32", 4, false},
    {dtype::f32, "F32", 4, true},
    {dtype::f64, "F64", 8, false},
    {dtype::i64, "I64", 8, false},
    {dtype::u64, "U64", 8, false},
}};

constexpr const dtype_info& info(dtype t) { return dtypes[static_cast<std::size_t>(t)]; }

}  // namespace detail

/// The format's name of `t` ("F32").
constexpr std::string_view name_of(dtype t) { return detail::info(t).name; }
/// Bytes per element.
constexpr std::size_t size_of(dtype t) { return detail::info(t).size; }
/// True for the types whose every value float holds exactly (F32, F16, BF16, F8_E4M3,
/// F8_E5M2): the ones file::floats converts. F64 is not one of them: convert it to F32
/// where the file is made, so that the rounding is a visible choice.
constexpr bool converts_to_float(dtype t) { return detail::info(t).floating; }

/// The element type of C++ type T (float, precis::float16, bfloat16, float8_e4m3,
/// float8_e5m2).
template <class T>
constexpr dtype dtype_of() {
  if constexpr (std::is_same_v<T, float>) {
    return dtype::f32;
  } else if constexpr (std::is_same_v<T, float16>) {
    return dtype::f16;
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    return dtype::bf16;
  } else if constexpr (std::is_same_v<T, float8_e4m3>) {
    return dtype::f8_e4m3;
  } else if constexpr (std::is_same_v<T, float8_e5m2>) {
    return dtype::f8_e5m2;
  } else {
    static_assert(!sizeof(T), "precis: safetensors writes float, float16, bfloat16 and float8 tensors");
  }
}

/// One tensor of a file: where its bytes lie in the data section.
struct entry {
  std::string name;                ///< the tensor's name, the key of its header entry
  dtype type = dtype::f32;         ///< its element type
  std::vector<std::size_t> shape;  ///< its shape, outermost dimension first ([] for a scalar)
  /// The byte offset of its first byte in the data section.
  std::size_t begin = 0, end = 0;  ///< the byte offset one past its last byte
  /// Number of elements (1 for a scalar of shape []).
  std::size_t elements() const {
    std::size_t n = 1;
    for (auto s : shape) n *= s;
    return n;
  }
};

/// "[2, 3]".
inline std::string shape_string(std::span<const std::size_t> shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

/// A parsed safetensors file: its entries, in the order of their data, its metadata and
/// its bytes. Made by parse() or read(); immutable.
class file {
 public:
  /// Header lengths above this are refused (as the reference implementation does).
  static constexpr std::uint64_t max_header_bytes = 100'000'000;

  /// Parses a whole file held in memory. `source` names it in error messages.
  static file parse(std::string bytes, std::string source = "(memory)") {
    file f;
    f.source_ = std::move(source);
    f.bytes_ = std::move(bytes);
    f.parse_header();
    return f;
  }
  /// Reads and parses `path`.
  static file read(const std::filesystem::path& path) {
    return parse(read_file(path, "safetensors file"), path.string());
  }

  /// The tensors, ordered by where their data lies.
  const std::vector<entry>& tensors() const { return entries_; }
  /// The tensor named `name`, or nullptr.
  const entry* find(std::string_view name) const {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : &entries_[it->second];
  }
  /// The tensor named `name`; throws precis::error when there is none.
  const entry& at(std::string_view name) const {
    if (const entry* e = find(name)) return *e;
    fail("there is no tensor named \"" + std::string(name) + "\"");
  }
  /// The "__metadata__" strings (empty when the file has none).
  const std::map<std::string, std::string, std::less<>>& metadata() const { return metadata_; }
  /// The raw little-endian bytes of a tensor of this file.
  std::span<const std::byte> bytes(const entry& e) const {
    return {reinterpret_cast<const std::byte*>(bytes_.data()) + data_start_ + e.begin, e.end - e.begin};
  }
  /// A tensor's values converted to float, exactly; throws precis::error for a dtype that
  /// float does not hold exactly (see converts_to_float).
  std::vector<float> floats(const entry& e) const {
    if (!converts_to_float(e.type)) {
      fail("tensor \"" + e.name + "\" has dtype " + std::string(name_of(e.type)) +
           ", which does not convert exactly to float (F32, F16, BF16, F8_E4M3 and F8_E5M2 do)");
    }
    const auto raw = bytes(e);
    std::vector<float> out(e.elements());
    switch (e.type) {
      case dtype::f32:
        if (!raw.empty()) std::memcpy(out.data(), raw.data(), raw.size());
        break;
      case dtype::f16: widen<float16>(raw, out); break;
      case dtype::bf16: widen<bfloat16>(raw, out); break;
      case dtype::f8_e4m3: widen<float8_e4m3>(raw, out); break;
      case dtype::f8_e5m2: widen<float8_e5m2>(raw, out); break;
      default: break;
    }
    return out;
  }
  /// The name given to parse() or the path given to read().
  const std::string& source() const { return source_; }

 private:
  file() = default;

  [[noreturn]] void fail(const std::string& what) const {
    throw error("precis::safetensors: " + source_ + ": " + what);
  }

  template <class T>
  static void widen(std::span<const std::byte> raw, std::vector<float>& out) {
    using bits_t = decltype(T{}.bits());
    for (std::size_t i = 0; i < out.size(); ++i) {
      bits_t b;
      std::memcpy(&b, raw.data() + i * sizeof(bits_t), sizeof(bits_t));
      out[i] = float(T::from_bits(b));
    }
  }

  void parse_header() {
    if (bytes_.size() < 8) {
      fail("the file has " + std::to_string(bytes_.size()) + " bytes; it must begin with an 8-byte header length");
    }
    std::uint64_t n = 0;
    std::memcpy(&n, bytes_.data(), 8);
    if (n > max_header_bytes) {
      fail("the header length " + std::to_string(n) + " is above the limit of " + std::to_string(max_header_bytes) +
           " bytes");
    }
    if (n > bytes_.size() - 8) {
      fail("the header length " + std::to_string(n) + " runs past the end of the file (" +
           std::to_string(bytes_.size() - 8) + " bytes follow the length)");
    }
    data_start_ = 8 + static_cast<std::size_t>(n);
    const std::string_view header(bytes_.data() + 8, static_cast<std::size_t>(n));
    if (header.empty() || header.front() != '{') fail("the header does not begin with '{'");

    // Keys of each object, to refuse one given twice (JSON parsers keep only one of them).
    std::vector<std::set<std::string>> open;
    std::string duplicate;
    const auto cb = [&](int, nlohmann::json::parse_event_t ev, nlohmann::json& value) {
      using event = nlohmann::json::parse_event_t;
      if (ev == event::object_start) {
        open.emplace_back();
      } else if (ev == event::object_end) {
        if (!open.empty()) open.pop_back();
      } else if (ev == event::key && !open.empty() && duplicate.empty() &&
                 !open.back().insert(value.get<std::string>()).second) {
        duplicate = value.get<std::string>();
      }
      return true;
    };
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(header.begin(), header.end(), cb);
    } catch (const nlohmann::json::exception& e) {
      fail(std::string("the header is not valid JSON: ") + e.what());
    }
    if (!duplicate.empty()) fail("the header gives the key \"" + duplicate + "\" twice in one object");
    if (!j.is_object()) fail("the header is not a JSON object");

    const std::size_t data_size = bytes_.size() - data_start_;
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it.key() == "__metadata__") {
        parse_metadata(it.value());
      } else {
        entries_.push_back(parse_entry(it.key(), it.value(), data_size));
      }
    }
    // The data must be covered exactly: sorted by offset, each tensor starts where the
    // previous one ended.
    std::sort(entries_.begin(), entries_.end(), [](const entry& a, const entry& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    std::size_t at = 0;
    const entry* previous = nullptr;
    for (const entry& e : entries_) {
      if (e.begin < at) {
        fail("tensors \"" + previous->name + "\" and \"" + e.name + "\" overlap (bytes " + std::to_string(e.begin) +
             " to " + std::to_string(at) + ")");
      }
      if (e.begin > at) {
        fail("bytes " + std::to_string(at) + " to " + std::to_string(e.begin) + " of the data belong to no tensor");
      }
      at = e.end;
      if (e.end > e.begin) previous = &e;
    }
    if (at != data_size) {
      fail("bytes " + std::to_string(at) + " to " + std::to_string(data_size) + " of the data belong to no tensor");
    }
    for (std::size_t i = 0; i < entries_.size(); ++i) index_.emplace(entries_[i].name, i);
  }

  void parse_metadata(const nlohmann::json& m) {
    if (!m.is_object()) fail("\"__metadata__\" is not an object of strings");
    for (auto it = m.begin(); it != m.end(); ++it) {
      if (!it.value().is_string()) fail("metadata \"" + it.key() + "\" is not a string");
      metadata_.emplace(it.key(), it.value().get<std::string>());
    }
  }

  entry parse_entry(const std::string& name, const nlohmann::json& v, std::size_t data_size) const {
    const std::string what = "tensor \"" + name + "\"";
    if (!v.is_object()) fail(what + " is not a JSON object");
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (it.key() != "dtype" && it.key() != "shape" && it.key() != "data_offsets") {
        fail(what + " has an unknown field \"" + it.key() + "\"");
      }
    }
    entry e;
    e.name = name;
    const auto d = v.find("dtype");
    if (d == v.end() || !d->is_string()) fail(what + " has no \"dtype\" string");
    const auto& dn = d->get_ref<const std::string&>();
    const auto known = std::find_if(detail::dtypes.begin(), detail::dtypes.end(),
                                    [&](const detail::dtype_info& i) { return i.name == dn; });
    if (known == detail::dtypes.end()) fail(what + " has the unknown dtype \"" + dn + "\"");
    e.type = known->type;

    const auto s = v.find("shape");
    if (s == v.end() || !s->is_array()) fail(what + " has no \"shape\" array");
    std::size_t elements = 1;
    bool overflow = false;
    for (const auto& x : *s) {
      if (!x.is_number_unsigned()) fail(what + " has a shape entry that is not a whole number: " + x.dump());
      const auto dim = x.get<std::uint64_t>();
      if (dim > std::numeric_limits<std::size_t>::max()) overflow = true;
      e.shape.push_back(static_cast<std::size_t>(dim));
      if (elements != 0 && dim > std::numeric_limits<std::size_t>::max() / elements) overflow = true;
      elements *= static_cast<std::size_t>(dim);
    }

    const auto o = v.find("data_offsets");
    if (o == v.end() || !o->is_array() || o->size() != 2 || !(*o)[0].is_number_unsigned() ||
        !(*o)[1].is_number_unsigned()) {
      fail(what + " has no \"data_offsets\" pair of whole numbers");
    }
    const auto b = (*o)[0].get<std::uint64_t>(), en = (*o)[1].get<std::uint64_t>();
    if (b > en) fail(what + " has data_offsets [" + std::to_string(b) + ", " + std::to_string(en) + "] that end before they begin");
    if (en > data_size) {
      fail(what + " has data_offsets [" + std::to_string(b) + ", " + std::to_string(en) + "] past the end of the data (" +
           std::to_string(data_size) + " bytes)");
    }
    e.begin = static_cast<std::size_t>(b);
    e.end = static_cast<std::size_t>(en);
    if (overflow || elements > std::numeric_limits<std::size_t>::max() / size_of(e.type) ||
        elements * size_of(e.type) != e.end - e.begin) {
      fail(what + " of dtype " + std::string(name_of(e.type)) + " and shape " + shape_string(e.shape) + " needs " +
           (overflow ? std::string("more bytes than a size can hold")
                     : std::to_string(elements * size_of(e.type)) + " bytes") +
           ", its data_offsets give " + std::to_string(e.end - e.begin));
    }
    return e;
  }

  std::string source_;
  std::string bytes_;
  std::size_t data_start_ = 0;
  std::vector<entry> entries_;
  std::map<std::string, std::size_t, std::less<>> index_;
  std::map<std::string, std::string, std::less<>> metadata_;
};

/// A tensor to write: its name, type, shape and little-endian bytes.
struct tensor_data {
  std::string name;                ///< the tensor's name in the file
  dtype type = dtype::f32;         ///< its element type
  std::vector<std::size_t> shape;  ///< its shape, outermost dimension first ([] for a scalar)
  std::string bytes;               ///< its values, row-major, little-endian
};

/// A tensor of `values` (float, float16, bfloat16, float8_e4m3 or float8_e5m2) to write.
/// Throws precis::error when the shape does not hold values.size() elements.
template <class T>
tensor_data tensor(std::string name, std::vector<std::size_t> shape, std::span<const T> values) {
  std::size_t n = 1;
  for (auto s : shape) n *= s;
  if (n != values.size()) {
    throw error("precis::safetensors: tensor \"" + name + "\" of shape " + shape_string(shape) + " is given " +
                std::to_string(values.size()) + " values");
  }
  tensor_data t{std::move(name), dtype_of<T>(), std::move(shape), {}};
  t.bytes.resize(values.size() * sizeof(T));
  if constexpr (std::is_same_v<T, float>) {
    if (!values.empty()) std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  } else {
    for (std::size_t i = 0; i < values.size(); ++i) {
      const auto b = values[i].bits();
      std::memcpy(t.bytes.data() + i * sizeof(b), &b, sizeof(b));
    }
  }
  return t;
}
/// The same, from a vector of values.
template <class T>
tensor_data tensor(std::string name, std::vector<std::size_t> shape, const std::vector<T>& values) {
  return tensor(std::move(name), std::move(shape), std::span<const T>(values));
}

/// The bytes of a safetensors file holding `tensors` (in this order) and `metadata`. The
/// header is padded with spaces to a multiple of 8 bytes, so that every tensor of 8-byte
/// or smaller elements is aligned when the file is mapped. Throws precis::error for two
/// tensors of one name or a name "__metadata__".
inline std::string serialize(const std::vector<tensor_data>& tensors,
                             const std::map<std::string, std::string, std::less<>>& metadata = {}) {
  // nlohmann's ordered_json keeps the order of insertion, so the header lists the tensors
  // in the order of their data.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    auto& m = header["__metadata__"] = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
  }
  std::size_t at = 0;
  std::set<std::string_view> names;
  for (const auto& t : tensors) {
    if (t.name == "__metadata__" || !names.insert(t.name).second) {
      throw error("precis::safetensors: cannot write two tensors named \"" + t.name +
                  "\" (or one named __metadata__)");
    }
    std::size_t n = 1;
    for (auto s : t.shape) n *= s;
    if (n * size_of(t.type) != t.bytes.size()) {
      throw error("precis::safetensors: tensor \"" + t.name + "\" of shape " + shape_string(t.shape) + " and dtype " +
                  std::string(name_of(t.type)) + " has " + std::to_string(t.bytes.size()) + " bytes");
    }
    header[t.name] = {{"dtype", std::string(name_of(t.type))},
                      {"shape", t.shape},
                      {"data_offsets", {at, at + t.bytes.size()}}};
    at += t.bytes.size();
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  const std::uint64_t n = h.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  out += h;
  for (const auto& t : tensors) out += t.bytes;
  return out;
}

/// Writes serialize(tensors, metadata) to `path` atomically (precis::write_file_atomically).
inline void write(const std::filesystem::path& path, const std::vector<tensor_data>& tensors,
                  const std::map<std::string, std::string, std::less<>>& metadata = {}) {
  write_file_atomically(path, serialize(tensors, metadata));
}

}  // namespace precis::safetensors
