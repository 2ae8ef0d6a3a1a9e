// Preference data for reward models and DPO: JSONL records {"prompt", "chosen", "rejected"} (TRL's
// standard format) read strictly, tokenized into a chosen and a rejected row that share the prompt
// and remember where it ends, truncated as TRL's DPOTrainer truncates, and batched as one [2B, L]
// next-token batch (chosen rows first) so that one forward scores both responses of every pair.
// The loader's order and cursor are EpochSampler's (data/records.h), so a run resumes exactly.
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

/// One comparison: `chosen` is the preferred response to `prompt`, `rejected` the other. `margin`
/// (optional in the file, 0 when absent) is how much better chosen is: a reward model's
/// Bradley-Terry loss asks r_chosen - r_rejected to exceed it (Llama 2's margin, TRL's "margin").
struct PreferenceRecord {
  std::string prompt, chosen, rejected;
  double margin = 0;
};

/// Largest preference file read_preference_jsonl accepts (bigger data belongs in several files).
constexpr int64_t kMaxPreferenceFileBytes = int64_t{1} << 30;

/// What one preference file may expand to. A ranked record's pairs grow as the square of its
/// completions, so a small file could otherwise ask for more pairs than memory holds; the defaults
/// are far above real data (InstructGPT ranks 4 to 9 completions, Nectar 7, UltraFeedback 4) and
/// docs/recipes/preference.md states them.
struct PreferenceLimits {
  int64_t completions = 64;              ///< per ranked record, so at most 2016 pairs
  int64_t pairs = int64_t{1} << 24;      ///< in the file, ranked records expanded
  int64_t text_bytes = int64_t{1} << 32; ///< prompt, chosen and rejected of every pair, summed
};

/// Records of a JSONL file, one object {"prompt": string, "chosen": string, "rejected": string} a
/// line, and optionally "margin": a finite number; or a ranked record {"prompt", "completions":
/// [K strings], "scores": [K numbers]}, which stands for every two completions whose scores differ
/// (the higher chosen; pairs in (i, j) order, as InstructGPT compares K responses of a prompt).
/// Blank lines are skipped; the prompt may be empty, the responses may not. Throws Error(data)
/// with one line naming "file:line" and the field for a line that is not JSON, not an object,
/// misses a field, has one of the wrong type, an empty response, a margin that is not a finite
/// number, a ranked record whose lists do not match or an unknown field; and naming the file when
/// it is missing, not a regular file, too large, or holds no records or no pairs (every ranked
/// record a tie). Every record is checked and its pairs counted before any is expanded: a ranked
/// record of more than limits.completions, and the record with which the file's pairs pass
/// limits.pairs or their text limits.text_bytes, are Error(data) naming "file:line".
std::vector<PreferenceRecord> read_preference_jsonl(const std::filesystem::path& file,
                                                    const PreferenceLimits& limits = {});

/// Lengths in tokens, as TRL's DPOTrainer (DPODataCollatorWithPadding / tokenize_row, up to TRL
/// 0.11) applies them with truncation_mode "keep_end". The defaults are the values TRL falls back
/// to when they are not given. The rule, per record, with P the prompt's ids and C, R the chosen
/// and rejected ids each followed by the end-of-text ids:
///   1. longer = max(|C|, |R|);
///   2. if |P| + longer > max_length: P keeps its last max_prompt_length ids (cut from the left);
///   3. if still |P| + longer > max_length: C and R each keep their first
///      max_length - max_prompt_length ids (cut from the right; the end-of-text may go).
/// Both rows then fit in max_length. As in TRL the cut depends on the longer response, so a short
/// response is cut only when it exceeds the budget of step 3, and that budget does not grow when
/// the prompt is shorter than max_prompt_length.
struct PreferenceTruncation {
  int64_t max_length = 512;         ///< prompt + response, per row
  int64_t max_prompt_length = 128;  ///< what a prompt is cut to when a pair does not fit
};

/// Tokenized pairs: chosen[i] and rejected[i] are prompt ids followed by that response's ids (both
/// as truncated); prompt_len[i] is the number of prompt ids at the start of both; margin[i] the
/// record's margin (an empty `margin` means 0 for every pair).
struct PreferenceDataset {
  std::vector<std::vector<int32_t>> chosen, rejected;
  std::vector<int64_t> prompt_len;
  std::vector<double> margin;
  int64_t size() const { return static_cast<int64_t>(chosen.size()); }
};

