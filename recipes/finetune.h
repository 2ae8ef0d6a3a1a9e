// Recipe finetune: a pretrained GPT (model.init_from) trained further on text, record files or
// JSONL instruction records, every weight or LoRA adapters only (docs/recipes/finetune.md).
#pragma once

#include <filesystem>

#include "data/sft.h"
#include "nn/gpt.h"
#include "runtime/config.h"
#include "runtime/registry.h"
#include "runtime/trainer.h"

namespace forge {

RecipeSpec finetune_recipe();
ConfigSection finetune_section();

int train_finetune(const RunConfig& config);
int eval_finetune(const RunConfig& config, const std::filesystem::path& checkpoint_file,
                 const CommandOptions& options = {});

/// Summed cross-entropy over the scored targets of an SFT batch (the completion and its
/// end-of-text; prompt and padding positions are ignored), and their count.
MicroBatchLoss sft_loss(const nn::GPT& model, const SFTBatch& batch);

}  // namespace forge
