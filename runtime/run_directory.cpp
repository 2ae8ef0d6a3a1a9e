// The run directory's recognition, creation, lock and move-aside. A crash at any point leaves a
// directory the next trainer can use: the marker is written before anything else, the lock dies
// with its process, and moving aside is one rename per entry.
#include "runtime/run_directory.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <string>
#include <system_error>
#include <vector>

#include "core/comm.h"
#include "core/durable_file.h"
#include "core/error.h"
#include "runtime/checkpoint.h"
#include "runtime/confusion.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

// output_dir is the user's choice: a path under a read-only directory, or below a file, is a usage
// error naming it, not a filesystem exception.
void create_run_directory(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);  // also fails (ENOTDIR) when dir exists as a file
  if (ec)
    throw Error(ExitCode::usage, detail::concat("output_dir ", dir.string(),
                                                ": cannot create the run directory: ", ec.message()));
}

bool is_regular(const fs::path& file) {
  std::error_code ec;
  return fs::symlink_status(file, ec).type() == fs::file_type::regular;
}

bool is_marked(const fs::path& dir) { return is_regular(dir / kRunMarker); }

void mark_run_directory(const fs::path& dir) {
  write_file_atomic(dir / kRunMarker,
                    "A Forge run directory: forge train writes into it (docs/architecture.md).\n",
                    ExitCode::usage);
}

// A run written before markers existed: its LATEST names one of the trainer's step files, and that
// file is an HDF5 file. One line and 8 bytes are read, of regular files only.
bool is_unmarked_run(const fs::path& dir) {
  const fs::path checkpoints = dir / "checkpoints";
  if (!is_regular(checkpoints / "LATEST")) return false;
  const std::string line = read_first_line(checkpoints / "LATEST");
  const std::string name = line.substr(0, line.find(' '));
  if (!name.starts_with("step-") || !name.ends_with(".h5") || name.find('/') != std::string::npos)
    return false;
  return is_regular(checkpoints / name) && is_checkpoint_file(checkpoints / name);
}

constexpr const char* kNothingFollowed =
    ": forge train follows no link and opens no special file in a run directory; remove it, or "
    "choose another output_dir";

const char* type_name(fs::file_type type) {
  switch (type) {
    case fs::file_type::symlink: return "a symlink";
    case fs::file_type::fifo: return "a FIFO";
    case fs::file_type::socket: return "a socket";
    case fs::file_type::character: return "a character device";
    case fs::file_type::block: return "a block device";
    case fs::file_type::directory: return "a directory";
    default: return "of another kind";
  }
}

// A fresh directory for an earlier run's record: <run>/previous-<UTC time>, with -2, -3 ... when
// that name is taken, so an earlier moved-aside run is never overwritten.
fs::path claim_previous_directory(const fs::path& dir) {
  const std::time_t now = std::time(nullptr);
  std::tm utc = {};
  gmtime_r(&now, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &utc);
  for (int n = 1;; ++n) {
    std::string name = std::string("previous-") + stamp;
    if (n > 1) name += '-' + std::to_string(n);
    const fs::path candidate = dir / name;
    std::error_code ec;
    if (fs::create_directory(candidate, ec)) return candidate;
    if (ec)
      throw Error(ExitCode::usage,
                  detail::concat(candidate.string(), ": cannot create it to move the earlier run "
                                 "aside (train.resume: never): ", ec.message(),
                                 "; nothing was moved"));
  }
}

}  // namespace

void check_run_directory(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec) || is_marked(dir)) return;
  const bool empty = fs::is_empty(dir, ec);
  if ((empty && !ec) || is_unmarked_run(dir)) return;
  throw Error(ExitCode::usage,
              detail::concat("output_dir ", dir.string(), ": exists, is not empty and is not a "
                             "Forge run directory (it has no ", kRunMarker, "); choose a new or "
                             "empty output_dir, or give forge train --use-existing-dir to train "
                             "into it anyway"));
}

void claim_output_dir(const fs::path& dir, bool use_existing) {
  // Rank 0 alone judges and marks the directory: under mpirun it may already be writing the
  // marker while another rank looks, and the set-up agreement reports its refusal to every rank.
  std::error_code ec;
  if (world_comm().rank() == 0) {
    if (!use_existing)
      check_run_directory(dir);
    else if (fs::is_directory(dir, ec) && !is_marked(dir))
      mark_run_directory(dir);
  }
  check_run_files(dir);
}

