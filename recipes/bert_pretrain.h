// Recipe bert_pretrain: a BERT encoder trained with masked-LM plus next-sentence prediction on
// sentence pairs built from the documents of a text corpus.
#pragma once

#include <string>

#include "recipes/config.h"

namespace forge {

/// Trains per `config` (DESIGN.md §1 run directory); returns the process exit code.
int train_bert(const RunConfig& config);

/// `forge eval` for a BERT run: MLM accuracy, loss and perplexity, NSP accuracy and loss on the
/// validation documents' fixed evaluation pairs.
int eval_bert(const RunConfig& config, const std::string& checkpoint_file);

}  // namespace forge
