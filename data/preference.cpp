// Preference pairs: strict JSON Lines (data/jsonl.h), TRL's truncation, and rows that share the
// prompt, batched chosen-first through next_token_rows like SFT rows.
#include "data/preference.h"

#include <algorithm>
#include <span>

#include "core/checksum.h"
#include "core/error.h"
#include "core/file_io.h"
#include "data/batch.h"
#include "data/jsonl.h"

namespace forge {

namespace {

// A ranked record's pairs: every two completions whose scores differ, the higher as chosen, in
// (i, j) order (InstructGPT's K-choose-2 comparisons of one prompt).
void expand_ranking(const JsonlObject& o, const std::string& prompt,
                    std::vector<PreferenceRecord>& records) {
  const nlohmann::json& completions = o.value.at("completions");
  const auto scores = o.value.find("scores");
  if (!completions.is_array() || completions.size() < 2)
    o.fail_field("completions", "must be a list of at least 2 strings");
  if (scores == o.value.end()) o.fail("missing field \"scores\" (one a completion)");
  if (!scores->is_array() || scores->size() != completions.size())
    o.fail_field("scores", detail::concat("must be a list of ", completions.size(),
                                          " numbers, one a completion"));
  std::vector<double> score;
  for (size_t i = 0; i < completions.size(); ++i) {
    const nlohmann::json& c = completions[i];
    if (!c.is_string() || c.get<std::string>().empty())
      o.fail_field("completions", i, "must be a non-empty string");
    score.push_back(jsonl_finite_number(o, "scores", i));
  }
  for (size_t i = 0; i < score.size(); ++i)
    for (size_t j = i + 1; j < score.size(); ++j) {
      if (score[i] == score[j]) continue;
      const size_t hi = score[i] > score[j] ? i : j, lo = hi == i ? j : i;
      records.push_back({prompt, completions[hi].get<std::string>(),
                         completions[lo].get<std::string>()});
    }
}

}  // namespace

std::vector<PreferenceRecord> read_preference_jsonl(const std::filesystem::path& file) {
  const JsonlSchema schema{"preference",
                           "a preference record",
                           {"prompt", "chosen", "rejected", "margin", "completions", "scores"},
                           kMaxPreferenceFileBytes};
  std::vector<PreferenceRecord> records;
  for (const JsonlObject& o : read_jsonl_objects(file, schema)) {
    const std::string prompt = jsonl_string(o, "prompt");
    if (o.value.contains("completions")) {
      for (const char* pair_field : {"chosen", "rejected", "margin"})
        if (o.value.contains(pair_field))
          o.fail_field(pair_field, "does not go with \"completions\" (a ranked record)");
      expand_ranking(o, prompt, records);
      continue;
    }
    PreferenceRecord r{prompt, jsonl_nonempty_string(o, "chosen"),
                       jsonl_nonempty_string(o, "rejected")};
    if (o.value.contains("margin")) r.margin = jsonl_finite_number(o, "margin");
    records.push_back(std::move(r));
  }
  if (records.empty())
    throw Error(ExitCode::data, quoted_path(file.string()) +
                                    ": no pairs: the completions of every ranked record score the "
                                    "same");
  return records;
}

namespace {

// Steps 2 and 3 of the rule in PreferenceTruncation's comment.
void truncate_pair(std::vector<int32_t>& prompt, std::vector<int32_t>& chosen,
                   std::vector<int32_t>& rejected, const PreferenceTruncation& t) {
  const auto longer = static_cast<int64_t>(std::max(chosen.size(), rejected.size()));
  const auto fits = [&] { return static_cast<int64_t>(prompt.size()) + longer <= t.max_length; };
  if (!fits() && static_cast<int64_t>(prompt.size()) > t.max_prompt_length)
    prompt.erase(prompt.begin(), prompt.end() - t.max_prompt_length);
  if (fits()) return;
  const auto budget = static_cast<size_t>(t.max_length - t.max_prompt_length);
  for (std::vector<int32_t>* response : {&chosen, &rejected})
    if (response->size() > budget) response->resize(budget);
}

}  // namespace

PreferenceDataset tokenize_preferences(const std::vector<PreferenceRecord>& records,
                                       const Tokenizer& tokenizer,
                                       const std::vector<int32_t>& end_of_text,
                                       const PreferenceTruncation& truncation) {
  if (truncation.max_prompt_length < 1 || truncation.max_prompt_length >= truncation.max_length)
    throw Error(ExitCode::usage,
                detail::concat("preference truncation needs 1 <= max_prompt_length < max_length, "
                               "got max_prompt_length ", truncation.max_prompt_length,
                               " and max_length ", truncation.max_length));
  PreferenceDataset out;
  out.chosen.reserve(records.size());
  out.rejected.reserve(records.size());
  out.prompt_len.reserve(records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    std::vector<int32_t> prompt = tokenizer.encode(records[i].prompt);
    std::vector<int32_t> chosen = tokenizer.encode(records[i].chosen);
    std::vector<int32_t> rejected = tokenizer.encode(records[i].rejected);
    for (auto [response, name] : {std::pair{&chosen, "chosen"}, std::pair{&rejected, "rejected"}}) {
      response->insert(response->end(), end_of_text.begin(), end_of_text.end());
      if (response->empty())
        throw Error(ExitCode::data, detail::concat("preference record ", i, ": the ", name,
                                                   " response encodes to no tokens"));
    }
    truncate_pair(prompt, chosen, rejected, truncation);
    if (prompt.empty() && std::min(chosen.size(), rejected.size()) < 2)
      throw Error(ExitCode::data,
                  detail::concat("preference record ", i, ": an empty prompt and a one-token ",
                                 chosen.size() < 2 ? "chosen" : "rejected",
                                 " response leave nothing to predict"));
    const auto prompt_len = static_cast<int64_t>(prompt.size());
    chosen.insert(chosen.begin(), prompt.begin(), prompt.end());
    rejected.insert(rejected.begin(), prompt.begin(), prompt.end());
    out.chosen.push_back(std::move(chosen));
    out.rejected.push_back(std::move(rejected));
    out.prompt_len.push_back(prompt_len);
    out.margin.push_back(records[i].margin);
  }
  return out;
}

uint64_t fingerprint(const PreferenceDataset& dataset) {
  const uint64_t h = fingerprint_rows(dataset.rejected, fingerprint_rows(dataset.chosen));
  const uint64_t p =
      fnv1a64(dataset.prompt_len.data(), dataset.prompt_len.size() * sizeof(int64_t), h);
  return fnv1a64(dataset.margin.data(), dataset.margin.size() * sizeof(double), p);
}

PreferenceSplit split_preferences_by_fraction(const PreferenceDataset& dataset,
                                              double val_fraction, uint64_t seed) {
  const auto [train_rows, val_rows] =
      split_rows_by_fraction(dataset.size(), val_fraction, seed, "preference_split");
  auto select = [&](const std::vector<int64_t>& rows) {
    auto out = std::make_shared<PreferenceDataset>();
    for (int64_t r : rows) {
      out->chosen.push_back(dataset.chosen[static_cast<size_t>(r)]);
      out->rejected.push_back(dataset.rejected[static_cast<size_t>(r)]);
      out->prompt_len.push_back(dataset.prompt_len[static_cast<size_t>(r)]);
      if (!dataset.margin.empty()) out->margin.push_back(dataset.margin[static_cast<size_t>(r)]);
    }
    return std::shared_ptr<const PreferenceDataset>(std::move(out));
  };
  return {select(train_rows), select(val_rows)};
}

PreferenceLoader::PreferenceLoader(std::shared_ptr<const PreferenceDataset> dataset,
                                   int64_t batch_size, uint64_t seed, bool shuffle)
    : dataset_(loader_dataset(std::move(dataset), "preference")),
      sampler_("preference", dataset_->size(), batch_size, seed, shuffle, /*drop_last=*/false,
               forge::fingerprint(*dataset_)) {}

PreferenceBatch PreferenceLoader::make_batch(const PreferenceDataset& dataset,
                                             std::vector<int64_t> rows) {
  // [2B, L-1]: the chosen rows of `rows`, then their rejected rows in the same order.
  std::vector<std::span<const int32_t>> tokens;
  std::vector<int64_t> prompt_len;
  for (const auto* side : {&dataset.chosen, &dataset.rejected})
    for (int64_t r : rows) {
      tokens.emplace_back((*side)[static_cast<size_t>(r)]);
      prompt_len.push_back(dataset.prompt_len[static_cast<size_t>(r)]);
    }
  NextTokenRows scored = next_token_rows(tokens, prompt_len);
  std::vector<double> counts(scored.targets_per_row.begin(), scored.targets_per_row.end());
  const auto n = static_cast<int64_t>(counts.size());
  std::vector<std::vector<int32_t>> whole;
  for (std::span<const int32_t> t : tokens) whole.emplace_back(t.begin(), t.end());
  const int64_t width = longest_row(whole);
  std::vector<double> margins;
  for (int64_t r : rows)
    margins.push_back(dataset.margin.empty() ? 0.0 : dataset.margin[static_cast<size_t>(r)]);
  const auto pairs = static_cast<int64_t>(rows.size());
  PreferenceBatch batch;
  batch.ids = std::move(scored.ids);
  batch.targets = std::move(scored.targets);
  batch.mask = std::move(scored.mask);
  batch.target_counts = from_vector(counts, {n}, DType::i64);
  batch.rows = pad_rows(whole, width, 0);
  batch.row_mask = padding_mask(whole, width);
  batch.margins = from_vector(margins, {pairs}, DType::f32);
  batch.indices = std::move(rows);
  return batch;
}

PreferenceBatch PreferenceLoader::next() { return make_batch(*dataset_, sampler_.next()); }

PreferenceBatch PreferenceLoader::batch_at(int64_t first, int64_t count) const {
  return make_batch(*dataset_, sampler_.rows_at(first, count));
}

}  // namespace forge
