// The one way forge reads an input file whole (configs, tokenizer files, corpora, records): only
// regular files, checked before opening so a FIFO never blocks and /dev/zero is never slurped, and
// a size limit checked against the file's size and again while reading, for a file that grows.
#pragma once

#include <cstdint>
#include <string>

#include "core/error.h"

namespace forge {

/// What is read and how a failure is reported: `kind` names the limit ("config", "corpus"),
/// `prefix` starts the message ("forge: config error: " or ""), `code` is the exit code.
struct InputKind {
  const char* kind;
  uint64_t max_bytes;
  ExitCode code;
  const char* prefix = "";
};

constexpr uint64_t kMiB = uint64_t(1) << 20;
constexpr uint64_t kGiB = uint64_t(1) << 30;
inline constexpr InputKind kConfigInput{"config", 16 * kMiB, ExitCode::usage,
                                        "forge: config error: "};
inline constexpr InputKind kTokenizerInput{"tokenizer file", 1 * kGiB, ExitCode::data};
inline constexpr InputKind kCorpusInput{"corpus", 64 * kGiB, ExitCode::data};
inline constexpr InputKind kTokenDatasetInput{"token dataset", 1024 * kGiB, ExitCode::data};

/// `path` with control characters and backslashes escaped (\n, \t, \xNN), so a name never splits
/// the one line an error is.
std::string quoted_path(const std::string& path);

/// The contents of the regular file `path`; throws Error(kind.code) naming the path for a missing
/// or unreadable file, "not a regular file", or more than kind.max_bytes.
std::string read_input_file(const std::string& path, const InputKind& kind);

/// The size of the regular file `path`, with read_input_file's checks (for readers that map or
/// stream the file themselves, such as HDF5).
uint64_t regular_file_size(const std::string& path, const InputKind& kind);

}  // namespace forge
