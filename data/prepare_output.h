// Where forge prepare writes: one token dataset file (TokenDatasetWriter's temp file and rename)
// or a shard directory (data/token_shards.h) built as a hidden sibling and renamed into place
// whole, so that a prepare stopped at any point leaves nothing under the output's name, and an
// output it replaces stays complete until the new one is.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

#include "data/token_dataset.h"
#include "data/token_shards.h"

namespace forge {

/// Error(usage) naming `output` when prepare must not write it: check_output_path's refusals (an
/// input, or a directory holding one), an existing output without `overwrite`, and for a shard
/// directory (`shards`) a missing parent or an existing directory holding anything but the
/// manifest and shards prepare writes, which replacing it would delete.
void check_prepare_output(const std::filesystem::path& output,
                          const std::vector<std::filesystem::path>& inputs, bool shards,
                          bool overwrite);

/// Documents in, a dataset out: with shard_tokens 0 one file, else shard-00000.h5, ... each ending
/// at the first document boundary at or past shard_tokens tokens.
class PreparedOutput {
 public:
  PreparedOutput(std::filesystem::path output, TokenizerInfo info, int64_t shard_tokens);
  /// Without finish(), what was written is removed.
  ~PreparedOutput();
  PreparedOutput(const PreparedOutput&) = delete;
  PreparedOutput& operator=(const PreparedOutput&) = delete;

  void add_document(const std::vector<int32_t>& ids);
  /// Completes the dataset (a shard directory gets one empty shard when there were no documents,
  /// and its manifest last) and moves it into place, replacing what was there.
  void finish();
  /// Shards written; 0 for one file.
  int64_t shards() const { return int64_t(manifest_.shards.size()); }

 private:
  void open_shard();
  void close_shard();

  std::filesystem::path output_, partial_;  // partial_: the hidden directory being filled
  TokenizerInfo info_;
  int64_t shard_tokens_;
  std::unique_ptr<TokenDatasetWriter> writer_;
  ShardManifest manifest_;
  bool finished_ = false;
};

}  // namespace forge
