// The run directory as a trainer holds it (docs/architecture.md, "The run directory"): created and
// locked by rank 0 for the length of a run, the earlier run moved aside under train.resume: never,
// and whether a resumed run has anything left to do.
#pragma once

#include <cstdint>
#include <filesystem>

#include "runtime/metrics.h"

namespace forge {

/// Rank 0's hold on output_dir while it trains: creates the directory, then takes an advisory lock,
/// flock(2) on <dir>/train.lock, which holds this process's pid for the message a second trainer
/// prints. The kernel drops the lock when the process dies, however it dies, so a killed run
/// resumes at once. Error(usage) naming the directory when it cannot be created (under a read-only
/// directory, below a file) or another trainer holds it; a filesystem without flock is a warning.
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
