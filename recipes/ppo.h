// Recipe ppo: PPO of a GPT policy (model.init_from, every weight or LoRA adapters) against a frozen
// reward model, with a per-token KL penalty to a frozen reference and a value function trained
// beside the policy, as InstructGPT and TRL's PPOTrainer do it (docs/recipes/ppo.md). A step is one
// rollout and ppo.ppo_epochs passes of minibatch updates over it.
#pragma once

#include "runtime/config.h"
#include "runtime/registry.h"

namespace forge {

RecipeSpec ppo_recipe();
ConfigSection ppo_section();

}  // namespace forge
