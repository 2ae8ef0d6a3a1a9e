// Recipe reward_model: a GPT with a scalar head on the last real token (nn::GPTRewardModel),
// initialised from a language model and trained on preference pairs with the Bradley-Terry loss, as
// TRL's RewardTrainer does (docs/recipes/preference.md). `forge score` puts its rewards on records.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>

#include "data/preference.h"
#include "nn/classifier.h"
#include "runtime/config.h"
#include "runtime/registry.h"
#include "runtime/trainer.h"

namespace forge {

RecipeSpec reward_model_recipe();
ConfigSection reward_model_section();

/// The reward_model: section, a field a key of reward_model_section (its docs and defaults are
/// there).
struct RewardModelSection {
  double center_rewards_coefficient{};
};
/// What `config` says in its reward_model: section.
RewardModelSection reward_model_settings(const RunConfig& config);

/// The Bradley-Terry loss of a batch of pairs summed over them, their count, and sums for the
/// train line: "pairs", "correct" (r_chosen > r_rejected), "chosen", "rejected" (summed rewards).
MicroBatchLoss reward_loss(const nn::GPTRewardModel& model, const PreferenceBatch& batch,
                           double center_rewards_coefficient);

/// Mean loss and the reward metrics over the first `pairs` pairs of `dataset` (all when 0), in
/// batches of `batch_size`: loss, reward_acc, reward_margin, reward_chosen, reward_rejected.
Metrics evaluate_reward_model(const nn::GPTRewardModel& model, const PreferenceDataset& dataset,
                              int64_t batch_size, int64_t pairs, double center_rewards_coefficient);

/// A reward_model run's model from checkpoint `file` (eval mode) and the config stored with it.
/// Error(checkpoint) naming the file when it is not a reward_model checkpoint. `dropout` false
/// builds it without dropout whatever the stored model.dropout (its config then says 0), for a
/// copy that trains on in train mode (PPO's value model).
struct LoadedRewardModel {
  RunConfig config;
  std::unique_ptr<nn::GPTRewardModel> model;
};
LoadedRewardModel load_reward_model(const std::filesystem::path& file, bool dropout = true);

/// The rewards of `texts`, each tokenized with the model's tokenizer and followed by its
/// preference.end_of_text, as the reward model was trained, in batches of `batch_size`. Throws
/// Error(data) naming names(i) when text i does not fit the model's context or is empty.
std::vector<double> score_texts(const LoadedRewardModel& rm, const std::vector<std::string>& texts,
                                int64_t batch_size,
                                const std::function<std::string(size_t)>& names);

/// forge score: every record of `input` (JSONL, other fields kept) with the reward model's scores
/// added: "reward" for prompt + completion (forge generate's records), "reward_chosen" and
/// "reward_rejected" for a preference record. Written atomically to `output`, or to stdout when it
/// is empty. Error(data) naming file:line for a record with neither, or one that does not fit the
/// model's context.
int score_records(const std::filesystem::path& checkpoint, const std::filesystem::path& input,
                  const std::filesystem::path& output, int64_t batch_size);

}  // namespace forge