void check_run_files(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const char* name : {kRunMarker, "train.lock", "config.yaml", "metrics.jsonl", "report.html"})
    files.push_back(dir / name);
  files.push_back(confusion_path(dir));
  const fs::path checkpoints = dir / "checkpoints";
  std::error_code ec;
  const fs::file_type type = fs::symlink_status(checkpoints, ec).type();
  if (type == fs::file_type::directory) {
    for (const fs::directory_entry& e : fs::directory_iterator(checkpoints, ec)) {
      const std::string name = e.path().filename().string();
      if (name == "LATEST" || name.starts_with("step-")) files.push_back(e.path());
    }
  } else if (!ec && type != fs::file_type::not_found) {
    throw Error(ExitCode::usage,
                detail::concat(checkpoints.string(), ": is ", type_name(type),
                               ", not a directory", kNothingFollowed));
  }
  for (const fs::path& file : files) {
    // A path lstat cannot take (too long) is left to the open that reports it.
    const fs::file_type t = fs::symlink_status(file, ec).type();
    if (!ec && t != fs::file_type::not_found && t != fs::file_type::regular)
      throw Error(ExitCode::usage,
                  detail::concat(file.string(), ": is ", type_name(t), ", not a regular file",
                                 kNothingFollowed));
  }
}

// The lock file stays behind: removing it would let a waiting and a new trainer lock two different
// files. The marker is written before the lock file, so that the directory is a run before this
// trainer leaves anything else in it.
RunDirectory::RunDirectory(const fs::path& dir, ProgressPrinter& progress) {
  check_run_directory(dir);
  create_run_directory(dir);
  if (!is_marked(dir)) mark_run_directory(dir);
  const fs::path file = dir / "train.lock";
  fd_ = open_regular_for_writing(file, O_RDWR | O_CREAT, ExitCode::usage);
  if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) {
    const std::string pid = std::to_string(::getpid()) + "\n";
    if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) != ssize_t(pid.size()))
      progress.message(detail::concat("forge: warning: ", file.string(),
                                      ": cannot record this process's pid: ", std::strerror(errno)));
    return;
  }
  const int err = errno;
  if (err != EWOULDBLOCK) {  // a filesystem without flock (some network mounts): train unguarded
    progress.message(detail::concat("forge: warning: ", file.string(), ": cannot lock (",
                                    std::strerror(err),
                                    "); a second trainer on this directory would not be noticed"));
    return;
  }
  char buf[32] = {};
  const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
  std::string holder(buf, size_t(std::max<ssize_t>(n, 0)));
  holder.erase(holder.find_last_not_of("\n") + 1);
  ::close(fd_);
  throw Error(ExitCode::usage,
              detail::concat(dir.string(), ": in use by another forge train (pid ",
                             holder.empty() ? "unknown" : holder, ", holding ", file.string(),
                             "); wait for it or stop it, or choose another output_dir"));
}

RunDirectory::~RunDirectory() { ::close(fd_); }

// One rename per entry: a crash between two renames leaves every file in one of the two places.
// checkpoints/ goes last: moved first, a crash would leave metrics.jsonl beside no checkpoint, and
// the next run, starting from step 0, would overwrite it.
void move_earlier_run_aside(const fs::path& dir, ProgressPrinter& progress) {
  std::vector<std::string> entries;
  std::error_code ec;
  for (const char* name : {"metrics.jsonl", "report.html", "checkpoints"})
    if (fs::symlink_status(dir / name, ec).type() != fs::file_type::not_found) entries.push_back(name);
  if (entries.empty()) return;  // a config.yaml alone records nothing worth keeping
  if (fs::exists(fs::symlink_status(dir / "config.yaml", ec)))
    entries.insert(entries.begin(), "config.yaml");
  const fs::path previous = claim_previous_directory(dir);
  std::string moved;
  for (const std::string& name : entries) {
    fs::rename(dir / name, previous / name, ec);
    if (ec)
      throw Error(ExitCode::usage,
                  detail::concat(dir.string(), ": cannot move ", name, " aside to ",
                                 previous.string(), " (train.resume: never): ", ec.message(),
                                 moved.empty() ? "; nothing was moved" : "; moved already:" + moved,
                                 "; nothing was deleted"));
    moved += " " + name + (name == "checkpoints" ? "/" : "");
  }
  progress.message(detail::concat("train.resume is never: moved the earlier run (", moved.substr(1),
                                  ") to ", previous.string()));
}

bool run_complete(const fs::path& dir, int64_t start, int64_t max_steps) {
  if (start != max_steps) return start > max_steps;
  for (const MetricsRecord& r : read_metrics(dir / "metrics.jsonl"))
    if (r.split == "val" && r.step == start) return true;
  return false;
}

}  // namespace forge
