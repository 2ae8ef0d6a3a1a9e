// What the recipes that train a pretrained policy (finetune, dpo, ppo) share: the policy from
// model.init_from, full or with LoRA adapters, its rules and memory estimate; for dpo and ppo its
// frozen reference (a copy of the base, or the policy with its adapters off), held-out text the
// policy must still write, and `forge eval`, whose --prompts samples policy and reference with the
// same draws and reports their KL and rewards (docs/recipes/preference.md).
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "data/lm_data.h"
#include "nn/generate.h"
#include "nn/gpt.h"
#include "nn/lora.h"
#include "runtime/components.h"
#include "runtime/config.h"
#include "runtime/metrics.h"
#include "runtime/registry.h"
#include "recipes/reward_model.h"
#include "runtime/trainer.h"

namespace forge {

/// The reference: a frozen copy of the base, or the policy itself with its LoRA adapters off.
/// Always in eval mode and without gradient.
class ReferencePolicy {
 public:
  ReferencePolicy(nn::GPT& policy, std::unique_ptr<nn::GPT> copy)
      : policy_(policy), copy_(std::move(copy)) {}

  nn::GPT* copy() const { return copy_.get(); }

  /// f(the reference model): the copy, or the policy with its adapters off and in eval mode for the
  /// call (its mode is restored after).
  template <class F>
  std::invoke_result_t<F, const nn::GPT&> with_model(F f) const {
    if (copy_) return f(*copy_);
    const bool training = policy_.is_training();
    policy_.eval();
    struct Restore {
      nn::GPT& m;
      bool on;
      ~Restore() { m.train(on); }
    } restore{policy_, training};
    nn::AdaptersDisabled off(policy_);
    return f(policy_);
  }

