// Prepared token datasets: one HDF5 file holding a corpus as token ids with document boundaries and
// the identity of the tokenizer that produced them (layout: docs/data-format.md), or a directory of
// such files with a manifest (data/token_shards.h). The writer streams documents to disk so a
// corpus never has to fit in memory; the streaming reader validates what it opens (format,
// checksums, tokenizer, id range) with bounded buffers and then reads ids on demand, so neither
// has to fit in memory either, and a bad file is one clear line.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "data/lm_data.h"
#include "data/token_source.h"

namespace forge {

/// Which tokenizer produced a dataset: a file prepared with one tokenizer must not train a model
/// built for another, so a reader compares all three.
struct TokenizerInfo {
  std::string name;        ///< e.g. "gpt2", "bytes" or a tokenizer directory's name
  int64_t vocab_size = 0;  ///< ids are in [0, vocab_size)
  std::string vocab_hash;  ///< identifies the vocabulary's content (e.g. 16 hex digits)
};

inline constexpr int64_t kTokenDatasetFormatVersion = 1;

/// Streams documents into `path`: data goes to `path.tmp`, renamed to `path` by finish(), so a
/// crash or an early exit never leaves a partial file under the final name.
class TokenDatasetWriter {
 public:
  TokenDatasetWriter(const std::filesystem::path& path, TokenizerInfo info);
  /// Without finish(), the temp file is removed.
  ~TokenDatasetWriter();
  TokenDatasetWriter(const TokenDatasetWriter&) = delete;
  TokenDatasetWriter& operator=(const TokenDatasetWriter&) = delete;

  /// Appends one document; throws Error(data) naming the document and position of an id outside
  /// [0, vocab_size), in which case nothing of the document is written.
  void add_document(const std::vector<int32_t>& ids);
  /// Writes the metadata and checksums and moves the file into place.
  void finish();

  int64_t num_documents() const;
  int64_t num_tokens() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Which document starts the validation split of `num_documents` documents of `num_tokens` tokens
/// (split_by_document's rule), `document_start(d)` giving where document d starts (called about
/// log2(num_documents) times). Error(data) naming `path` when val_fraction > 0 and there are fewer
/// than two documents.
int64_t first_validation_document(int64_t num_documents, int64_t num_tokens, double val_fraction,
                                  const std::function<int64_t(int64_t)>& document_start,
                                  const std::filesystem::path& path);

/// A dataset loaded in memory: ids widened to int32 so LMWindows can use them directly.
class TokenDataset {
 public:
  TokenDataset(std::filesystem::path path, TokenizerInfo info,
               std::shared_ptr<const std::vector<int32_t>> tokens,
               std::vector<int64_t> doc_offsets);

  const std::shared_ptr<const std::vector<int32_t>>& tokens() const { return tokens_; }
  /// Document d is tokens [doc_offsets[d], doc_offsets[d + 1]); the last entry is num_tokens().
  const std::vector<int64_t>& doc_offsets() const { return doc_offsets_; }
  const TokenizerInfo& info() const { return info_; }
  const std::filesystem::path& path() const { return path_; }
  int64_t num_documents() const { return int64_t(doc_offsets_.size()) - 1; }
  int64_t num_tokens() const { return int64_t(tokens_->size()); }

  /// Validation is the last whole documents holding about `val_fraction` of the tokens (the
  /// document boundary nearest to that point; at least one document on each side when
  /// val_fraction > 0). Throws Error(data) if val_fraction > 0 and there are fewer than two
  /// documents.
  TokenSplit split_by_document(double val_fraction) const;

 private:
  std::filesystem::path path_;
  TokenizerInfo info_;
  std::shared_ptr<const std::vector<int32_t>> tokens_;
  std::vector<int64_t> doc_offsets_;
};

/// Reads and validates a dataset written by TokenDatasetWriter (or by any tool following
/// docs/data-format.md). Every failure is Error(data, "<file>: ..."): a digest that does not match
/// the `<file>.digest` sidecar the writer leaves, not HDF5, missing or malformed
/// dataset/attribute, checksum mismatch, a tokenizer other than `expected` (when given),
/// or an id ≥ `model_vocab_size` (when ≥ 0).
TokenDataset open_token_dataset(const std::filesystem::path& path,
                                const TokenizerInfo* expected = nullptr,
                                int64_t model_vocab_size = -1);

/// What a resumed run compares to know it still reads the same data: the counts and a CRC-32 over
/// every file's tokens_crc32 and doc_offsets_crc32, in order.
struct TokenDatasetIdentity {
  int64_t num_tokens = 0, num_documents = 0;
  uint32_t crc32 = 0;
  /// "N tokens in D documents, content crc32 xxxxxxxx"
  std::string describe() const;
  bool operator==(const TokenDatasetIdentity&) const = default;
};

/// A token dataset opened for streaming: one file, or a shard directory read as its shards'
/// documents end to end. Nothing of its size is held in memory: ids come from disk through a
/// bounded cache, document boundaries by small reads.
class TokenDatasetReader {
 public:
  struct Impl;
  explicit TokenDatasetReader(std::shared_ptr<const Impl> impl);

  const std::filesystem::path& path() const;
  const TokenizerInfo& info() const;
  int64_t num_tokens() const;
  int64_t num_documents() const;
  int64_t num_files() const;
  /// Every id, range-checked as it is read (Error(data) naming the file and position).
  const std::shared_ptr<const TokenSource>& tokens() const;
  /// Where document d starts (d = num_documents(): num_tokens()).
  int64_t document_start(int64_t d) const;
  /// As TokenDataset::split_by_document, as views of tokens().
  TokenSourceSplit split_by_document(double val_fraction) const;
  TokenDatasetIdentity identity() const;

 private:
  std::shared_ptr<const Impl> impl_;
};

/// Whether `path` names a token dataset (a `.h5` file or a directory holding manifest.json)
/// rather than text.
bool is_token_dataset_path(const std::filesystem::path& path);

/// Opens a `.h5` file with open_token_dataset's checks, or a shard directory: its manifest
/// (read_shard_manifest, check_shard_files), then every shard against its digest in the manifest
/// and against the manifest (tokenizer, counts) and the first shard (id type). The contents of a
/// file are read once: its digest (the manifest's, or its `.digest` sidecar) covers every byte,
/// after which ids are range-checked as they are read; a file without one has its checksums and
/// ids checked by a pass over it. Every failure is Error(data, "<file>: ...").
TokenDatasetReader open_token_dataset_reader(const std::filesystem::path& path,
                                             const TokenizerInfo* expected = nullptr,
                                             int64_t model_vocab_size = -1);

/// The identity of the dataset at `path` from its metadata alone (the manifest and each file's
/// attributes), for a dataset open_token_dataset_reader already checked.
TokenDatasetIdentity read_token_dataset_identity(const std::filesystem::path& path);

}  // namespace forge
