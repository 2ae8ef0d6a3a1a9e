// Recipe bert_pretrain: a BERT encoder trained with masked-LM plus next-sentence prediction on
// sentence pairs built from the documents of a text corpus.
#pragma once

#include <string>

#include "recipes/bert_objective.h"
#include "runtime/config.h"
#include "runtime/registry.h"

namespace forge {

/// bert_pretrain for the registry.
RecipeSpec bert_pretrain_recipe();

/// Trains per `config` (the run directory of README.md); returns the process exit code.
int train_bert(const RunConfig& config);

/// `forge eval` for a BERT run: MLM accuracy, loss and perplexity, NSP accuracy and loss on the
/// validation documents' fixed evaluation pairs.
int eval_bert(const RunConfig& config, const std::string& checkpoint_file);

}  // namespace forge
