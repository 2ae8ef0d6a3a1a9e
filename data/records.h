// Labelled record datasets for fine-tuning recipes (classification and the like): text records
// whose label is the name of the file they come from, tokenized with optional [CLS]/[SEP] framing,
// split by a seeded permutation, and served by a loader whose epoch order is a pure function of
// (seed, epoch), so that a checkpointed two-integer cursor resumes the exact batch stream.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "data/prepare.h"
#include "data/tokenizer.h"

namespace forge {

/// One record and the name of its class.
struct TextRecord {
  std::string text;
  std::string label;
};

/// Records of `files` split with split_records (text exactly as it gives it); each record's label
/// is its file's stem (fortunes/love.txt -> "love"). A directory stands for its regular *.txt
/// files sorted by name. Records keep file order, then order within the file.
/// Throws Error(data) naming a path that is missing or unreadable, or a directory without *.txt.
std::vector<TextRecord> read_labeled_records(const std::vector<std::filesystem::path>& files,
                                             RecordFormat format);

/// Tokenized records: row i is tokens[i] with class labels[i], an index into label_names.
struct RecordDataset {
  std::vector<std::string> label_names;  ///< sorted, unique
  std::vector<std::vector<int32_t>> tokens;
  std::vector<int32_t> labels;
  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
};

struct RecordTokenizeOptions {
  std::vector<std::string> prepend;  ///< special tokens before the text, e.g. {"[CLS]"}
  std::vector<std::string> append;   ///< special tokens after it, e.g. {"[SEP]"}
  int64_t max_len = 0;  ///< > 0: rows keep their specials and the first max_len - specials text ids
};

/// Encodes every record, framed by the options' specials. label_names are the sorted distinct
/// labels. Throws Error(data) if a special is not in the tokenizer, Error(usage) if max_len leaves
/// no room for text.
RecordDataset tokenize_records(const std::vector<TextRecord>& records, const Tokenizer& tokenizer,
                               const RecordTokenizeOptions& options = {});

/// Both sides keep the full label_names, so label ids mean the same thing in train and val.
struct RecordSplit {
  std::shared_ptr<const RecordDataset> train, val;
};

/// Rows go to val or train by a permutation drawn from (seed, "record_split"), so the classes mix
/// whatever the file order; each side keeps dataset order. val gets round(n * val_fraction) rows,
/// at least one on each side when val_fraction > 0. Throws Error(usage) for val_fraction outside
/// [0, 1), Error(data) if val_fraction > 0 and there are fewer than two rows.
RecordSplit split_records_by_fraction(const RecordDataset& dataset, double val_fraction,
                                      uint64_t seed);

/// Where a RecordLoader is: the next batch starts at row `position` of epoch `epoch`'s order.
struct LoaderCursor {
  int64_t epoch = 0;
  int64_t position = 0;
  bool operator==(const LoaderCursor&) const = default;

  /// {prefix + "epoch", prefix + "position"}, for a checkpoint's integer counters.
  std::map<std::string, int64_t> to_counters(const std::string& prefix) const;
  /// The inverse of to_counters; throws Error(checkpoint) naming a missing key.
  static LoaderCursor from_counters(const std::map<std::string, int64_t>& counters,
                                    const std::string& prefix);
};

/// ids and mask i64 [B, L] (L: the batch's longest row; mask 1 on real tokens, 0 on padding),
/// labels i64 [B], and the dataset rows used.
struct RecordBatch {
  Tensor ids, mask, labels;
  std::vector<int64_t> indices;
};

struct RecordLoaderOptions {
  bool shuffle = true;     ///< false: every epoch in dataset order
  bool drop_last = false;  ///< true: an epoch's last short batch is skipped
  int32_t pad_id = 0;      ///< id written into padding (masked out anyway)
};

/// Batches of a RecordDataset, epoch after epoch. An epoch serves its order in consecutive batches
/// of batch_size; its last batch is short (drop_last = false) or skipped (drop_last = true), and
/// the next batch is the first of the next epoch. The cursor always names the next batch to serve.
class RecordLoader {
 public:
  /// Throws Error(data) for an empty dataset (or one smaller than batch_size with drop_last),
  /// Error(usage) for batch_size < 1.
  RecordLoader(std::shared_ptr<const RecordDataset> dataset, int64_t batch_size, uint64_t seed,
               RecordLoaderOptions options = {});

  /// The batch at the cursor; moves the cursor past it.
  RecordBatch next();
  const LoaderCursor& cursor() const { return cursor_; }
  /// Continues from `cursor` as if next() had been called up to it. Throws Error(checkpoint) for a
  /// negative epoch or a position where no batch of this dataset can start.
  void restore(const LoaderCursor& cursor);

  /// Row order of `epoch`: a Fisher-Yates shuffle drawn from Philox under (seed,
  /// rng_stream("record_shuffle", epoch)), or 0..n-1 without shuffle.
  std::vector<int64_t> epoch_order(int64_t epoch) const;
  int64_t batches_per_epoch() const;
  int64_t batch_size() const { return batch_size_; }
  const RecordDataset& dataset() const { return *dataset_; }

 private:
  bool batch_fits(int64_t position) const;
  void enter_epoch(int64_t epoch);

  std::shared_ptr<const RecordDataset> dataset_;
  int64_t batch_size_;
  uint64_t seed_;
  RecordLoaderOptions options_;
  LoaderCursor cursor_;
  std::vector<int64_t> order_;  // epoch_order(cursor_.epoch)
};

}  // namespace forge
