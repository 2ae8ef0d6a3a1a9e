// The run directory as a trainer holds it (docs/architecture.md, "The run directory"): created and
// locked by rank 0 for the length of a run, the earlier run moved aside under train.resume: never,
// and whether a resumed run has anything left to do.
#pragma once

#include <cstdint>
#include <filesystem>

#include "runtime/metrics.h"

namespace forge {

/// The file that makes a directory a Forge run directory: forge train writes it when it creates the
/// directory or takes one over (an empty one, a run from before markers, --use-existing-dir).
/// Nothing reads its content; a run is recognised by it, never by the names of its other files.
inline constexpr const char* kRunMarker = ".forge-run";

/// Error(usage) naming `dir`, and saying how to proceed, when forge train must not write into it:
/// it exists, holds anything, and is neither marked (kRunMarker, a regular file) nor a run written
/// before markers existed (checkpoints/LATEST naming a step-*.h5 file that is an HDF5 file), so
/// that a mistyped output_dir (a home directory, a repository root, /) loses nothing.
void check_run_directory(const std::filesystem::path& dir);

/// Error(usage) naming the first of the run's files in `dir` that is there but is not a regular
/// file (a symlink, FIFO, device, socket or directory), or a checkpoints/ that is not a directory
/// (a symlink): lstat(2) only, so nothing blocks, and no later read or write of the run follows a
/// link out of it. Every rank calls it before reading the run to resume.
void check_run_files(const std::filesystem::path& dir);

/// forge train's look at output_dir before anything is built or read (recipes look for a
/// checkpoint to resume while they set up), so that a refusal costs nothing: check_run_directory,
/// or with `use_existing` (forge train --use-existing-dir) rank 0 marks an existing directory as a
/// run at once; then check_run_files.
void claim_output_dir(const std::filesystem::path& dir, bool use_existing);

/// Rank 0's hold on output_dir while it trains: creates the directory or checks that it is a run
/// (check_run_directory), marks it, then takes an advisory lock, flock(2) on <dir>/train.lock
/// (never through a symlink), which holds this process's pid for the message a second trainer
/// prints. The kernel drops the lock when the process dies, however it dies, so a killed run
/// resumes at once. Error(usage) naming the directory when it cannot be created (under a read-only
/// directory, below a file), is not a run, or another trainer holds it; a filesystem without flock
/// is a warning.
class RunDirectory {
 public:
  RunDirectory(const std::filesystem::path& dir, ProgressPrinter& progress);
  ~RunDirectory();
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;

 private:
  int fd_ = -1;
};

/// train.resume: never: moves the earlier run's config.yaml, metrics.jsonl, report.html and
/// checkpoints/ into <dir>/previous-<UTC time>/ and says where in one line. Error(usage) saying what
/// was already moved when a move fails; nothing is deleted.
void move_earlier_run_aside(const std::filesystem::path& dir, ProgressPrinter& progress);

/// Whether the run in `dir`, resumed at step `start`, has nothing left to do up to `max_steps`: a
/// run stopped during its final evaluation has its last checkpoint but no final val line, and the
/// same command finishes it.
bool run_complete(const std::filesystem::path& dir, int64_t start, int64_t max_steps);

}  // namespace forge
