// Text files -> a token dataset (data/token_dataset.h), one file or a shard directory
// (data/token_shards.h). Each input splits into documents one of three ways: the whole file,
// '%'-separated records (the fortunes format) or one record per line; documents stay separate in
// the dataset so splits never cut one. Inputs stream through in blocks, so their size is unbounded.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace forge {

enum class RecordFormat { file, percent, lines };

/// "file", "percent" or "lines"; throws Error(usage) listing the choices otherwise.
RecordFormat parse_record_format(const std::string& name);

/// The documents of `text` under `format` (empty records are dropped).
std::vector<std::string_view> split_records(std::string_view text, RecordFormat format);

/// A positive count with an optional decimal suffix k, M or G (1e3, 1e6, 1e9): "500M". Throws
/// Error(usage) starting with `what` for 0, a sign, a fraction, another suffix or an overflow.
int64_t parse_token_count(const std::string& what, const std::string& text);

struct PrepareStats {
  int64_t files = 0, documents = 0, tokens = 0, bytes = 0;
  int64_t shards = 0;  ///< files in the shard directory; 0 when one file was written
  int64_t threads = 0;  ///< encoding threads
  int64_t max_held_bytes = 0;  ///< the most input text the reader held at once
};

/// Where a prepare has got to, after each block of documents is written.
struct PrepareProgress {
  int64_t bytes_done = 0, bytes_total = 0, documents = 0, tokens = 0;
};

struct PrepareOptions {
  RecordFormat format = RecordFormat::file;
  /// 0: one dataset file. Otherwise a shard directory whose shards end at the first document
  /// boundary at or past this many tokens.
  int64_t shard_tokens = 0;
  /// Replace an existing output (a file, or a shard directory prepare wrote) once the new one is
  /// complete.
  bool overwrite = false;
  std::function<void(const PrepareProgress&)> progress = {};
  /// Bytes read from an input at a time, text given to one thread at a time, and the size a large
  /// document is cut into for the threads (Tokenizer::independent_cuts, which must decide a cut
  /// from the text within part_bytes of it). Tests shrink them to put every boundary everywhere.
  size_t block_bytes = size_t(1) << 20;
  size_t chunk_bytes = size_t(1) << 20;
  size_t part_bytes = size_t(256) << 10;
};

/// Tokenizes `inputs` into `output`: a reader streams the inputs in blocks, kernels::max_threads()
/// threads encode (the tokenizer's encode() is called concurrently), this thread among them, and
/// this thread writes the documents in input order, so the dataset holds the same tokens whatever
/// the thread count and block size. Memory holds a few blocks per thread, plus the text of a
/// document no cut can split and the ids of the document being written. The output appears only when complete (a file
/// through a temp file, a shard directory built as the hidden `.NAME.partial-PID` beside it and
/// renamed). Refused with Error(usage) before anything is written: an output that is an input,
/// holds one, is not the kind of thing it would replace, exists without `overwrite`, or (a
/// directory) holds anything but prepare's shards. Throws Error(data) naming an input that is
/// missing, not a regular file (a FIFO, a device), unreadable, or changes size while read.
PrepareStats prepare_dataset(const Tokenizer& tokenizer,
                             const std::vector<std::filesystem::path>& inputs,
                             const std::filesystem::path& output,
                             const PrepareOptions& options = {});

/// forge prepare's progress on `out` (stderr): on a terminal one line, rewritten at most four
/// times a second, with bytes, tokens, MB/s, tokens/s and the time left; elsewhere (a log) a line
/// every 10% or 30 seconds, so a long run never floods it. finish() ends with one summary line.
class PrepareProgressPrinter {
 public:
  PrepareProgressPrinter(std::FILE* out, bool terminal) : out_(out), terminal_(terminal) {}
  /// `seconds` since the prepare started.
  void update(const PrepareProgress& p, double seconds);
  void finish(const PrepareStats& stats, double seconds);

 private:
  std::FILE* out_;
  bool terminal_;
  double last_seconds_ = -1;
  int64_t last_tenth_ = 0;
  bool line_open_ = false;
};

}  // namespace forge