/// Encodes prompt, chosen and rejected separately (so the prompt's ids are exactly its own),
/// appends `end_of_text` (may be empty) to each response and truncates by `truncation`. Throws
/// Error(usage) unless 1 <= max_prompt_length < max_length; Error(data) naming the record's index
/// when a response has no tokens, or a row has nothing to predict (an empty prompt and a one-token
/// response: the first token of a row is never a target).
PreferenceDataset tokenize_preferences(const std::vector<PreferenceRecord>& records,
                                       const Tokenizer& tokenizer,
                                       const std::vector<int32_t>& end_of_text,
                                       const PreferenceTruncation& truncation = {});

/// 64-bit FNV-1a over the chosen rows, the rejected rows (count, lengths, ids), every prompt_len
/// and every margin.
uint64_t fingerprint(const PreferenceDataset& dataset);

struct PreferenceSplit {
  std::shared_ptr<const PreferenceDataset> train, val;
};

/// Pairs go to val or train by a permutation drawn from (seed, "preference_split"); each side keeps
/// dataset order. The rules and errors of split_rows_by_fraction.
PreferenceSplit split_preferences_by_fraction(const PreferenceDataset& dataset,
                                              double val_fraction, uint64_t seed);

/// B pairs as one batch of 2B rows, L the longest row: row b < B is pair indices[b]'s chosen row,
/// row B + b its rejected row. ids, targets and mask i64 [2B, L-1] as next_token_rows
/// (data/batch.h) makes them: targets[r][j] = row[j+1] where prompt_len <= j+1 < the row's length,
/// else -100, so only response tokens (and their end-of-text) are scored; target_counts i64 [2B] is
/// each row's number of scored positions (what IPO's per-token average divides by). A reward
/// model reads whole rows instead: rows i64 [2B, L] (padded with 0) and row_mask i64 [2B, L], 1 on
/// real tokens; margins f32 [B] are the pairs' margins.
struct PreferenceBatch {
  Tensor ids, targets, mask, target_counts;
  Tensor rows, row_mask, margins;
  std::vector<int64_t> indices;
  int64_t pairs() const { return static_cast<int64_t>(indices.size()); }
};

/// Batches of a PreferenceDataset, epoch after epoch, in the order of an EpochSampler named
/// "preference" (each epoch a seeded shuffle, its last batch short), with a resumable cursor.
class PreferenceLoader {
 public:
  /// Throws Error(data) for an empty dataset, Error(usage) for batch_size < 1.
  PreferenceLoader(std::shared_ptr<const PreferenceDataset> dataset, int64_t batch_size,
                   uint64_t seed, bool shuffle = true);

  /// The batch at the cursor; moves the cursor past it.
  PreferenceBatch next();
  /// Moves the cursor past the batch at it without building the batch (the micro-batches another
  /// rank of a data-parallel run trains on).
  void skip() { sampler_.next(); }
  const LoaderCursor& cursor() const { return sampler_.cursor(); }
  /// Continues from `cursor` as if next() had been called up to it. Throws Error(checkpoint) for a
  /// cursor of another dataset (fingerprint) or one where no batch can start.
  void restore(const LoaderCursor& cursor) { sampler_.restore(cursor); }

  /// Pairs [first, first + count) in dataset order (count clipped at the end), for evaluation.
  /// Throws Error(usage) when first is outside [0, size) or count < 1.
  PreferenceBatch batch_at(int64_t first, int64_t count) const;
  int64_t batches_per_epoch() const { return sampler_.batches_per_epoch(); }
  /// fingerprint(dataset()), what a checkpointed cursor is checked against.
  uint64_t fingerprint() const { return sampler_.cursor().fingerprint; }
  const PreferenceDataset& dataset() const { return *dataset_; }

  /// The batch of the pairs `rows` (dataset indices, in that order).
  static PreferenceBatch make_batch(const PreferenceDataset& dataset, std::vector<int64_t> rows);

 private:
  std::shared_ptr<const PreferenceDataset> dataset_;
  EpochSampler sampler_;
};

}  // namespace forge
