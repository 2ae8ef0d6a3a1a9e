// Bounded, non-blocking reads of whole input files (core/file_io.h).
#include "core/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace forge {
namespace {

[[noreturn]] void fail(const std::string& path, const InputKind& kind, const std::string& what) {
  throw Error(kind.code, std::string(kind.prefix) + quoted_path(path) + ": " + what);
}

void check_stat(const std::string& path, const InputKind& kind, const struct stat& st) {
  if (!S_ISREG(st.st_mode)) fail(path, kind, "not a regular file");
  if (uint64_t(st.st_size) > kind.max_bytes)
    fail(path, kind,
         detail::concat(st.st_size, " bytes, more than the ", kind.kind, " limit of ",
                        kind.max_bytes, " bytes"));
}

}  // namespace

std::string quoted_path(const std::string& path) {
  std::string out;
  for (unsigned char c : path) {
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\\') out += "\\\\";
    else if (c < 0x20 || c == 0x7f) {
      char hex[5];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    } else out += char(c);
  }
  return out;
}

uint64_t regular_file_size(const std::string& path, const InputKind& kind) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    fail(path, kind, errno == ENOENT ? "file not found" : std::strerror(errno));
  check_stat(path, kind, st);
  return uint64_t(st.st_size);
}

std::string read_input_file(const std::string& path, const InputKind& kind) {
  regular_file_size(path, kind);
  // O_NONBLOCK: if the path was swapped for a FIFO after the stat, open does not wait for a writer;
  // fstat of the opened file is the check that counts.
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) fail(path, kind, std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, kind, "not a regular file");
  }
  std::string text;
  text.reserve(size_t(std::min<uint64_t>(uint64_t(st.st_size), kind.max_bytes)));
  char buffer[1 << 16];
  while (true) {
    ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      std::string why = std::strerror(errno);
      ::close(fd);
      fail(path, kind, "read error (" + why + ")");
    }
    if (n == 0) break;
    if (text.size() + size_t(n) > kind.max_bytes) {
      ::close(fd);
      fail(path, kind,
           detail::concat("grew past the ", kind.kind, " limit of ", kind.max_bytes,
                          " bytes while being read"));
    }
    text.append(buffer, size_t(n));
  }
  ::close(fd);
  return text;
}

}  // namespace forge
