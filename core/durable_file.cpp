// Durable replacement and whole-file digests (core/durable_file.h).
#include "core/durable_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <vector>

#include "core/checksum.h"

namespace forge {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void fail(const fs::path& file, const std::string& what, ExitCode code) {
  throw Error(code, file.string() + ": " + what);
}

}  // namespace

// O_NONBLOCK lets a FIFO be refused rather than waited on; it changes nothing for a regular file.
int open_regular_for_writing(const fs::path& file, int flags, ExitCode code) {
  const int fd = ::open(file.c_str(), flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    struct stat st {};
    if (::lstat(file.c_str(), &st) == 0 && S_ISLNK(st.st_mode))
      fail(file, "is a symlink: forge writes no file through a link; remove it", code);
    if (err == ENXIO || err == EISDIR)  // a FIFO without a reader, a directory
      fail(file, "exists and is not a regular file; remove it", code);
    fail(file, std::string("cannot open for writing: ") + std::strerror(err), code);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(file, "exists and is not a regular file; remove it", code);
  }
  return fd;
}

void fsync_path(const fs::path& path, bool directory, ExitCode code) {
  int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) fail(path, std::string("cannot open for fsync: ") + std::strerror(errno), code);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) fail(path, std::string("fsync failed: ") + std::strerror(err), code);
}

void rename_durably(const fs::path& from, const fs::path& to, ExitCode code) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    const int err = errno;
    ::unlink(from.c_str());
    fail(to, std::string("cannot rename temp file into place: ") + std::strerror(err), code);
  }
  fs::path dir = to.parent_path().empty() ? fs::path(".") : to.parent_path();
  fsync_path(dir, true, code);
}

void write_file_atomic(const fs::path& file, const std::string& content, ExitCode code) {
  // O_EXCL under a name of this process: a file of the user's that happens to be called OUT.tmp
  // is never truncated.
  fs::path tmp = fs::path(file.string() + ".tmp." + std::to_string(::getpid()));
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) fail(tmp, std::string("cannot create: ") + std::strerror(errno), code);
  const char* p = content.data();
  size_t left = content.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      fail(tmp, std::string("write failed: ") + std::strerror(err), code);
    }
    p += n;
    left -= size_t(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    fail(tmp, std::string("fsync failed: ") + std::strerror(err), code);
  }
  rename_durably(tmp, file, code);
}

std::string file_digest(const fs::path& file, ExitCode code) {
  std::ifstream in(file, std::ios::binary);
  if (!in) fail(file, "cannot open for reading", code);
  std::vector<char> buffer(size_t(1) << 22);
  uint32_t crc = 0;
  uint64_t size = 0;
  while (in) {
    in.read(buffer.data(), std::streamsize(buffer.size()));
    std::streamsize n = in.gcount();
    crc = crc32(buffer.data(), size_t(n), crc);
    size += uint64_t(n);
  }
  if (in.bad()) fail(file, "read error", code);
  char out[48];
  std::snprintf(out, sizeof out, "crc32:%08x:%llu", crc, (unsigned long long)size);
  return out;
}

fs::path digest_path(const fs::path& file) { return fs::path(file.string() + ".digest"); }

void write_digest_sidecar(const fs::path& file, ExitCode code) {
  write_file_atomic(digest_path(file), file_digest(file, code) + "\n", code);
}

void check_digest(const fs::path& file, const std::string& expected, const std::string& source,
                  ExitCode code) {
  std::string actual = file_digest(file, code);
  if (actual != expected)
    fail(file,
         "digest " + actual + " does not match " + expected + " recorded in " + source +
             ": the file is damaged (or was replaced without its .digest)",
         code);
}

bool check_sidecar_digest(const fs::path& file, ExitCode code) {
  fs::path sidecar = digest_path(file);
  std::error_code ec;
  if (!fs::exists(sidecar, ec)) return false;
  std::string expected = read_first_line(sidecar);
  if (expected.rfind("crc32:", 0) != 0) fail(sidecar, "not a digest file (damaged?)", code);
  check_digest(file, expected, sidecar.string(), code);
  return true;
}

// Opened without blocking and checked to be a regular file, so a FIFO planted as LATEST or as a
// sidecar reads as unreadable instead of hanging the process; a few kilobytes are plenty.
std::string read_first_line(const fs::path& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return "";
  struct stat st {};
  std::string text(4096, '\0');
  ssize_t n = -1;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) n = ::read(fd, text.data(), text.size());
  ::close(fd);
  if (n <= 0) return "";
  text.resize(size_t(n));
  std::string line = text.substr(0, text.find('\n'));
  while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
  return line;
}

}  // namespace forge
