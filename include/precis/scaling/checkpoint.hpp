/// @file
/// The complete state of a scaler or float8 recipe, saved and loaded in a versioned,
/// self-describing binary format.
///
/// Layout (little-endian):
///   "PRECISSC"             8-byte magic
///   u32 version            format version (2; version 1 had no f64 fields)
///   u16 n, n bytes         the kind ("dynamic_scaler", "delayed_scaling", ...)
///   u32 count              number of fields
///   count x field:         u16 n, n bytes of name; u8 type; payload
///                          type 1: f32; 2: u32; 3: u64; 4: u64 n, n x f32;
///                          5: u64 n, n x (u64 step, f32 scale); 6: f64
///   u32 crc                CRC-32 (IEEE) of every byte before it
///
/// Loading reads into a copy, checks the magic, version, checksum, kind, every field's name
/// and type, that no field is missing or unexpected, and the loaded state's consistency;
/// only then does it replace the object's state. Any failure throws precis::error saying
/// what is wrong and leaves the object unchanged.
#pragma once

#include <precis/config.hpp>
#include <precis/scaling/scalers.hpp>

#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <istream>
#include <iterator>
#include <map>
#include <ostream>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace precis {

/// Version of the checkpoint format this precis writes and reads.
inline constexpr std::uint32_t scaler_checkpoint_version = 2;

namespace detail {

inline std::uint32_t crc32(std::string_view bytes) {
  static const auto table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1U) ? 0xEDB88320U ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  std::uint32_t c = 0xFFFFFFFFU;
  for (char ch : bytes) c = table[(c ^ static_cast<unsigned char>(ch)) & 0xFFU] ^ (c >> 8);
  return c ^ 0xFFFFFFFFU;
}

constexpr std::string_view checkpoint_magic = "PRECISSC";
enum class field_type : std::uint8_t { f32 = 1, u32 = 2, u64 = 3, f32_array = 4, history = 5, f64 = 6 };

class checkpoint_writer {
 public:
  template <class T>
  void put(T v) {
    unsigned char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    for (std::size_t i = 0; i < sizeof(T); ++i) out_.push_back(static_cast<char>(b[i]));
  }
  void put_string(std::string_view s) {
    put(static_cast<std::uint16_t>(s.size()));
    out_.append(s);
  }
  // Two fields of one name would save, then fail to load: refused here, before any file is
  // written.
  void begin_field(std::string_view name, field_type t) {
    if (!names_.emplace(name).second) {
      throw error("precis: a checkpoint field named '" + std::string(name) +
                  "' is written twice (nn::model saves every layer's parameters itself: a layer's "
                  "visit_state writes only its other state)");
    }
    put_string(name);
    put(static_cast<std::uint8_t>(t));
    ++count_;
  }
  void field(std::string_view name, float& v) {
    begin_field(name, field_type::f32);
    put(v);
  }
  void field(std::string_view name, double& v) {
    begin_field(name, field_type::f64);
    put(v);
  }
  void field(std::string_view name, std::uint32_t& v) {
    begin_field(name, field_type::u32);
    put(v);
  }
  void field(std::string_view name, std::uint64_t& v) {
    begin_field(name, field_type::u64);
    put(v);
  }
  void floats(std::string_view name, std::vector<float>& v) {
    begin_field(name, field_type::f32_array);
    put(static_cast<std::uint64_t>(v.size()));
    for (float x : v) put(x);
  }
  void history(std::string_view name, std::vector<scale_change>& v) {
    begin_field(name, field_type::history);
    put(static_cast<std::uint64_t>(v.size()));
    for (const auto& c : v) {
      put(c.step);
      put(c.scale);
    }
  }
  std::string& bytes() { return out_; }
  std::uint32_t count() const { return count_; }
  const std::set<std::string, std::less<>>& names() const { return names_; }

 private:
  std::string out_;
  std::uint32_t count_ = 0;
  std::set<std::string, std::less<>> names_;
};

