// Packing SFT records into full rows: records, in the loader's order, go first-fit into the rows
// of a batch (never split across rows), each keeping its own next-token targets, positions that
// restart at 0 and a record id, so that attention confined to each record (the fused kernel's
// segments) computes for every record what it computes alone. Targets are -100 (ignored) on padding
// and at every record's end; the loader's cursor counts records, so a resumed run packs the same
// batches.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "data/records.h"
#include "data/sft.h"

namespace forge {

/// Rows of `capacity` positions filled first-fit: each record goes to the first row with room.
class RowPacker {
 public:
  /// Throws Error(usage) for rows < 1 or capacity < 1.
  RowPacker(int64_t rows, int64_t capacity);
  /// Places `record` of `length` positions in the first of the rows it fits; false (nothing
  /// placed) when it fits none. Throws Error(data) for a length outside [1, capacity].
  bool place(int64_t record, int64_t length);
  /// The records of each non-empty row, in the order placed.
  std::vector<std::vector<int64_t>> rows() const;
  bool empty() const { return used_[0] == 0; }

 private:
  int64_t capacity_;
  std::vector<int64_t> used_;
  std::vector<std::vector<int64_t>> records_;
};

/// One record to pack: its next-token inputs and targets (LMWindows::kIgnoreTarget where not
/// scored), of equal length.
struct ScoredRecord {
  std::span<const int32_t> inputs, targets;
};

/// rows[r] = the records along packed row r -> an SFTBatch of W = the fullest row's length: ids
/// (padding 0), targets (padding kIgnoreTarget), positions (within each record; 0, 1, ... on the
/// padding) and segments (0, 1, ... per record, one more on the padding) i64 [R, W]; mask 1 on
/// record tokens; num_targets and num_tokens over all records; indices empty.
SFTBatch pack_records(const std::vector<std::vector<ScoredRecord>>& rows);

/// Packed batches of an SFTDataset: up to `rows` rows of `context` positions per batch, records in
/// the order of an EpochSampler named "sft" (the padded SFTLoader's order for the same seed), the
/// batch closed by the first record that fits no row (it opens the next batch) or by the epoch's
/// end. A record of n tokens takes n - 1 positions (tokenize_sft cuts rows at context + 1).
class PackedSFTLoader {
 public:
  /// Throws Error(data) for an empty dataset or a row longer than context + 1, Error(usage) for
  /// rows < 1 or context < 1.
  PackedSFTLoader(std::shared_ptr<const SFTDataset> dataset, int64_t rows, int64_t context,
                  uint64_t seed, bool shuffle = true);

  /// The batch at the cursor (indices: its records, row by row); moves the cursor past it.
  SFTBatch next();
  /// Moves the cursor past the batch at it without building the batch.
  void skip() { plan(); }
  /// The cursor names the next record: (epoch, position in that epoch's order).
  const LoaderCursor& cursor() const { return sampler_.cursor(); }
  /// Continues from `cursor` as if next() had been called up to it. Throws Error(checkpoint) for
  /// another dataset's cursor or a position outside it.
  void restore(const LoaderCursor& cursor) { sampler_.restore(cursor); }
  uint64_t fingerprint() const { return sampler_.cursor().fingerprint; }
  const SFTDataset& dataset() const { return *dataset_; }

 private:
  // The records of the batch at the cursor, row by row; moves the cursor past them.
  std::vector<std::vector<int64_t>> plan();

  std::shared_ptr<const SFTDataset> dataset_;
  int64_t rows_, context_;
  EpochSampler sampler_;  // batches of one record: its cursor counts records
  int64_t order_epoch_ = -1;
  std::vector<int64_t> order_;  // sampler_.epoch_order(order_epoch_)
};

}  // namespace forge
