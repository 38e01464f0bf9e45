/// @file
/// Whole-file reads and writes that never leave half a file behind.
///
///     precis::write_file_atomically(path, bytes)   the old file or the complete new one
///     precis::read_file(path, what)                 the whole file, or precis::error
#pragma once

#include <precis/config.hpp>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>

#include <fcntl.h>
#include <unistd.h>

namespace precis {

namespace detail {

inline void write_all(int fd, std::string_view bytes, const std::filesystem::path& p) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw error("precis: writing " + p.string() + " failed: " + std::strerror(errno));
    }
    done += static_cast<std::size_t>(n);
  }
}

}  // namespace detail

/// Writes `bytes` to `file` so that a crash at any moment leaves either the previous file
/// or the complete new one: the bytes go to a temporary file in the same directory, which
/// is flushed to disk and then renamed over `file` (and the rename made durable). On
/// failure the temporary file is removed and precis::error is thrown; `file` is untouched.
inline void write_file_atomically(const std::filesystem::path& file, std::string_view bytes) {
  const std::filesystem::path tmp = file.string() + ".tmp-" + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw error("precis: cannot create " + tmp.string() + ": " + std::strerror(errno));
  try {
    detail::write_all(fd, bytes, tmp);
    if (::fsync(fd) != 0) throw error("precis: fsync of " + tmp.string() + " failed: " + std::strerror(errno));
  } catch (...) {
    ::close(fd);
    std::filesystem::remove(tmp);
    throw;
  }
  if (::close(fd) != 0) {
    std::filesystem::remove(tmp);
    throw error("precis: closing " + tmp.string() + " failed: " + std::strerror(errno));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, file, ec);
  if (ec) {
    std::filesystem::remove(tmp);
    throw error("precis: renaming " + tmp.string() + " to " + file.string() + " failed: " + ec.message());
  }
  const auto dir = file.has_parent_path() ? file.parent_path() : std::filesystem::path(".");
  if (const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

/// The whole of `file`. Throws precis::error ("cannot open <what> <file>") when it cannot
/// be opened or read.
inline std::string read_file(const std::filesystem::path& file, std::string_view what = "file") {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw error("precis: cannot open " + std::string(what) + " " + file.string());
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw error("precis: reading " + std::string(what) + " " + file.string() + " failed");
  return bytes;
}

}  // namespace precis
