// Recipe dpo: Direct Preference Optimization of a GPT policy (model.init_from, every weight or LoRA
// adapters) against a frozen reference, on preference pairs (docs/recipes/preference.md). The
// reference is a copy of the base, or for a LoRA policy the same model with its adapters off; its
// log-probabilities may be computed once before training (dpo.precompute_reference).
#pragma once

#include "runtime/config.h"
#include "runtime/registry.h"

namespace forge {

RecipeSpec dpo_recipe();
ConfigSection dpo_section();

}  // namespace forge