// Parses and verifies the whole input first; fields are then handed out by name.
class checkpoint_reader {
 public:
  checkpoint_reader(std::string_view bytes, std::string_view expected_kind) : in_(bytes) {
    if (in_.size() < checkpoint_magic.size() + 4 + 4 ||
        in_.substr(0, checkpoint_magic.size()) != checkpoint_magic) {
      fail("not a precis scaler checkpoint (the magic bytes \"PRECISSC\" are missing)");
    }
    const auto body = in_.substr(0, in_.size() - 4);
    pos_ = in_.size() - 4;
    const auto stored_crc = get<std::uint32_t>();
    pos_ = checkpoint_magic.size();
    const auto version = get<std::uint32_t>();
    if (version != scaler_checkpoint_version) {
      fail("format version " + std::to_string(version) + " is not supported (this precis reads version " +
           std::to_string(scaler_checkpoint_version) + ")");
    }
    if (crc32(body) != stored_crc) fail("the checksum does not match: the data is truncated or corrupted");
    end_ = body.size();
    const std::string kind = get_string();
    if (kind != expected_kind) {
      fail("it holds the state of a " + kind + ", not of a " + std::string(expected_kind));
    }
    const auto count = get<std::uint32_t>();
    for (std::uint32_t i = 0; i < count; ++i) {
      std::string name = get_string();
      const auto type = static_cast<field_type>(get<std::uint8_t>());
      const std::size_t start = pos_;
      switch (type) {
        case field_type::f32: skip(4); break;
        case field_type::u32: skip(4); break;
        case field_type::u64: skip(8); break;
        case field_type::f64: skip(8); break;
        case field_type::f32_array: skip_array(4); break;
        case field_type::history: skip_array(12); break;
        default: fail("field '" + name + "' has an unknown type");
      }
      if (!fields_.emplace(name, std::pair{type, in_.substr(start, pos_ - start)}).second) {
        fail("field '" + name + "' appears twice");
      }
    }
    if (pos_ != end_) fail("there are bytes after the last field");
  }

  void field(std::string_view name, float& v) { v = scalar<float>(name, field_type::f32); }
  void field(std::string_view name, double& v) { v = scalar<double>(name, field_type::f64); }
  void field(std::string_view name, std::uint32_t& v) { v = scalar<std::uint32_t>(name, field_type::u32); }
  void field(std::string_view name, std::uint64_t& v) { v = scalar<std::uint64_t>(name, field_type::u64); }
  void floats(std::string_view name, std::vector<float>& v) {
    auto r = sub(name, field_type::f32_array);
    const auto n = r.get<std::uint64_t>();
    v.assign(n, 0.0f);
    for (auto& x : v) x = r.get<float>();
  }
  void history(std::string_view name, std::vector<scale_change>& v) {
    auto r = sub(name, field_type::history);
    const auto n = r.get<std::uint64_t>();
    v.assign(n, scale_change{0, 0.0f});
    for (auto& c : v) {
      c.step = r.get<std::uint64_t>();
      c.scale = r.get<float>();
    }
  }
  void finish() const {
    for (const auto& [name, f] : fields_) {
      if (!used_.count(name)) fail("field '" + name + "' is not part of this state");
    }
  }

 private:
  [[noreturn]] static void fail(const std::string& what) {
    throw error("precis: cannot load the scaler checkpoint: " + what);
  }
  void need(std::size_t n) const {
    if (n > end_ - pos_) fail("it ends in the middle of a field (truncated)");
  }
  void skip(std::size_t n) {
    need(n);
    pos_ += n;
  }
  void skip_array(std::size_t item) {
    const auto n = get<std::uint64_t>();
    if (n > (end_ - pos_) / item) fail("an array is longer than the data (truncated or corrupted)");
    pos_ += n * item;
  }
  template <class T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string get_string() {
    const auto n = get<std::uint16_t>();
    need(n);
    std::string s(in_.substr(pos_, n));
    pos_ += n;
    return s;
  }
  checkpoint_reader sub(std::string_view name, field_type t) {
    auto it = fields_.find(std::string(name));
    if (it == fields_.end()) fail("field '" + std::string(name) + "' is missing");
    if (it->second.first != t) fail("field '" + std::string(name) + "' has the wrong type");
    used_.emplace(it->first, true);
    checkpoint_reader r;
    r.in_ = it->second.second;
    r.end_ = r.in_.size();
    return r;
  }
  template <class T>
  T scalar(std::string_view name, field_type t) {
    return sub(name, t).template get<T>();
  }
  checkpoint_reader() = default;

  std::string_view in_;
  std::size_t pos_ = 0;
  std::size_t end_ = 0;
  std::map<std::string, std::pair<field_type, std::string_view>> fields_;
  std::map<std::string, bool> used_;
};

