// Recipe grpo: GRPO of a GPT policy (model.init_from, every weight or LoRA adapters) from checkable
// rewards (recipes/verifier.h), as DeepSeekMath and TRL's GRPOTrainer do it: G completions per
// prompt, each completion's reward relative to its group as the advantage of its tokens, the
// clipped loss with an optional k3 KL to a frozen reference; or online rejection-sampling
// fine-tuning on the same rollout (docs/recipes/grpo.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "recipes/verifier.h"
#include "runtime/config.h"
#include "runtime/registry.h"

namespace forge {

RecipeSpec grpo_recipe();
ConfigSection grpo_section();

/// The grpo: section, one field per key of grpo_section() (docs/config.md has their meaning).
struct GRPOSection {
  enum class Advantage { group, rejection };
  enum class LossType { grpo, dapo, dr_grpo };
  int64_t num_generations = 0, prompts_per_step = 0, num_iterations = 0;
  int64_t generation_batch_size = 0, max_new_tokens = 0;
  double temperature = 0;
  int64_t top_k = 0;
  double top_p = 0;
  std::string stop_text;
  Advantage advantage = Advantage::group;
  bool scale_rewards = true;
  double rejection_threshold = 0;
  LossType loss_type = LossType::dapo;
  double epsilon = 0, epsilon_high = 0, beta = 0;
  std::vector<std::string> rewards;
  double answer_weight = 0, regex_weight = 0, command_weight = 0;
  std::string answer_field, answer_pattern, format_pattern, command;
  double command_timeout = 0, eval_temperature = 0;
  bool operator==(const GRPOSection&) const = default;
};
/// The grpo: section of `config` (validated by the loader against grpo_section()).
GRPOSection grpo_section_settings(const RunConfig& config);

/// The verifier options grpo.rewards and its keys configure.
VerifierOptions verifier_options(const GRPOSection& section);

}  // namespace forge
