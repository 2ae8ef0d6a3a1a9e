// Language-model data from a token stream: the byte tokenizer, a train/validation split by
// position, random training windows drawn from the counter-based generator (so the batch of any
// step is a pure function of seed and step: resuming needs no data cursor replay), and sequential
// windows covering a split for evaluation. Windows read their ids from a TokenSource, in memory or
// streamed from a token dataset on disk, with the same batches either way.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "data/token_source.h"

namespace forge {

/// Token ids of a text file read as bytes (ids 0..255). Throws Error(data) if it cannot be read.
std::vector<int32_t> read_byte_tokens(const std::filesystem::path& path);

/// The tail of `tokens` holding `val_fraction` of them is validation, the rest training.
struct TokenSplit {
  std::shared_ptr<const std::vector<int32_t>> train, val;
};
TokenSplit split_by_position(std::vector<int32_t> tokens, double val_fraction);

/// ids [B, T] and next-token targets [B, T], both i64.
struct LMBatch {
  Tensor ids, targets;
  int64_t num_targets() const { return targets.numel(); }
};

class LMWindows {
 public:
  /// Windows of `context` inputs plus one target position over `tokens`.
  LMWindows(std::shared_ptr<const TokenSource> tokens, int64_t context);
  /// The same over ids held in memory.
  LMWindows(std::shared_ptr<const std::vector<int32_t>> tokens, int64_t context);

  /// Batch `micro` of training step `step`: starts uniform over all windows, drawn from Philox
  /// stream ("lm_batch", step) under `seed`.
  LMBatch sample(int64_t batch_size, uint64_t seed, int64_t step, int64_t micro = 0) const;

  /// Non-overlapping windows covering the split in order, so that every token after the first is
  /// predicted exactly once. The last window is shifted back to end at the split's end; its targets
  /// that the previous window already scored are set to kIgnoreTarget.
  int64_t num_eval_windows() const;
  /// Windows [first, first + count) of that sequence, count clipped at the end.
  LMBatch eval_batch(int64_t first, int64_t count) const;
  static constexpr int64_t kIgnoreTarget = -100;

  int64_t num_tokens() const { return tokens_->size(); }
  int64_t context() const { return context_; }

 private:
  // One window: ids [T] from tokens [start, start + T), targets [T] one position later, read
  // through `window` (T + 1 ids, the caller's, so a batch allocates it once).
  void fill_row(int64_t start, std::vector<int32_t>& window, int64_t* ids, int64_t* targets) const;

  std::shared_ptr<const TokenSource> tokens_;
  int64_t context_;
};

}  // namespace forge
