// The `lora:` config section, shared by every recipe that can train adapters instead of all
// weights (finetune today; distill, dpo and ppo later): its keys, the nn::LoRAConfig they make, and
// which parameters a LoRA run trains.
#pragma once

#include <string>
#include <vector>

#include "nn/gpt.h"
#include "nn/lora.h"
#include "runtime/config.h"
#include "runtime/registry.h"

namespace forge {

ConfigSection lora_section();

/// The lora: section, a field a key of lora_section (its docs and defaults are there). The
/// adapters' keys (rank, alpha, dropout, targets, rslora) are nn::LoRAConfig's fields, so the
/// section passes where nn takes adapters; rank 0 means none (every weight trains).
struct LoRASection : nn::LoRAConfig {
  double lr_ratio{};
  std::vector<std::string> train_also;
};
/// What `config` says in its lora: section.
LoRASection lora_settings(const RunConfig& config);

/// Globs of the parameters a LoRA run trains: the adapters and lora.train_also.
std::vector<std::string> lora_trainable_patterns(const RunConfig& config);

/// LoRA+ (Hayou et al. 2024, PEFT's loraplus_lr_ratio): B trains at lora.lr_ratio times A's rate.
/// The optimizer's lr scales for build_optimizer; none without adapters or at ratio 1.
std::vector<std::pair<std::string, double>> lora_lr_scale(const RunConfig& config);

/// The parameters a LoRA run of `model` trains, counted without building it: the adapters and
/// the base parameters that lora.train_also names. Throws Error(usage) for a train_also pattern
/// that matches no parameter, as training would, so that `forge validate` says it first.
int64_t lora_trainable_parameters(const nn::GPTConfig& model, const RunConfig& config);

/// lora.* rules for a recipe's check: targets must be given when rank > 0, and lr_ratio and
/// train_also, which act on adapters, need rank > 0.
void check_lora(ConfigChecker& checker);

}  // namespace forge
