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

// A ranked record's scores, one a completion, its lists checked.
std::vector<double> ranking_scores(const JsonlObject& o, const PreferenceLimits& limits) {
  const nlohmann::json& completions = o.value.at("completions");
  const auto scores = o.value.find("scores");
  if (!completions.is_array() || completions.size() < 2)
    o.fail_field("completions", "must be a list of at least 2 strings");
  if (int64_t(completions.size()) > limits.completions)
    o.fail_field("completions", detail::concat("holds ", completions.size(),
                                               " completions, more than the ", limits.completions,
                                               " a ranked record may have"));
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
  return score;
}

// Calls fn(hi, lo) for each pair of a ranked record: every two completions whose scores differ,
// the higher as chosen, in (i, j) order (InstructGPT's K-choose-2 comparisons of one prompt).
template <class Fn>
void for_each_ranked_pair(const std::vector<double>& score, Fn fn) {
  for (size_t i = 0; i < score.size(); ++i)
    for (size_t j = i + 1; j < score.size(); ++j) {
      if (score[i] == score[j]) continue;
      const size_t hi = score[i] > score[j] ? i : j;
      fn(hi, hi == i ? j : i);
    }
}

}  // namespace

std::vector<PreferenceRecord> read_preference_jsonl(const std::filesystem::path& file,
                                                    const PreferenceLimits& limits) {
  const JsonlSchema schema{"preference",
                           "a preference record",
                           {"prompt", "chosen", "rejected", "margin", "completions", "scores"},
                           kMaxPreferenceFileBytes};
  const std::vector<JsonlObject> objects = read_jsonl_objects(file, schema);
  // Every record is checked and its pairs counted before one is expanded, so a file that would
  // expand beyond the limits is refused before its pairs are allocated.
  std::vector<std::vector<double>> scores(objects.size());
  int64_t pairs = 0, text_bytes = 0;
  for (size_t r = 0; r < objects.size(); ++r) {
    const JsonlObject& o = objects[r];
    const auto prompt_bytes = int64_t(jsonl_string(o, "prompt").size());
    if (o.value.contains("completions")) {
      for (const char* pair_field : {"chosen", "rejected", "margin"})
        if (o.value.contains(pair_field))
          o.fail_field(pair_field, "does not go with \"completions\" (a ranked record)");
      scores[r] = ranking_scores(o, limits);
      const nlohmann::json& completions = o.value.at("completions");
      for_each_ranked_pair(scores[r], [&](size_t hi, size_t lo) {
        ++pairs;
        text_bytes += prompt_bytes + int64_t(completions[hi].get_ref<const std::string&>().size() +
                                             completions[lo].get_ref<const std::string&>().size());
      });
    } else {
      const std::string chosen = jsonl_nonempty_string(o, "chosen");
      const std::string rejected = jsonl_nonempty_string(o, "rejected");
      if (o.value.contains("margin")) jsonl_finite_number(o, "margin");
      ++pairs;
      text_bytes += prompt_bytes + int64_t(chosen.size() + rejected.size());
    }
    if (pairs > limits.pairs)
      o.fail(detail::concat("the file's pairs pass ", limits.pairs,
                            ", the most one preference file may expand to"));
    if (text_bytes > limits.text_bytes)
      o.fail(detail::concat("the text of the file's pairs passes ", limits.text_bytes,
                            " bytes, the most one preference file may expand to"));
  }
  std::vector<PreferenceRecord> records;
  records.reserve(size_t(pairs));
  for (size_t r = 0; r < objects.size(); ++r) {
    const JsonlObject& o = objects[r];
    const std::string prompt = o.value.at("prompt").get<std::string>();
    if (o.value.contains("completions")) {
      const nlohmann::json& completions = o.value.at("completions");
      for_each_ranked_pair(scores[r], [&](size_t hi, size_t lo) {
        records.push_back(
            {prompt, completions[hi].get<std::string>(), completions[lo].get<std::string>()});
      });
      continue;
    }
    PreferenceRecord pair{prompt, o.value.at("chosen").get<std::string>(),
                          o.value.at("rejected").get<std::string>()};
    if (o.value.contains("margin")) pair.margin = o.value.at("margin").get<double>();
    records.push_back(std::move(pair));
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
