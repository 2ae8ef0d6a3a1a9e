// Recipe finetune: a pretrained GPT (model.init_from) trained further on text, record files or
// JSONL instruction records, every weight or LoRA adapters only (docs/recipes/finetune.md).
#pragma once

#include <filesystem>
#include <string>

#include "data/prepare.h"
#include "data/sft.h"
#include "nn/gpt.h"
#include "runtime/config.h"
#include "runtime/registry.h"
#include "runtime/trainer.h"

namespace forge {

RecipeSpec finetune_recipe();
ConfigSection finetune_section();

/// The finetune: section, a field a key of finetune_section (its docs and defaults are there).
struct FinetuneSection {
  std::string end_of_text;
  RecordFormat records{};
  bool packing = false;
};
/// What `config` says in its finetune: section.
FinetuneSection finetune_settings(const RunConfig& config);

int train_finetune(const RunConfig& config);
int eval_finetune(const RunConfig& config, const std::filesystem::path& checkpoint_file,
                 const CommandOptions& options = {});

/// Summed cross-entropy over the scored targets of an SFT batch (the completion and its
/// end-of-text; prompt and padding positions are ignored), their count and the batch's real
/// tokens. A packed batch (data/packing.h) runs with its records' positions and segments.
MicroBatchLoss sft_loss(const nn::GPT& model, const SFTBatch& batch);

}  // namespace forge
