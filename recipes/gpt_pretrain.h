// Recipe gpt_pretrain: a GPT trained with next-token cross-entropy on a byte corpus.
#pragma once

#include "runtime/config.h"
#include "runtime/registry.h"

namespace forge {

/// gpt_pretrain for the registry.
RecipeSpec gpt_pretrain_recipe();

/// Trains per `config` (the run directory of README.md); returns the process exit code.
int train_gpt(const RunConfig& config);

/// `forge eval` for a GPT run: loss and perplexity over the whole validation split.
int eval_gpt(const RunConfig& config, const std::string& checkpoint_file);

}  // namespace forge