 private:
  nn::GPT& policy_;
  std::unique_ptr<nn::GPT> copy_;
};

/// A frozen copy of the base policy `base` (a checkpoint) in eval mode, with `config`'s model.
std::unique_ptr<nn::GPT> load_frozen_base(const RunConfig& config,
                                          const std::filesystem::path& base);

/// The model finetune, dpo and ppo train: a GPT from model.init_from, every weight or (lora.rank >
/// 0) LoRA adapters on it, and for dpo and ppo its frozen reference.
struct Policy {
  std::unique_ptr<nn::GPT> model;
  std::unique_ptr<ReferencePolicy> reference;  ///< none for finetune
  std::filesystem::path base;  ///< model.init_from resolved to a checkpoint file
  bool lora = false;
};

/// The policy from model.init_from (with adapters when lora.rank > 0), without a reference. A full
/// fine-tune's checkpoints hold every weight, so its resume does not read the base; LoRA
/// checkpoints hold the adapters only, so the base is read every time (and its digest checked).
Policy build_policy(const RunConfig& config, bool resuming);

/// The same with its reference: a frozen copy of the base, read even on resume, or for LoRA the
/// policy with its adapters off. `need_reference_copy` false (DPO's precomputed reference) skips
/// the copy.
Policy build_policy(const RunConfig& config, bool resuming, bool need_reference_copy);

/// The rules of a recipe that trains a policy: the model family's and lora.*'s, and model.init_from
/// given; `starts_from` says what the recipe takes from it ("a trained model").
void check_policy(ConfigChecker& checker, const std::string& starts_from);

/// Config errors at model.dropout and lora.dropout when either is not 0: the policy trains in
/// train mode, and its log-probabilities must equal the reference's (and PPO's rollout's) before
/// an update, as TRL runs every model without dropout. Refused rather than overridden so that the
/// config stored with the run says how it ran.
void check_policy_dropout(ConfigChecker& checker);

/// The policy and its reference as a run's models: the policy is the main model (saved whole, or
/// for LoRA its adapters with the base referenced), the reference copy a frozen "reference"
/// referenced by the base's path and digest, so a resume against another base fails. With no copy
/// (LoRA: the policy with adapters off; finetune: no reference), no reference entry; `absent_copy`
/// (an empty module) stands for a full policy's reference the run does not hold (DPO's precomputed
/// one).
std::vector<RunModel> policy_run_models(const Policy& policy, nn::Module* absent_copy = nullptr);

/// The policy of a dpo or ppo checkpoint (a LoRA run's: its base with the adapters) and its
/// reference: the copy of model.init_from, or the policy with its adapters off.
struct LoadedPolicy {
  LoadedGPT loaded;
  std::unique_ptr<ReferencePolicy> reference;
};
LoadedPolicy load_policy(const RunConfig& config, const std::filesystem::path& checkpoint);

/// The parameters the policy's optimizer trains: all of them, or LoRA's adapters and train_also.
NamedTensors policy_trained_parameters(const RunConfig& config, const Policy& policy);

/// What a recipe holds and trains besides its policy, for estimate_policy_memory.
struct PolicyMemory {
  /// The reference is a frozen copy of the base. Only a full policy's can be: a LoRA policy's
  /// reference is itself with its adapters off.
  bool reference_copy = false;
  int64_t frozen_parameters = 0;   ///< other frozen models (ppo's reward model)
  int64_t trained_parameters = 0;  ///< other trained ones (ppo's value model or head)
  int64_t rows = 0;                ///< rows one forward runs; 0: train.batch_size
  int64_t row_length = 0;          ///< tokens a row; 0: model.context
};

/// `forge validate`'s estimate of a recipe that trains a policy from model.init_from (finetune, dpo,
/// ppo): the policy, every weight trained or LoRA's adapters (and lora.train_also), plus `extra`;
/// the logits of every row are kept for backward.
MemoryEstimate estimate_policy_memory(const RunConfig& config, const PolicyMemory& extra = {});

/// The held-out end (`fraction`) of text file `text` as LM windows, as data.val_fraction splits a
/// pretraining text; nothing when `text` is empty.
std::unique_ptr<LMWindows> held_out_text(const RunConfig& config, const std::string& text,
                                         double fraction);

/// "text_loss": the LM loss of `model` on held-out text (lm_eval's windows and batches), without
/// gradient: does the policy still write the base's language?
Metric text_loss(const nn::GPT& model, const LMWindows& text, int64_t batch_size, int64_t batches,
                 bool full);

/// The summed log-probability of each completion (its prompt not scored) under `model`, its logits
/// divided by `temperature`, in batches of `batch_size` rows, without gradient.
std::vector<double> completion_logprobs(const nn::GPT& model,
                                        const std::vector<std::vector<int64_t>>& prompts,
                                        const std::vector<nn::Completion>& completions,
                                        int64_t batch_size, double temperature = 1.0);

/// What the reward model gives each completion after its prompt.
std::vector<double> completion_rewards(const LoadedRewardModel& rm,
                                       const std::vector<std::string>& prompts,
                                       const std::vector<nn::Completion>& completions,
                                       const Tokenizer& tokenizer, int64_t batch_size);

/// forge eval --prompts: K samples of every prompt from the policy and from the reference (the same
/// draws), the KL per token of the distribution the policy's samples were drawn from (temperature,
/// top-k, top-p) to the reference at the same temperature, and with --reward-model both models'
/// mean reward and the policy's win rate by reward (ties half). Error(usage) for temperature 0.
Metrics evaluate_policy(const RunConfig& config, nn::GPT& policy, const ReferencePolicy& reference,
                        const CommandOptions& options);

/// forge eval of a dpo or ppo checkpoint: its policy and reference (load_policy), the recipe's
/// `metrics` of them, then with --prompts evaluate_policy's, printed as print_eval does.
int eval_policy(
    const RunConfig& config, const std::filesystem::path& checkpoint, const CommandOptions& options,
    const std::function<Metrics(nn::GPT& policy, const ReferencePolicy& reference)>& metrics);

/// The options of evaluate_policy, for RecipeSpec::eval_options.
std::vector<std::pair<std::string, std::string>> policy_eval_options();

}  // namespace forge
