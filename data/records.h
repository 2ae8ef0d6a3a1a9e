// Labelled record datasets for fine-tuning recipes (classification and the like): text records
// whose label is the name of the file they come from, tokenized with optional [CLS]/[SEP] framing,
// split by a seeded permutation, and served by a loader whose epoch order is a pure function of
// (seed, epoch), so that a checkpointed cursor (two integers and the dataset's fingerprint) resumes
// the exact batch stream, and refuses to resume over changed data.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/checksum.h"
#include "core/error.h"
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
/// files sorted by name. A .jsonl file holds records {"text": ..., "label": ...} instead
/// (read_labeled_jsonl). Records keep file order, then order within the file.
/// Throws Error(data) naming a path that is missing or unreadable, or a directory without *.txt.
std::vector<TextRecord> read_labeled_records(const std::vector<std::filesystem::path>& files,
                                             RecordFormat format);

/// Records of a JSONL file, one object {"text": string, "label": string or integer} a line (an
/// integer label becomes its decimal text). Throws Error(data) naming "file:line" and the field as
/// data/jsonl.h does, also for an empty text or label.
std::vector<TextRecord> read_labeled_jsonl(const std::filesystem::path& file);

/// The records whose label is in `labels`, in their order. Throws Error(data) naming a label that
/// no record has, with the labels there are.
std::vector<TextRecord> keep_labels(const std::vector<TextRecord>& records,
                                    const std::vector<std::string>& labels);

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
  /// The label ids in this order (a classifier's stored labels); empty = the sorted distinct
  /// labels of the records.
  std::vector<std::string> labels = {};
};

/// Encodes every record, framed by the options' specials. label_names are options.labels, or the
/// sorted distinct labels. Throws Error(data) if a special is not in the tokenizer or a record's
/// label is not among options.labels, Error(usage) if max_len leaves no room for text.
RecordDataset tokenize_records(const std::vector<TextRecord>& records, const Tokenizer& tokenizer,
                               const RecordTokenizeOptions& options = {});

/// One text as tokenize_records encodes it (framing and max_len of `options`; labels unused), for
/// texts without a label (forge predict). The same errors.
std::vector<int32_t> encode_record(const std::string& text, const Tokenizer& tokenizer,
                                   const RecordTokenizeOptions& options);

/// Both sides keep the full label_names, so label ids mean the same thing in train and val.
struct RecordSplit {
  std::shared_ptr<const RecordDataset> train, val;
};

/// The stratified split of split_rows_stratified over the dataset's labels; each side keeps
/// dataset order.
RecordSplit split_records_by_fraction(const RecordDataset& dataset, double val_fraction,
                                      uint64_t seed);

/// A stratified split of rows by their label (labels[i] is row i's): each label's rows, in order,
/// are permuted by a draw from (seed, rng_stream("record_split/" + label)) and the first
/// round(n_label * val_fraction) go to val, at least one and never all when val_fraction > 0 and
/// the label has two rows or more (a single row trains). A label's split depends only on its own
/// rows, so two runs that read the same file among different others hold out the same records
/// of it (the classify recipe and an LM fine-tune on the whole corpus). Returns {train rows, val
/// rows}, each ascending. Throws Error(usage) for val_fraction outside [0, 1), Error(data) when
/// val_fraction > 0 and nothing could be held out.
std::pair<std::vector<int64_t>, std::vector<int64_t>> split_rows_stratified(
    const std::vector<std::string>& labels, double val_fraction, uint64_t seed);

/// 0..n-1 shuffled by Fisher-Yates, swap i drawing from Philox block i of (seed, stream): every
/// seeded order of rows in Forge.
std::vector<int64_t> philox_permutation(int64_t n, uint64_t seed, uint64_t stream);

/// The row split behind split_records_by_fraction (and the SFT split) for `n` rows, with the
/// permutation drawn from (seed, rng_stream(purpose)): {train rows, val rows}, each ascending.
/// Same rules and errors.
std::pair<std::vector<int64_t>, std::vector<int64_t>> split_rows_by_fraction(
    int64_t n, double val_fraction, uint64_t seed, std::string_view purpose);

/// Where a loader is: the next batch starts at row `position` of epoch `epoch`'s order, over the
/// dataset whose fingerprint() is `fingerprint`.
struct LoaderCursor {
  int64_t epoch = 0;
  int64_t position = 0;
  uint64_t fingerprint = 0;
  bool operator==(const LoaderCursor&) const = default;

  /// {prefix + "epoch", prefix + "position", prefix + "fingerprint"} (the fingerprint's bits as an
  /// int64), for a checkpoint's integer counters.
  std::map<std::string, int64_t> to_counters(const std::string& prefix) const;
  /// The inverse of to_counters. Throws Error(checkpoint) naming a missing key, or saying that the
  /// training data changed when the saved fingerprint is not `expected_fingerprint` (the
  /// fingerprint of the dataset the run now loads).
  static LoaderCursor from_counters(const std::map<std::string, int64_t>& counters,
                                    const std::string& prefix, uint64_t expected_fingerprint);
};

