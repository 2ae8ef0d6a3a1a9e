// What the preference recipes (reward_model, dpo) share: the `preference:` section, which says how
// {"prompt", "chosen", "rejected"} records become rows (TRL's lengths and truncation, the
// end-of-text a response ends with), and the data both read from data.train / data.val.
#pragma once

#include <memory>
#include <string>

#include "data/preference.h"
#include "data/tokenizer.h"
#include "runtime/config.h"
#include "runtime/registry.h"

namespace forge {

ConfigSection preference_section();

/// The preference: section, a field a key of preference_section (its docs and defaults are there;
/// 0 lengths are resolved by preference_truncation).
struct PreferenceSection {
  int64_t max_length{};
  int64_t max_prompt_length{};
  std::string end_of_text;
};
/// What `config` says in its preference: section.
PreferenceSection preference_settings(const RunConfig& config);

/// preference.max_length and max_prompt_length with their defaults resolved (model.context, and a
/// quarter of max_length as TRL's 128 of 512).
PreferenceTruncation preference_truncation(const RunConfig& config);

/// Rules for a preference recipe's check: the lengths fit the model, the data are JSONL files.
void check_preference(ConfigChecker& checker);

struct PreferenceData {
  std::unique_ptr<Tokenizer> tokenizer;
  std::shared_ptr<const PreferenceDataset> train, val;
};

/// data.train's pairs and the validation pairs: data.val's, or data.val_fraction of data.train's
/// drawn by data.split_seed.
PreferenceData load_preference_data(const RunConfig& config);

/// Tokens in a pair (both rows), on average: what a step of B pairs counts for tokens/s.
double mean_pair_tokens(const PreferenceDataset& dataset);

/// The next-token targets of a batch's B chosen rows over the whole row, prompt included (TRL's ORPO
/// NLL scores them): i64 [B, L-1], targets[b][j] = rows[b][j+1] where that is a real token of the
/// row, else -100; the same width as batch.ids.
Tensor chosen_row_targets(const PreferenceBatch& batch);

/// Pairs [first, first + count) of `dataset` in order (count clipped at the end), for evaluation.
PreferenceBatch preference_batch_at(const PreferenceDataset& dataset, int64_t first, int64_t count);

}  // namespace forge