/// The bytes save_state writes for an object of `kind` whose fields `fields` holds: the
/// magic, the version, the kind, the field count, the fields and a CRC-32; what
/// checkpoint_reader reads.
inline std::string framed_state(std::string_view kind, checkpoint_writer& fields) {
  checkpoint_writer out;
  out.bytes().append(checkpoint_magic);
  out.put(scaler_checkpoint_version);
  out.put_string(kind);
  out.put(fields.count());
  out.bytes() += fields.bytes();
  out.put(crc32(out.bytes()));
  return std::move(out.bytes());
}

}  // namespace detail

/// The complete state of `s` (a scaler or a float8 recipe): options, scale, counters,
/// scale history, amax history.
template <class Stateful>
std::string save_state(const Stateful& s) {
  detail::checkpoint_writer fields;
  Stateful copy = s;  // visit_state also serves loading, so it takes a mutable object
  copy.visit_state(fields);
  return detail::framed_state(Stateful::kind, fields);
}

/// Replaces the state of `s` with the saved one. Throws precis::error, leaving `s`
/// unchanged, when the data is not a checkpoint, is of another version or another kind of
/// object, is truncated or corrupted, or describes an inconsistent state.
template <class Stateful>
void load_state(Stateful& s, std::string_view bytes) {
  detail::checkpoint_reader in(bytes, Stateful::kind);
  Stateful loaded = s;
  loaded.visit_state(in);
  in.finish();
  if (auto problem = loaded.validate(); !problem.empty()) {
    throw error("precis: cannot load the scaler checkpoint: the state is inconsistent: " + problem);
  }
  s = std::move(loaded);
}

/// Writes save_state(s) to a stream.
template <class Stateful>
void save_state(const Stateful& s, std::ostream& out) {
  const std::string bytes = save_state(s);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw error("precis: writing the scaler checkpoint failed");
}

/// Reads a whole stream and loads it as load_state does.
template <class Stateful>
void load_state(Stateful& s, std::istream& in) {
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  load_state(s, std::string_view(bytes));
}

namespace detail {

/// One named field of a stateful object (a scaler or a float8 recipe), reached through its
/// visit_state: copied into `value` (read) or overwritten from it (write).
template <class T>
class field_access {
 public:
  field_access(std::string_view name, T& value, bool write) : name_(name), value_(&value), write_(write) {}
  template <class V>
  void field(std::string_view n, V& v) {
    visit(n, v);
  }
  void floats(std::string_view n, std::vector<float>& v) { visit(n, v); }
  void history(std::string_view n, std::vector<scale_change>& v) { visit(n, v); }
  bool found() const { return found_; }

 private:
  template <class V>
  void visit(std::string_view n, V& v) {
    if constexpr (std::is_same_v<V, T>) {
      if (n != name_) return;
      found_ = true;
      if (write_) {
        v = *value_;
      } else {
        *value_ = v;
      }
    }
  }
  std::string_view name_;
  T* value_;
  bool write_;
  bool found_ = false;
};

template <class Stateful, class T>
void access_field(Stateful& s, std::string_view name, T& value, bool write) {
  field_access<T> a(name, value, write);
  s.visit_state(a);
  if (!a.found()) {
    throw error("precis: " + std::string(Stateful::kind) + " has no state field \"" + std::string(name) +
                "\" of that type");
  }
}

}  // namespace detail

/// The value of the field `name` of s's state, as save_state writes it (T: float,
/// double, std::uint32_t, std::uint64_t or std::vector<float>, exactly the field's type). Throws
/// precis::error when s has no such field of type T.
template <class T, class Stateful>
T state_field(const Stateful& s, std::string_view name) {
  T value{};
  Stateful copy = s;  // visit_state also serves loading, so it takes a mutable object
  detail::access_field(copy, name, value, false);
  return value;
}

/// Replaces fields of s's state at once: `assign(set)` calls set(name, value) for each
/// (value of exactly the field's type: std::uint32_t{2}, not 2), on a copy of s, which is
/// then validated and moved into s. Throws precis::error, leaving s
/// unchanged, for an unknown field or an inconsistent result (as load_state does).
template <class Stateful, class Assign>
void assign_state_fields(Stateful& s, Assign&& assign) {
  Stateful copy = s;
  assign([&copy](std::string_view name, auto value) { detail::access_field(copy, name, value, true); });
  if (auto problem = copy.validate(); !problem.empty()) {
    throw error("precis: cannot set the " + std::string(Stateful::kind) + " state: " + problem);
  }
  s = std::move(copy);
}

}  // namespace precis