/// 64-bit FNV-1a over the row count, every row's length and ids, the labels and the label names:
/// any change to the tokenized data changes it (with probability 1 - 2^-64).
uint64_t fingerprint(const RecordDataset& dataset);
/// FNV-1a over the row count, each row's length and ids, continuing from `h`: the part every
/// dataset of token rows hashes the same way.
uint64_t fingerprint_rows(const std::vector<std::vector<int32_t>>& rows,
                          uint64_t h = kFnv1a64Offset);

/// The row-choosing half of a loader, shared by RecordLoader and SFTLoader: each epoch's order (a
/// Fisher-Yates shuffle drawn from Philox under (seed, rng_stream(name + "_shuffle", epoch)), or
/// 0..n-1 without shuffle), served in consecutive batches of batch_size; an epoch's last batch is
/// short (drop_last = false) or skipped (drop_last = true), then the next epoch starts. The cursor
/// always names the next batch.
class EpochSampler {
 public:
  /// `name` ("record", "sft") names the shuffle stream and the loader in messages. Throws
  /// Error(data) for no rows (or fewer than batch_size with drop_last), Error(usage) for
  /// batch_size < 1.
  EpochSampler(std::string name, int64_t num_rows, int64_t batch_size, uint64_t seed,
               bool shuffle, bool drop_last, uint64_t fingerprint);

  /// The dataset rows of the batch at the cursor; moves the cursor past them.
  std::vector<int64_t> next();
  /// Rows [first, first + count) in dataset order (count clipped at the end), for evaluation.
  /// Throws Error(usage) when first is outside [0, num_rows) or count < 1.
  std::vector<int64_t> rows_at(int64_t first, int64_t count) const;
  const LoaderCursor& cursor() const { return cursor_; }
  /// Continues from `cursor` as if next() had been called up to it. Throws Error(checkpoint) for
  /// another dataset's fingerprint, a negative epoch or a position where no batch can start.
  void restore(const LoaderCursor& cursor);

  std::vector<int64_t> epoch_order(int64_t epoch) const;
  int64_t batches_per_epoch() const;
  int64_t batch_size() const { return batch_size_; }
  int64_t num_rows() const { return num_rows_; }

 private:
  bool batch_fits(int64_t position) const;
  void enter_epoch(int64_t epoch);

  std::string name_;
  int64_t num_rows_, batch_size_;
  uint64_t seed_;
  bool shuffle_, drop_last_;
  LoaderCursor cursor_;
  std::vector<int64_t> order_;  // epoch_order(cursor_.epoch)
};

/// `dataset` for a loader named `name`; Error(data) "<name> loader: the dataset has no records"
/// (what EpochSampler says of an empty one) when it is null.
template <class Dataset>
std::shared_ptr<const Dataset> loader_dataset(std::shared_ptr<const Dataset> dataset,
                                              const std::string& name) {
  if (!dataset) throw Error(ExitCode::data, name + " loader: the dataset has no records");
  return dataset;
}

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

/// Batches of a RecordDataset, epoch after epoch, in the order of an EpochSampler named "record".
class RecordLoader {
 public:
  /// Throws Error(data) for an empty dataset (or one smaller than batch_size with drop_last),
  /// Error(usage) for batch_size < 1.
  RecordLoader(std::shared_ptr<const RecordDataset> dataset, int64_t batch_size, uint64_t seed,
               RecordLoaderOptions options = {});

  /// The batch at the cursor; moves the cursor past it.
  RecordBatch next();
  /// Moves the cursor past the batch at it without building the batch (the micro-batches another
  /// rank of a data-parallel run trains on).
  void skip() { sampler_.next(); }
  const LoaderCursor& cursor() const { return sampler_.cursor(); }
  /// Continues from `cursor` as if next() had been called up to it. Throws Error(checkpoint) for a
  /// cursor of another dataset, a negative epoch or a position where no batch of this dataset can
  /// start.
  void restore(const LoaderCursor& cursor) { sampler_.restore(cursor); }

  /// Row order of `epoch`: a Fisher-Yates shuffle drawn from Philox under (seed,
  /// rng_stream("record_shuffle", epoch)), or 0..n-1 without shuffle.
  std::vector<int64_t> epoch_order(int64_t epoch) const { return sampler_.epoch_order(epoch); }
  int64_t batches_per_epoch() const { return sampler_.batches_per_epoch(); }
  int64_t batch_size() const { return sampler_.batch_size(); }
  const RecordDataset& dataset() const { return *dataset_; }

  /// The batch of `rows` (dataset indices, in that order), padded with pad_id.
  static RecordBatch make_batch(const RecordDataset& dataset, std::vector<int64_t> rows,
                                int32_t pad_id = 0);

 private:
  std::shared_ptr<const RecordDataset> dataset_;
  RecordLoaderOptions options_;
  EpochSampler sampler_;
};

}  // namespace forge
