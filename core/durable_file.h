// Files that must survive a crash and be recognised when damaged: atomic, durable replacement
// (temp file, fsync, rename, fsync of the directory), and a whole-file digest kept beside a file
// in `<file>.digest`, which readers check before a parser that trusts the file's bytes (libhdf5)
// opens it. Checkpoints (runtime/checkpoint.h) and token datasets (data/token_dataset.h) use both.
#pragma once

#include <filesystem>
#include <string>

#include "core/error.h"

namespace forge {

/// open(2) of `file` with `flags` (O_RDWR or O_WRONLY, with O_CREAT, O_APPEND, O_TRUNC ...) that
/// follows no symlink and never waits: Error(code) naming the file when it is a symlink or exists
/// and is not a regular file (a FIFO, device, socket or directory), so that a link planted in a
/// run directory is never written through and a FIFO never blocks. Returns the descriptor.
int open_regular_for_writing(const std::filesystem::path& file, int flags, ExitCode code);

/// fsync of a file, or of a directory (which makes a rename in it durable); Error(code) naming it.
void fsync_path(const std::filesystem::path& path, bool directory, ExitCode code);

/// rename(2) of `from` onto `to` (atomic within a file system), then fsync of `to`'s directory.
/// `from` is a temp file the caller wrote: when the rename fails it is removed, so a refused
/// output leaves nothing behind.
void rename_durably(const std::filesystem::path& from, const std::filesystem::path& to,
                    ExitCode code);

/// Replaces `file` with `content` atomically and durably: a temp file of this process in the same
/// directory (`<file>.tmp.<pid>`, created exclusively), fsync, rename, fsync of the directory. Readers see the old or the new content, never a mix.
void write_file_atomic(const std::filesystem::path& file, const std::string& content,
                       ExitCode code);

/// "crc32:<8 hex digits>:<size in bytes>" of a whole file: identifies its exact bytes (a
/// referenced teacher or base, a damaged checkpoint). Error(code) if unreadable.
std::string file_digest(const std::filesystem::path& file, ExitCode code);

/// `<file>.digest`: the sidecar holding file_digest(file).
std::filesystem::path digest_path(const std::filesystem::path& file);

/// Writes `file`'s digest sidecar (atomically): call after `file` is complete and in place.
void write_digest_sidecar(const std::filesystem::path& file, ExitCode code);

/// Error(code) naming `file` when its digest is not `expected`, which `source` recorded.
void check_digest(const std::filesystem::path& file, const std::string& expected,
                  const std::string& source, ExitCode code);

/// Checks `file` against its sidecar and returns true; false when there is no sidecar (a file
/// from elsewhere, or one whose writer was stopped before writing it). Error(code) on a mismatch
/// or a sidecar that is not a digest.
bool check_sidecar_digest(const std::filesystem::path& file, ExitCode code);

/// The first line of a small text file without trailing white space; "" if unreadable.
std::string read_first_line(const std::filesystem::path& file);

}  // namespace forge
