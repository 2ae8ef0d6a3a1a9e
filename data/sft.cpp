// SFT records: strict JSON Lines (data/jsonl.h), tokenized into rows that remember where the
// prompt ends, so that only the completion is scored.
#include "data/sft.h"

#include <algorithm>
#include <fstream>

#include "core/checksum.h"
#include "core/error.h"
#include "core/file_io.h"
#include "data/batch.h"
#include "data/jsonl.h"
#include "data/lm_data.h"

namespace forge {

namespace fs = std::filesystem;

std::vector<SFTRecord> read_sft_jsonl(const fs::path& file) {
  const JsonlSchema schema{"SFT", "an SFT record", {"prompt", "completion"}, kMaxSFTFileBytes};
  std::vector<SFTRecord> records;
  for (const JsonlObject& o : read_jsonl_objects(file, schema))
    records.push_back({jsonl_string(o, "prompt"), jsonl_string(o, "completion")});
  return records;
}

std::vector<int32_t> end_of_text_ids(const Tokenizer& tokenizer, const std::string& text) {
  return tokenizer.encode(text);  // encode() turns a whole special token into its id
}

SFTDataset tokenize_sft(const std::vector<SFTRecord>& records, const Tokenizer& tokenizer,
                        const std::vector<int32_t>& end_of_text, int64_t max_len) {
  if (max_len < 2)
    throw Error(ExitCode::usage, detail::concat("SFT max_len must be at least 2, got ", max_len));
  if (end_of_text.empty()) throw Error(ExitCode::usage, "SFT end-of-text has no token ids");
  SFTDataset out;
  out.tokens.reserve(records.size());
  out.prompt_len.reserve(records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    std::vector<int32_t> row = tokenizer.encode(records[i].prompt);
    const auto prompt_len = static_cast<int64_t>(row.size());
    if (prompt_len + 1 > max_len)
      throw Error(ExitCode::data,
                  detail::concat("SFT record ", i, ": the prompt is ", prompt_len,
                                 " tokens, leaving no room for a completion token in max_len ",
                                 max_len));
    const std::vector<int32_t> completion = tokenizer.encode(records[i].completion);
    row.insert(row.end(), completion.begin(), completion.end());
    row.insert(row.end(), end_of_text.begin(), end_of_text.end());
    if (static_cast<int64_t>(row.size()) > max_len) row.resize(static_cast<size_t>(max_len));
    if (row.size() < 2)
      throw Error(ExitCode::data, detail::concat("SFT record ", i, ": ", row.size(),
                                                 " token, nothing to predict"));
    out.tokens.push_back(std::move(row));
    out.prompt_len.push_back(prompt_len);
  }
  return out;
}

std::vector<int32_t> sft_targets(const SFTDataset& dataset, int64_t i) {
  std::span<const uint8_t> flags;
  if (!dataset.scored.empty()) flags = dataset.scored[size_t(i)];
  return next_token_targets(dataset.tokens[size_t(i)], dataset.prompt_len[size_t(i)], flags);
}

uint64_t fingerprint(const SFTDataset& dataset) {
  uint64_t h = fingerprint_rows(dataset.tokens);
  h = fnv1a64(dataset.prompt_len.data(), dataset.prompt_len.size() * sizeof(int64_t), h);
  for (const std::vector<uint8_t>& mask : dataset.scored) h = fnv1a64(mask.data(), mask.size(), h);
  return h;
}

SFTSplit split_sft_by_fraction(const SFTDataset& dataset, double val_fraction, uint64_t seed) {
  const auto [train_rows, val_rows] =
      split_rows_by_fraction(dataset.size(), val_fraction, seed, "sft_split");
  auto select = [&](const std::vector<int64_t>& rows) {
    auto out = std::make_shared<SFTDataset>();
    for (int64_t r : rows) {
      out->tokens.push_back(dataset.tokens[static_cast<size_t>(r)]);
      out->prompt_len.push_back(dataset.prompt_len[static_cast<size_t>(r)]);
      if (!dataset.scored.empty()) out->scored.push_back(dataset.scored[static_cast<size_t>(r)]);
    }
    return std::shared_ptr<const SFTDataset>(std::move(out));
  };
  return {select(train_rows), select(val_rows)};
}

SFTLoader::SFTLoader(std::shared_ptr<const SFTDataset> dataset, int64_t batch_size, uint64_t seed,
                     bool shuffle)
    : dataset_(loader_dataset(std::move(dataset), "sft")),
      sampler_("sft", dataset_->size(), batch_size, seed, shuffle, /*drop_last=*/false,
               forge::fingerprint(*dataset_)) {}

SFTBatch SFTLoader::make_batch(const SFTDataset& dataset, std::vector<int64_t> rows) {
  std::vector<std::span<const int32_t>> tokens;
  std::vector<int64_t> prompt_len;
  std::vector<std::span<const uint8_t>> masks;
  for (int64_t r : rows) {
    tokens.emplace_back(dataset.tokens[static_cast<size_t>(r)]);
    prompt_len.push_back(dataset.prompt_len[static_cast<size_t>(r)]);
    if (!dataset.scored.empty()) masks.emplace_back(dataset.scored[static_cast<size_t>(r)]);
  }
  NextTokenRows scored = next_token_rows(tokens, prompt_len, masks);
  SFTBatch batch{std::move(scored.ids), std::move(scored.targets), std::move(scored.mask), 0,
                 std::move(rows)};
  for (int64_t n : scored.targets_per_row) batch.num_targets += n;
  for (const std::span<const int32_t>& row : tokens) batch.num_tokens += int64_t(row.size()) - 1;
  return batch;
}

SFTBatch SFTLoader::next() { return make_batch(*dataset_, sampler_.next()); }

SFTBatch SFTLoader::batch_at(int64_t first, int64_t count) const {
  return make_batch(*dataset_, sampler_.rows_at(first, count));
}

}  // namespace forge
