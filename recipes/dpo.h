// Recipe dpo: Direct Preference Optimization of a GPT policy (model.init_from, every weight or LoRA
// adapters) against a frozen reference, on preference pairs (docs/recipes/preference.md). The
// reference is a copy of the base, or for a LoRA policy the same model with its adapters off; its
// log-probabilities may be computed once before training (dpo.precompute_reference). ORPO and
// SimPO (dpo.loss_type orpo, simpo) train the policy without any reference.
#pragma once

#include <string>

#include "nn/preference.h"
#include "runtime/config.h"
#include "runtime/registry.h"

namespace forge {

RecipeSpec dpo_recipe();
ConfigSection dpo_section();

/// The dpo: section, a field a key of dpo_section (its docs and defaults are there).
struct DPOSection {
  double beta{};
  nn::DPOLossType loss_type{};
  double label_smoothing{};
  double simpo_gamma{};
  bool precompute_reference{};
  std::string eval_text;
  double eval_text_fraction{};
};
/// What `config` says in its dpo: section.
DPOSection dpo_settings(const RunConfig& config);

}  // namespace forge
