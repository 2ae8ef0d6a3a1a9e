// Instruction (SFT) data: JSONL records {"prompt": ..., "completion": ...} read strictly (every
// error names file:line and the field), tokenized into prompt + completion + end-of-text rows that
// remember where the prompt ends, split by a seeded permutation, and batched so that only the
// completion and its end-of-text are scored. The loader's order and cursor are EpochSampler's
// (data/records.h), so resuming an SFT run follows the uninterrupted batch stream.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "data/records.h"
#include "data/tokenizer.h"

namespace forge {

/// One instruction record.
struct SFTRecord {
  std::string prompt, completion;
};

/// Largest SFT file read_sft_jsonl accepts (bigger data belongs in a prepared dataset).
constexpr int64_t kMaxSFTFileBytes = int64_t{1} << 30;

/// Records of a JSONL file, one object {"prompt": string, "completion": string} a line; blank lines
/// are skipped. Throws Error(data) with one line naming "file:line" (and the field) for a line
/// that is not JSON (with the parser's byte position), not an object, misses "prompt" or
/// "completion", has a field that is not a string or an unknown field; and naming the file when it
/// is missing, not a regular file, larger than kMaxSFTFileBytes or holds no records.
std::vector<SFTRecord> read_sft_jsonl(const std::filesystem::path& file);

/// Tokenized records: row i is prompt ids, completion ids, end-of-text ids (possibly cut);
/// prompt_len[i] is the number of prompt ids at its start.
struct SFTDataset {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<int64_t> prompt_len;
  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
};

/// Encodes prompt and completion separately (so the prompt's ids are exactly its own) and appends
/// `end_of_text`. Rows longer than max_len are cut at max_len, the prompt kept whole. Throws
/// Error(usage) for max_len < 2 or an empty end_of_text, Error(data) naming the record's index when
/// its prompt plus one completion token does not fit in max_len, or its row has nothing to predict
/// (fewer than two tokens).
SFTDataset tokenize_sft(const std::vector<SFTRecord>& records, const Tokenizer& tokenizer,
                        const std::vector<int32_t>& end_of_text, int64_t max_len);

/// The end-of-text ids for `text`: the special token's id when the tokenizer has `text` as a
/// special (e.g. "<|endoftext|>" for gpt2), otherwise the text's encoding (e.g. "\n" for bytes).
/// Both are what encode() gives, which maps special tokens in a text to their ids.
std::vector<int32_t> end_of_text_ids(const Tokenizer& tokenizer, const std::string& text);

/// 64-bit FNV-1a over the row count, every row's length and ids, and every prompt_len.
uint64_t fingerprint(const SFTDataset& dataset);

struct SFTSplit {
  std::shared_ptr<const SFTDataset> train, val;
};

/// Rows go to val or train by a permutation drawn from (seed, "sft_split"); each side keeps
/// dataset order. The rules and errors of split_records_by_fraction.
SFTSplit split_sft_by_fraction(const SFTDataset& dataset, double val_fraction, uint64_t seed);

/// Row i's next-token targets, one per input (its length - 1): tokens[j+1] where j+1 >= prompt_len,
/// else LMWindows::kIgnoreTarget (-100, data/lm_data.h). What every batch of the row scores.
std::vector<int32_t> sft_targets(const SFTDataset& dataset, int64_t i);

/// A batch of B rows, L the longest row: ids i64 [B, L-1] (the inputs, right-padded with 0);
/// targets i64 [B, L-1], row b's sft_targets then kIgnoreTarget on padding; mask i64 [B, L-1], 1 on
/// real input tokens; num_targets = the scored positions; num_tokens = the real input tokens;
/// indices = the dataset rows used. Packed batches (data/packing.h) hold several records a row and
/// say where each is: positions and segments i64 [B, W] (undefined in padded batches).
struct SFTBatch {
  Tensor ids, targets, mask;
  int64_t num_targets = 0;
  std::vector<int64_t> indices;
  int64_t num_tokens = 0;
  Tensor positions = {}, segments = {};
};

/// Batches of an SFTDataset, epoch after epoch, in the order of an EpochSampler named "sft" (each
/// epoch a seeded shuffle, its last batch short), with a resumable cursor.
class SFTLoader {
 public:
  /// Throws Error(data) for an empty dataset, Error(usage) for batch_size < 1.
  SFTLoader(std::shared_ptr<const SFTDataset> dataset, int64_t batch_size, uint64_t seed,
            bool shuffle = true);

  /// The batch at the cursor; moves the cursor past it.
  SFTBatch next();
  /// Moves the cursor past the batch at it without building the batch (the micro-batches another
  /// rank of a data-parallel run trains on).
  void skip() { sampler_.next(); }
  const LoaderCursor& cursor() const { return sampler_.cursor(); }
  /// Continues from `cursor` as if next() had been called up to it. Throws Error(checkpoint) for a
  /// cursor of another dataset (fingerprint) or one where no batch can start.
  void restore(const LoaderCursor& cursor) { sampler_.restore(cursor); }

  /// Rows [first, first + count) in dataset order (count clipped at the end), for evaluation.
  /// Throws Error(usage) when first is outside [0, size) or count < 1.
  SFTBatch batch_at(int64_t first, int64_t count) const;
  int64_t batches_per_epoch() const { return sampler_.batches_per_epoch(); }
  /// fingerprint(dataset()), what a checkpointed cursor is checked against.
  uint64_t fingerprint() const { return sampler_.cursor().fingerprint; }
  const SFTDataset& dataset() const { return *dataset_; }

  /// The batch of `rows` (dataset indices, in that order).
  static SFTBatch make_batch(const SFTDataset& dataset, std::vector<int64_t> rows);

 private:
  std::shared_ptr<const SFTDataset> dataset_;
  EpochSampler sampler_;
};

}  // namespace forge
