/// @file
/// A training checkpoint (model, optimizer, scaler, any object with checkpointable state) written
/// atomically and read all-or-nothing.
///
/// File layout (little-endian): "PRECISCK", u32 version (1), u32 part count, then per part
/// u64 length and the part's save_state() bytes (each with its own kind and checksum), and
/// a CRC-32 of everything before it.
#pragma once

#include <precis/config.hpp>
#include <precis/io/file.hpp>
#include <precis/scaling/checkpoint.hpp>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

namespace precis {

/// Something a checkpoint can hold: a `kind`, `visit_state(archive)` naming its fields,
/// `validate()` reporting inconsistencies, and copies (loading goes through a copy).
template <class T>
concept checkpointable = std::copy_constructible<T> && requires(const T& c) {
  { T::kind } -> std::convertible_to<std::string_view>;
  { c.validate() } -> std::convertible_to<std::string>;
};

/// Version of the checkpoint file format.
inline constexpr std::uint32_t checkpoint_file_version = 1;

namespace detail {

constexpr std::string_view checkpoint_file_magic = "PRECISCK";

}  // namespace detail

/// Writes the states of `parts` to `file` so that a crash at any moment leaves either the
/// previous file or the complete new one: the bytes go to a temporary file in the same
/// directory, which is flushed to disk and then renamed over `file`. On failure the
/// temporary file is removed and precis::error is thrown; `file` is untouched.
template <checkpointable... Parts>
void save_checkpoint(const std::filesystem::path& file, const Parts&... parts) {
  std::string bytes(detail::checkpoint_file_magic);
  auto put = [&bytes](auto v) { bytes.append(reinterpret_cast<const char*>(&v), sizeof v); };
  put(checkpoint_file_version);
  put(static_cast<std::uint32_t>(sizeof...(Parts)));
  (
      [&] {
        const std::string part = save_state(parts);
        put(static_cast<std::uint64_t>(part.size()));
        bytes += part;
      }(),
      ...);
  put(detail::crc32(bytes));

  write_file_atomically(file, bytes);
}

/// Loads every part from `file`, or none: each part is loaded into a copy and checked;
/// only when all succeed are the parts replaced. A missing, truncated, corrupted or
/// mismatched file throws precis::error saying what is wrong.
template <checkpointable... Parts>
void load_checkpoint(const std::filesystem::path& file, Parts&... parts) {
  const std::string bytes = read_file(file, "checkpoint");
  auto fail = [&](const std::string& what) -> void {
    throw error("precis: cannot load checkpoint " + file.string() + ": " + what);
  };
  const std::size_t header = detail::checkpoint_file_magic.size() + 8;
  if (bytes.size() < header + 4 ||
      std::string_view(bytes).substr(0, detail::checkpoint_file_magic.size()) != detail::checkpoint_file_magic) {
    fail("not a precis checkpoint (the magic bytes \"PRECISCK\" are missing)");
  }
  auto get = [&bytes](std::size_t at, auto v) {
    std::memcpy(&v, bytes.data() + at, sizeof v);
    return v;
  };
  const auto version = get(8, std::uint32_t{});
  if (version != checkpoint_file_version) {
    fail("file format version " + std::to_string(version) + " is not supported (this precis reads version " +
         std::to_string(checkpoint_file_version) + ")");
  }
  if (detail::crc32(std::string_view(bytes).substr(0, bytes.size() - 4)) != get(bytes.size() - 4, std::uint32_t{})) {
    fail("the checksum does not match: the file is truncated or corrupted");
  }
  const auto count = get(12, std::uint32_t{});
  if (count != sizeof...(Parts)) {
    fail("it holds " + std::to_string(count) + " parts, " + std::to_string(sizeof...(Parts)) + " were asked for");
  }
  std::size_t at = header;
  const std::size_t end = bytes.size() - 4;
  std::tuple<Parts...> loaded(parts...);
  std::apply(
      [&](auto&... copies) {
        (
            [&](auto& copy) {
              if (end - at < 8) fail("a part's length is cut off");
              const auto len = get(at, std::uint64_t{});
              at += 8;
              if (len > end - at) fail("a part is longer than the file");
              load_state(copy, std::string_view(bytes).substr(at, static_cast<std::size_t>(len)));
              at += static_cast<std::size_t>(len);
            }(copies),
            ...);
      },
      loaded);
  if (at != end) fail("there are bytes after the last part");
  std::apply([&](auto&... copies) { ((parts = std::move(copies)), ...); }, loaded);
}

}  // namespace precis
