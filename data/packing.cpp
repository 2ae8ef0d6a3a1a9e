// First-fit packing of SFT records into rows, the packed batch's tensors, and the loader that walks
// the epoch order one record at a time so its cursor resumes mid-epoch at any record.
#include "data/packing.h"

#include <algorithm>

#include "core/error.h"
#include "data/batch.h"
#include "data/lm_data.h"

namespace forge {

RowPacker::RowPacker(int64_t rows, int64_t capacity)
    : capacity_(capacity), used_(size_t(std::max<int64_t>(rows, 1)), 0), records_(used_.size()) {
  if (rows < 1 || capacity < 1)
    throw Error(ExitCode::usage, detail::concat("packing: rows (", rows, ") and capacity (",
                                                capacity, ") must be at least 1"));
}

bool RowPacker::place(int64_t record, int64_t length) {
  if (length < 1 || length > capacity_)
    throw Error(ExitCode::data, detail::concat("packing: record ", record, " takes ", length,
                                               " positions, rows hold 1 to ", capacity_));
  for (size_t r = 0; r < used_.size(); ++r)
    if (used_[r] + length <= capacity_) {
      used_[r] += length;
      records_[r].push_back(record);
      return true;
    }
  return false;
}

std::vector<std::vector<int64_t>> RowPacker::rows() const {
  std::vector<std::vector<int64_t>> out;
  for (const std::vector<int64_t>& row : records_)
    if (!row.empty()) out.push_back(row);
  return out;
}

SFTBatch pack_records(const std::vector<std::vector<ScoredRecord>>& rows) {
  // [R, W]: records one after another along each row, then padding.
  std::vector<std::vector<int32_t>> ids(rows.size()), targets(rows.size()), positions(rows.size()),
      segments(rows.size());
  SFTBatch batch;
  for (size_t r = 0; r < rows.size(); ++r) {
    int32_t segment = 0;
    for (const ScoredRecord& record : rows[r]) {
      FORGE_CHECK(record.inputs.size() == record.targets.size() && !record.inputs.empty(),
                  "pack_records: a record has ", record.inputs.size(), " inputs and ",
                  record.targets.size(), " targets");
      ids[r].insert(ids[r].end(), record.inputs.begin(), record.inputs.end());
      targets[r].insert(targets[r].end(), record.targets.begin(), record.targets.end());
      for (size_t j = 0; j < record.inputs.size(); ++j) {
        positions[r].push_back(int32_t(j));
        segments[r].push_back(segment);
        batch.num_targets += record.targets[j] != LMWindows::kIgnoreTarget;
      }
      batch.num_tokens += int64_t(record.inputs.size());
      ++segment;
    }
  }
  const int64_t width = longest_row(ids);
  batch.ids = pad_rows(ids, width, 0);
  batch.targets = pad_rows(targets, width, LMWindows::kIgnoreTarget);
  batch.mask = padding_mask(ids, width);
  // Padding is one more record of its own, at positions from 0, so no record attends to it and
  // every position stays inside the model's context.
  for (size_t r = 0; r < rows.size(); ++r) {
    const auto segment = int32_t(rows[r].size());
    for (int32_t j = 0; int64_t(segments[r].size()) < width; ++j) {
      segments[r].push_back(segment);
      positions[r].push_back(j);
    }
  }
  batch.positions = pad_rows(positions, width, 0);
  batch.segments = pad_rows(segments, width, 0);
  return batch;
}

PackedSFTLoader::PackedSFTLoader(std::shared_ptr<const SFTDataset> dataset, int64_t rows,
                                 int64_t context, uint64_t seed, bool shuffle)
    : dataset_(loader_dataset(std::move(dataset), "sft")),
      rows_(rows),
      context_(context),
      sampler_("sft", dataset_->size(), 1, seed, shuffle, /*drop_last=*/false,
               forge::fingerprint(*dataset_)) {
  RowPacker(rows, context);  // the usage errors, before any record is read
  for (int64_t i = 0; i < dataset_->size(); ++i) {
    const auto length = int64_t(dataset_->tokens[size_t(i)].size());
    if (length < 2 || length > context + 1)
      throw Error(ExitCode::data, detail::concat("sft packing: record ", i, " has ", length,
                                                 " tokens, packed rows of context ", context,
                                                 " hold 2 to ", context + 1));
  }
}

std::vector<std::vector<int64_t>> PackedSFTLoader::plan() {
  const int64_t epoch = sampler_.cursor().epoch;
  if (order_epoch_ != epoch) {
    order_ = sampler_.epoch_order(epoch);
    order_epoch_ = epoch;
  }
  RowPacker packer(rows_, context_);
  while (sampler_.cursor().epoch == epoch) {
    const int64_t record = order_[size_t(sampler_.cursor().position)];
    if (!packer.place(record, int64_t(dataset_->tokens[size_t(record)].size()) - 1)) break;
    sampler_.next();
  }
  return packer.rows();
}

SFTBatch PackedSFTLoader::next() {
  const std::vector<std::vector<int64_t>> plan_rows = plan();
  std::vector<std::vector<int32_t>> targets;  // owns what the ScoredRecords' targets view
  std::vector<std::vector<ScoredRecord>> rows(plan_rows.size());
  std::vector<int64_t> indices;
  for (const std::vector<int64_t>& row : plan_rows)
    indices.insert(indices.end(), row.begin(), row.end());
  targets.reserve(indices.size());
  for (size_t r = 0; r < plan_rows.size(); ++r)
    for (int64_t record : plan_rows[r]) {
      const std::vector<int32_t>& tokens = dataset_->tokens[size_t(record)];
      const std::vector<int32_t>& scored = targets.emplace_back(sft_targets(*dataset_, record));
      rows[r].push_back({std::span<const int32_t>(tokens).first(tokens.size() - 1), scored});
    }
  SFTBatch batch = pack_records(rows);
  batch.indices = std::move(indices);
  return batch;
}

}  // namespace forge
