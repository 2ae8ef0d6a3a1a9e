// Prepared token datasets: one HDF5 file holding a corpus as token ids with document boundaries and
// the identity of the tokenizer that produced them (layout: docs/data-format.md). The writer
// streams documents to disk so a corpus never has to fit in memory; the reader validates
// everything it returns (format, checksums, tokenizer, id range) so a bad file is one clear line.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "data/lm_data.h"

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

}  // namespace forge
