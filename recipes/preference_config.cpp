// The `preference:` section (see preference_config.h). Lengths follow TRL's DPOTrainer (up to
// 0.11): max_length bounds prompt + response, max_prompt_length is what a prompt is cut to (from
// the left) when a pair does not fit; docs/recipes/preference.md has the rule.
#include "recipes/preference_config.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include "data/lm_data.h"
#include "data/sft.h"

namespace forge {

ConfigSection preference_section() {
  return {
      "preference",
      "how the preference recipes (reward_model, dpo) read {\"prompt\", \"chosen\", \"rejected\"} "
      "records",
      {section_key("preference.max_length",
                   integer_key(0, "[0, 1000000]").shown_as("model.context"),
                   "tokens of prompt + response per row; 0 = model.context"),
       section_key("preference.max_prompt_length",
                   integer_key(0, "[0, 1000000]").shown_as("max_length / 4"),
                   "what a prompt keeps (its end) when prompt + the longer response pass "
                   "max_length; responses are then cut to max_length - max_prompt_length"),
       section_key("preference.end_of_text", string_key(""),
                   "appended to every response: a special token of the tokenizer (e.g. "
                   "<|endoftext|>), else this text itself; empty = nothing")}};
}

PreferenceSection preference_settings(const RunConfig& config) {
  return {.max_length = config.get<int64_t>("preference.max_length"),
          .max_prompt_length = config.get<int64_t>("preference.max_prompt_length"),
          .end_of_text = config.get<std::string>("preference.end_of_text")};
}

PreferenceTruncation preference_truncation(const RunConfig& config) {
  const PreferenceSection s = preference_settings(config);
  PreferenceTruncation t;
  t.max_length = s.max_length > 0 ? s.max_length : config.model.context;
  t.max_prompt_length = s.max_prompt_length > 0 ? s.max_prompt_length : t.max_length / 4;
  return t;
}

void check_preference(ConfigChecker& checker) {
  const RunConfig& c = checker.config();
  const PreferenceTruncation t = preference_truncation(c);
  checker.cross({"preference.max_length", "model.context"}, t.max_length <= c.model.context,
                "preference.max_length: a row of " + std::to_string(t.max_length) +
                    " tokens does not fit model.context " + std::to_string(c.model.context));
  checker.cross({"preference.max_prompt_length", "preference.max_length"},
                t.max_prompt_length >= 1 && t.max_prompt_length < t.max_length,
                "preference.max_prompt_length: must be at least 1 and below max_length (" +
                    std::to_string(t.max_length) + ")");
  for (const char* key : {"data.train", "data.val"}) {
    const std::string& path = std::string(key) == "data.train" ? c.data.train : c.data.val;
    checker.cross({key}, path.empty() || std::filesystem::path(path).extension() == ".jsonl",
                  std::string(key) + ": preference pairs are a .jsonl file of {\"prompt\", " +
                      "\"chosen\", \"rejected\"} records, got '" + path + "'");
  }
}

PreferenceData load_preference_data(const RunConfig& config) {
  PreferenceData data;
  data.tokenizer = make_tokenizer(config.data.tokenizer, config.data.special_tokens);
  const std::vector<int32_t> eot =
      end_of_text_ids(*data.tokenizer, preference_settings(config).end_of_text);
  const PreferenceTruncation t = preference_truncation(config);
  auto read = [&](const std::string& path) {
    return tokenize_preferences(read_preference_jsonl(path), *data.tokenizer, eot, t);
  };
  PreferenceDataset train = read(config.data.train);
  if (config.data.val.empty()) {
    PreferenceSplit split = split_preferences_by_fraction(train, config.data.val_fraction,
                                                          uint64_t(config.data.split_seed));
    data.train = split.train;
    data.val = split.val;
  } else {
    data.train = std::make_shared<const PreferenceDataset>(std::move(train));
    data.val = std::make_shared<const PreferenceDataset>(read(config.data.val));
  }
  return data;
}

double mean_pair_tokens(const PreferenceDataset& dataset) {
  double total = 0;
  for (int64_t i = 0; i < dataset.size(); ++i)
    total += double(dataset.chosen[size_t(i)].size() + dataset.rejected[size_t(i)].size());
  return total / double(std::max<int64_t>(1, dataset.size()));
}

Tensor chosen_row_targets(const PreferenceBatch& batch) {
  // [2B, L] rows and mask -> [B, L-1]
  const int64_t B = batch.pairs(), L = batch.rows.size(1);
  const std::vector<int64_t> rows = batch.rows.to_vector<int64_t>();
  const std::vector<int64_t> mask = batch.row_mask.to_vector<int64_t>();
  std::vector<double> targets;
  targets.reserve(size_t(B * (L - 1)));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 1; j < L; ++j) {
      const auto k = size_t(b * L + j);
      targets.push_back(mask[k] ? double(rows[k]) : double(LMWindows::kIgnoreTarget));
    }
  return from_vector(targets, {B, L - 1}, DType::i64);
}

PreferenceBatch preference_batch_at(const PreferenceDataset& dataset, int64_t first,
                                    int64_t count) {
  std::vector<int64_t> rows;
  for (int64_t i = first; i < std::min(dataset.size(), first + count); ++i) rows.push_back(i);
  return PreferenceLoader::make_batch(dataset, std::move(rows));
}

}  // namespace forge
