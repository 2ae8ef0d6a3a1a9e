// What the recipes that align a pretrained policy (dpo, ppo) share: the policy from
// model.init_from, full or with LoRA adapters, and its frozen reference (a copy of the base, or the
// policy itself with its adapters off); held-out text to check that the policy still writes the
// base's language; and `forge eval --prompts`, which samples policy and reference with the same
// draws and reports their KL and their rewards (docs/recipes/preference.md).
#pragma once

#include <filesystem>
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

struct Policy {
  std::unique_ptr<nn::GPT> model;
  std::unique_ptr<ReferencePolicy> reference;
  std::filesystem::path base;  ///< model.init_from resolved to a checkpoint file
  bool lora = false;
};

/// The policy from model.init_from (with adapters when lora.rank > 0) and its reference. A full
/// fine-tune's resume overwrites the policy from its checkpoint, so the base is read then only for
/// the reference; `need_reference_copy` false (DPO's precomputed reference) skips even that.
Policy build_policy(const RunConfig& config, bool resuming, bool need_reference_copy);

/// The policy and its reference as a run's models: the policy is the main model (saved whole, or
/// for LoRA its adapters with the base referenced), the reference copy a frozen "reference"
/// referenced by the base's path and digest, so a resume against another base fails. With no copy
/// (LoRA: the policy with adapters off), no reference entry; `absent_copy` (an empty module) stands
/// for a full policy's reference the run does not hold (DPO's precomputed one).
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

/// The held-out end of the text file named by key `text_key` (fraction `fraction_key`) as LM
/// windows, as data.val_fraction splits a pretraining text; nothing when the key is empty.
std::unique_ptr<LMWindows> held_out_text(const RunConfig& config, const std::string& text_key,
                                         const std::string& fraction_key);

/// The summed log-probability of each completion (its prompt not scored) under `model`, in batches
/// of `batch_size` rows, without gradient.
std::vector<double> completion_logprobs(const nn::GPT& model,
                                        const std::vector<std::vector<int64_t>>& prompts,
                                        const std::vector<nn::Completion>& completions,
                                        int64_t batch_size);

/// What the reward model gives each completion after its prompt.
std::vector<double> completion_rewards(const LoadedRewardModel& rm,
                                       const std::vector<std::string>& prompts,
                                       const std::vector<nn::Completion>& completions,
                                       const Tokenizer& tokenizer, int64_t batch_size);

/// forge eval --prompts: K samples of every prompt from the policy and from the reference (the same
/// draws), the policy's KL to the reference per token on its own samples, and with --reward-model
/// both models' mean reward and the policy's win rate by reward (ties half).
Metrics evaluate_policy(const RunConfig& config, nn::GPT& policy, const ReferencePolicy& reference,
                        const CommandOptions& options);

/// The options of evaluate_policy, for RecipeSpec::eval_options.
std::vector<std::pair<std::string, std::string>> policy_eval_options();

}  // namespace forge
