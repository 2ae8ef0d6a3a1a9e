// Recipe ppo: PPO of a GPT policy (model.init_from, every weight or LoRA adapters) against a frozen
// reward model, with a per-token KL penalty to a frozen reference and a value function trained
// beside the policy, as InstructGPT and TRL's PPOTrainer do it (docs/recipes/ppo.md). A step is one
// rollout and ppo.ppo_epochs passes of minibatch updates over it.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/config.h"
#include "runtime/registry.h"

namespace forge {

RecipeSpec ppo_recipe();
ConfigSection ppo_section();

/// The ppo: section, one field per key of ppo_section() (docs/config.md has their meaning).
struct PPOSection {
  enum class Value { separate, shared };
  std::string reward_model;
  Value value = Value::separate;
  int64_t rollout_batch = 0, ppo_epochs = 0, generation_batch_size = 0, max_new_tokens = 0;
  double temperature = 0;
  int64_t top_k = 0;
  double top_p = 0;
  std::string stop_text;
  double missing_eos_penalty = 0, kl_coef = 0;
  bool adaptive_kl = false;
  double target_kl = 0, kl_horizon = 0, gamma = 0, lam = 0, clip_range = 0, clip_range_value = 0;
  double vf_coef = 0, entropy_coef = 0;
  bool whiten_rewards = false;
  std::string eval_text;
  double eval_text_fraction = 0;
  bool operator==(const PPOSection&) const = default;
};
/// The ppo: section of `config` (validated by the loader against ppo_section()).
PPOSection ppo_section_settings(const RunConfig& config);

}  // namespace forge
